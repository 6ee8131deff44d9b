package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/server"
)

// The operator's data dir (MCP_EXEC_DATA_DIR), read-only at /data in
// every sandbox: checked at start (here, where the settings are named;
// the sandbox's own listing of it is part of the start-up proof, engine.go)
// and measured for the tool's description.

// checkDataDir makes c.DataDir the real path of a directory the sandbox
// may be given: not the root, and nothing of the server's own (the
// rootfs, its cache, the state dir) within it or around it.
func (c *config) checkDataDir() error {
	if c.DataDir == "" {
		return nil
	}
	abs, err := filepath.Abs(c.DataDir)
	if err == nil {
		abs, err = filepath.EvalSymlinks(abs)
	}
	if err != nil {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s: %w", c.DataDir, err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s is not a directory (%v)", c.DataDir, err)
	}
	if abs == "/" {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s is the host's root: name the directory of the data only", c.DataDir)
	}
	cacheDir := c.CacheDir
	if cacheDir == "" {
		cacheDir = rootfs.DefaultCacheDir()
	}
	for _, own := range []struct{ what, dir string }{{"the rootfs (MCP_EXEC_ROOTFS)", c.Rootfs},
		{"the rootfs cache (MCP_EXEC_CACHE_DIR)", cacheDir}, {"the state dir (MCP_EXEC_STATE_DIR)", c.StateDir}} {
		if own.dir == "" {
			continue
		}
		dir, err := filepath.Abs(own.dir)
		if err == nil {
			if real, err := filepath.EvalSymlinks(dir); err == nil {
				dir = real
			}
		}
		if within(abs, dir) || within(dir, abs) {
			return fmt.Errorf("MCP_EXEC_DATA_DIR=%s and %s (%s) overlap: the sandbox would read the server's own files", c.DataDir, own.what, dir)
		}
	}
	if p, kind := dataChannel(abs); p != "" {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s holds %s, a %s: read-only and nodev do not stop a call from opening it, to reach what listens on the host "+
			"or to meet another call; keep only files and dirs in the data dir", c.DataDir, p, kind)
	}
	c.DataDir = abs
	return nil
}

// dataChannel finds, within maxDataListing entries, a socket or a FIFO in
// dir: what a read-only bind still lets a call connect to or open for
// writing, a way out to a host service or to another call. It returns its
// path and what it is, or "".
func dataChannel(dir string) (path, kind string) {
	visited := 0
	stop := errors.New("found")
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if visited++; visited > maxDataListing {
			return stop
		}
		if err != nil {
			return nil
		}
		switch {
		case e.Type()&fs.ModeSocket != 0:
			path, kind = p, "unix socket"
		case e.Type()&fs.ModeNamedPipe != 0:
			path, kind = p, "FIFO"
		default:
			return nil
		}
		return stop
	})
	return path, kind
}

// within reports whether p is dir or below it; both are clean absolute
// paths.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// maxDataListing bounds the entries the listing visits: past it the
// description says "at least".
const maxDataListing = 100000

// dataListing measures dir as the sandbox sees it at policy.DataDir: its
// regular files and their bytes, links not followed, what cannot be read
// skipped; partial when it stopped at its bound.
func dataListing(dir string) server.DataInfo {
	d := server.DataInfo{Path: policy.DataDir}
	visited := 0
	stop := errors.New("enough")
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if visited++; visited > maxDataListing {
			d.Partial = true
			return stop
		}
		if err != nil || !e.Type().IsRegular() {
			return nil
		}
		if fi, err := e.Info(); err == nil {
			d.Files++
			d.Bytes += fi.Size()
		}
		return nil
	})
	return d
}
