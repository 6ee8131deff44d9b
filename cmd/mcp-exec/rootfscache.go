package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/inhuman/mcp-exec/rootfs"
)

// mcp-exec rootfs ls and prune: what the rootfs cache holds, and removing
// what no running server uses.

// cacheDirFlag adds --cache-dir, defaulting to MCP_EXEC_CACHE_DIR, else
// the default cache dir.
func cacheDirFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("MCP_EXEC_CACHE_DIR")
	if def == "" {
		def = rootfs.DefaultCacheDir()
	}
	return fs.String("cache-dir", def, "the rootfs cache (env MCP_EXEC_CACHE_DIR)")
}

func rootfsLs(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mcp-exec rootfs ls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := cacheDirFlag(fs)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	if err := fs.Parse(args); err != nil {
		return exitParse(err)
	}
	list, err := rootfs.List(*dir)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs ls:", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if list == nil {
			list = []rootfs.Entry{}
		}
		enc.Encode(list)
		return 0
	}
	var total int64
	for _, e := range list {
		total += e.Bytes
	}
	fmt.Fprintf(stdout, "%s: %d rootfs, %s\n", *dir, len(list), mebibytes(total))
	if len(list) == 0 {
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tLAST USED\tSTATE\tHOLDS")
	for _, e := range list {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", e.Name, mebibytes(e.Bytes), e.LastUsed.Local().Format("2006-01-02 15:04"), entryState(e), describeEntry(e))
	}
	tw.Flush()
	return 0
}

// entryState says whether an entry is in use, and whether a server would
// still use it.
func entryState(e rootfs.Entry) string {
	var s []string
	switch {
	case e.InUse():
		s = append(s, fmt.Sprintf("in use (%d)", e.Holders))
	case e.Kind == "unknown":
		s = append(s, "not mcp-exec's to remove")
	default:
		s = append(s, "unused")
	}
	if e.Kind == "built" && !e.Current {
		s = append(s, "replaced")
	}
	return strings.Join(s, ", ")
}

func rootfsPrune(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mcp-exec rootfs prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := cacheDirFlag(fs)
	var o rootfs.PruneOptions
	fs.IntVar(&o.Keep, "keep", 0, "keep the N most recently used of the rootfs no server uses")
	fs.Var(&days{&o.OlderThan}, "older-than", "remove only those last used longer ago than this (e.g. 36h, 7d)")
	fs.BoolVar(&o.DryRun, "dry-run", false, "say what would be removed, remove nothing")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcp-exec rootfs prune [--cache-dir DIR] [--keep N] [--older-than D] [--dry-run]\n\n"+
			"Removes, least recently used first, the cached rootfs that no running mcp-exec uses (of any\n"+
			"instance on this host: each holds a lock on what it uses); a server that needs one again builds it.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return exitParse(err)
	}
	if o.Keep < 0 || fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	removed, err := rootfs.Prune(ctx, *dir, o)
	verb := "removed"
	if o.DryRun {
		verb = "would remove"
	}
	var freed int64
	for _, e := range removed {
		freed += e.Bytes
		fmt.Fprintf(stdout, "%s %s (%s, last used %s): %s\n", verb, e.Name, mebibytes(e.Bytes), e.LastUsed.Local().Format("2006-01-02 15:04"), describeEntry(e))
	}
	fmt.Fprintf(stdout, "%s %d rootfs, %s\n", verb, len(removed), mebibytes(freed))
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs prune:", err)
		return 1
	}
	return 0
}

func exitParse(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func mebibytes(n int64) string {
	return strconv.FormatFloat(float64(n)/mib, 'f', 1, 64) + " MiB"
}

// days is a duration flag that also takes whole days: 7d.
type days struct{ d *time.Duration }

func (d *days) String() string {
	if d.d == nil || *d.d == 0 {
		return ""
	}
	return d.d.String()
}

func (d *days) Set(s string) error {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		f, err := strconv.ParseFloat(n, 64)
		if err != nil || f < 0 {
			return fmt.Errorf("want a duration such as 36h or 7d, got %q", s)
		}
		*d.d = time.Duration(f * 24 * float64(time.Hour))
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf("want a duration such as 36h or 7d, got %q", s)
	}
	*d.d = v
	return nil
}
