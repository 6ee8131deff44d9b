package rootfs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// testDir holds what tests share, above all the one rootfs built for the
// host's python3; TestMain removes it.
var testDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "rootfs-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	testDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireRoot is the one place that decides whether a test that needs root
// (chroot, setuid to the sandbox's uid) can run. Under CI a missing
// prerequisite fails instead of skipping.
func requireRoot(t *testing.T) {
	t.Helper()
	testenv.Root(t)
}

var host struct {
	once sync.Once
	py   Interpreter
	err  error
}

// hostPython is the interpreter FindPython picks on this host.
func hostPython(t testing.TB) Interpreter {
	t.Helper()
	testenv.Real(t)
	host.once.Do(func() {
		host.py, host.err = FindPython(context.Background(), "")
	})
	if host.err != nil {
		testenv.Missing(t, "no host python3: %v", host.err)
	}
	return host.py
}

var shared struct {
	once    sync.Once
	dir     string
	elapsed time.Duration
	err     error
}

// builtRootfs builds the rootfs of the host's python3 once per test binary.
func builtRootfs(t *testing.T) (Interpreter, string) {
	t.Helper()
	py := hostPython(t)
	shared.once.Do(func() {
		shared.dir = filepath.Join(testDir, "shared-rootfs")
		start := time.Now()
		shared.err = Build(context.Background(), py, Options{}, shared.dir, nil)
		shared.elapsed = time.Since(start)
	})
	if shared.err != nil {
		t.Fatalf("Build(%s): %v", py.Path, shared.err)
	}
	return py, shared.dir
}

// runIn runs PythonPath in root as the sandbox's uid, with the environment
// the sandbox gives, and returns its stdout.
func runIn(t *testing.T, root string, args ...string) string {
	t.Helper()
	cmd := exec.Command(PythonPath, args...)
	cmd.Dir = "/tmp"
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     root,
		Credential: &syscall.Credential{Uid: 65532, Gid: 65532, Groups: []uint32{}},
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("running %s %q chrooted into %s: %v\nstderr:\n%s", PythonPath, args, root, err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("running %s %q chrooted into %s: stderr = %q, want empty", PythonPath, args, root, stderr.String())
	}
	return stdout.String()
}

// probe is what the chroot tests run: the modules whose extension modules
// pull in the most libraries, plus what the skeleton /etc and the locale are for.
const probe = `
import sys, json, sqlite3, ssl, decimal, ctypes, multiprocessing, subprocess
import locale, pwd, grp, socket, os
locale.setlocale(locale.LC_ALL, "")
print(json.dumps({
    "version": ".".join(str(v) for v in sys.version_info[:3]),
    "full_version": sys.version,
    "prefix": sys.prefix,
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "group": grp.getgrgid(os.getgid()).gr_name,
    "localhost": socket.gethostbyname("localhost"),
    "sqlite": sqlite3.connect(":memory:").execute("select 1+1").fetchone()[0],
    "ssl": ssl.OPENSSL_VERSION,
    "decimal": str(decimal.Decimal(1) / decimal.Decimal(8)),
    "encoding": sys.stdout.encoding,
}))
`

type probeResult struct {
	Version     string `json:"version"`
	FullVersion string `json:"full_version"`
	Prefix      string `json:"prefix"`
	User        string `json:"user"`
	Group       string `json:"group"`
	Localhost   string `json:"localhost"`
	SQLite      int    `json:"sqlite"`
	SSL         string `json:"ssl"`
	Decimal     string `json:"decimal"`
	Encoding    string `json:"encoding"`
}

func checkProbe(t *testing.T, py Interpreter, root string) {
	t.Helper()
	out := runIn(t, root, "-c", probe)
	var got probeResult
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output %q: %v", out, err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"version", got.Version, py.Version},
		{"sys.prefix", got.Prefix, py.Prefix},
		{"user", got.User, "sandbox"},
		{"group", got.Group, "sandbox"},
		{"localhost", got.Localhost, "127.0.0.1"},
		{"decimal", got.Decimal, "0.125"},
		{"stdout encoding", got.Encoding, "utf-8"},
	} {
		if c.got != c.want {
			t.Errorf("python in the rootfs of %s: %s = %q, want %q", py.Path, c.name, c.got, c.want)
		}
	}
	if got.SQLite != 2 {
		t.Errorf("python in the rootfs of %s: sqlite select 1+1 = %d, want 2", py.Path, got.SQLite)
	}
	t.Logf("python %s in %s (%s)", got.FullVersion, root, got.SSL)
}

func TestBuildRunsChrooted(t *testing.T) {
	requireRoot(t)
	py, root := builtRootfs(t)
	checkProbe(t, py, root)
}

// A pyenv interpreter lives under /root (0700 on the host), links libpython
// through an absolute DT_RUNPATH, and is reached through a bash shim.
func TestBuildPyenvChrooted(t *testing.T) {
	requireRoot(t)
	shim := pyenvShim(t)
	py, err := FindPython(context.Background(), shim)
	if err != nil {
		t.Fatalf("FindPython(%s): %v", shim, err)
	}
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := Build(context.Background(), py, Options{}, root, nil); err != nil {
		t.Fatalf("Build(%s): %v", py.Path, err)
	}
	checkProbe(t, py, root)
}

