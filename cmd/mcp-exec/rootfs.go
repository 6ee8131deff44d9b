package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/inhuman/mcp-exec/rootfs"
)

// rootfsCmd builds the default rootfs from the host's Python into a
// directory of the caller's choosing.
func rootfsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, "usage: mcp-exec rootfs build --out DIR [--python PATH]")
		return 2
	}
	fs := flag.NewFlagSet("mcp-exec rootfs build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "directory to create (must not exist)")
	python := fs.String("python", os.Getenv("MCP_EXEC_PYTHON"), "host interpreter to build from (env MCP_EXEC_PYTHON; default /usr/bin/python3, else python3 on PATH)")
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: mcp-exec rootfs build --out DIR [--python PATH]")
		return 2
	}
	dir, err := filepath.Abs(*out)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs build:", err)
		return 1
	}
	py, err := rootfs.FindPython(ctx, *python)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs build:", err)
		return 1
	}
	start := time.Now()
	if err := rootfs.Build(ctx, py, rootfs.Options{}, dir, nil); err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs build:", err)
		return 1
	}
	fmt.Fprintf(stdout, "built %s from %s (Python %s) in %v\n", dir, py.Path, py.Version, time.Since(start).Round(time.Millisecond))
	return 0
}
