package rootfs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A cache dir holds, side by side, the rootfs generations Ensure builds and
// the images FlattenImage flattens (ensure.go and image.go say how each names
// its entries):
//
//	.lock           the flock every build and every removal holds
//	<name>/         an entry: a complete rootfs, never modified once there
//	<name><suffix>  its hold file, shared-locked by every process using it;
//	                its mtime is when a process last took or let go of it
//	<name>.about    what it holds, for `mcp-exec rootfs ls` (entries.go)
//	.building-*     what a killed build left
//	.removing-*     what a killed removal left
//
// An entry is written once: built in a temp dir next to its name and renamed
// into place, never over anything. It is removed, never rebuilt in place:
// servers started on it have it bind-mounted as the root of live containers
// and keep its path for new ones. Each process that uses an entry keeps a
// shared flock on its hold file until it exits (see held); an entry its
// kind no longer wants is removed once no process holds it. Neither age nor
// a count says whether an entry is still in use; the lock does, and the
// kernel drops it when its holder dies.
//
// The hold file is there before its entry's dir appears and removed after
// the dir is gone, so a dir without one is someone's doing: whether it is
// in use can no longer be told, and it is left alone.

// lockPoll is how often a cache's lock is retried while another process
// builds: flock(2) cannot wait on a context, so it waits in steps.
const lockPoll = 100 * time.Millisecond

// tempPrefix starts the name of a rootfs being built. A cache removes dirs of
// that name it finds: they are left by a killed build.
const tempPrefix = ".building-"

// trashPrefix starts the name an entry is renamed to before it is removed.
const trashPrefix = ".removing-"

// cache is a cache dir seen through one kind of entry, whose hold files end
// in suffix. Kinds that share a dir share its lock and its leftovers.
type cache struct {
	dir, suffix string
}

// lock creates the cache dir if it is missing and takes an exclusive flock on
// its .lock, waiting for ctx. The dir is 0755: the sandbox's uid reads the
// rootfs through it. Each call opens the file anew, so goroutines of one
// process exclude each other like processes do, and the kernel drops the
// lock when a holder dies, so no stale lock survives a killed build.
func (c cache) lock(ctx context.Context) (unlock func(), err error) {
	if err := c.makeDir(); err != nil {
		return nil, err
	}
	p := filepath.Join(c.dir, ".lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the cache lock: %w", err)
	}
	for {
		ok, err := flockNB(f, unix.LOCK_EX)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", p, err)
		}
		if ok {
			return func() { f.Close() }, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for the build in %s: %w", c.dir, ctx.Err())
		case <-time.After(lockPoll):
		}
	}
}

func (c cache) makeDir() error {
	if _, err := os.Stat(c.dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return fmt.Errorf("creating cache dir: %w", err)
	}
	// MkdirAll honours the umask; the sandbox must still read through it.
	if err := os.Chmod(c.dir, 0o755); err != nil {
		return fmt.Errorf("creating cache dir: %w", err)
	}
	return nil
}

// tryLock takes the cache's lock if no one holds it, without waiting and
// without creating anything: for a clean-up that can as well be done later.
func (c cache) tryLock() (unlock func(), ok bool) {
	f, err := os.OpenFile(filepath.Join(c.dir, ".lock"), os.O_RDWR, 0)
	if err != nil {
		return nil, false
	}
	if ok, err := flockNB(f, unix.LOCK_EX); err != nil || !ok {
		f.Close()
		return nil, false
	}
	return func() { f.Close() }, true
}

// tidy removes what a killed build or removal left. The caller holds the
// lock, so none is running.
func (c cache) tidy() error {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !isLeftover(e.Name()) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(c.dir, e.Name())); err != nil {
			return fmt.Errorf("removing the leftovers of a killed build: %w", err)
		}
	}
	return tidyAbouts(c.dir, entries)
}

func isLeftover(name string) bool {
	return strings.HasPrefix(name, tempPrefix) || strings.HasPrefix(name, trashPrefix)
}

// stage makes the temp dir that entry name is built in: next to it (the same
// filesystem, so that publish's rename is atomic) and named so that tidy
// recognizes it. It is 0700, as MkdirTemp makes it.
func (c cache) stage(name string) (string, error) {
	return os.MkdirTemp(c.dir, tempPrefix+name+"-")
}

// publish renames the built tmp to the entry name: readers see no entry or a
// complete one. It never replaces: a plain rename(2) of a dir onto an empty
// dir succeeds, which would hide a concurrent mistake.
func (c cache) publish(tmp, name string) error {
	to := filepath.Join(c.dir, name)
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		// The filesystem cannot; Lstat narrows the window to nearly nothing.
		if _, statErr := os.Lstat(to); statErr == nil {
			return &os.LinkError{Op: "rename", Old: tmp, New: to, Err: unix.EEXIST}
		}
		return os.Rename(tmp, to)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: tmp, New: to, Err: err}
	}
	return nil
}

// open opens entry name's hold file and takes a shared flock on it; see
// openHold.
func (c cache) open(name string) (holdFile, error) {
	return openHold(filepath.Join(c.dir, name+c.suffix))
}

