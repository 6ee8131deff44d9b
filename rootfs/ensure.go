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
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The cache dir holds, for each key (Interpreter.Key):
//
//	<key>                a symlink to the key's current generation, replaced by rename(2)
//	<key>.<n>/           generation n: a complete rootfs, never modified once there
//	<key>.<n>.manifest   what generation n was built from (0600; see manifest)
//	.lock                the flock every build and every removal holds
//	.building-*          what a killed build left
//	.removing-*          what a killed removal left
//
// A generation is replaced, never rebuilt in place: servers started on it
// have it bind-mounted as the root of live containers and keep its path for
// new ones. Each process Ensure hands a generation to keeps a shared flock on
// its manifest until it exits (see held); a generation that is no longer
// current is removed once no process holds it, by whoever next builds or
// next finds it on the way (Ensure's fast path tries the lock, never waits).
// Neither age nor a count of generations says whether one is still in use;
// the lock does, and the kernel drops it when its holder dies.
//
// The manifest is written before its generation's dir appears and removed
// after the dir is gone, so a generation dir without one is someone's doing:
// whether it is in use can no longer be told, and it is left alone.

// lockPoll is how often Ensure retries the cache lock while another process
// builds: flock(2) cannot wait on a context, so it waits in steps.
const lockPoll = 100 * time.Millisecond

// manifestSuffix ends the name of a generation's manifest.
const manifestSuffix = ".manifest"

// trashPrefix starts the name a generation is renamed to before it is removed.
const trashPrefix = ".removing-"

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
		return "", errors.New("ensuring rootfs: no cache dir (set MCP_EXEC_ROOTFS or HOME)")
	}
	norm, err := opts.Normalize()
	if err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	c := cacheEntry{dir: cacheDir, key: norm.key(py)}
	if dir, _, err := c.lookup(); dir != "" || err != nil {
		if dir != "" {
			tidy(cacheDir)
		}
		return dir, err
	}

	if err := makeCacheDir(cacheDir); err != nil {
		return "", err
	}
	unlock, err := lockDir(ctx, cacheDir)
	if err != nil {
		return "", err
	}
	defer unlock()

	// Another process may have built it while we waited.
	dir, why, err := c.lookup()
	if dir != "" || err != nil {
		return dir, err
	}
	// Holding the lock, no build is running here: a temp dir is what a
	// killed one left.
	if err := removeLeftovers(cacheDir); err != nil {
		return "", err
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
			removeGeneration(cacheDir, name)
		}
	}()
	om, err := openManifest(out + manifestSuffix)
	if err != nil {
		return "", fmt.Errorf("ensuring rootfs: %w", err)
	}
	if err := c.point(name); err != nil {
		om.f.Close()
		return "", err
	}
	hold(out, om)
	// What the new generation replaced goes now if no one runs on it; a
	// failure to remove it costs only disk, and the next build retries.
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
	hold(dir, om)
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

type fileID struct{ dev, ino uint64 }

// openedManifest is a generation's manifest, open and shared-locked.
type openedManifest struct {
	f  *os.File
	id fileID
	m  *manifest
}

// openManifest opens a generation's manifest, takes a shared flock on it
// without waiting (an exclusive holder is removing the generation), and
// reads it. The caller closes it, or holds it for as long as it uses the
// generation.
func openManifest(p string) (*openedManifest, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	if ok, err := flockNB(f, unix.LOCK_SH); err != nil || !ok {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s is being removed", p)
		}
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Nlink == 0 {
		// Removed, with its generation, between the open and the lock.
		f.Close()
		return nil, fmt.Errorf("%s was removed", p)
	}
	m, err := readManifest(p)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &openedManifest{f: f, id: fileID{dev: st.Dev, ino: st.Ino}, m: m}, nil
}

// held keeps, for the life of the process, one open, shared-locked manifest
// for every generation Ensure returned: removeGeneration skips a generation
// whose manifest it cannot lock exclusively, so no process removes a rootfs
// another still runs containers on, and the kernel drops the locks when the
// process exits. It is keyed by the manifest's identity, not its name, so that
// a cache wiped and rebuilt under the same names is held anew.
//
// What is held is a regular file, not the generation's dir: a long-lived fd
// of a host dir in a process that starts containers is one leak away from an
// escape (runc's CVE-2024-21626). The files are close-on-exec besides.
var held = struct {
	sync.Mutex
	files map[fileID]heldGeneration
}{files: map[fileID]heldGeneration{}}

