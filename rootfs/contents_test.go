package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A cached generation whose files changed while no server watched it is
// never served again: the next Ensure refuses it, naming the file and how
// to rebuild it. A change inotify never reports (a write through a
// mapping, or a file put back with its old mtime) moves the change time,
// which the contents file stamps. One built before contents files existed
// is stamped when first served.
func TestEnsureRefusesAChangedGeneration(t *testing.T) {
	py := hostPython(t)
	// The host interpreter's stdlib, as the rootfs holds it.
	stdlib := strings.TrimPrefix(py.Stdlib, "/")
	osPy := stdlib + "/os.py"
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		want   string
	}{
		{"appended", func(t *testing.T, dir string) {
			f, err := os.OpenFile(filepath.Join(dir, osPy), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				t.Fatalf("the rootfs has no %s: %v", osPy, err)
			}
			f.WriteString("\nprint('owned')\n")
			f.Close()
		}, osPy + " was written"},
		{"mtime put back", func(t *testing.T, dir string) {
			p := filepath.Join(dir, osPy)
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatalf("the rootfs has no %s: %v", osPy, err)
			}
			data, _ := os.ReadFile(p)
			os.WriteFile(p, append(data[:len(data)-1], '#'), 0o644)
			os.Chtimes(p, time.Time{}, fi.ModTime())
		}, osPy + " was written"},
		{"a file added", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, stdlib, "sitecustomize.py"), []byte("x"), 0o644)
		}, stdlib}, // the dir (its change time) or the file
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache := t.TempDir()
			dir, err := ensure(context.Background(), py, Options{}, cache, nil, build)
			if err != nil {
				t.Fatal(err)
			}
			release(dir)
			tc.change(t, dir)
			_, err = ensure(context.Background(), py, Options{}, cache, nil, build)
			if !errors.Is(err, errContentsChanged) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "to rebuild it") {
				t.Errorf("Ensure after the change: %v; want a refusal saying %q and how to rebuild", err, tc.want)
			}
		})
	}
	t.Run("built before contents files", func(t *testing.T) {
		cache := t.TempDir()
		dir, err := ensure(context.Background(), py, Options{}, cache, nil, build)
		if err != nil {
			t.Fatal(err)
		}
		release(dir)
		os.Remove(dir + contentsSuffix)
		if _, err := ensure(context.Background(), py, Options{}, cache, nil, build); err != nil {
			t.Fatalf("Ensure of a generation without a contents file: %v", err)
		}
		if _, err := os.Stat(dir + contentsSuffix); err != nil {
			t.Errorf("it was not stamped when served: %v", err)
		}
	})
}
