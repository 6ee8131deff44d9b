package rootfs

// What FlattenImage lays over an image's layers, and the tree it leaves: the
// sandbox's own files, where the image's would be, and modes and owners safe
// for a rootfs every server and sandbox shares, whatever the layers or
// Prepare left.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/rootfs/image"
)

// imagePythons are where an image's python3 is looked for, in the order of a
// Debian PATH: python:*-slim keeps it in /usr/local/bin, a distribution's
// image in /usr/bin.
var imagePythons = []string{"/usr/local/bin/python3", "/usr/bin/python3"}

// imageEtcDropped are the image's /etc files that go with its passwd and
// group: they describe accounts that no longer exist, and the shadow files
// would become readable by the sandbox.
var imageEtcDropped = []string{"shadow", "gshadow", "shadow-", "gshadow-", "passwd-", "group-"}

// findImagePython returns the path of python3 inside root, and its "3.X".
func findImagePython(root string) (py, version string, err error) {
	for _, c := range imagePythons {
		real, err := securejoin.SecureJoin(root, c)
		if err != nil {
			continue
		}
		fi, err := os.Lstat(real)
		if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
			continue
		}
		return c, pythonVersion(root, c, real), nil
	}
	return "", "", fmt.Errorf("the image has no python3: neither %s is an executable file", strings.Join(imagePythons, " nor "))
}

// pythonVersion reads "3.X" from the name python3 resolves to
// (/usr/local/bin/python3.12), or else from the stdlib dir next to it
// (/usr/local/lib/python3.12), when there is exactly one.
func pythonVersion(root, py, real string) string {
	if v, ok := versionOf(filepath.Base(real), "python"); ok {
		return v
	}
	lib, err := securejoin.SecureJoin(root, path.Join(path.Dir(path.Dir(py)), "lib"))
	if err != nil {
		return ""
	}
	entries, err := os.ReadDir(lib)
	if err != nil {
		return ""
	}
	var found []string
	for _, e := range entries {
		if v, ok := versionOf(e.Name(), "python"); ok && e.IsDir() {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		return ""
	}
	return found[0]
}

// versionOf parses prefix + "3.X" into "3.X".
func versionOf(name, prefix string) (string, bool) {
	v, ok := strings.CutPrefix(name, prefix)
	if !ok {
		return "", false
	}
	major, minor, ok := strings.Cut(v, ".")
	if !ok || major != "3" {
		return "", false
	}
	if _, err := strconv.ParseUint(minor, 10, 16); err != nil {
		return "", false
	}
	return v, true
}

// layOver puts the sandbox's own files over the image: /etc's identity files,
// the mount points, and PythonPath when the image has none.
func layOver(root, py string) error {
	etc := filepath.Join(root, "etc")
	if fi, err := os.Lstat(etc); err == nil && !fi.IsDir() {
		if err := os.Remove(etc); err != nil {
			return fmt.Errorf("replacing /etc: %w", err)
		}
	}
	if err := os.Mkdir(etc, image.DirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating /etc: %w", err)
	}
	for _, name := range imageEtcDropped {
		if err := os.RemoveAll(filepath.Join(etc, name)); err != nil {
			return fmt.Errorf("removing /etc/%s: %w", name, err)
		}
	}
	for _, f := range etcFiles {
		p := filepath.Join(etc, f.name)
		// Whatever the image has there, link or hard link, goes; it is
		// never written through.
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("replacing /etc/%s: %w", f.name, err)
		}
		if err := writeNewFile(p, f.content, 0o644); err != nil {
			return fmt.Errorf("replacing /etc/%s: %w", f.name, err)
		}
	}
	for _, mp := range madeMountPoints() {
		if err := makeImageMountPoint(root, mp); err != nil {
			return err
		}
	}
	if _, err := resolveIn(root, PythonPath); err == nil || py == PythonPath {
		return nil
	}
	// No /usr/bin/python3 (python:*-slim): Check, MCP_EXEC_ROOTFS and
	// code that runs it by that path all expect one.
	bin, err := securejoin.SecureJoin(root, path.Dir(PythonPath))
	if err != nil {
		return fmt.Errorf("linking %s: %w", PythonPath, err)
	}
	if err := os.MkdirAll(bin, image.DirMode); err != nil {
		return fmt.Errorf("linking %s: %w", PythonPath, err)
	}
	link := filepath.Join(bin, path.Base(PythonPath))
	// A dangling link there pointed nowhere; it goes.
	if err := os.RemoveAll(link); err != nil {
		return fmt.Errorf("linking %s: %w", PythonPath, err)
	}
	if err := os.Symlink(py, link); err != nil {
		return fmt.Errorf("linking %s: %w", PythonPath, err)
	}
	return nil
}

