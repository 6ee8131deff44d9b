package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// A Watcher names the first change to any file or dir of the trees it
// watches, by the time Changed is asked, and keeps naming it.
func TestWatcherSeesChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(root string) error
		rel    string
	}{
		{"append to a module", func(root string) error {
			f, err := os.OpenFile(filepath.Join(root, "usr/lib/python3/os.py"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteString("\nprint('owned')\n")
			return err
		}, "usr/lib/python3/os.py"},
		{"a new file", func(root string) error {
			return os.WriteFile(filepath.Join(root, "usr/lib/python3/sitecustomize.py"), []byte("x"), 0o644)
		}, "usr/lib/python3/sitecustomize.py"},
		{"chmod", func(root string) error { return os.Chmod(filepath.Join(root, "usr/lib/python3/os.py"), 0o666) }, "usr/lib/python3/os.py"},
		{"rename over", func(root string) error {
			tmp := filepath.Join(root, "usr/lib/x")
			if err := os.WriteFile(tmp, []byte("y"), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, filepath.Join(root, "usr/lib/python3/os.py"))
		}, "usr/lib/x"},
		{"remove a dir", func(root string) error { return os.RemoveAll(filepath.Join(root, "usr/lib/python3")) }, "usr/lib/python3/os.py"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "usr/lib/python3"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "usr/lib/python3/os.py"), []byte("import sys\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			w, err := Watch(root)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			if err := w.Changed(); err != nil {
				t.Fatalf("Changed() before any change = %v, want nil", err)
			}
			// Reading changes nothing.
			if _, err := os.ReadFile(filepath.Join(root, "usr/lib/python3/os.py")); err != nil {
				t.Fatal(err)
			}
			if err := w.Changed(); err != nil {
				t.Fatalf("Changed() after a read = %v, want nil", err)
			}
			if err := tc.change(root); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 2; i++ {
				err := w.Changed()
				var ce *ChangedError
				if !errors.As(err, &ce) || !errors.Is(err, ErrChanged) {
					t.Fatalf("Changed() = %v, want a *ChangedError", err)
				}
				if ce.Dir != root || ce.Rel != tc.rel {
					t.Errorf("Changed() names %s in %s, want %s", ce.Rel, ce.Dir, tc.rel)
				}
			}
		})
	}
}

// What inotify cannot see, the Watcher still does: a write through a
// shared mapping (the next rescan sees the file's change time move) and a
// filesystem mounted over a file or dir of the tree (the mount table,
// checked whenever the kernel says it changed).
func TestWatcherSeesWhatInotifyDoesNot(t *testing.T) {
	old := rescanEvery
	defer func() { rescanEvery = old }()
	for _, tc := range []struct {
		name   string
		root   bool
		rescan time.Duration // the mounts are seen before a call, not by a scan
		change func(t *testing.T, root string)
		rel    string
	}{
		{"a write through a mapping", false, 20 * time.Millisecond, func(t *testing.T, root string) {
			// A writer that keeps its file open: no close of a file open for
			// writing to report either.
			f, err := os.OpenFile(filepath.Join(root, "usr/lib/python3/os.py"), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			m, err := unix.Mmap(int(f.Fd()), 0, 8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			copy(m, "import x")
			unix.Munmap(m)
		}, "usr/lib/python3/os.py"},
		{"a file bound over one", true, time.Hour, func(t *testing.T, root string) {
			other := filepath.Join(t.TempDir(), "evil.py")
			os.WriteFile(other, []byte("print('owned')\n"), 0o644)
			target := filepath.Join(root, "usr/lib/python3/os.py")
			if err := unix.Mount(other, target, "", unix.MS_BIND, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
		}, "usr/lib/python3/os.py"},
		{"a tmpfs on a dir", true, time.Hour, func(t *testing.T, root string) {
			target := filepath.Join(root, "usr/lib/python3")
			if err := unix.Mount("tmpfs", target, "tmpfs", 0, ""); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Unmount(target, unix.MNT_DETACH) })
		}, "usr/lib/python3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root {
				testenv.Root(t)
			}
			rescanEvery = tc.rescan
			root := t.TempDir()
			if err := os.MkdirAll(filepath.Join(root, "usr/lib/python3"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(root, "usr/lib/python3/os.py"), []byte("import sys\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			w, err := Watch(root)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			tc.change(t, root)
			var ce *ChangedError
			testenv.EventuallyWithin(t, 10*time.Second, "the change to be seen", func() bool {
				return errors.As(w.Changed(), &ce)
			})
			// A mount over a dir hides what was in it: the rescan may name
			// a file below it first.
			if ce.Rel != tc.rel && !strings.HasPrefix(ce.Rel, tc.rel+"/") {
				t.Errorf("Changed() names %s (%s), want %s or below", ce.Rel, ce.What, tc.rel)
			}
		})
	}
}
