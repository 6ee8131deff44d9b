package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingBuild is Build, counted.
func countingBuild(n *atomic.Int32) buildFunc {
	return func(ctx context.Context, py Interpreter, out string, validate func(context.Context, string) error) error {
		n.Add(1)
		return Build(ctx, py, out, validate)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
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
			dirs[i], errs[i] = ensure(context.Background(), py, cache, nil, build)
		}()
	}
	wg.Wait()
	want := filepath.Join(cache, py.Key())
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
	got, err := ensure(context.Background(), py, cache, nil, build)
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
	if got, want := strings.Join(dirNames(t, cache), " "), ".lock "+py.Key(); got != want {
		t.Errorf("cache dir holds %q, want %q", got, want)
	}
}

func TestBuildFailingValidateLeavesNothing(t *testing.T) {
	py := hostPython(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "rootfs")
	errInvalid := errors.New("python did not start")
	var validated string
	err := Build(context.Background(), py, out, func(ctx context.Context, dir string) error {
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
	_, err = Ensure(context.Background(), py, cache, func(context.Context, string) error { return errInvalid })
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
	err := Build(context.Background(), py, out, nil)
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("Build into existing %s = %v, want an 'already exists' error", out, err)
	}
}

func TestBuildCancelled(t *testing.T) {
	py := hostPython(t)
	parent := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Build(ctx, py, filepath.Join(parent, "rootfs"), nil)
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
	fake := func(ctx context.Context, py Interpreter, out string, validate func(context.Context, string) error) error {
		_, err := os.Lstat(leftover)
		sawLeftover = err == nil
		return os.Mkdir(out, 0o755)
	}
	if _, err := ensure(context.Background(), py, cache, nil, fake); err != nil {
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
	unlock, err := lockDir(context.Background(), cache)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 3*lockPoll)
	defer cancel()
	built := false
	fake := func(context.Context, Interpreter, string, func(context.Context, string) error) error {
		built = true
		return nil
	}
	_, err = ensure(ctx, py, cache, nil, fake)
	if !errors.Is(err, context.DeadlineExceeded) || built {
		t.Errorf("Ensure while another holds the lock = %v (built %v), want context.DeadlineExceeded, no build", err, built)
	}

	// Once the holder is done, a waiting Ensure proceeds.
	done := make(chan error, 1)
	go func() {
		_, err := ensure(context.Background(), py, cache, nil, func(_ context.Context, _ Interpreter, out string, _ func(context.Context, string) error) error {
			return os.Mkdir(out, 0o755)
		})
		done <- err
	}()
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
	cache := t.TempDir()
	if err := os.Mkdir(filepath.Join(cache, py.Key()), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := Ensure(context.Background(), py, cache, nil)
	if err == nil || !strings.Contains(err.Error(), "remove "+filepath.Join(cache, py.Key())) {
		t.Errorf("Ensure over a broken cached rootfs = %v, want an error saying what to remove", err)
	}
}
