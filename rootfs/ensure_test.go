package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// countingBuild is build, counted.
func countingBuild(n *atomic.Int32) buildFunc {
	return func(ctx context.Context, py Interpreter, opts Options, out, manifestPath string, validate func(context.Context, string) error) error {
		n.Add(1)
		return build(ctx, py, opts, out, manifestPath, validate)
	}
}

// mkdirBuild builds an empty dir with an empty manifest: a rootfs that is
// never stale, and not one Check accepts.
func mkdirBuild(_ context.Context, _ Interpreter, _ Options, out, manifestPath string, _ func(context.Context, string) error) error {
	if err := writeManifest(manifestPath, &manifest{Format: manifestFormat}); err != nil {
		return err
	}
	return os.Mkdir(out, 0o755)
}

// release drops this process's hold on generation dir, as its exit would.
func release(dir string) {
	held.Lock()
	defer held.Unlock()
	for id, h := range held.files {
		if h.dir == dir {
			h.f.Close()
			delete(held.files, id)
		}
	}
}

// dirNames lists dir, but for the about files of its entries (entries.go),
// which must be there only beside their entry.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		if entry, ok := strings.CutSuffix(e.Name(), aboutSuffix); ok {
			if _, err := os.Lstat(filepath.Join(dir, entry)); err != nil {
				t.Errorf("%s is there without its entry", e.Name())
			}
			continue
		}
		names = append(names, e.Name())
	}
	return names
}

func TestEnsureBuildsOnce(t *testing.T) {
	py := hostPython(t)
	cache := filepath.Join(t.TempDir(), "a", "cache")
	var builds atomic.Int32
	build := countingBuild(&builds)

	// Each goroutine opens the lock file anew, as separate processes do.
	const n = 4
	dirs := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dirs[i], errs[i] = ensure(context.Background(), py, Options{}, cache, nil, build)
		}()
	}
	wg.Wait()
	want := filepath.Join(cache, py.Key()+".1")
	for i := range n {
		if errs[i] != nil || dirs[i] != want {
			t.Errorf("concurrent Ensure #%d = %q, %v; want %s", i, dirs[i], errs[i], want)
		}
	}
	if got := builds.Load(); got != 1 {
		t.Errorf("%d concurrent Ensure calls built %d times, want 1", n, got)
	}
	if fi, err := os.Stat(cache); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("cache dir %s: mode %v (err %v), want 0755", cache, fi.Mode().Perm(), err)
	}

	before, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ensure(context.Background(), py, Options{}, cache, nil, build)
	if err != nil || got != want {
		t.Fatalf("second Ensure = %q, %v; want %s", got, err, want)
	}
	after, err := os.Stat(want)
	if err != nil {
		t.Fatal(err)
	}
	if builds.Load() != 1 || !os.SameFile(before, after) || !after.ModTime().Equal(before.ModTime()) {
		t.Errorf("second Ensure rebuilt (builds %d, same dir %v)", builds.Load(), os.SameFile(before, after))
	}
	key := py.Key()
	if got, want := strings.Join(dirNames(t, cache), " "), ".lock "+key+" "+key+".1 "+key+".1"+contentsSuffix+" "+key+".1.manifest"; got != want {
		t.Errorf("cache dir holds %q, want %q", got, want)
	}
	if target, err := os.Readlink(filepath.Join(cache, key)); err != nil || target != key+".1" {
		t.Errorf("cache link %s -> %q (err %v), want %s", key, target, err, key+".1")
	}
	if fi, err := os.Stat(want + manifestSuffix); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("manifest %s: mode %v (err %v), want 0600", want+manifestSuffix, fi.Mode().Perm(), err)
	}
	// The manifest is next to the rootfs, not in it: the sandbox sees
	// what a plain Build makes, and nothing more.
	_, plain := builtRootfs(t)
	if got, want := strings.Join(dirNames(t, want), " "), strings.Join(dirNames(t, plain), " "); got != want {
		t.Errorf("cached rootfs holds %q at its root, want what Build makes: %q", got, want)
	}
}

