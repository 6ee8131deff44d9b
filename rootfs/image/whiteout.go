package image

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"
)

// The names by which a layer removes what lower layers left (the OCI image
// spec's whiteouts, AUFS's before it): .wh.NAME removes NAME, .wh..wh..opq
// empties its dir, and any other .wh..wh.* is AUFS bookkeeping
// (.wh..wh.plnk), no file of the image. None is ever made.
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// whiteoutEntry applies the whiteout base, in the image dir dir.
func (a *applier) whiteoutEntry(dir, base string) error {
	switch {
	case base == whiteoutOpaque:
		return a.opaque(dir)
	case strings.HasPrefix(base, whiteoutMeta):
		return nil
	default:
		return a.whiteout(dir, strings.TrimPrefix(base, whiteoutPrefix))
	}
}

// whiteout removes name, in the image dir dir, as a lower layer left it.
func (a *applier) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." {
		return nil
	}
	real, err := securejoin.SecureJoin(a.root, dir)
	if err != nil {
		return err
	}
	target := filepath.Join(real, name)
	if a.created[target] {
		return nil
	}
	return a.clear(target)
}

// opaque empties the image dir dir of what lower layers left in it.
func (a *applier) opaque(dir string) error {
	a.lastDir = ""
	real, err := securejoin.SecureJoin(a.root, dir)
	if err != nil {
		return err
	}
	if err := a.removeLower(real); err != nil {
		return err
	}
	a.markCreated(real)
	return nil
}

// removeLower removes, below the host dir dir, what this layer did not
// make.
func (a *applier) removeLower(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		switch {
		case !a.created[p]:
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		case e.IsDir():
			if err := a.removeLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}
