package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/server"
)

// A data dir is checked at start, each refusal naming the variable: it
// must be a directory, not the host's root, hold nothing of the server's
// own (the rootfs, its cache, the state dir) nor lie within it, and hold
// no socket or FIFO, which a read-only bind leaves open to a call.
func TestDataDirChecked(t *testing.T) {
	base := t.TempDir()
	data, state, cache, root := filepath.Join(base, "data"), filepath.Join(base, "state"), filepath.Join(base, "cache"), filepath.Join(base, "rootfs")
	for _, d := range []string{data, state, cache, root, filepath.Join(state, "x"), filepath.Join(root, "srv")} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(base, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(data, link); err != nil {
		t.Fatal(err)
	}
	// A socket and a FIFO, each in a data dir of its own.
	sockDir, fifoDir := filepath.Join(base, "sock"), filepath.Join(base, "fifo")
	for _, d := range []string{sockDir, filepath.Join(fifoDir, "deep")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ln, err := net.Listen("unix", filepath.Join(sockDir, "service.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := syscall.Mkfifo(filepath.Join(fifoDir, "deep", "pipe"), 0o666); err != nil {
		t.Fatal(err)
	}
	own := []string{"MCP_EXEC_STATE_DIR=" + state, "MCP_EXEC_CACHE_DIR=" + cache, "MCP_EXEC_ROOTFS=" + root}
	for _, c := range []struct {
		dir  string
		want []string // what the error names; nil: accepted
	}{
		{data, nil},
		{link, nil},
		{filepath.Join(base, "none"), []string{"MCP_EXEC_DATA_DIR=" + filepath.Join(base, "none")}},
		{filepath.Join(base, "file"), []string{"MCP_EXEC_DATA_DIR=", "is not a directory"}},
		{"/", []string{"MCP_EXEC_DATA_DIR=/ is the host's root"}},
		{base, []string{"MCP_EXEC_DATA_DIR=" + base, "overlap"}},
		{filepath.Join(state, "x"), []string{"MCP_EXEC_STATE_DIR", "overlap"}},
		{filepath.Join(cache), []string{"MCP_EXEC_CACHE_DIR", "overlap"}},
		{filepath.Join(root, "srv"), []string{"MCP_EXEC_ROOTFS", "overlap"}},
		{sockDir, []string{"MCP_EXEC_DATA_DIR=" + sockDir, "service.sock, a unix socket"}},
		{fifoDir, []string{"MCP_EXEC_DATA_DIR=" + fifoDir, "deep/pipe, a FIFO"}},
	} {
		cfg, err := loadWith(t, append([]string{"MCP_EXEC_DATA_DIR=" + c.dir}, own...)...)
		if c.want == nil {
			if err != nil || cfg.DataDir != data {
				t.Errorf("MCP_EXEC_DATA_DIR=%s: %v, data dir %q; want accepted as %s", c.dir, err, cfg.DataDir, data)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("MCP_EXEC_DATA_DIR=%s: %v, want an error naming %q", c.dir, err, w)
			}
		}
	}
}

// The listing the description gives: regular files and their bytes, no
// link followed.
func TestDataListing(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "a.csv"), []byte("12345"), 0o644)
	os.Mkdir(filepath.Join(dir, "sub"), 0o755)
	os.WriteFile(filepath.Join(dir, "sub", "b.csv"), []byte("678"), 0o644)
	os.Symlink("/etc", filepath.Join(dir, "etc"))
	if got, want := dataListing(dir), (server.DataInfo{Path: "/data", Files: 2, Bytes: 8}); got != want {
		t.Errorf("dataListing = %+v, want %+v", got, want)
	}
}

// A data dir is mounted by its path for each sandbox: one that a user
// other than root or the server's could swap after start (by a dir above
// it they own or may write, or a sticky one where the data dir is theirs)
// is refused, as is one the check cannot see all of.
func TestDataDirHeld(t *testing.T) {
	testenv.Root(t) // the dirs are given to another user
	const other = 65534
	base := t.TempDir()
	os.Chmod(base, 0o755)
	mk := func(parts ...string) string {
		d := filepath.Join(append([]string{base}, parts...)...)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	ownedAbove := mk("owned", "data")
	os.Chown(filepath.Dir(ownedAbove), other, other)
	writableAbove := mk("writable", "data")
	os.Chmod(filepath.Dir(writableAbove), 0o777)
	stickyTheirs := mk("sticky", "theirs")
	os.Chmod(filepath.Dir(stickyTheirs), 0o777|os.ModeSticky)
	os.Chown(stickyTheirs, other, other)
	stickyOurs := mk("sticky", "ours")
	theirsInside := mk("ours", "data")
	os.Chown(theirsInside, other, other) // its contents are the data: its owner may change them
	many := mk("many")
	for i := range 6 {
		os.WriteFile(filepath.Join(many, strconv.Itoa(i)), nil, 0o644)
	}
	defer func(n int) { maxDataListing = n }(maxDataListing)
	maxDataListing = 5 // past it, a socket could hide
	for _, c := range []struct {
		dir  string
		want []string
	}{
		{ownedAbove, []string{"MCP_EXEC_DATA_DIR=" + ownedAbove, "is owned by uid 65534"}},
		{writableAbove, []string{"MCP_EXEC_DATA_DIR=" + writableAbove, "is writable by others"}},
		{stickyTheirs, []string{"MCP_EXEC_DATA_DIR=" + stickyTheirs, "owned by another user in the sticky"}},
		{stickyOurs, nil},
		{theirsInside, nil},
		{many, []string{"MCP_EXEC_DATA_DIR=" + many, "could not be checked whole", "more than 5 entries"}},
	} {
		_, err := loadWith(t, "MCP_EXEC_DATA_DIR="+c.dir)
		if c.want == nil {
			if err != nil {
				t.Errorf("MCP_EXEC_DATA_DIR=%s: %v; want it accepted", c.dir, err)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("MCP_EXEC_DATA_DIR=%s: %v; want an error naming %q", c.dir, err, w)
			}
		}
	}
}
