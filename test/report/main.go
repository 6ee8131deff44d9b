// Command report reads `go test -json` on its standard input and prints
// what a person reading a CI log needs: each package's result as go test
// prints it, the whole output of every test that failed, and at the end
// the slowest tests, so that the cost of the suite stays in sight.
//
// Usage: go test -json ./... | go run ./test/report [-slowest N]
//
// It exits 1 when a test or a package failed, or when the input ended
// without a package's result (a crashed or killed test binary).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Elapsed float64
	Output  string
}

type timing struct {
	name    string
	elapsed time.Duration
}

// report is what has been read so far.
type report struct {
	w       io.Writer
	output  map[string][]string // package/test → its output, until it ends
	slow    []timing
	failed  []string
	started map[string]bool // packages without a result yet
}

func main() {
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list")
	flag.Parse()
	r := &report{w: os.Stdout, output: map[string][]string{}, started: map[string]bool{}}
	if err := r.read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "report:", err)
		os.Exit(2)
	}
	os.Exit(r.summary(*slowest))
}

// read handles every event of in, printing as it goes.
func (r *report) read(in io.Reader) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			// Not an event (a build error goes to stderr, but be lenient).
			fmt.Fprintln(r.w, sc.Text())
			continue
		}
		r.handle(e)
	}
	return sc.Err()
}

func (r *report) handle(e event) {
	key := e.Package + " " + e.Test
	switch e.Action {
	case "start":
		r.started[e.Package] = true
	case "output":
		if e.Test == "" {
			// The package's own lines: "ok pkg 1.2s", "FAIL", panics.
			if !strings.HasPrefix(e.Output, "=== ") && !strings.HasPrefix(e.Output, "--- ") && e.Output != "PASS\n" {
				fmt.Fprint(r.w, e.Output)
			}
			return
		}
		r.output[key] = append(r.output[key], e.Output)
	case "pass", "skip":
		if e.Test == "" {
			delete(r.started, e.Package)
		} else if e.Action == "pass" {
			r.slow = append(r.slow, timing{key, time.Duration(e.Elapsed * float64(time.Second))})
		}
		delete(r.output, key)
	case "fail":
		if e.Test == "" {
			delete(r.started, e.Package)
			r.failed = append(r.failed, e.Package)
			return
		}
		r.failed = append(r.failed, key)
		fmt.Fprintf(r.w, "--- FAIL: %s %s (%.2fs)\n%s", e.Package, e.Test, e.Elapsed, strings.Join(r.output[key], ""))
		delete(r.output, key)
	}
}

// summary prints the slowest tests and what failed, and returns the exit
// status.
func (r *report) summary(n int) int {
	sort.Slice(r.slow, func(i, j int) bool { return r.slow[i].elapsed > r.slow[j].elapsed })
	if len(r.slow) > n {
		r.slow = r.slow[:n]
	}
	fmt.Fprintf(r.w, "\nthe %d slowest tests:\n", len(r.slow))
	for _, t := range r.slow {
		fmt.Fprintf(r.w, "  %8.2fs  %s\n", t.elapsed.Seconds(), t.name)
	}
	status := 0
	for p := range r.started {
		fmt.Fprintf(r.w, "FAIL: %s ended without a result (its test binary crashed or was killed)\n", p)
		status = 1
	}
	if len(r.failed) > 0 {
		fmt.Fprintf(r.w, "FAILED: %s\n", strings.Join(r.failed, ", "))
		status = 1
	}
	return status
}
