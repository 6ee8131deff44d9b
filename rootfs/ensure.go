package rootfs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Ensure's entries in the cache dir (cache.go), for each key
// (Interpreter.Key):
//
//	<key>                a symlink to the key's current generation, replaced by rename(2)
//	<key>.<n>/           generation n: a complete rootfs, never modified once there
//	<key>.<n>.manifest   what generation n was built from (0600; see manifest), and its hold file
//
// A generation that is no longer current is removed once no process holds
// it, by whoever next builds or next finds it on the way (Ensure's fast
// path tries the lock, never waits).

// manifestSuffix ends the name of a generation's manifest.
const manifestSuffix = ".manifest"

// generations is the cache of Ensure's generations in dir.
func generations(dir string) cache {
	return cache{dir: dir, suffix: manifestSuffix}
}

type buildFunc func(ctx context.Context, py Interpreter, opts Options, out, manifestPath string, validate func(context.Context, string) error) error

// Ensure returns a cached rootfs for py with opts under cacheDir, building it
// with Build if there is none, or if a host file it was built from (a
// library, a stdlib file, a package's file or file list, ld.so.conf) has
// changed since: a security update of libssl or an upgrade of
// python3-numpy that leaves python3 alone must reach the sandbox. Each
// normalized opts has its own cache entry (Options.Key). The dir returned stays as it is
// for as long as the calling process lives, even after a later Ensure
// replaced it; use the dir, not the cache's link to it.
//
// Several server processes may call it at once: builds run under an flock on
// cacheDir/.lock, and whoever gets the lock second finds the rootfs there.
// cacheDir is created 0755 if missing: the rootfs must be readable by the
// sandbox's uid. A warm call costs one lstat per host file the rootfs was
// built from (a few ms for the stdlib's ~1500).
func Ensure(ctx context.Context, py Interpreter, opts Options, cacheDir string, validate func(ctx context.Context, dir string) error) (string, error) {
	return ensure(ctx, py, opts, cacheDir, validate, build)
}

func ensure(ctx context.Context, py Interpreter, opts Options, cacheDir string, validate func(context.Context, string) error, build buildFunc) (_ string, retErr error) {
	if cacheDir == "" {
		return "", errors.New("ensuring rootfs: no cache dir (set {Rootfs} or HOME)")
	}
	norm, err := opts.Normalize()
	if err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	c := cacheEntry{dir: cacheDir, key: norm.key(py)}
	if dir, _, err := c.lookup(); dir != "" || err != nil {
		if dir != "" {
			sweep(cacheDir)
		}
		return dir, err
	}

	gens := generations(cacheDir)
	unlock, err := gens.lock(ctx)
	if err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	defer unlock()

	// Another process may have built it while we waited.
	dir, why, err := c.lookup()
	if dir != "" || err != nil {
		return dir, err
	}
	// Holding the lock, no build is running here: a temp dir is what a
	// killed one left.
	if err := gens.tidy(); err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	name, err := c.nextGeneration()
	if err != nil {
		return "", err
	}
	out := filepath.Join(cacheDir, name)
	if err := build(ctx, py, opts, out, out+manifestSuffix, validate); err != nil {
		if why != "" {
			return "", fmt.Errorf("ensuring rootfs in %s: rebuilding, as the cached one is stale (%s): %w", cacheDir, why, err)
		}
		return "", fmt.Errorf("ensuring rootfs in %s: %w", cacheDir, err)
	}
	defer func() {
		if retErr != nil {
			gens.remove(name)
		}
	}()
	if err := writeContents(out, out+contentsSuffix); err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	om, err := openManifest(out + manifestSuffix)
	if err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	if err := c.point(name); err != nil {
		om.f.Close()
		return "", err
	}
	hold(out, om.holdFile)
	builds.Add(1)
	gens.describe(name, About{Python: py.Path, PythonVersion: py.Version, Packages: norm.Packages,
		Shell: norm.Shell, Preload: norm.Preload, Built: time.Now().UTC()})
	// What the new generation replaced goes now if no one runs on it.
	collect(cacheDir)
	return out, nil
}

// cacheEntry names a key's entries in a cache dir.
type cacheEntry struct {
	dir, key string
}

