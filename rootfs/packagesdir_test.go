package rootfs

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// wheelDir lays out what pip install --target makes of a manylinux wheel:
// good/_ext.so needs libdep.so from good.libs/ through its
// $ORIGIN/../good.libs RUNPATH, and libdep.so needs libc only. bad/ has
// the same module, whose good.libs is a link out of the dir.
func wheelDir(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.Missing(t, "no C compiler (cc) to build test objects: %v", err)
	}
	dir := publicTempDir(t)
	src := t.TempDir()
	for _, d := range []string{"good", "good.libs", "sub/bad"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, s := range map[string]string{
		"dep.c": "#include <stdlib.h>\nint dep(void) { return rand(); }\n",
		"ext.c": "int dep(void);\nint ext(void) { return dep(); }\n",
	} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cc1 := func(args ...string) {
		t.Helper()
		cmd := exec.Command(cc, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cc %q: %v\n%s", args, err, out)
		}
	}
	cc1("-shared", "-fPIC", "-o", "good.libs/libdep.so", filepath.Join(src, "dep.c"))
	cc1("-shared", "-fPIC", "-o", "good/_ext.cpython-311-x86_64-linux-gnu.so", filepath.Join(src, "ext.c"),
		"-Lgood.libs", "-ldep", "-Wl,--enable-new-dtags", "-Wl,-rpath,$ORIGIN/../good.libs")
	if err := os.WriteFile(filepath.Join(dir, "good/__init__.py"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// publicTempDir is a temp dir the sandbox's user could read, as a packages
// dir must be: t.TempDir makes its dirs 0700.
func publicTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// A packages dir the sandbox's user cannot read (a 0700 dir, a 0600 file)
// is refused, naming {PackagesDir} and the fix: it would otherwise
// be silently missing from every sandbox.
func TestCheckPackagesDirUnreadable(t *testing.T) {
	dir := publicTempDir(t)
	for _, tc := range []struct {
		name string
		prep func(p string) error
		want string
	}{
		{"private dir", func(p string) error { return os.Mkdir(p, 0o700) }, "mode -rwx------"},
		{"private file", func(p string) error {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(p, "m.py"), nil, 0o600)
		}, "m.py (mode -rw-------)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
			if err := tc.prep(p); err != nil {
				t.Fatal(err)
			}
			os.Chmod(p, map[bool]os.FileMode{true: 0o700, false: 0o755}[tc.name == "private dir"])
			err := CheckPackagesDir(p, t.TempDir())
			if err == nil || !strings.Contains(err.Error(), "{PackagesDir}") || !strings.Contains(err.Error(), tc.want) ||
				!strings.Contains(err.Error(), "chmod -R o+rX") {
				t.Errorf("CheckPackagesDir(%s) = %v, want a refusal naming {PackagesDir}, %q and the fix", tc.name, err, tc.want)
			}
		})
	}
}

func TestCheckPackagesDir(t *testing.T) {
	_, root := builtRootfs(t)
	dir := wheelDir(t)
	if err := CheckPackagesDir(dir, root); err != nil {
		t.Errorf("CheckPackagesDir(a wheel with its libs) = %v, want nil", err)
	}

	// The same extension module where its libs are behind a link out of
	// the dir: not followed, as the sandbox would not.
	data, err := os.ReadFile(filepath.Join(dir, "good/_ext.cpython-311-x86_64-linux-gnu.so"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "sub/bad/_ext.so"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	copyTestFile(t, filepath.Join(dir, "good.libs/libdep.so"), filepath.Join(outside, "libdep.so"), 0o644)
	if err := os.Symlink(outside, filepath.Join(dir, "sub/good.libs")); err != nil {
		t.Fatal(err)
	}
	// And one of another machine.
	machineMismatch(t, filepath.Join(dir, "good.libs/libdep.so"), filepath.Join(dir, "other.so"))

	err = CheckPackagesDir(dir, root)
	if err == nil {
		t.Fatalf("CheckPackagesDir(a dir with a module missing its library) = nil, want an error")
	}
	t.Logf("CheckPackagesDir: %v", err)
	for _, want := range []string{"{PackagesDir}: ", "sub/bad/_ext.so needs libdep.so", "other.so is a "} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckPackagesDir(...) = %q, want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), " good/") {
		t.Errorf("CheckPackagesDir(...) = %q, names the module that can be loaded", err)
	}

	// Only the rootfs's libraries count, not the host's.
	if err := CheckPackagesDir(dir, t.TempDir()); err == nil || !strings.Contains(err.Error(), "good.libs/libdep.so needs libc.so.6") {
		t.Errorf("CheckPackagesDir(against an empty rootfs) = %v, want libc.so.6 missing", err)
	}
	if err := CheckPackagesDir(filepath.Join(dir, "nope"), root); err == nil || !strings.Contains(err.Error(), "{PackagesDir}") {
		t.Errorf("CheckPackagesDir(a missing dir) = %v, want an error naming {PackagesDir}", err)
	}
}
