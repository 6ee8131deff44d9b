package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
)

// DirMode is the mode of every dir Apply makes: a restrictive one would only
// hide files from the sandbox, which must read all of them.
const DirMode fs.FileMode = 0o755

// FileMode is the mode a file of a rootfs gets, from an image's layer or
// copied from the host: root owns the rootfs and the sandbox (uid 65532,
// "others") must read everything and run what may be run. setuid and setgid
// would be inert under no_new_privs, and group- and world-writable bits
// would let whoever shares the cache's group or uid change what every
// sandbox runs; all go, and so does the sticky bit.
func FileMode(m fs.FileMode) fs.FileMode {
	perm := m.Perm()&^0o022 | 0o004
	if perm&0o111 != 0 {
		perm |= 0o001
	}
	return perm
}

// Apply applies one layer, an uncompressed tar stream, to root, as the
// image's next layer over what root holds: entries replace what is there,
// whiteouts remove what lower layers left. It reads layer to its end, so that
// a digest of what it read covers the tar's padding too, and stops at b's
// limits and when ctx is done.
func Apply(ctx context.Context, root string, layer io.Reader, b *Budget) error {
	a := &applier{ctx: ctx, root: root, budget: b, buf: make([]byte, 1<<20), created: map[string]bool{}}
	r := newReadAhead(countingReader{ctx: ctx, b: b, r: layer}, 4, 1<<20)
	defer r.stop()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := a.entry(tr, hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	_, err := io.CopyBuffer(io.Discard, r, a.buf)
	return err
}

// applier applies one layer to root.
type applier struct {
	ctx    context.Context
	root   string
	budget *Budget
	buf    []byte
	// created holds the host paths this layer created or replaced, and
	// their parents: an opaque whiteout removes only what lower layers
	// left in its dir.
	created map[string]bool
	// lastDir is the image dir mkdirAll resolved last, to lastReal.
	lastDir, lastReal string
}

// entry applies one tar entry: a whiteout, or what create makes of its type.
func (a *applier) entry(tr *tar.Reader, hdr *tar.Header) error {
	if err := a.ctx.Err(); err != nil {
		return err
	}
	// Cleaned from "/", ".." stops at the image's root.
	p := path.Clean("/" + hdr.Name)
	if p == "/" {
		return nil
	}
	dir, base := path.Split(p)
	if strings.HasPrefix(base, whiteoutPrefix) {
		return a.whiteoutEntry(dir, base)
	}
	create := a.creator(tr, hdr)
	if create == nil {
		// Devices, FIFOs and anything unknown: see the invariants.
		return nil
	}
	parent, err := a.mkdirAll(dir)
	if err != nil {
		return err
	}
	target := filepath.Join(parent, base)
	if err := create(target); err != nil {
		return err
	}
	a.markCreated(target)
	return nil
}

// creator returns what makes hdr's entry at its host path, or nil for a type
// that is skipped.
func (a *applier) creator(tr *tar.Reader, hdr *tar.Header) func(target string) error {
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse, '\x00':
		return func(target string) error { return a.file(tr, hdr, target) }
	case tar.TypeDir:
		return a.dir
	case tar.TypeSymlink:
		return func(target string) error { return a.symlink(hdr.Linkname, target) }
	case tar.TypeLink:
		return func(target string) error { return a.hardlink(hdr.Linkname, target) }
	default:
		return nil
	}
}

// dir makes target a dir, keeping one a lower layer made.
func (a *applier) dir(target string) error {
	// A dir "a/b" where a/b was a link resolves differently from now on.
	a.lastDir = ""
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
		return nil
	}
	if err := a.clear(target); err != nil {
		return err
	}
	return os.Mkdir(target, DirMode)
}

// symlink makes target a link to linkname, which is never followed here: it
// is resolved inside root whenever a later name passes through it.
func (a *applier) symlink(linkname, target string) error {
	// A dir "a/b" where a/b is now a link resolves differently from now on.
	a.lastDir = ""
	if err := a.clear(target); err != nil {
		return err
	}
	return os.Symlink(linkname, target)
}

