package rootfs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Interpreter describes the host Python a rootfs is built from.
type Interpreter struct {
	Path       string // real executable on the host, symlinks resolved (e.g. /usr/bin/python3.11)
	Version    string // e.g. "3.11.2" (sys.version_info joined)
	Prefix     string // sys.base_prefix
	Stdlib     string // sysconfig stdlib dir, e.g. /usr/lib/python3.11
	PlatStdlib string // sysconfig platstdlib (often the same as Stdlib)
	DynLoad    string // lib-dynload dir
	Hash       string // sha256 hex of the executable's content
	// SitePackages are site.getsitepackages(), in sys.path order: the dirs
	// site adds to sys.path when they exist. Debian's python lists
	// /usr/local/lib/python3.X/dist-packages first, then
	// /usr/lib/python3/dist-packages, where its python3-* packages are.
	SitePackages []string
}

// keyVersion is mixed into every cache key. Bump it whenever Build puts
// something different into a rootfs, or the cache's layout changes, so that
// caches built by an older mcp-exec are not reused. v2: generations with
// manifests behind a link (see ensure.go); a v1 entry is a plain dir at the
// key, which a v1 server may still be running on, so it is left alone.
//
// v3: Options (packages, shell), the empty packages dir mount point, and the
// /.mcp-exec mount point of the init. v4: the matplotlib backend saves
// under $TMPDIR/outputs. v5: no group-writable file. v6: the backend
// names figures as the driver does. v7: the empty /data mount point of
// the data dir.
const keyVersion = "rootfs-v7"

// Key is the cache key of the stdlib-only rootfs: Options{}.Key(py).
func (py Interpreter) Key() string {
	return Options{}.key(py)
}

