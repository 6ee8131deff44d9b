package rootfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// pyenvShim returns pyenv's python3 shim, a bash script, or skips.
func pyenvShim(t *testing.T) string {
	t.Helper()
	root := os.Getenv("PYENV_ROOT")
	if root == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			testenv.Optional(t, "pyenv (no home dir: %v)", err)
		}
		root = filepath.Join(home, ".pyenv")
	}
	shim := filepath.Join(root, "shims", "python3")
	if _, err := os.Stat(shim); err != nil {
		testenv.Optional(t, "pyenv's python3 shim: %v", err)
	}
	return shim
}

func checkInterpreter(t *testing.T, arg string, py Interpreter) {
	t.Helper()
	real, err := filepath.EvalSymlinks(py.Path)
	if err != nil || real != py.Path {
		t.Errorf("FindPython(%q).Path = %s, resolves to %s (err %v); want a resolved path", arg, py.Path, real, err)
	}
	if !isELFFile(py.Path) {
		t.Errorf("FindPython(%q).Path = %s, not an ELF executable", arg, py.Path)
	}
	if !strings.HasPrefix(py.Version, "3.") || strings.Count(py.Version, ".") != 2 {
		t.Errorf("FindPython(%q).Version = %q, want 3.X.Y", arg, py.Version)
	}
	sum, err := fileSHA256(py.Path)
	if err != nil || sum != py.Hash {
		t.Errorf("FindPython(%q).Hash = %s, want %s (err %v)", arg, py.Hash, sum, err)
	}
	for name, dir := range map[string]string{"Prefix": py.Prefix, "Stdlib": py.Stdlib, "PlatStdlib": py.PlatStdlib, "DynLoad": py.DynLoad} {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			t.Errorf("FindPython(%q).%s = %q, not a dir (err %v)", arg, name, dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(py.Stdlib, "os.py")); err != nil {
		t.Errorf("FindPython(%q).Stdlib = %s, has no os.py: %v", arg, py.Stdlib, err)
	}
}

func TestFindPythonDefault(t *testing.T) {
	py := hostPython(t)
	checkInterpreter(t, "", py)
	if _, err := os.Stat(defaultPython); err == nil {
		want, _ := filepath.EvalSymlinks(defaultPython)
		if py.Path != want {
			t.Errorf("FindPython(\"\").Path = %s, want %s (the real file of %s)", py.Path, want, defaultPython)
		}
	}
}

func TestFindPythonShim(t *testing.T) {
	shim := pyenvShim(t)
	py, err := FindPython(context.Background(), shim)
	if err != nil {
		t.Fatalf("FindPython(%s): %v", shim, err)
	}
	checkInterpreter(t, shim, py)
	if py.Path == shim || strings.Contains(py.Path, "/shims/") {
		t.Errorf("FindPython(%s).Path = %s, want the interpreter behind the shim", shim, py.Path)
	}
}

func TestFindPythonErrors(t *testing.T) {
	tests := []struct {
		path string
		want string
	}{
		{"/nonexistent/python3", "python interpreter /nonexistent/python3 not found"},
		{"no-such-python-here", "python interpreter no-such-python-here not found"},
		{"/", "python interpreter / is a directory"},
		{"/bin/false", "running python interpreter /bin/false"},
	}
	for _, tt := range tests {
		_, err := FindPython(context.Background(), tt.path)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("FindPython(%q) = %v, want an error containing %q", tt.path, err, tt.want)
		}
	}
}

func TestKey(t *testing.T) {
	py := Interpreter{Path: "/usr/bin/python3.11", Version: "3.11.2", Hash: "abc", Prefix: "/usr"}
	key := py.Key()
	if len(key) != 16 || strings.Trim(key, "0123456789abcdef") != "" {
		t.Errorf("Key() = %q, want 16 hex digits", key)
	}
	same := py
	same.Prefix = "/elsewhere" // not part of the identity
	if same.Key() != key {
		t.Errorf("Key() changed with Prefix: %s, want %s", same.Key(), key)
	}
	for name, other := range map[string]Interpreter{
		"Path":    {Path: "/usr/bin/python3.12", Version: py.Version, Hash: py.Hash},
		"Version": {Path: py.Path, Version: "3.11.3", Hash: py.Hash},
		"Hash":    {Path: py.Path, Version: py.Version, Hash: "abd"},
		// The separator keeps shifted fields apart.
		"boundary": {Path: py.Path + "3", Version: ".11.2", Hash: py.Hash},
	} {
		if other.Key() == key {
			t.Errorf("Key() with another %s = %s, want a different key", name, key)
		}
	}
	if h := hostPython(t); h.Key() != h.Key() {
		t.Errorf("Key() of the host python is not stable")
	}
}
