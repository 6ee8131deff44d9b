package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
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
// inotify does not see every change: a write through a shared mapping
// of a file, or a filesystem mounted over a file or dir of the tree. So
// the mount table is checked too whenever the kernel says it changed
// (before each call), and every file's inode, size and change time are
// compared with what they were at Watch, every rescanEvery in the
// background (a write through a mapping moves the change time).
//
// What it cannot see: a write through a hard link from outside the tree
// (a built rootfs has none: its files are copies) between scans. A change
// made while no server watched is the contents file's to see: a cached
// generation is compared with its build's stamps when a server starts on
// it (contents.go); an operator's MCP_EXEC_ROOTFS is the operator's.
type Watcher struct {
	mu     sync.Mutex
	fd     int              // inotify, non-blocking; -1 once closed
	dirs   map[int32]string // watch descriptor → dir
	roots  []string         // the dirs Watch was given
	first  *ChangedError    // the first change seen, nil while none
	mounts int              // /proc/self/mountinfo, polled for changes; -1: none
	inMnt  map[string]bool  // mount points under the roots at Watch
	files  map[string]fileStamp
	stop   chan struct{}
	done   chan struct{}
}

// fileStamp is what a change to a file moves: its inode (replaced), its
// size, its change time (written, through a mapping too, or chmod'ed).
type fileStamp struct {
	ino, ctimeNs uint64
	size         int64
}

// rescanEvery is how often every file is stat'ed again. A variable for
// tests.
var rescanEvery = 30 * time.Second

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
	w := &Watcher{fd: fd, mounts: -1, dirs: map[int32]string{}, roots: dirs, files: map[string]fileStamp{},
		stop: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			unix.Close(fd)
			if w.mounts >= 0 {
				unix.Close(w.mounts)
			}
		}
	}()
	for _, root := range dirs {
		if err := w.add(root); err != nil {
			return nil, fmt.Errorf("watching the rootfs for changes: %w", err)
		}
	}
	// A raw descriptor: one Go's poller held would have its change events
	// taken by the poller's own epoll (each poll of mountinfo resets it).
	if w.mounts, err = unix.Open("/proc/self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("watching the rootfs for changes: %w", err)
	}
	w.inMnt = w.mountsUnder()
	go w.rescan()
	return w, nil
}

// add watches every dir under root and stamps every other entry.
func (w *Watcher) add(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			if st, ok := stamp(p); ok {
				w.files[p] = st
			}
			return nil
		}
		wd, err := unix.InotifyAddWatch(w.fd, p, watchMask)
		if err != nil {
			return fmt.Errorf("%s: %w%s", p, err, limitHint(err))
		}
		w.dirs[int32(wd)] = p
		return nil
	})
}

// stamp is p's fileStamp, as lstat sees it.
func stamp(p string) (fileStamp, bool) {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil {
		return fileStamp{}, false
	}
	return fileStamp{ino: st.Ino, size: st.Size, ctimeNs: uint64(st.Ctim.Nano())}, true
}

// mountsUnder reads the mount table and returns the mount points at or
// below the roots.
func (w *Watcher) mountsUnder() map[string]bool {
	under := map[string]bool{}
	data, err := readAllAt(w.mounts)
	if err != nil {
		return under
	}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMountPath(f[4])
		for _, root := range w.roots {
			if mp == root || strings.HasPrefix(mp, root+"/") {
				under[mp] = true
			}
		}
	}
	return under
}

// readAllAt reads fd from its start to its end.
func readAllAt(fd int) ([]byte, error) {
	var out []byte
	buf := make([]byte, 64<<10)
	for off := int64(0); ; {
		n, err := unix.Pread(fd, buf, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return out, err
		}
		if n == 0 {
			return out, nil
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// checkMounts notes a filesystem newly mounted at or below a root, when
// the kernel says the mount table changed (POLLPRI on mountinfo, reset
// by each poll). w.mu is held.
func (w *Watcher) checkMounts() {
	if w.mounts < 0 || w.first != nil {
		return
	}
	fds := []unix.PollFd{{Fd: int32(w.mounts), Events: unix.POLLPRI}}
	if n, _ := unix.Poll(fds, 0); n <= 0 || fds[0].Revents&(unix.POLLPRI|unix.POLLERR) == 0 {
		return
	}
	for mp := range w.mountsUnder() {
		if !w.inMnt[mp] {
			w.noteAt(mp, "had a filesystem mounted on it")
			return
		}
	}
}

// rescan compares every file's stamp with the one it had at Watch, every
// rescanEvery, until Close or the first change.
func (w *Watcher) rescan() {
	defer close(w.done)
	tick := time.NewTicker(rescanEvery)
	defer tick.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-tick.C:
		}
		if p, what := w.scan(); p != "" {
			w.mu.Lock()
			w.noteAt(p, what)
			w.mu.Unlock()
			return
		}
	}
}

// scan returns a file whose stamp moved since Watch, and how.
func (w *Watcher) scan() (string, string) {
	for p, was := range w.files {
		now, ok := stamp(p)
		switch {
		case !ok:
			return p, "was removed"
		case now.ino != was.ino:
			return p, "was replaced"
		case now != was:
			return p, "was written (its size or change time moved)"
		}
	}
	return "", ""
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
	w.noteAt(filepath.Join(w.dirs[wd], name), describeEvent(mask))
}

// noteAt keeps the first change, of the host path p. w.mu is held.
func (w *Watcher) noteAt(p, what string) {
	if w.first != nil {
		return
	}
	w.first = &ChangedError{Dir: p, Rel: ".", What: what}
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
	w.checkMounts()
	if w.first == nil {
		return nil
	}
	return w.first
}

// Close stops watching.
func (w *Watcher) Close() error {
	w.mu.Lock()
	if w.fd < 0 {
		w.mu.Unlock()
		return nil
	}
	err := unix.Close(w.fd)
	w.fd = -1
	unix.Close(w.mounts)
	w.mounts = -1
	w.mu.Unlock()
	close(w.stop)
	<-w.done
	return err
}
