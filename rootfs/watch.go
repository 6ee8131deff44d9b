package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrChanged is what Watcher.Changed wraps: a file of the rootfs changed
// while a server served it.
var ErrChanged = errors.New("the rootfs changed while the server serves it")

// Watcher notices any change to the files of a served rootfs: the cache's
// or an operator's dir, which every sandbox binds read-only from the host.
// Read-only to the sandbox is not read-only to the host: a file appended
// there (a library, a stdlib module) would run in the next call, unproved
// and unsaid. The kernel reports each change (inotify, on every dir of the
// tree, before the server serves a call), and the server refuses calls
// from then on, naming the path, rather than run on a rootfs nobody proved.
//
// What it cannot see: a write through a hard link from outside the tree
// (a built rootfs has none: its files are copies) and a change made while
// no server watched (the rootfs is proved again at start).
type Watcher struct {
	mu    sync.Mutex
	fd    int              // non-blocking; -1 once closed
	dirs  map[int32]string // watch descriptor → dir
	roots []string         // the dirs Watch was given
	first *ChangedError    // the first change seen, nil while none
}

// watchMask is every event that says a dir or a file in it changed.
const watchMask = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CLOSE_WRITE | unix.IN_CREATE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF |
	unix.IN_DONT_FOLLOW | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// Watch starts watching every dir under each of dirs (symlinks are not
// followed). It fails when the kernel will not watch them all: an
// unwatched rootfs could change unseen.
func Watch(dirs ...string) (_ *Watcher, retErr error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("watching the rootfs for changes: %w%s", err, limitHint(err))
	}
	w := &Watcher{fd: fd, dirs: map[int32]string{}, roots: dirs}
	defer func() {
		if retErr != nil {
			unix.Close(fd)
		}
	}()
	for _, root := range dirs {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			wd, err := unix.InotifyAddWatch(fd, p, watchMask)
			if err != nil {
				return fmt.Errorf("%s: %w%s", p, err, limitHint(err))
			}
			w.dirs[int32(wd)] = p
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("watching the rootfs for changes: %w", err)
		}
	}
	return w, nil
}

// limitHint names the kernel's limit an inotify error hit.
func limitHint(err error) string {
	switch {
	case errors.Is(err, unix.ENOSPC):
		return " (the kernel's limit on watches: raise sysctl fs.inotify.max_user_watches)"
	case errors.Is(err, unix.EMFILE):
		return " (the kernel's limit on inotify instances: raise sysctl fs.inotify.max_user_instances)"
	}
	return ""
}

// drain reads what the kernel queued, without waiting: each change is
// queued by the write that made it, so a change made before a call is
// seen by the Changed that comes before it. w.mu is held.
func (w *Watcher) drain() {
	var buf [16 << 10]byte
	for w.fd >= 0 {
		n, err := unix.Read(w.fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if n <= 0 || err != nil {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
			off += unix.SizeofInotifyEvent + int(ev.Len)
			w.note(ev.Wd, ev.Mask, name)
		}
	}
}

// note keeps the first change. w.mu is held.
func (w *Watcher) note(wd int32, mask uint32, name string) {
	if w.first != nil {
		return
	}
	if mask&unix.IN_Q_OVERFLOW != 0 {
		w.first = &ChangedError{Dir: w.roots[0], What: "changed more than the kernel could queue"}
		return
	}
	p := filepath.Join(w.dirs[wd], name)
	w.first = &ChangedError{Dir: p, Rel: ".", What: describeEvent(mask)}
	for _, root := range w.roots {
		if rel, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(rel, "..") {
			w.first.Dir, w.first.Rel = root, rel
			break
		}
	}
}

// describeEvent says what an event's mask means.
func describeEvent(mask uint32) string {
	switch {
	case mask&(unix.IN_MODIFY|unix.IN_CLOSE_WRITE) != 0:
		return "was written"
	case mask&unix.IN_ATTRIB != 0:
		return "had its mode, owner, times or links changed"
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		return "was created"
	case mask&(unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
		return "was removed or renamed"
	case mask&(unix.IN_UNMOUNT|unix.IN_IGNORED) != 0:
		return "is no longer watched (unmounted or removed)"
	}
	return fmt.Sprintf("changed (inotify mask %#x)", mask)
}

// ChangedError names the first change a Watcher saw.
type ChangedError struct {
	// Dir is the watched dir the change is under, Rel the changed path
	// relative to it ("." for Dir itself; "" when the kernel could not say).
	Dir, Rel string
	// What happened to it.
	What string
}

func (e *ChangedError) Error() string {
	return fmt.Sprintf("%v: %s %s", ErrChanged, filepath.Join(e.Dir, e.Rel), e.What)
}

func (e *ChangedError) Unwrap() error { return ErrChanged }

// Changed is nil while no file of the rootfs changed since Watch, else a
// *ChangedError naming the first change. Once changed, a rootfs stays
// changed: only a new start proves it again.
func (w *Watcher) Changed() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.drain()
	if w.first == nil {
		return nil
	}
	return w.first
}

// Close stops watching.
func (w *Watcher) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd < 0 {
		return nil
	}
	err := unix.Close(w.fd)
	w.fd = -1
	return err
}
