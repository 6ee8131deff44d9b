package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// fakeEntry puts an entry into cacheDir — a built generation, current,
// when name is one, else an image — taking size bytes, last used at when;
// it returns its hold file.
func fakeEntry(t *testing.T, cacheDir, name string, size int, when time.Time, about *About) string {
	t.Helper()
	dir := filepath.Join(cacheDir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), make([]byte, size), 0o644); err != nil {
		t.Fatal(err)
	}
	hold := dir + holdSuffix
	if key, _, ok := parseGeneration(name); ok {
		hold = dir + manifestSuffix
		if err := writeManifest(hold, &manifest{Format: manifestFormat}); err != nil {
			t.Fatal(err)
		}
		if err := (cacheEntry{dir: cacheDir, key: key}).point(name); err != nil {
			t.Fatal(err)
		}
	} else if err := os.WriteFile(hold, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if about != nil {
		cache{dir: cacheDir}.describe(name, *about)
		if _, err := os.Stat(dir + aboutSuffix); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chtimes(hold, when, when); err != nil {
		t.Fatal(err)
	}
	return hold
}

func entryNamesOf(list []Entry) []string {
	var n []string
	for _, e := range list {
		n = append(n, e.Name)
	}
	return n
}

// List says what each entry holds, its size and when it was last used,
// least recently used first, and which are held.
func TestList(t *testing.T) {
	cache := t.TempDir()
	now := time.Now()
	fakeEntry(t, cache, "aaaaaaaaaaaaaaaa.1", 300<<10, now.Add(-3*time.Hour),
		&About{PythonVersion: "3.11.2", Packages: []string{"python3-numpy"}, Shell: true})
	heldHold := fakeEntry(t, cache, "bbbbbbbbbbbbbbbb.2", 100<<10, now.Add(-time.Hour), nil)
	fakeEntry(t, cache, imagePrefix+"0123-abc", 200<<10, now.Add(-2*time.Hour), &About{Image: "/srv/img.tar", Digest: "sha256:0123"})
	// A replaced generation: its key's link points to another.
	fakeEntry(t, cache, "cccccccccccccccc.1", 10<<10, now.Add(-4*time.Hour), nil)
	fakeEntry(t, cache, "cccccccccccccccc.2", 10<<10, now.Add(-30*time.Minute), nil)
	h, err := openHold(heldHold)
	if err != nil {
		t.Fatal(err)
	}
	defer h.f.Close()

	list, err := List(cache)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cccccccccccccccc.1", "aaaaaaaaaaaaaaaa.1", imagePrefix + "0123-abc", "bbbbbbbbbbbbbbbb.2", "cccccccccccccccc.2"}
	if !slices.Equal(entryNamesOf(list), want) {
		t.Fatalf("List = %q, want least recently used first: %q", entryNamesOf(list), want)
	}
	byName := map[string]Entry{}
	for _, e := range list {
		byName[e.Name] = e
	}
	a := byName["aaaaaaaaaaaaaaaa.1"]
	if a.Kind != "built" || !a.Current || a.InUse() || a.Bytes < 300<<10 || a.About == nil || a.About.String() != "python 3.11.2; python3-numpy; shell" {
		t.Errorf("built entry: %+v (about %v)", a, a.About)
	}
	if b := byName["bbbbbbbbbbbbbbbb.2"]; b.Holders != 1 || !b.InUse() || b.About == nil || b.About.String() != "standard library only" {
		t.Errorf("held entry: %+v, want one holder, and what its manifest says", b)
	}
	if im := byName[imagePrefix+"0123-abc"]; im.Kind != "image" || !im.Current || !strings.HasPrefix(im.About.String(), "image /srv/img.tar (sha256:0123)") {
		t.Errorf("image entry: %+v", im)
	}
	if c := byName["cccccccccccccccc.1"]; c.Current || !byName["cccccccccccccccc.2"].Current {
		t.Errorf("a replaced generation listed as current: %+v", c)
	}
	if missing, err := List(filepath.Join(cache, "nope")); err != nil || len(missing) != 0 {
		t.Errorf("List of a missing cache dir = %v, %v; want nothing, no error", missing, err)
	}
}

// Prune removes, least recently used first, only what no process holds:
// with a bound, only while the cache is over it; with --keep, all but the
// newest unused; with --older-than, only what was last used before.
func TestPrune(t *testing.T) {
	now := time.Now()
	setup := func(t *testing.T) (string, func()) {
		cache := t.TempDir()
		fakeEntry(t, cache, "aaaaaaaaaaaaaaaa.1", 400<<10, now.Add(-72*time.Hour), &About{})
		hold := fakeEntry(t, cache, "bbbbbbbbbbbbbbbb.1", 400<<10, now.Add(-96*time.Hour), nil)
		fakeEntry(t, cache, imagePrefix+"0123-abc", 400<<10, now.Add(-48*time.Hour), nil)
		fakeEntry(t, cache, "cccccccccccccccc.1", 400<<10, now.Add(-time.Hour), nil)
		h, err := openHold(hold)
		if err != nil {
			t.Fatal(err)
		}
		return cache, func() { h.f.Close() }
	}
	total := func(cache string) int64 {
		list, _ := List(cache)
		var n int64
		for _, e := range list {
			n += e.Bytes
		}
		return n
	}
	for _, tc := range []struct {
		name    string
		opts    func(cache string) PruneOptions
		removed []string
	}{
		{"all unused", func(string) PruneOptions { return PruneOptions{} },
			[]string{"aaaaaaaaaaaaaaaa.1", imagePrefix + "0123-abc", "cccccccccccccccc.1"}},
		{"keep 1", func(string) PruneOptions { return PruneOptions{Keep: 1} },
			[]string{"aaaaaaaaaaaaaaaa.1", imagePrefix + "0123-abc"}},
		{"older than 2 days", func(string) PruneOptions { return PruneOptions{OlderThan: 60 * time.Hour} },
			[]string{"aaaaaaaaaaaaaaaa.1"}},
		{"bound one entry below", func(cache string) PruneOptions { return PruneOptions{MaxBytes: total(cache) - 100<<10} },
			[]string{"aaaaaaaaaaaaaaaa.1"}},
		{"bound below what is held", func(string) PruneOptions { return PruneOptions{MaxBytes: 1} },
			[]string{"aaaaaaaaaaaaaaaa.1", imagePrefix + "0123-abc", "cccccccccccccccc.1"}},
		{"dry run", func(string) PruneOptions { return PruneOptions{DryRun: true} },
			[]string{"aaaaaaaaaaaaaaaa.1", imagePrefix + "0123-abc", "cccccccccccccccc.1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cache, unhold := setup(t)
			defer unhold()
			o := tc.opts(cache)
			removed, err := Prune(context.Background(), cache, o)
			if err != nil || !slices.Equal(entryNamesOf(removed), tc.removed) {
				t.Errorf("Prune(%+v) = %q, %v; want %q", o, entryNamesOf(removed), err, tc.removed)
			}
			left, _ := List(cache)
			for _, e := range removed {
				_, dirErr := os.Lstat(e.Dir)
				_, aboutErr := os.Lstat(e.Dir + aboutSuffix)
				if gone := os.IsNotExist(dirErr) && os.IsNotExist(aboutErr); gone == o.DryRun {
					t.Errorf("Prune(%+v): %s gone %v", o, e.Name, gone)
				}
			}
			if !o.DryRun {
				if len(left) != 4-len(tc.removed) || !slices.Contains(entryNamesOf(left), "bbbbbbbbbbbbbbbb.1") {
					t.Errorf("after Prune(%+v) the cache holds %q", o, entryNamesOf(left))
				}
				// A removed current generation takes its key's link.
				if _, err := os.Lstat(filepath.Join(cache, "aaaaaaaaaaaaaaaa")); !os.IsNotExist(err) {
					t.Errorf("the removed generation's link is still there (%v)", err)
				}
			}
		})
	}
}

// An entry another process holds — as a server running on it does — is
// never removed, whatever Prune is asked; once that process is gone it is.
func TestPruneKeepsWhatAnotherProcessHolds(t *testing.T) {
	testenv.Real(t)
	if _, err := exec.LookPath("flock"); err != nil {
		testenv.Missing(t, "flock(1) is not installed (util-linux)")
	}
	cache := t.TempDir()
	hold := fakeEntry(t, cache, "aaaaaaaaaaaaaaaa.1", 1<<20, time.Now().Add(-1000*time.Hour), nil)
	fakeEntry(t, cache, "bbbbbbbbbbbbbbbb.1", 1<<20, time.Now(), nil)
	// flock(1) takes a shared flock(2) lock, as a server holding the
	// entry does, and keeps it until it is killed.
	// --close: the lock stays with flock, not with sleep.
	holder := exec.Command("flock", "--shared", "--close", hold, "sleep", "600")
	holder.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	kill := func() { syscall.Kill(-holder.Process.Pid, syscall.SIGKILL); holder.Wait() }
	defer kill()
	testenv.Eventually(t, "the holder to hold the entry", func() bool {
		list, _ := List(cache)
		return len(list) == 2 && list[0].InUse()
	})
	removed, err := Prune(context.Background(), cache, PruneOptions{MaxBytes: 1})
	if err != nil || !slices.Equal(entryNamesOf(removed), []string{"bbbbbbbbbbbbbbbb.1"}) {
		t.Errorf("Prune with another process holding the oldest = %q, %v; want only the unheld one removed", entryNamesOf(removed), err)
	}
	if _, err := os.Stat(filepath.Join(cache, "aaaaaaaaaaaaaaaa.1", "data")); err != nil {
		t.Errorf("the held entry lost its files: %v", err)
	}
	kill()
	testenv.Eventually(t, "the holder's lock to go with it", func() bool {
		list, _ := List(cache)
		return len(list) == 1 && !list[0].InUse()
	})
	removed, err = Prune(context.Background(), cache, PruneOptions{})
	if err != nil || !slices.Equal(entryNamesOf(removed), []string{"aaaaaaaaaaaaaaaa.1"}) {
		t.Errorf("Prune once its holder is gone = %q, %v; want it removed", entryNamesOf(removed), err)
	}
}
