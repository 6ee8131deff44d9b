package rootfs

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
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
