package rootfs

import (
	"os"
	"path/filepath"
	"testing"
)

// Compiled files land beside their sources, in __pycache__; one beside no
// source, one that is no compiled name, and one whose __pycache__ is a
// link out of the rootfs are passed over: the compiler's output is data,
// never a way to write outside the tree.
func TestPlaceBytecode(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	for _, d := range []string{"a/b", "c"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a/b/m.py", "c/n.py"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "c", "__pycache__")); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{
		"a/b/m.cpython-312.pyc": []byte("m"),
		"a/b/x.cpython-312.pyc": []byte("no source"),
		"a/b/m.pyc":             []byte("not a compiled name"),
		"c/n.cpython-312.pyc":   []byte("through a link"),
	}
	n, err := PlaceBytecode(root, func(yield func(string, []byte) bool) {
		for p, d := range files {
			if !yield(p, d) {
				return
			}
		}
	})
	if err != nil || n != 1 {
		t.Fatalf("PlaceBytecode: %d placed, %v; want 1", n, err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "a/b/__pycache__/m.cpython-312.pyc")); err != nil || string(got) != "m" {
		t.Errorf("a/b/__pycache__/m.cpython-312.pyc: %q, %v", got, err)
	}
	if left, _ := os.ReadDir(outside); len(left) != 0 {
		t.Errorf("a file was written through the link, out of the rootfs: %v", left)
	}
	if _, err := os.Stat(filepath.Join(root, "a/b/__pycache__/x.cpython-312.pyc")); err == nil {
		t.Error("a compiled file beside no source was placed")
	}
}