// hardlink links target to the image path linkname, resolved inside root.
func (a *applier) hardlink(linkname, target string) error {
	lp := path.Clean("/" + linkname)
	ldir, lbase := path.Split(lp)
	real, err := securejoin.SecureJoin(a.root, ldir)
	if err != nil {
		return err
	}
	src := filepath.Join(real, lbase)
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("hard link to %s: no such file in the image", linkname)
	}
	if fi.IsDir() {
		return fmt.Errorf("hard link to %s: a dir", linkname)
	}
	if src == target {
		return nil
	}
	if err := a.clear(target); err != nil {
		return err
	}
	// link(2) does not follow src when it is a symlink.
	return os.Link(src, target)
}

// file writes a regular file's content to target, with FileMode of its mode
// and its mtime.
func (a *applier) file(tr *tar.Reader, hdr *tar.Header, target string) (retErr error) {
	if hdr.Size < 0 {
		return fmt.Errorf("size %d", hdr.Size)
	}
	if err := a.budget.wrote.take(hdr.Size); err != nil {
		return err
	}
	fd, err := a.create(target)
	if err != nil {
		return err
	}
	defer func() {
		if err := unix.Close(fd); err != nil && retErr == nil {
			retErr = &os.PathError{Op: "close", Path: target, Err: err}
		}
	}()
	if _, err := io.CopyBuffer(fdWriter(fd), tr, a.buf); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(FileMode(hdr.FileInfo().Mode()))); err != nil {
		return &os.PathError{Op: "chmod", Path: target, Err: err}
	}
	// A .pyc records its source's mtime: a .py newer than in the image
	// would make every import recompile, unable to cache it on a read-only
	// root.
	ts := unix.NsecToTimespec(hdr.ModTime.UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, target, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimensat", Path: target, Err: err}
	}
	return nil
}

// create creates target as a new file, open for writing. Never into an
// existing file: a hard link to it elsewhere would change too. Most names
// are new; what is there is removed only when the create says so, which
// saves an lstat per file.
func (a *applier) create(target string) (int, error) {
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Open(target, flags, 0o600)
	if errors.Is(err, unix.EEXIST) {
		if err := a.clear(target); err != nil {
			return -1, err
		}
		fd, err = unix.Open(target, flags, 0o600)
	}
	if err != nil {
		return -1, &os.PathError{Op: "create", Path: target, Err: err}
	}
	return fd, nil
}

// fdWriter writes to a file descriptor: an *os.File costs a poller
// registration and an fstat per file, which shows in a layer of many small
// files.
type fdWriter int

func (w fdWriter) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := unix.Write(int(w), p[n:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return n, err
		}
		n += m
	}
	return n, nil
}

// mkdirAll resolves dir, an image path, inside root as a chrooted process
// would, creates what is missing of it, and returns its host path. Entries
// come grouped by dir, so the last answer is kept until something is
// removed or a symlink or dir appears, which may change it.
func (a *applier) mkdirAll(dir string) (string, error) {
	if a.lastDir != "" && dir == a.lastDir {
		return a.lastReal, nil
	}
	real, err := securejoin.SecureJoin(a.root, dir)
	if err != nil {
		return "", err
	}
	// SecureJoin resolved every symlink there is, so MkdirAll follows
	// none; nothing else writes in root.
	if fi, err := os.Lstat(real); err != nil || !fi.IsDir() {
		if err := os.MkdirAll(real, DirMode); err != nil {
			return "", err
		}
		a.markCreated(real)
	}
	a.lastDir, a.lastReal = dir, real
	return real, nil
}

// markCreated records p and its parents as this layer's.
func (a *applier) markCreated(p string) {
	for ; p != a.root && len(p) > len(a.root); p = filepath.Dir(p) {
		if a.created[p] {
			return
		}
		a.created[p] = true
	}
}

// clear removes whatever is at target (a host path whose parent is resolved),
// without following it: a symlink goes, not what it points to.
func (a *applier) clear(target string) error {
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	a.lastDir = ""
	return os.RemoveAll(target)
}