// key is a short hex of sha256(path, version, content hash, options), stable
// for the same interpreter and the same normalized options: different
// package sets get different cached rootfs generations. o must be
// normalized.
func (o Options) key(py Interpreter) string {
	h := sha256.New()
	// The backend's source too: an edit of it must not find a rootfs
	// built with the old one.
	for _, s := range []string{keyVersion, py.Path, py.Version, py.Hash, o.String(), matplotlibBackendSource} {
		// The NUL separator keeps ("a", "bc") and ("ab", "c") apart.
		io.WriteString(h, s)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// defaultPython is what FindPython takes when it is given no path: the
// distribution's interpreter, which its package manager keeps patched.
const defaultPython = "/usr/bin/python3"

// probeScript prints, as one JSON object, everything FindPython needs. It runs
// under -I so that neither PYTHON* variables nor the user's site directory
// change the answer: the sandbox sees neither. -S skips running site, which
// the answer does not depend on, and a third of the probe's start-up;
// site.getsitepackages only computes the dirs it would add.
const probeScript = `
import json, os, site, sys, sysconfig
paths = sysconfig.get_paths()
dynload = ""
for d in sys.path:
    if os.path.basename(d) == "lib-dynload" and os.path.isdir(d):
        dynload = d
        break
if not dynload:
    for d in (paths["platstdlib"], paths["stdlib"]):
        if os.path.isdir(os.path.join(d, "lib-dynload")):
            dynload = os.path.join(d, "lib-dynload")
            break
if not dynload:
    try:
        import _ctypes
        dynload = os.path.dirname(_ctypes.__file__)
    except Exception:
        pass
print(json.dumps({
    "executable": sys.executable,
    "version": ".".join(str(v) for v in sys.version_info[:3]),
    "prefix": sys.base_prefix,
    "stdlib": paths["stdlib"],
    "platstdlib": paths["platstdlib"],
    "dynload": dynload,
    "site": site.getsitepackages() if hasattr(site, "getsitepackages") else [],
}))
`

// FindPython resolves the interpreter to use. If path is empty it takes
// /usr/bin/python3 when that exists, else python3 from PATH.
//
// The candidate is run rather than inspected because PATH may hold a shim
// (pyenv's is a bash script): only the interpreter itself knows which
// executable and standard library it really uses.
func FindPython(ctx context.Context, path string) (Interpreter, error) {
	cand, err := pythonCandidate(path)
	if err != nil {
		return Interpreter{}, err
	}

	cmd := exec.CommandContext(ctx, cand, "-I", "-S", "-c", probeScript)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	// A shim may leave a grandchild holding the pipes; don't wait forever.
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if msg != "" {
			return Interpreter{}, fmt.Errorf("running python interpreter %s: %w: %s", cand, err, msg)
		}
		return Interpreter{}, fmt.Errorf("running python interpreter %s: %w", cand, err)
	}

	var probe struct {
		Executable string   `json:"executable"`
		Version    string   `json:"version"`
		Prefix     string   `json:"prefix"`
		Stdlib     string   `json:"stdlib"`
		PlatStdlib string   `json:"platstdlib"`
		DynLoad    string   `json:"dynload"`
		Site       []string `json:"site"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &probe); err != nil {
		return Interpreter{}, fmt.Errorf("reading the answer of python interpreter %s: %w (output %q)", cand, err, stdout.String())
	}
	if !strings.HasPrefix(probe.Version, "3.") {
		return Interpreter{}, fmt.Errorf("python interpreter %s is Python %s, want Python 3", cand, probe.Version)
	}
	if probe.Executable == "" {
		return Interpreter{}, fmt.Errorf("python interpreter %s does not know its executable (sys.executable is empty)", cand)
	}
	for _, f := range []struct{ name, dir string }{
		{"sys.executable", probe.Executable},
		{"sys.base_prefix", probe.Prefix},
		{"the stdlib dir", probe.Stdlib},
		{"the platstdlib dir", probe.PlatStdlib},
		{"the lib-dynload dir", probe.DynLoad},
	} {
		if !filepath.IsAbs(f.dir) {
			return Interpreter{}, fmt.Errorf("python interpreter %s: %s is %q, want an absolute path", cand, f.name, f.dir)
		}
	}

	var site []string
	for _, d := range probe.Site {
		// A relative one would be relative to the cwd of whoever imports.
		if filepath.IsAbs(d) {
			site = append(site, filepath.Clean(d))
		}
	}

	real, err := filepath.EvalSymlinks(probe.Executable)
	if err != nil {
		return Interpreter{}, fmt.Errorf("resolving python executable %s of %s: %w", probe.Executable, cand, err)
	}
	sum, err := fileSHA256(real)
	if err != nil {
		return Interpreter{}, fmt.Errorf("hashing python executable %s: %w", real, err)
	}
	return Interpreter{
		Path:         real,
		Version:      probe.Version,
		Prefix:       filepath.Clean(probe.Prefix),
		Stdlib:       filepath.Clean(probe.Stdlib),
		PlatStdlib:   filepath.Clean(probe.PlatStdlib),
		DynLoad:      filepath.Clean(probe.DynLoad),
		Hash:         sum,
		SitePackages: site,
	}, nil
}

// pythonCandidate turns FindPython's argument into something to execute.
func pythonCandidate(path string) (string, error) {
	if path == "" {
		if _, err := os.Stat(defaultPython); err == nil {
			return defaultPython, nil
		}
		p, err := exec.LookPath("python3")
		if err != nil {
			return "", fmt.Errorf("python interpreter not found: %s does not exist and there is no python3 in PATH", defaultPython)
		}
		return p, nil
	}
	if !strings.Contains(path, "/") {
		p, err := exec.LookPath(path)
		if err != nil {
			return "", fmt.Errorf("python interpreter %s not found: %w", path, err)
		}
		return p, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("python interpreter %s not found: %w", path, err)
		}
		return "", fmt.Errorf("python interpreter %s: %w", path, err)
	}
	if fi.IsDir() {
		return "", fmt.Errorf("python interpreter %s is a directory", path)
	}
	return path, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
