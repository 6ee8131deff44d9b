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

const rootfsUsage = `usage:
  mcp-exec rootfs build --out DIR [--python PATH] [--packages LIST] [--shell]
  mcp-exec rootfs ls [--cache-dir DIR] [--json]
  mcp-exec rootfs prune [--cache-dir DIR] [--keep N] [--older-than D] [--dry-run]`

// rootfsCmd builds the default rootfs from the host's Python into a
// directory of the caller's choosing, or lists or prunes the cache.
func rootfsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	stdout, stderr = fieldWriter{stdout}, fieldWriter{stderr}
	if len(args) > 0 {
		switch args[0] {
		case "ls":
			return rootfsLs(args[1:], stdout, stderr)
		case "prune":
			return rootfsPrune(ctx, args[1:], stdout, stderr)
		}
	}
	if len(args) == 0 || args[0] != "build" {
		fmt.Fprintln(stderr, rootfsUsage)
		return 2
	}
	fs := flag.NewFlagSet("mcp-exec rootfs build", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "directory to create (must not exist)")
	python := fs.String("python", os.Getenv("MCP_EXEC_PYTHON"), "host interpreter to build from (env MCP_EXEC_PYTHON; default /usr/bin/python3, else python3 on PATH)")
	var opts rootfs.Options
	fs.Var(list(&opts.Packages), "packages", "Python packages to include, from the host's Debian python3-* packages (env MCP_EXEC_PACKAGES)")
	fs.Var(boolean(&opts.Shell), "shell", "include /bin/sh and the common command-line tools from busybox-static (env MCP_EXEC_SHELL)")
	for _, e := range []struct {
		env string
		v   flag.Value
	}{{"MCP_EXEC_PACKAGES", list(&opts.Packages)}, {"MCP_EXEC_SHELL", boolean(&opts.Shell)}} {
		if v, ok := os.LookupEnv(e.env); ok {
			if err := e.v.Set(v); err != nil {
				fmt.Fprintf(stderr, "mcp-exec rootfs build: %s: %v\n", e.env, err)
				return 2
			}
		}
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "usage: mcp-exec rootfs build --out DIR [--python PATH] [--packages LIST] [--shell]")
		return 2
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs build:", err)
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
	if _, err := rootfs.Describe(py, opts); err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs build:", err)
		return 1
	}
	if err := rootfs.Build(ctx, py, opts, dir, nil); err != nil {
		fmt.Fprintln(stderr, "mcp-exec rootfs build:", err)
		return 1
	}
	fmt.Fprintf(stdout, "built %s from %s (Python %s; %s) in %v\n", dir, py.Path, py.Version, opts, time.Since(start).Round(time.Millisecond))
	return 0
}
