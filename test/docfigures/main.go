// Command docfigures checks that every figure of the README's performance
// table is one docs/performance.md holds: the README quotes measurements,
// it never makes them up or keeps an old one. make vet runs it.
//
// A figure is a number in a data cell of the table under the README's
// "## Performance" heading (the row labels, the first column, are not
// figures); docs/performance.md must hold the same number as a whole word.
//
// Usage: go run ./test/docfigures [README [PERFORMANCE]]
package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

var number = regexp.MustCompile(`\d[\d,]*(\.\d+)?`)

func main() {
	readme, perf := "README.md", "docs/performance.md"
	if len(os.Args) > 1 {
		readme = os.Args[1]
	}
	if len(os.Args) > 2 {
		perf = os.Args[2]
	}
	missing, err := check(readme, perf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docfigures:", err)
		os.Exit(2)
	}
	for _, m := range missing {
		fmt.Fprintf(os.Stderr, "docfigures: %s quotes %s, which %s does not hold\n", readme, m, perf)
	}
	if len(missing) > 0 {
		os.Exit(1)
	}
}

// check returns the README's figures that the performance page lacks, each
// with the row it is in.
func check(readmePath, perfPath string) ([]string, error) {
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return nil, err
	}
	perf, err := os.ReadFile(perfPath)
	if err != nil {
		return nil, err
	}
	rows := table(string(readme))
	if len(rows) == 0 {
		return nil, fmt.Errorf("%s has no table under its ## Performance heading", readmePath)
	}
	var missing []string
	for _, row := range rows {
		cells := strings.Split(strings.Trim(row, "|"), "|")
		for _, cell := range cells[1:] {
			for _, n := range number.FindAllString(cell, -1) {
				if !holds(string(perf), n) {
					missing = append(missing, fmt.Sprintf("%q (row %q)", n, strings.TrimSpace(cells[0])))
				}
			}
		}
	}
	return missing, nil
}

// table returns the data rows of the first table under "## Performance".
func table(md string) []string {
	_, after, ok := strings.Cut(md, "\n## Performance\n")
	if !ok {
		return nil
	}
	var rows []string
	header := true
	for _, line := range strings.Split(after, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			return rows
		case !strings.HasPrefix(line, "|"):
			if len(rows) > 0 {
				return rows
			}
		case strings.HasPrefix(line, "|---"):
			header = false
		case !header:
			rows = append(rows, line)
		}
	}
	return rows
}

// holds says whether text has n as a whole number (not part of a longer
// one: 9.6 is not held by 19.6 or 9.65).
func holds(text, n string) bool {
	re := regexp.MustCompile(`(^|[^\d.,])` + regexp.QuoteMeta(n) + `($|[^\d]|[.,][^\d])`)
	return re.MatchString(text)
}