func TestBuildFailingValidateLeavesNothing(t *testing.T) {
	py := hostPython(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "rootfs")
	errInvalid := errors.New("python did not start")
	var validated string
	err := Build(context.Background(), py, Options{}, out, func(ctx context.Context, dir string) error {
		validated = dir
		if err := Check(dir); err != nil {
			t.Errorf("validate got an incomplete rootfs: %v", err)
		}
		return errInvalid
	})
	if !errors.Is(err, errInvalid) {
		t.Errorf("Build with a failing validate = %v, want it to wrap %v", err, errInvalid)
	}
	if filepath.Dir(validated) != parent {
		t.Errorf("validate ran on %s, want a dir next to %s", validated, out)
	}
	if names := dirNames(t, parent); len(names) != 0 {
		t.Errorf("after a failed Build, %s holds %q; want nothing", parent, names)
	}

	cache := t.TempDir()
	_, err = Ensure(context.Background(), py, Options{}, cache, func(context.Context, string) error { return errInvalid })
	if !errors.Is(err, errInvalid) {
		t.Errorf("Ensure with a failing validate = %v, want it to wrap %v", err, errInvalid)
	}
	if got := strings.Join(dirNames(t, cache), " "); got != ".lock" {
		t.Errorf("after a failed Ensure, the cache holds %q, want only .lock", got)
	}
}

func TestBuildRefusesExistingOut(t *testing.T) {
	py := hostPython(t)
	out := t.TempDir()
	err := Build(context.Background(), py, Options{}, out, nil)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Build into existing %s = %v, want an 'already exists' error", out, err)
	}
}

func TestBuildCancelled(t *testing.T) {
	py := hostPython(t)
	parent := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Build(ctx, py, Options{}, filepath.Join(parent, "rootfs"), nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Build with a cancelled context = %v, want context.Canceled", err)
	}
	if names := dirNames(t, parent); len(names) != 0 {
		t.Errorf("after a cancelled Build, %s holds %q; want nothing", parent, names)
	}
}

func TestEnsureRemovesLeftovers(t *testing.T) {
	py := Interpreter{Path: "/usr/bin/python3.99", Version: "3.99.0", Hash: "x"}
	cache := t.TempDir()
	leftover := filepath.Join(cache, tempPrefix+py.Key()+"-123")
	if err := os.MkdirAll(filepath.Join(leftover, "usr/lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	var sawLeftover bool
	fake := func(ctx context.Context, py Interpreter, opts Options, out, manifestPath string, validate func(context.Context, string) error) error {
		_, err := os.Lstat(leftover)
		sawLeftover = err == nil
		return mkdirBuild(ctx, py, opts, out, manifestPath, validate)
	}
	if _, err := ensure(context.Background(), py, Options{}, cache, nil, fake); err != nil {
		t.Fatal(err)
	}
	if sawLeftover {
		t.Errorf("Ensure built with the leftover %s still there", leftover)
	}
	if _, err := os.Lstat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover %s: %v, want it removed", leftover, err)
	}
}

func TestEnsureWaitsForLockWithContext(t *testing.T) {
	py := Interpreter{Path: "/usr/bin/python3.99", Version: "3.99.0", Hash: "x"}
	cache := t.TempDir()
	unlock, err := generations(cache).lock(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*lockPoll)
	defer cancel()
	built := false
	fake := func(context.Context, Interpreter, Options, string, string, func(context.Context, string) error) error {
		built = true
		return errors.New("built")
	}
	_, err = ensure(ctx, py, Options{}, cache, nil, fake)
	if !errors.Is(err, context.DeadlineExceeded) || built {
		t.Errorf("Ensure while another holds the lock = %v (built %v), want context.DeadlineExceeded, no build", err, built)
	}

	// Once the holder is done, a waiting Ensure proceeds.
	done := make(chan error, 1)
	go func() {
		_, err := ensure(context.Background(), py, Options{}, cache, nil, mkdirBuild)
		done <- err
	}()
	// Give it a poll or so to start waiting. Should it not have begun by
	// the unlock, it takes a free lock, and the test still holds.
	time.Sleep(lockPoll)
	unlock()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Ensure after the lock was released: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Ensure still waiting 10s after the lock was released")
	}
}