// checkLayout checks what every rootfs must be: owned by root (when built
// as root), every link leading somewhere inside, dirs 0755 (/tmp 1777),
// files world-readable, neither setuid, setgid nor group- or world-writable, nothing
// else. It returns the number and size of the regular files.
func checkLayout(t *testing.T, root string) (files int, size int64) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if os.Geteuid() == 0 && (st.Uid != 0 || st.Gid != 0) {
			t.Errorf("%s: owner %d:%d, want 0:0", rel, st.Uid, st.Gid)
		}
		mode := fi.Mode()
		switch {
		case mode&fs.ModeSymlink != 0:
			// Every link must lead somewhere inside the rootfs.
			if _, err := resolveIn(root, rel); err != nil {
				t.Errorf("%s: dangling symlink: %v", rel, err)
			}
		case mode.IsDir():
			want := fs.ModeDir | 0o755
			if rel == "/tmp" {
				want = fs.ModeDir | fs.ModeSticky | 0o777
			}
			if mode != want {
				t.Errorf("%s: mode %v, want %v", rel, mode, want)
			}
		case mode.IsRegular():
			files++
			size += fi.Size()
			if mode&(fs.ModeSetuid|fs.ModeSetgid) != 0 || mode&0o022 != 0 || mode&0o004 == 0 {
				t.Errorf("%s: mode %v, want no setuid/setgid, not group- or world-writable, world-readable", rel, mode)
			}
			if mode&0o100 != 0 && mode&0o001 == 0 {
				t.Errorf("%s: mode %v, executable but not by others", rel, mode)
			}
		default:
			t.Errorf("%s: unexpected file type %v", rel, mode.Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files, size
}

func TestBuildLayout(t *testing.T) {
	py, root := builtRootfs(t)
	files, size := checkLayout(t, root)
	t.Logf("rootfs of %s: %d files, %.1f MB, built in %v", py.Path, files, float64(size)/1e6, shared.elapsed)

	for _, mp := range MountPoints() {
		entries, err := os.ReadDir(filepath.Join(root, mp))
		if err != nil || len(entries) != 0 {
			t.Errorf("mount point %s: entries %d, err %v; want an empty dir", mp, len(entries), err)
		}
	}
	if mp := PackagesDirMountPoint(py); mp == "" {
		t.Errorf("PackagesDirMountPoint(%s) = \"\", want the first of %q", py.Path, py.SitePackages)
	} else if entries, err := os.ReadDir(filepath.Join(root, mp)); err != nil || len(entries) != 0 {
		t.Errorf("packages dir mount point %s: entries %d, err %v; want an empty dir", mp, len(entries), err)
	}
	if _, err := os.Lstat(filepath.Join(root, "sys")); err == nil {
		t.Errorf("/sys exists; want none (it is not mounted)")
	}

	etc, err := os.ReadDir(filepath.Join(root, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range etc {
		names = append(names, e.Name())
	}
	if got, want := strings.Join(names, " "), "group hostname hosts nsswitch.conf passwd"; got != want {
		t.Errorf("/etc holds %q, want %q", got, want)
	}
	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	if !strings.Contains(string(passwd), "sandbox:x:65532:65532:sandbox:/tmp:/sbin/nologin\n") {
		t.Errorf("/etc/passwd = %q, want the sandbox user 65532", passwd)
	}

	exe, err := resolveIn(root, PythonPath)
	if err != nil || exe != filepath.Join(root, py.Path) {
		t.Errorf("%s resolves to %q (err %v), want %s", PythonPath, exe, err, filepath.Join(root, py.Path))
	}

	for _, rel := range []string{"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3/tests", "site-packages", "dist-packages"} {
		if _, err := os.Lstat(filepath.Join(root, py.Stdlib, rel)); err == nil {
			t.Errorf("%s/%s is in the rootfs; want it excluded", py.Stdlib, rel)
		}
	}
	for _, rel := range []string{"os.py", "json/__init__.py", "sqlite3/__init__.py", "__pycache__"} {
		if _, err := os.Lstat(filepath.Join(root, py.Stdlib, rel)); err != nil {
			t.Errorf("%s/%s is missing from the rootfs: %v", py.Stdlib, rel, err)
		}
	}
	dynload, err := os.ReadDir(filepath.Join(root, py.DynLoad))
	if err != nil || len(dynload) == 0 {
		t.Errorf("%s in the rootfs: %d entries, err %v; want the extension modules", py.DynLoad, len(dynload), err)
	}

	// A .pyc is valid only for a source of the same mtime.
	hostFI, err := os.Stat(filepath.Join(py.Stdlib, "os.py"))
	if err != nil {
		t.Fatal(err)
	}
	copyFI, err := os.Stat(filepath.Join(root, py.Stdlib, "os.py"))
	if err != nil {
		t.Fatal(err)
	}
	if !copyFI.ModTime().Equal(hostFI.ModTime()) {
		t.Errorf("os.py mtime = %v, want the host's %v (else every .pyc is stale)", copyFI.ModTime(), hostFI.ModTime())
	}
}

// Python must find its compiled modules valid, or it recompiles every one
// at every start, unable to cache them on a read-only root.
func TestBuildPycUsed(t *testing.T) {
	requireRoot(t)
	_, root := builtRootfs(t)
	cmd := exec.Command(PythonPath, "-v", "-c", "import json")
	cmd.Env = []string{"PATH=/usr/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Chroot:     root,
		Credential: &syscall.Credential{Uid: 65532, Gid: 65532, Groups: []uint32{}},
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python -v -c 'import json': %v\n%s", err, out)
	}
	if !bytes.Contains(out, []byte("code object from")) || bytes.Contains(out, []byte("bad mtime")) {
		t.Errorf("python -v -c 'import json': want modules loaded from valid .pyc files; got\n%s", out)
	}
}

func TestCheck(t *testing.T) {
	_, built := builtRootfs(t)

	empty := t.TempDir()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name    string
		dir     string
		wantErr []string // substrings; nil means no error
	}{
		{"built", built, nil},
		{"empty dir", empty, []string{PythonPath, "/proc", "/dev", "/tmp", "/code", "/etc/passwd"}},
		{"missing", filepath.Join(empty, "nope"), []string{"nope", "no such file"}},
		{"file", file, []string{"not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := Check(tt.dir)
			if tt.wantErr == nil {
				if err != nil {
					t.Errorf("Check(%s) = %v, want nil", tt.dir, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Check(%s) = nil, want an error naming %q", tt.dir, tt.wantErr)
			}
			for _, s := range tt.wantErr {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Check(%s) = %q, want it to name %q", tt.dir, err, s)
				}
			}
		})
	}
}

// A rootfs with a mount below it is refused: the runtime binds the root
// recursively and makes only its top read-only, so the mount would come
// into the sandbox writable.
func TestCheckRefusesMountsBelow(t *testing.T) {
	testenv.Root(t)
	_, built := builtRootfs(t)
	sub := filepath.Join(built, "usr", "mcp-exec-mount-test")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(sub)
	if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(sub, syscall.MNT_DETACH)
	err := Check(built)
	if err == nil || !strings.Contains(err.Error(), "mounts below it") || !strings.Contains(err.Error(), sub) {
		t.Errorf("Check of a rootfs with a mount at %s = %v, want a refusal naming it", sub, err)
	}
}

// A mount point that is a symlink could send the runtime's mount out of the
// rootfs; Check must refuse it.
func TestCheckRejectsSymlinkedMountPoint(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"usr/bin", "etc", "proc", "dev", "code", ".mcp-exec", "elsewhere"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/python3.99"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("python3.99", filepath.Join(root, "usr/bin/python3")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/passwd"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/elsewhere", filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	err := Check(root)
	if err == nil || !strings.Contains(err.Error(), "mount point /tmp is not a directory") {
		t.Errorf("Check(rootfs with /tmp -> /elsewhere) = %v, want an error about /tmp", err)
	}
	if err := os.Remove(filepath.Join(root, "tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Check(root); err != nil {
		t.Errorf("Check(minimal rootfs) = %v, want nil", err)
	}
}

func TestMountPoints(t *testing.T) {
	got := MountPoints()
	if want := "/proc /dev /tmp /code /.mcp-exec"; strings.Join(got, " ") != want {
		t.Errorf("MountPoints() = %q, want %q", got, want)
	}
	got[0] = "/changed"
	if MountPoints()[0] != "/proc" {
		t.Errorf("MountPoints() returns a shared slice; a caller changed it for all")
	}
}

func TestDefaultCacheDir(t *testing.T) {
	if os.Geteuid() == 0 {
		if got, want := DefaultCacheDir(), "/var/cache/mcp-exec/rootfs"; got != want {
			t.Errorf("DefaultCacheDir() as root = %q, want %q", got, want)
		}
		return
	}
	t.Setenv("XDG_CACHE_HOME", "/x/cache")
	if got, want := DefaultCacheDir(), "/x/cache/mcp-exec/rootfs"; got != want {
		t.Errorf("DefaultCacheDir() with XDG_CACHE_HOME=/x/cache = %q, want %q", got, want)
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"lib":          "usr/lib",
		"usr/lib/abs":  "/usr/lib",
		"usr/lib/up":   "../../../../..",
		"usr/lib/loop": "loop",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		path, want string
		wantErr    bool
	}{
		{"/lib", "/usr/lib", false},
		{"/lib/abs/abs", "/usr/lib", false},
		// ".." stops at the root, as in a chroot.
		{"/lib/up/usr", "/usr", false},
		{"/lib/loop", "", true},
		{"/nope", "", true},
	}
	for _, tt := range tests {
		got, err := resolveIn(root, tt.path)
		if tt.wantErr {
			if err == nil {
				t.Errorf("resolveIn(root, %s) = %s, want an error", tt.path, got)
			}
			continue
		}
		if want := filepath.Join(root, tt.want); err != nil || got != want {
			t.Errorf("resolveIn(root, %s) = %q, %v; want %q", tt.path, got, err, want)
		}
	}
}