// remove removes entry name unless a process holds it, or it has no hold
// file (see above). The caller holds the lock.
func (c cache) remove(name string) error {
	_, err := c.removeUnused(name)
	return err
}

// removeUnused is remove, saying whether the entry was removed: false
// when a process holds it or it has no hold file.
func (c cache) removeUnused(name string) (bool, error) {
	dir := filepath.Join(c.dir, name)
	f, err := os.Open(dir + c.suffix)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("removing %s: %w", dir, err)
	}
	defer f.Close()
	if ok, err := flockNB(f, unix.LOCK_EX); err != nil || !ok {
		return false, err
	}
	// The dir goes first, away from its name, so that no one can take it
	// half removed; then the hold file, so that a process that opened it
	// before finds it unlinked once it gets its shared lock. A killed
	// removal leaves a trash dir for tidy, or a hold file without its dir
	// for the next removal.
	trash := filepath.Join(c.dir, trashPrefix+name)
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("removing %s: %w", dir, err)
	}
	if err := os.Remove(dir + c.suffix); err != nil {
		return false, fmt.Errorf("removing %s: %w", dir, err)
	}
	// What it held goes with it; tidy takes one a killed removal left.
	for _, beside := range []string{aboutSuffix, contentsSuffix} {
		if err := os.Remove(dir + beside); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, fmt.Errorf("removing %s: %w", dir, err)
		}
	}
	if err := os.RemoveAll(trash); err != nil {
		return false, fmt.Errorf("removing %s: %w", dir, err)
	}
	return true, nil
}

// collect removes the entries of names that no process holds. The caller
// holds the lock. It is best effort: a failure costs only disk, and the next
// build retries.
func (c cache) collect(names []string) {
	for _, name := range names {
		c.remove(name)
	}
}

// create creates entry name's hold file, empty, and takes a shared flock on
// it: an entry held before it appears cannot be collected in between.
func (c cache) create(name string) (_ holdFile, retErr error) {
	p := filepath.Join(c.dir, name+c.suffix)
	f, err := os.OpenFile(p, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return holdFile{}, err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(p)
		}
	}()
	// Nothing else has the new file open yet: no lock is held elsewhere.
	if ok, err := flockNB(f, unix.LOCK_SH); !ok {
		return holdFile{}, fmt.Errorf("locking %s: %w", p, cmp.Or(err, errors.New("held elsewhere")))
	}
	fi, err := f.Stat()
	if err != nil {
		return holdFile{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	return holdFile{f: f, id: fileID{dev: st.Dev, ino: st.Ino}}, nil
}

type fileID struct{ dev, ino uint64 }

// holdFile is an entry's hold file, open and shared-locked.
type holdFile struct {
	f  *os.File
	id fileID
}

// openHold opens the hold file p and takes a shared flock on it without
// waiting: an exclusive holder is removing its entry. The caller closes it,
// or holds it for as long as it uses the entry.
func openHold(p string) (holdFile, error) {
	f, err := os.Open(p)
	if err != nil {
		return holdFile{}, err
	}
	if ok, err := flockNB(f, unix.LOCK_SH); err != nil || !ok {
		f.Close()
		if err == nil {
			err = fmt.Errorf("%s is being removed", p)
		}
		return holdFile{}, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return holdFile{}, err
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Nlink == 0 {
		// Removed, with its entry, between the open and the lock.
		f.Close()
		return holdFile{}, fmt.Errorf("%s was removed", p)
	}
	return holdFile{f: f, id: fileID{dev: st.Dev, ino: st.Ino}}, nil
}

// held keeps, for the life of the process, one open, shared-locked hold file
// for every entry a cache handed out: remove skips an entry whose hold file
// it cannot lock exclusively, so no process removes a rootfs another still
// runs containers on, and the kernel drops the locks when the process exits.
// It is keyed by the file's identity, not its name, so that a cache wiped and
// rebuilt under the same names is held anew.
//
// What is held is a regular file, not the entry's dir: a long-lived fd of a
// host dir in a process that starts containers is one leak away from an
// escape (runc's CVE-2024-21626). The files are close-on-exec besides.
var held = struct {
	sync.Mutex
	files map[fileID]heldEntry
}{files: map[fileID]heldEntry{}}

type heldEntry struct {
	dir string
	f   *os.File
}

// hold keeps h, the hold file of the entry at dir, open for the life of the
// process, or closes it if the process already holds that file. Its mtime
// says the entry was used now: the cache's bound removes the entries used
// least recently first.
func hold(dir string, h holdFile) {
	touch(h.f.Name())
	held.Lock()
	defer held.Unlock()
	if _, ok := held.files[h.id]; ok {
		h.f.Close()
		return
	}
	held.files[h.id] = heldEntry{dir: dir, f: h.f}
}

// TouchHeld marks every entry this process holds as used now: a server
// that stops calls it, so that the entries it used for weeks are not the
// first the cache's bound removes.
func TouchHeld() {
	held.Lock()
	defer held.Unlock()
	for _, e := range held.files {
		touch(e.f.Name())
	}
}

// touch sets p's times to now, if it may: the mtime of a hold file is
// when its entry was last used, and only an approximation is at stake.
func touch(p string) {
	now := time.Now()
	os.Chtimes(p, now, now)
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