func TestEnsureReportsBrokenCache(t *testing.T) {
	py := Interpreter{Path: "/usr/bin/python3.99", Version: "3.99.0", Hash: "x"}
	key := py.Key()
	tests := []struct {
		name  string
		setup func(cache string) error
	}{
		// A generation that Check refuses, and whose host files did not
		// change: someone changed it.
		{"broken generation", func(cache string) error {
			_, err := ensure(context.Background(), py, Options{}, cache, nil, mkdirBuild)
			return err
		}},
		{"not a link", func(cache string) error {
			return os.Mkdir(filepath.Join(cache, key), 0o755)
		}},
		{"link elsewhere", func(cache string) error {
			return os.Symlink("/usr", filepath.Join(cache, key))
		}},
	}
	for _, tt := range tests {
		cache := t.TempDir()
		if err := tt.setup(cache); err != nil {
			t.Fatal(err)
		}
		_, err := Ensure(context.Background(), py, Options{}, cache, nil)
		if err == nil || !strings.Contains(err.Error(), "remove "+filepath.Join(cache, key)) {
			t.Errorf("%s: Ensure over a broken cache = %v, want an error saying what to remove", tt.name, err)
		}
	}
}

// fakeHostPython lays out an interpreter whose "host" files a test may
// change: a copy of the host's executable, a stdlib of two files and a link,
// and a lib-dynload holding a copy of the host's _ssl module (whose libssl
// and libcrypto come from the real host). Not under /tmp: the builder
// refuses paths below mount points.
func fakeHostPython(t *testing.T) Interpreter {
	t.Helper()
	host := hostPython(t)
	mods, _ := filepath.Glob(filepath.Join(host.DynLoad, "_ssl*.so"))
	if len(mods) != 1 {
		testenv.Missing(t, "no single _ssl module in %s: %q", host.DynLoad, mods)
	}
	root, err := os.MkdirTemp("/var/tmp", "rootfs-host-")
	if err != nil {
		testenv.Missing(t, "no writable /var/tmp: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	stdlib := filepath.Join(root, "lib/python3")
	py := Interpreter{
		Path:       filepath.Join(root, "bin", filepath.Base(host.Path)),
		Version:    host.Version,
		Prefix:     root,
		Stdlib:     stdlib,
		PlatStdlib: stdlib,
		DynLoad:    filepath.Join(stdlib, "lib-dynload"),
	}
	for _, d := range []string{filepath.Dir(py.Path), py.DynLoad} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyTestFile(t, host.Path, py.Path, 0o755)
	copyTestFile(t, mods[0], filepath.Join(py.DynLoad, filepath.Base(mods[0])), 0o644)
	for name, content := range map[string]string{"os.py": "sep = '/'\n", "other.py": "x = 1\n"} {
		if err := os.WriteFile(filepath.Join(stdlib, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("os.py", filepath.Join(stdlib, "link.py")); err != nil {
		t.Fatal(err)
	}
	if py.Hash, err = fileSHA256(py.Path); err != nil {
		t.Fatal(err)
	}
	agePastClock(t, stdlib, py.DynLoad)
	return py
}

func copyTestFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, mode); err != nil {
		t.Fatal(err)
	}
}

// agePastClock gives dirs an mtime an hour ago, so that adding or removing an
// entry moves it, however coarse the filesystem's clock.
func agePastClock(t *testing.T, dirs ...string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	for _, d := range dirs {
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
	}
}

// A host update that leaves the interpreter alone must still reach the
// sandbox: Ensure builds a new generation when a file the rootfs was built
// from changed, and only then; every generation it handed out stays usable
// for the process it handed it to.
func TestEnsureRebuildsWhenHostChanges(t *testing.T) {
	py := fakeHostPython(t)
	ssl, _ := filepath.Glob(filepath.Join(py.DynLoad, "_ssl*.so"))
	cache := t.TempDir()
	ctx := context.Background()
	var builds atomic.Int32
	build := countingBuild(&builds)
	c := cacheEntry{dir: cache, key: py.Key()}

	first, err := ensure(ctx, py, Options{}, cache, nil, build)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := ensure(ctx, py, Options{}, cache, nil, build); err != nil || again != first || builds.Load() != 1 {
		t.Fatalf("Ensure with nothing changed = %q, %v (builds %d); want %s, 1 build", again, err, builds.Load(), first)
	}

	later := time.Now().Add(time.Hour)
	steps := []struct {
		name   string
		change func(prev string) error
		want   string // what lookup must say is stale
	}{
		{"library touched", func(string) error {
			return os.Chtimes(ssl[0], later, later)
		}, ssl[0] + ": mtime"},
		{"stdlib file rewritten", func(string) error {
			return os.WriteFile(filepath.Join(py.Stdlib, "os.py"), []byte("sep = '\\\\'\n"), 0o644)
		}, filepath.Join(py.Stdlib, "os.py") + ": size"},
		{"module added to lib-dynload", func(string) error {
			return os.WriteFile(filepath.Join(py.DynLoad, "_new.so"), nil, 0o644)
		}, py.DynLoad + ": mtime"},
		// The stdlib dir's mtime is put back, so that only the link
		// tells.
		{"link retargeted", func(string) error {
			p := filepath.Join(py.Stdlib, "link.py")
			fi, err := os.Stat(py.Stdlib)
			if err != nil {
				return err
			}
			if err := os.Remove(p); err != nil {
				return err
			}
			if err := os.Symlink("other.py", p); err != nil {
				return err
			}
			return os.Chtimes(py.Stdlib, fi.ModTime(), fi.ModTime())
		}, filepath.Join(py.Stdlib, "link.py") + ": link target"},
		{"stdlib file removed", func(string) error {
			p := filepath.Join(py.Stdlib, "os.py")
			fi, err := os.Stat(py.Stdlib)
			if err != nil {
				return err
			}
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Chtimes(py.Stdlib, fi.ModTime(), fi.ModTime())
		}, filepath.Join(py.Stdlib, "os.py") + ": vanished"},
		{"manifest removed", func(prev string) error {
			return os.Remove(prev + manifestSuffix)
		}, "manifest"},
	}
	dirs := []string{first}
	for _, st := range steps {
		prev := dirs[len(dirs)-1]
		n := builds.Load()
		if err := st.change(prev); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if dir, why, err := c.lookup(); dir != "" || err != nil || !strings.Contains(why, st.want) {
			t.Errorf("%s: lookup() = %q, %q, %v; want it stale because %q", st.name, dir, why, err, st.want)
		}
		got, err := ensure(ctx, py, Options{}, cache, nil, build)
		if err != nil {
			t.Fatalf("%s: Ensure: %v", st.name, err)
		}
		if got == prev || builds.Load() != n+1 {
			t.Errorf("%s: Ensure = %q (builds %d), want a new generation, not %s", st.name, got, builds.Load()-n, prev)
		}
		if again, err := ensure(ctx, py, Options{}, cache, nil, build); err != nil || again != got || builds.Load() != n+1 {
			t.Errorf("%s: Ensure again = %q, %v (builds %d); want %s, no build", st.name, again, err, builds.Load()-n, got)
		}
		dirs = append(dirs, got)
	}
	// This process still has every generation it was given.
	for _, d := range dirs {
		if err := Check(d); err != nil {
			t.Errorf("a generation handed out earlier is no longer usable: %v", err)
		}
	}

	// Once no process holds them, old generations go at the next Ensure;
	// one another process holds (a shared lock of its own) stays, and so
	// does the one whose manifest was removed: whether it is in use can no
	// longer be told.
	current := dirs[len(dirs)-1]
	other := dirs[1]
	noManifest := dirs[len(dirs)-2]
	om, err := openManifest(other + manifestSuffix)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs[:len(dirs)-1] {
		release(d)
	}
	if got, err := ensure(ctx, py, Options{}, cache, nil, build); err != nil || got != current {
		t.Fatalf("Ensure = %q, %v; want %s", got, err, current)
	}
	key := py.Key()
	names := func(dirs ...string) string {
		want := []string{".lock", key, filepath.Base(noManifest), filepath.Base(noManifest) + contentsSuffix}
		for _, d := range dirs {
			want = append(want, filepath.Base(d), filepath.Base(d)+manifestSuffix, filepath.Base(d)+contentsSuffix)
		}
		slices.Sort(want)
		return strings.Join(want, " ")
	}
	if got, want := strings.Join(dirNames(t, cache), " "), names(other, current); got != want {
		t.Errorf("cache after old generations were released, one still held elsewhere: %q, want %q", got, want)
	}
	if err := Check(other); err != nil {
		t.Errorf("a generation another process holds was removed: %v", err)
	}
	om.f.Close()
	if _, err := ensure(ctx, py, Options{}, cache, nil, build); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(dirNames(t, cache), " "), names(current); got != want {
		t.Errorf("cache once no one holds old generations: %q, want %q", got, want)
	}
	if n := builds.Load(); n != int32(len(dirs)) {
		t.Errorf("%d builds for %d generations", n, len(dirs))
	}
}

func TestRemoveGeneration(t *testing.T) {
	cache := t.TempDir()
	name := "0123456789abcdef.1"
	dir := filepath.Join(cache, name)
	create := func(withManifest bool) {
		t.Helper()
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if withManifest {
			if err := writeManifest(dir+manifestSuffix, &manifest{Format: manifestFormat}); err != nil {
				t.Fatal(err)
			}
		}
	}
	exists := func(p string) bool {
		_, err := os.Lstat(p)
		return err == nil
	}

	// Unheld: removed, and a process that opened the manifest just before
	// must not take it once it gets its lock.
	create(true)
	early, err := os.Open(dir + manifestSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := generations(cache).remove(name); err != nil {
		t.Fatal(err)
	}
	if exists(dir) || exists(dir+manifestSuffix) {
		t.Errorf("removeGeneration left %s or its manifest", dir)
	}
	if fi, err := early.Stat(); err != nil || fi.Sys().(*syscall.Stat_t).Nlink != 0 {
		t.Errorf("manifest opened before removal: still linked (err %v)", err)
	}
	early.Close()
	if _, err := openManifest(dir + manifestSuffix); err == nil {
		t.Errorf("openManifest of a removed generation = nil error, want one")
	}

	// Held with a shared lock: kept.
	create(true)
	om, err := openManifest(dir + manifestSuffix)
	if err != nil {
		t.Fatal(err)
	}
	if err := generations(cache).remove(name); err != nil {
		t.Fatal(err)
	}
	if !exists(dir) || !exists(dir+manifestSuffix) {
		t.Errorf("removeGeneration removed a generation held with a shared lock")
	}
	om.f.Close()
	if err := generations(cache).remove(name); err != nil || exists(dir) {
		t.Errorf("removeGeneration once released = %v (dir still there: %v), want it removed", err, exists(dir))
	}

	// Without a manifest: left alone.
	create(false)
	if err := generations(cache).remove(name); err != nil || !exists(dir) {
		t.Errorf("removeGeneration of a generation without manifest = %v (dir there: %v), want it left alone", err, exists(dir))
	}
	if got := strings.Join(dirNames(t, cache), " "); got != name {
		t.Errorf("cache holds %q, want only %s", got, name)
	}
}

func TestParseGeneration(t *testing.T) {
	tests := []struct {
		name string
		key  string
		n    int
		ok   bool
	}{
		{"0123456789abcdef.1", "0123456789abcdef", 1, true},
		{"0123456789abcdef.42", "0123456789abcdef", 42, true},
		{"0123456789abcdef", "", 0, false},
		{"0123456789abcdef.0", "", 0, false},
		{"0123456789abcdef.01", "", 0, false},
		{"0123456789abcdef.-1", "", 0, false},
		{"0123456789abcdef.1.manifest", "", 0, false},
		{"0123456789ABCDEF.1", "", 0, false},
		{"0123456789abcde.1", "", 0, false},
		{"../x.1", "", 0, false},
	}
	for _, tt := range tests {
		key, n, ok := parseGeneration(tt.name)
		if key != tt.key || n != tt.n || ok != tt.ok {
			t.Errorf("parseGeneration(%q) = %q, %d, %v; want %q, %d, %v", tt.name, key, n, ok, tt.key, tt.n, tt.ok)
		}
	}
}

// BenchmarkEnsureWarm measures Ensure on a cache that holds a fresh rootfs of
// the host's python3, against what a warm Ensure cost before manifests (an
// Lstat and Check), measured in the same run.
func BenchmarkEnsureWarm(b *testing.B) {
	py := hostPython(b)
	cache := b.TempDir()
	ctx := context.Background()
	dir, err := Ensure(ctx, py, Options{}, cache, nil)
	if err != nil {
		b.Fatal(err)
	}
	m, err := readManifest(dir + manifestSuffix)
	if err != nil {
		b.Fatal(err)
	}
	const baseRuns = 1000
	start := time.Now()
	for range baseRuns {
		os.Lstat(dir)
		if err := Check(dir); err != nil {
			b.Fatal(err)
		}
	}
	base := time.Since(start) / baseRuns

	for b.Loop() {
		if got, err := Ensure(ctx, py, Options{}, cache, nil); err != nil || got != dir {
			b.Fatalf("Ensure = %q, %v; want %s", got, err, dir)
		}
	}
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(len(m.Sources)), "sources")
	b.ReportMetric(float64(base.Nanoseconds()), "baseline-ns")
	b.ReportMetric(float64(per)/float64(base), "x-baseline")
}