// lookup returns the dir of the key's current generation when it can be used
// as it is: complete, built from the host's files as they are now, and held
// by this process. Otherwise dir is "", and why says what is stale ("" when
// there is no generation at all); a generation someone damaged is an error,
// reported rather than rebuilt behind the user's back.
func (c cacheEntry) lookup() (dir, why string, err error) {
	link := filepath.Join(c.dir, c.key)
	target, err := os.Readlink(link)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", nil
	}
	if errors.Is(err, unix.EINVAL) {
		return "", "", fmt.Errorf("ensuring rootfs: cache entry %s is not a link to a generation; remove %s to rebuild it", link, link)
	}
	if err != nil {
		return "", "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	if key, _, ok := parseGeneration(target); !ok || key != c.key {
		return "", "", fmt.Errorf("ensuring rootfs: cache entry %s points to %q, not to a generation of it; remove %s to rebuild it", link, target, link)
	}
	dir = filepath.Join(c.dir, target)

	om, err := openManifest(dir + manifestSuffix)
	if err != nil {
		// Missing, unreadable, or being removed: build another.
		return "", err.Error(), nil
	}
	if why := om.m.changed(); why != "" {
		om.f.Close()
		return "", why, nil
	}
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		om.f.Close()
		return "", dir + " is gone", nil
	}
	if err := Check(dir); err != nil {
		om.f.Close()
		return "", "", fmt.Errorf("ensuring rootfs: cached %w; remove %s to rebuild it", err, link)
	}
	if err := checkContents(dir, dir+contentsSuffix); err != nil {
		om.f.Close()
		return "", "", fmt.Errorf("ensuring rootfs: the cached rootfs %s: %w; remove %s to rebuild it", dir, err, link)
	}
	hold(dir, om.holdFile)
	return dir, "", nil
}

// parseGeneration splits a generation's name, <key>.<n>, where the key is
// Interpreter.Key's 16 hex digits and n > 0.
func parseGeneration(name string) (key string, n int, ok bool) {
	key, num, found := strings.Cut(name, ".")
	if !found || len(key) != 16 || strings.Trim(key, "0123456789abcdef") != "" {
		return "", 0, false
	}
	if num == "" || num[0] == '0' || strings.Trim(num, "0123456789") != "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return "", 0, false
	}
	return key, n, true
}

// nextGeneration names the key's next generation: one past the newest
// present, so a name is never reused while anything of it is left.
func (c cacheEntry) nextGeneration() (string, error) {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	last := 0
	for _, e := range entries {
		key, n, ok := parseGeneration(strings.TrimSuffix(e.Name(), manifestSuffix))
		if ok && key == c.key {
			last = max(last, n)
		}
	}
	return c.key + "." + strconv.Itoa(last+1), nil
}

// point makes name the key's current generation, atomically: readers see the
// old link or the new one.
func (c cacheEntry) point(name string) error {
	tmp := filepath.Join(c.dir, tempPrefix+c.key+".link")
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("ensuring rootfs: %w", err)
	}
	if err := os.Symlink(name, tmp); err != nil {
		return fmt.Errorf("ensuring rootfs: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, c.key)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("ensuring rootfs: making %s current: %w", name, err)
	}
	return nil
}

// openedManifest is a generation's manifest, open and shared-locked.
type openedManifest struct {
	holdFile
	m *manifest
}

// openManifest opens a generation's manifest, its hold file, shared-locked
// (see openHold), and reads it. The caller closes it, or holds it for as long
// as it uses the generation.
func openManifest(p string) (*openedManifest, error) {
	h, err := openHold(p)
	if err != nil {
		return nil, err
	}
	m, err := readManifest(p)
	if err != nil {
		h.f.Close()
		return nil, err
	}
	return &openedManifest{holdFile: h, m: m}, nil
}

// collect removes the generations no key's link points to and no process
// holds. The caller holds the cache lock.
func collect(cacheDir string) {
	old, _, err := scan(cacheDir)
	if err != nil {
		return
	}
	generations(cacheDir).collect(old)
}

// sweep is collect (and the cache's tidy) on Ensure's fast path, when there
// is something to remove and no build is running: a generation outlived by
// the servers that used it should not wait for the next host update to go.
func sweep(cacheDir string) {
	old, leftovers, err := scan(cacheDir)
	if err != nil || (len(old) == 0 && !leftovers) {
		return
	}
	gens := generations(cacheDir)
	unlock, ok := gens.tryLock()
	if !ok {
		return
	}
	defer unlock()
	gens.tidy()
	collect(cacheDir)
}

// scan lists the generations in cacheDir that their key's link does not
// point to, and whether leftovers of a killed build or removal are there.
// Entries it does not know (a rootfs of an older mcp-exec, at <key>) it
// leaves alone: a running server may use them.
func scan(cacheDir string) (old []string, leftovers bool, err error) {
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		return nil, false, err
	}
	current := map[string]string{}
	gens := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		switch {
		case isLeftover(name):
			leftovers = true
		case e.Type()&fs.ModeSymlink != 0:
			if target, err := os.Readlink(filepath.Join(cacheDir, name)); err == nil {
				current[name] = target
			}
		default:
			gen := strings.TrimSuffix(name, manifestSuffix)
			if _, _, ok := parseGeneration(gen); ok {
				gens[gen] = true
			}
		}
	}
	for gen := range gens {
		key, _, _ := parseGeneration(gen)
		if current[key] != gen {
			old = append(old, gen)
		}
	}
	slices.Sort(old)
	return old, leftovers, nil
}
