package rootfs

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

func depNames(deps []dependency) []string {
	var names []string
	for _, d := range deps {
		names = append(names, d.name)
	}
	return names
}

func hostResolver(t *testing.T) *resolver {
	t.Helper()
	r, err := newResolver(nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestClosureHostPython(t *testing.T) {
	py := hostPython(t)
	obj, err := readELF(py.Path)
	if err != nil {
		t.Fatal(err)
	}
	if obj.interp == "" {
		t.Fatalf("readELF(%s): no PT_INTERP", py.Path)
	}
	deps, err := hostResolver(t).closure(py.Path, nil)
	if err != nil {
		t.Fatalf("closure(%s): %v", py.Path, err)
	}
	names := depNames(deps)
	for _, want := range []string{"libc.so.6", obj.interp} {
		if !slices.Contains(names, want) {
			t.Errorf("closure(%s) = %q, want it to include %s", py.Path, names, want)
		}
	}
	for _, d := range deps {
		if d.kind != obj.kind {
			t.Errorf("closure(%s): %s is %v, want %v", py.Path, d.path, d.kind, obj.kind)
		}
	}
}

func TestClosureSSLModule(t *testing.T) {
	py := hostPython(t)
	mods, _ := filepath.Glob(filepath.Join(py.DynLoad, "_ssl*.so"))
	if len(mods) != 1 {
		testenv.Missing(t, "no single _ssl module in %s: %q", py.DynLoad, mods)
	}
	deps, err := hostResolver(t).closure(py.Path, mods)
	if err != nil {
		t.Fatalf("closure(%s, %s): %v", py.Path, mods[0], err)
	}
	for _, want := range []string{"libssl.so", "libcrypto.so"} {
		found := false
		for _, d := range deps {
			found = found || strings.HasPrefix(d.name, want)
		}
		if !found {
			t.Errorf("closure(%s, %s) = %q, want a %s*", py.Path, mods[0], depNames(deps), want)
		}
	}
}

// buildTree compiles bin/prog needing lib/libfoo.so, which needs
// other/libbar.so; prog finds libfoo through $ORIGIN/../lib and carries
// $ORIGIN/../other too, as a DT_RPATH or a DT_RUNPATH.
func buildTree(t *testing.T, dtags string) string {
	t.Helper()
	cc, err := exec.LookPath("cc")
	if err != nil {
		testenv.Missing(t, "no C compiler (cc) to build test objects: %v", err)
	}
	dir := t.TempDir()
	for _, d := range []string{"bin", "lib", "other", "src"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	src := map[string]string{
		"bar.c":  "int bar(void) { return 1; }\n",
		"foo.c":  "int bar(void);\nint foo(void) { return bar(); }\n",
		"prog.c": "int foo(void);\nint main(void) { return foo(); }\n",
	}
	for name, s := range src {
		if err := os.WriteFile(filepath.Join(dir, "src", name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command(cc, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("cc %q: %v\n%s", args, err, out)
		}
	}
	run("-shared", "-fPIC", "-o", "other/libbar.so", "src/bar.c")
	run("-shared", "-fPIC", "-o", "lib/libfoo.so", "src/foo.c", "-Lother", "-lbar")
	run("-o", "bin/prog", "src/prog.c", "-Llib", "-lfoo", "-Wl,-rpath-link,other",
		"-Wl,"+dtags, "-Wl,-rpath,$ORIGIN/../lib:$ORIGIN/../other")
	return dir
}

func TestClosureOrigin(t *testing.T) {
	t.Run("RPATH", func(t *testing.T) {
		dir := buildTree(t, "--disable-new-dtags")
		prog := filepath.Join(dir, "bin/prog")
		deps, err := hostResolver(t).closure(prog, nil)
		if err != nil {
			t.Fatalf("closure(prog with DT_RPATH): %v", err)
		}
		paths := map[string]string{}
		for _, d := range deps {
			paths[d.name] = d.path
		}
		// $ORIGIN is prog's dir; libbar is found through prog's RPATH,
		// which the loader also searches for libfoo's deps.
		for name, want := range map[string]string{
			"libfoo.so": filepath.Join(dir, "lib/libfoo.so"),
			"libbar.so": filepath.Join(dir, "other/libbar.so"),
		} {
			if paths[name] != want {
				t.Errorf("closure(prog with DT_RPATH): %s at %q, want %q", name, paths[name], want)
			}
		}
	})
	t.Run("RUNPATH", func(t *testing.T) {
		dir := buildTree(t, "--enable-new-dtags")
		prog := filepath.Join(dir, "bin/prog")
		// A RUNPATH applies to the object's own deps only: libbar, needed
		// by libfoo, is not found, as the real loader would fail.
		_, err := hostResolver(t).closure(prog, nil)
		if err == nil || !strings.Contains(err.Error(), "library libbar.so needed by "+filepath.Join(dir, "lib/libfoo.so")) {
			t.Errorf("closure(prog with DT_RUNPATH) = %v, want an error naming libbar.so and libfoo.so", err)
		}
	})
}

// machineMismatch copies an ELF file and changes its e_machine.
func machineMismatch(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	other := elf.EM_AARCH64
	if f.Machine == elf.EM_AARCH64 {
		other = elf.EM_X86_64
	}
	f.ByteOrder.PutUint16(data[18:20], uint16(other)) // e_machine
	f.Close()
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFindSkipsOtherMachines(t *testing.T) {
	py := hostPython(t)
	r := hostResolver(t)
	obj, err := readELF(py.Path)
	if err != nil {
		t.Fatal(err)
	}
	libc, _, err := r.find("libc.so.6", obj.kind, nil)
	if err != nil {
		t.Fatal(err)
	}
	wrong, notELF := t.TempDir(), t.TempDir()
	machineMismatch(t, libc, filepath.Join(wrong, "libc.so.6"))
	if err := os.WriteFile(filepath.Join(notELF, "libc.so.6"), []byte("GROUP ( libc.so.6 )\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, _, err := r.find("libc.so.6", obj.kind, []string{wrong, notELF})
	if err != nil || got != libc {
		t.Errorf("find(libc.so.6) past a foreign-machine and a non-ELF file = %q, %v; want %s", got, err, libc)
	}
	_, _, err = r.find("libc.so.6", elfKind{obj.kind.class, elf.EM_MIPS}, nil)
	if err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("find(libc.so.6) for a MIPS object = %v, want not found", err)
	}
}

func TestExpandOrigin(t *testing.T) {
	tests := []struct {
		in   []string
		want []string
	}{
		{[]string{"$ORIGIN/../lib"}, []string{"/opt/py/lib"}},
		{[]string{"${ORIGIN}/x", "/abs"}, []string{"/opt/py/bin/x", "/abs"}},
		{[]string{"", "rel", "$LIB/x", "/usr/$PLATFORM"}, nil},
	}
	for _, tt := range tests {
		got := expandOrigin(tt.in, "/opt/py/bin")
		if !slices.Equal(got, tt.want) {
			t.Errorf("expandOrigin(%q, /opt/py/bin) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// ldSoConfTree writes an ld.so.conf with includes into a temp dir.
func ldSoConfTree(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"ld.so.conf":     "# comment\ninclude conf.d/*.conf\n/opt/first # trailing\n",
		"conf.d/a.conf":  "/a/one:/a/two, /a/three\nhwcap 0 nosegneg\n",
		"conf.d/b.conf":  "/b=libc6\nrelative/ignored\ninclude " + filepath.Join(dir, "more.conf") + "\n",
		"conf.d/c.notit": "/not/included\n",
		"more.conf":      "/more\n",
	}
	for name, s := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestReadLdSoConf(t *testing.T) {
	dir := ldSoConfTree(t)
	got, err := readLdSoConf(filepath.Join(dir, "ld.so.conf"), 0, nil)
	want := []string{"/a/one", "/a/two", "/a/three", "/b", "/more", "/opt/first"}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("readLdSoConf = %q, %v; want %q", got, err, want)
	}
	if got, err := readLdSoConf(filepath.Join(dir, "absent"), 0, nil); err != nil || got != nil {
		t.Errorf("readLdSoConf(absent) = %q, %v; want nothing, no error", got, err)
	}
}

// A library the host's loader finds only through ld.so.cache (a dir listed in
// /etc/ld.so.conf, not a default one) must get a name the loader finds in a
// rootfs that has no cache.
func TestAliasForConfDirs(t *testing.T) {
	py := hostPython(t)
	obj, err := readELF(py.Path)
	if err != nil {
		t.Fatal(err)
	}
	host := hostResolver(t)
	libc, _, err := host.find("libc.so.6", obj.kind, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Not under /tmp: the builder refuses paths below mount points.
	conf, err := os.MkdirTemp("/var/tmp", "rootfs-conf-")
	if err != nil {
		testenv.Missing(t, "no writable /var/tmp: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(conf) })
	data, err := os.ReadFile(libc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(conf, "libc.so.6"), data, 0o755); err != nil {
		t.Fatal(err)
	}

	r := &resolver{confDirs: []string{conf}, isELF: map[string]elfKind{}}
	deps, err := r.closure(py.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	var dep dependency
	for _, d := range deps {
		if d.name == "libc.so.6" {
			dep = d
		}
	}
	if dep.path != filepath.Join(conf, "libc.so.6") || !dep.viaConf {
		t.Fatalf("closure with ld.so.conf dir %s: libc.so.6 = %+v, want it from there, viaConf", conf, dep)
	}

	root := t.TempDir()
	b := &builder{ctx: context.Background(), root: root, made: map[string]bool{"/": true}}
	if _, err := b.place(dep.path); err != nil {
		t.Fatal(err)
	}
	if err := b.alias(dep); err != nil {
		t.Fatal(err)
	}
	if err := b.copyFiles(); err != nil {
		t.Fatal(err)
	}
	var first string
	for _, d := range defaultDirs(obj.kind) {
		if _, err := os.Stat(d); err == nil {
			first = d
			break
		}
	}
	link := filepath.Join(first, "libc.so.6")
	if got, err := resolveIn(root, link); err != nil || got != filepath.Join(root, dep.path) {
		t.Errorf("%s in the rootfs resolves to %q (err %v), want %s", link, got, err, filepath.Join(root, dep.path))
	}
}

// What the resolver answers depends on the ld.so.conf files and on every path
// it looked at, found or not; the manifest must notice when any of them
// changes.
func TestResolverRecordsWhatItRead(t *testing.T) {
	t.Run("ld.so.conf", func(t *testing.T) {
		tests := []struct {
			name, want string
			change     func(dir string) error
		}{
			{"included file edited", "more.conf: size", func(dir string) error {
				return os.WriteFile(filepath.Join(dir, "more.conf"), []byte("/more\n/evenmore\n"), 0o644)
			}},
			{"file added to an include dir", "conf.d: mtime", func(dir string) error {
				return os.WriteFile(filepath.Join(dir, "conf.d/d.conf"), []byte("/d\n"), 0o644)
			}},
		}
		for _, tt := range tests {
			dir := ldSoConfTree(t)
			// An old mtime, so that any change moves it, however
			// coarse the filesystem's clock.
			old := time.Now().Add(-time.Hour)
			if err := os.Chtimes(filepath.Join(dir, "conf.d"), old, old); err != nil {
				t.Fatal(err)
			}
			src := newSources()
			if _, err := readLdSoConf(filepath.Join(dir, "ld.so.conf"), 0, src); err != nil {
				t.Fatal(err)
			}
			m := src.manifest()
			if why := m.changed(); why != "" {
				t.Fatalf("%s: manifest of ld.so.conf, nothing changed: changed() = %q, want \"\"", tt.name, why)
			}
			if err := tt.change(dir); err != nil {
				t.Fatal(err)
			}
			if why := m.changed(); !strings.Contains(why, tt.want) {
				t.Errorf("%s: changed() = %q, want it to say %q", tt.name, why, tt.want)
			}
		}
	})

	t.Run("library earlier in the search order", func(t *testing.T) {
		dir := buildTree(t, "--disable-new-dtags")
		src := newSources()
		r := &resolver{isELF: map[string]elfKind{}, src: src}
		if _, err := r.closure(filepath.Join(dir, "bin/prog"), nil); err != nil {
			t.Fatal(err)
		}
		m := src.manifest()
		if why := m.changed(); why != "" {
			t.Fatalf("manifest of a closure, nothing changed: changed() = %q, want \"\"", why)
		}
		// prog's DT_RPATH lists lib before other: a libbar there is the
		// one the loader would now take.
		data, err := os.ReadFile(filepath.Join(dir, "other/libbar.so"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "lib/libbar.so"), data, 0o755); err != nil {
			t.Fatal(err)
		}
		want := filepath.Join(dir, "lib/libbar.so") + ": appeared"
		if why := m.changed(); why != want {
			t.Errorf("after adding lib/libbar.so: changed() = %q, want %q", why, want)
		}
	})
}
