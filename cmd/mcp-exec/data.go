package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

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
	if err := dataDirHeld(abs); err != nil {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s: %w", c.DataDir, err)
	}
	p, kind, unchecked := dataChannel(abs)
	if p != "" {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s holds %s, a %s: read-only and nodev do not stop a call from opening it, to reach what listens on the host "+
			"or to meet another call; keep only files and dirs in the data dir", c.DataDir, p, kind)
	}
	if unchecked != "" {
		return fmt.Errorf("MCP_EXEC_DATA_DIR=%s could not be checked whole for unix sockets and FIFOs, which a read-only bind leaves open to a call (%s): "+
			"give a dir the server can list all of, of at most %d entries", c.DataDir, unchecked, maxDataListing)
	}
	c.DataDir = abs
	return nil
}

// dataDirHeld refuses a data dir that someone but root or the server's
// user could put another in the place of after the server checked it:
// every sandbox mounts it by its path, and a dir above it writable by
// others (or a sticky one, where the dir below is another's) let such a
// user swap it for a link to / between two calls, which then listed the
// host's root, /proc included, at /data (red team 2, R4).
func dataDirHeld(dir string) error {
	euid := uint32(os.Geteuid())
	trusted := func(uid uint32) bool { return uid == 0 || uid == euid }
	child := dir
	for p := filepath.Dir(dir); ; p = filepath.Dir(p) {
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no owner to check", p)
		}
		switch {
		case !trusted(st.Uid):
			return fmt.Errorf("%s, a dir above it, is owned by uid %d: its owner could put another dir in the data dir's place; "+
				"give a data dir whose parents are owned by root or the server's user", p, st.Uid)
		case fi.Mode().Perm()&0o022 != 0 && fi.Mode()&os.ModeSticky == 0:
			return fmt.Errorf("%s, a dir above it, is writable by others (%v): they could put another dir in the data dir's place; "+
				"give a data dir whose parents only root or the server's user may write", p, fi.Mode().Perm())
		case fi.Mode()&os.ModeSticky != 0:
			// Anyone may write a sticky dir, but rename only what they own.
			cfi, err := os.Lstat(child)
			if err != nil {
				return err
			}
			if cst, ok := cfi.Sys().(*syscall.Stat_t); !ok || !trusted(cst.Uid) {
				return fmt.Errorf("%s is owned by another user in the sticky %s: that user could put another dir in its place; "+
					"give a data dir owned by root or the server's user there", child, p)
			}
		}
		if p == "/" {
			return nil
		}
		child = p
	}
}

// dataChannel finds a socket or a FIFO in dir: what a read-only bind
// still lets a call connect to or open for writing, a way out to a host
// service or to another call. It returns its path and what it is, or
// "", and, when it could not look at everything (an entry it could not
// read, or more than maxDataListing), why.
func dataChannel(dir string) (path, kind, unchecked string) {
	visited := 0
	stop := errors.New("found")
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if visited++; visited > maxDataListing {
			unchecked = fmt.Sprintf("more than %d entries", maxDataListing)
			return stop
		}
		if err != nil {
			unchecked = err.Error()
			return stop
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
	return path, kind, unchecked
}

// within reports whether p is dir or below it; both are clean absolute
// paths.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// maxDataListing bounds the entries the listing visits: past it the
// description says "at least", and the check for sockets refuses.
var maxDataListing = 100000

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