type heldGeneration struct {
	dir string
	f   *os.File
}

// hold keeps om open for the life of the process, or closes it if the process
// already holds that manifest.
func hold(dir string, om *openedManifest) {
	held.Lock()
	defer held.Unlock()
	if _, ok := held.files[om.id]; ok {
		om.f.Close()
		return
	}
	held.files[om.id] = heldGeneration{dir: dir, f: om.f}
}

// collect removes the generations no key's link points to and no process
// holds. The caller holds the cache lock. It is best effort: what it cannot
// remove now it retries next time.
func collect(cacheDir string) {
	old, _, err := scan(cacheDir)
	if err != nil {
		return
	}
	for _, name := range old {
		removeGeneration(cacheDir, name)
	}
}

// tidy is collect (and removeLeftovers) on Ensure's fast path, when there is
// something to remove and no build is running: a generation outlived by the
// servers that used it should not wait for the next host update to go.
func tidy(cacheDir string) {
	old, leftovers, err := scan(cacheDir)
	if err != nil || (len(old) == 0 && !leftovers) {
		return
	}
	f, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_RDWR, 0)
	if err != nil {
		return
	}
	defer f.Close()
	if ok, err := flockNB(f, unix.LOCK_EX); err != nil || !ok {
		return
	}
	removeLeftovers(cacheDir)
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
		case strings.HasPrefix(name, tempPrefix), strings.HasPrefix(name, trashPrefix):
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

// removeGeneration removes generation name and its manifest unless a process
// holds it, or it has no manifest (see above). The caller holds the cache lock.
func removeGeneration(cacheDir, name string) error {
	dir := filepath.Join(cacheDir, name)
	f, err := os.Open(dir + manifestSuffix)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("removing rootfs %s: %w", dir, err)
	}
	defer f.Close()
	if ok, err := flockNB(f, unix.LOCK_EX); err != nil || !ok {
		return err
	}
	// The dir goes first, away from its name, so that no one can take it
	// half removed; then the manifest, so that a process that opened it
	// before finds it unlinked once it gets its shared lock. A killed
	// removal leaves a trash dir for removeLeftovers, or a manifest
	// without its dir for the next removal.
	trash := filepath.Join(cacheDir, trashPrefix+name)
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing rootfs %s: %w", dir, err)
	}
	if err := os.Remove(dir + manifestSuffix); err != nil {
		return fmt.Errorf("removing rootfs %s: %w", dir, err)
	}
	if err := os.RemoveAll(trash); err != nil {
		return fmt.Errorf("removing rootfs %s: %w", dir, err)
	}
	return nil
}

func makeCacheDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("ensuring rootfs: creating cache dir: %w", err)
	}
	// MkdirAll honours the umask; the sandbox must still read through it.
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("ensuring rootfs: creating cache dir: %w", err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir/.lock. Each call opens the file
// anew, so goroutines of one process exclude each other like processes do.
// The kernel drops the lock when a holder dies, so no stale lock survives a
// killed build.
func lockDir(ctx context.Context, dir string) (unlock func(), err error) {
	p := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ensuring rootfs: opening lock: %w", err)
	}
	for {
		ok, err := flockNB(f, unix.LOCK_EX)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("ensuring rootfs: locking %s: %w", p, err)
		}
		if ok {
			return func() { f.Close() }, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("ensuring rootfs: waiting for the build in %s: %w", dir, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

// flockNB tries once to take an flock of kind how (LOCK_SH or LOCK_EX) on
// f; ok is false when another open file holds a conflicting one.
func flockNB(f *os.File, how int) (ok bool, err error) {
	for {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EWOULDBLOCK):
			return false, nil
		default:
			return false, err
		}
	}
}

// removeLeftovers removes what a killed build or removal left. The caller
// holds the cache lock, so none is running.
func removeLeftovers(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("ensuring rootfs: %w", err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) && !strings.HasPrefix(e.Name(), trashPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("ensuring rootfs: removing the leftovers of a killed build: %w", err)
		}
	}
	return nil
}