func writeNewFile(p, content string, mode fs.FileMode) (retErr error) {
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	defer func() {
		if err := f.Close(); err != nil && retErr == nil {
			retErr = err
		}
	}()
	if _, err := io.WriteString(f, content); err != nil {
		return err
	}
	return f.Chmod(mode)
}

// makeImageMountPoint makes mp an empty dir, whatever the image has there
// (python images ship a /tmp, some a /dev with nodes), with the mode
// build.go's skeleton gives it. Its parents must be real dirs: the runtime
// mounts onto the path as it reads it.
func makeImageMountPoint(root, mp string) error {
	cur := root
	parts := splitPath(mp)
	for i, c := range parts {
		cur = filepath.Join(cur, c)
		if i == len(parts)-1 {
			break
		}
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(cur, image.DirMode); err != nil {
				return fmt.Errorf("creating mount point %s: %w", mp, err)
			}
		case err != nil:
			return fmt.Errorf("creating mount point %s: %w", mp, err)
		case !fi.IsDir():
			return fmt.Errorf("creating mount point %s: the image has a %v at %s", mp, fi.Mode().Type(), strings.TrimPrefix(cur, root))
		}
	}
	if err := os.RemoveAll(cur); err != nil {
		return fmt.Errorf("creating mount point %s: %w", mp, err)
	}
	if err := os.Mkdir(cur, image.DirMode); err != nil {
		return fmt.Errorf("creating mount point %s: %w", mp, err)
	}
	mode := image.DirMode
	if mp == "/tmp" {
		mode = 0o777 | fs.ModeSticky
	}
	if err := os.Chmod(cur, mode); err != nil {
		return fmt.Errorf("creating mount point %s: %w", mp, err)
	}
	return nil
}

// normalizeTree enforces the tree's invariants on everything in root: what
// the layers made, and what Prepare may have added. It removes special files,
// gives files to the flattening user (when root) and makes every mode safe.
func normalizeTree(ctx context.Context, root string) error {
	asRoot := os.Geteuid() == 0
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if p == root {
			// Last: the tree is opened to others once it is safe.
			return nil
		}
		t := d.Type()
		if !t.IsDir() && !t.IsRegular() && t&fs.ModeSymlink == 0 {
			return os.Remove(p)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		if asRoot && (st.Uid != uid || st.Gid != gid) {
			if err := os.Lchown(p, int(uid), int(gid)); err != nil {
				return err
			}
		}
		var want fs.FileMode
		switch {
		case t&fs.ModeSymlink != 0:
			return nil
		case t.IsDir():
			want = image.DirMode
			if p == filepath.Join(root, "tmp") {
				want = 0o777 | fs.ModeSticky
			}
		default:
			want = image.FileMode(fi.Mode())
			// A file capability is setuid by another name. Reading
			// first: removing needs CAP_SETFCAP even when there is none.
			if _, err := unix.Lgetxattr(p, "security.capability", nil); err == nil {
				if err := unix.Lremovexattr(p, "security.capability"); err != nil {
					return fmt.Errorf("removing the file capabilities of %s: %w", p, err)
				}
			}
		}
		if fi.Mode()&(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != want {
			return os.Chmod(p, want)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.Chmod(root, image.DirMode)
}
