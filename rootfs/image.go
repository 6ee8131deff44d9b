package rootfs

// An image rootfs (MCP_EXEC_ROOTFS_IMAGE) is the filesystem of a container
// image the operator supplies as a local file: a `docker save` tarball or an
// OCI image-layout dir. Nothing is pulled. FlattenImage applies its layers
// (package image), lowest first, into one dir, lays the sandbox's own files
// over it (overlay.go), and caches the result by the image's config digest.
//
// Invariants a maintainer must keep:
//   - An image is data, never code run on the host: nothing in it is executed
//     while flattening (Prepare is the caller's, and runs it sandboxed), and
//     no link in it is followed out of the dir (package image says how).
//   - The flattened tree holds only dirs, regular files and symlinks, owned by
//     the flattening user (root, for a server run as root), readable by
//     everyone (the sandbox is uid 65532, "others"), with no setuid, setgid,
//     sticky (but /tmp's), group- or world-writable bit or file capability. Device
//     nodes, FIFOs and sockets in a layer are skipped: the runtime mounts
//     /dev, and a read-only root has no use for the rest. normalizeTree makes
//     it so again after Prepare.
//   - The sandbox's /etc/passwd, group, hosts, hostname and nsswitch.conf
//     (etcFiles) and its mount points (MountPoints) replace the image's; the
//     image's shadow files go. The rest of the image's /etc stays: it is the
//     image's, not the host's, and its programs need it (ld.so.cache finds
//     python:*-slim's libpython in /usr/local/lib, /etc/alternatives leads to
//     BLAS, /etc/ssl holds the CA certificates).
//   - A cached image is keyed by its config digest (which names every
//     layer's uncompressed digest, checked while flattening) and by what is
//     laid over it (overlayKey); it appears complete or not at all (temp dir
//     + rename), and is never modified. A process holds a shared flock on its
//     <name>.hold file for as long as it lives; a build removes the other
//     images no process holds.
//   - The image's config (Env, Entrypoint, User, WorkingDir) is ignored: the
//     sandbox's environment is an allowlist and its process is fixed.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/rootfs/image"
)

// imageField is how errors name the setting of the image, {Field} for
// the edge to name as the operator sets it (docs/architecture.md).
const imageField = "{RootfsImage}"

// imageFormat is part of every cached image's key (overlayKey). Bump it
// whenever FlattenImage puts something different into the dir (another mode
// rule, another file dropped), so that no server runs on an image flattened
// by an older mcp-exec. etcFiles and MountPoints are in the key themselves.
// v2: group-write stripped too.
const imageFormat = "image-v2"

// imagePrefix starts the name of every cached image:
// image-<config digest hex>-<overlayKey>.
const imagePrefix = "image-"

// overlayKey is a short hex of everything FlattenImage lays over an image:
// a new mount point must not find an old cached image without it.
func overlayKey() string {
	h := sha256.New()
	io.WriteString(h, imageFormat)
	for _, f := range etcFiles {
		fmt.Fprintf(h, "\x00%s\x00%s", f.name, f.content)
	}
	for _, mp := range madeMountPoints() {
		fmt.Fprintf(h, "\x00%s", mp)
	}
	fmt.Fprintf(h, "\x00%s\x00%s\x00%s", PythonPath, strings.Join(imagePythons, ","), strings.Join(imageEtcDropped, ","))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// holdSuffix ends the name of a cached image's hold file.
const holdSuffix = ".hold"

// images is the cache of flattened images in dir:
//
//	image-<hex>-<overlay>/       the flattened rootfs
//	image-<hex>-<overlay>.hold   its hold file
func images(dir string) cache {
	return cache{dir: dir, suffix: holdSuffix}
}

// DefaultImageMaxBytes bounds, when ImageOptions.MaxBytes is 0, both the
// uncompressed bytes read from an image's layers and the bytes written for
// its files: enough for a CUDA + PyTorch image, and a stop for a
// decompression bomb before it fills the disk.
const DefaultImageMaxBytes int64 = 16 << 30

// ImageOptions tune FlattenImage; the zero value is the default.
type ImageOptions struct {
	// Prepare, if not nil, is called on the complete rootfs in its temp dir
	// before it enters the cache, with python's path inside it (for
	// instance to byte-compile the stdlib of an image that ships no .pyc,
	// in a sandbox whose root is dir, writable). What it leaves is cached,
	// with the modes and ownership made safe again afterwards.
	Prepare func(ctx context.Context, dir, python string) error
	// MaxBytes bounds the uncompressed bytes read from the layers, and,
	// separately, the bytes written for files (a sparse file counts its
	// full size). 0 means DefaultImageMaxBytes.
	MaxBytes int64
}

// Image is a flattened image, ready to be the sandbox's root.
type Image struct {
	// Dir is the rootfs: complete, shared, never modified once returned, and
	// kept for as long as the calling process lives.
	Dir string
	// Python is the interpreter's absolute path inside the rootfs
	// (/usr/local/bin/python3 or /usr/bin/python3). PythonPath always
	// names it too: when the image has no /usr/bin/python3, FlattenImage
	// adds it as a symlink.
	Python string
	// PythonVersion is its "3.X", read from the file name it resolves to
	// (python3.12) or the name of its stdlib dir, or "" when neither says.
	// The image's python is never run on the host to ask.
	PythonVersion string
	// Digest is the image's config digest ("sha256:…", Docker's image ID):
	// the same image saved as a tarball or as a layout has the same one.
	Digest string
}

// FlattenImage flattens the image at src into a cached, read-only rootfs dir
// under cacheDir, keyed by the image's config digest, and returns it.
//
// src is what image.Open takes: a `docker save` tarball or an OCI
// image-layout dir, optionally followed by ":REF" to pick one image when it
// holds several.
//
// A warm call reads the tarball's manifest.json and config (or the layout's
// index, manifest and config), never a layer. Several server processes may
// call it at once: the build runs under an flock on cacheDir/.lock (the lock
// Ensure takes, so both may share a cache dir), in a temp dir renamed into
// place. Every error names imageField.
func FlattenImage(ctx context.Context, src, cacheDir string, opts ImageOptions) (Image, error) {
	if src == "" {
		return Image{}, fmt.Errorf("flattening %s: it is empty", imageField)
	}
	if cacheDir == "" {
		return Image{}, fmt.Errorf("flattening %s=%s: no cache dir", imageField, src)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultImageMaxBytes
	}
	if opts.MaxBytes < 0 {
		return Image{}, fmt.Errorf("flattening %s=%s: MaxBytes is %d, want > 0", imageField, src, opts.MaxBytes)
	}
	img, digest, err := image.Open(src)
	if err != nil {
		return Image{}, wrapImageErr(src, err)
	}
	c := cachedImage{cache: images(cacheDir), name: imagePrefix + digest.Hex + "-" + overlayKey(), digest: digest.String(), src: src}

	if im, err := c.lookup(); im.Dir != "" || err != nil {
		return im, wrapImageErr(src, err)
	}
	unlock, err := c.lock(ctx)
	if err != nil {
		return Image{}, wrapImageErr(src, err)
	}
	defer unlock()
	// Another process may have built it while we waited.
	if im, err := c.lookup(); im.Dir != "" || err != nil {
		return im, wrapImageErr(src, err)
	}
	im, err := c.build(ctx, img, opts)
	if err != nil {
		return Image{}, wrapImageErr(src, err)
	}
	// What no process runs on goes now.
	c.collect(c.others())
	return im, nil
}

func wrapImageErr(src string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("flattening %s=%s: %w", imageField, src, err)
}

// cachedImage is one image's entry in the cache.
type cachedImage struct {
	cache
	name, digest string
	src          string // what the operator named, for the about file
}

// lookup returns the cached image when it is complete, and holds it for the
// life of the process. A dir without its hold file was not made by
// FlattenImage; it is reported, never replaced behind the user's back.
func (c cachedImage) lookup() (Image, error) {
	dir := filepath.Join(c.dir, c.name)
	h, err := c.open(c.name)
	if err != nil {
		if _, statErr := os.Lstat(dir); statErr == nil && errors.Is(err, fs.ErrNotExist) {
			return Image{}, fmt.Errorf("cache entry %s has no %s; remove it to flatten the image again", dir, holdSuffix)
		}
		return Image{}, nil
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		// A killed build or removal; the build under the lock redoes it.
		h.f.Close()
		return Image{}, nil
	}
	im, err := describeImage(dir, c.digest)
	if err != nil {
		h.f.Close()
		return Image{}, fmt.Errorf("cached image %s is damaged (%w); remove it to flatten the image again", dir, err)
	}
	hold(dir, h)
	return im, nil
}

// describeImage finds what Image says about a flattened dir.
func describeImage(dir, digest string) (Image, error) {
	py, version, err := findImagePython(dir)
	if err != nil {
		return Image{}, err
	}
	if err := Check(dir); err != nil {
		return Image{}, err
	}
	return Image{Dir: dir, Python: py, PythonVersion: version, Digest: digest}, nil
}

// build flattens img into the cache. The caller holds the cache lock.
func (c cachedImage) build(ctx context.Context, img v1.Image, opts ImageOptions) (_ Image, retErr error) {
	if err := c.tidy(); err != nil {
		return Image{}, err
	}
	dir := filepath.Join(c.dir, c.name)
	holdPath := dir + holdSuffix
	if _, err := os.Lstat(dir); err == nil {
		return Image{}, fmt.Errorf("cache entry %s is in the way; remove it to flatten the image again", dir)
	}
	// A hold file without its image is what a killed build left.
	if err := os.Remove(holdPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Image{}, err
	}

	tmp, err := c.stage(c.name)
	if err != nil {
		return Image{}, err
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	py, err := flattenInto(ctx, img, tmp, opts)
	if err != nil {
		return Image{}, err
	}

	h, err := c.create(c.name)
	if err != nil {
		return Image{}, err
	}
	defer func() {
		if retErr != nil {
			h.f.Close()
			os.Remove(holdPath)
		}
	}()
	if err := c.publish(tmp, c.name); err != nil {
		return Image{}, err
	}
	im, err := describeImage(dir, c.digest)
	if err != nil {
		return Image{}, err
	}
	if im.Python != py {
		return Image{}, fmt.Errorf("python3 moved from %s to %s while caching", py, im.Python)
	}
	hold(dir, h)
	builds.Add(1)
	c.describe(c.name, About{Image: c.src, Digest: c.digest, PythonVersion: im.PythonVersion, Built: time.Now().UTC()})
	return im, nil
}

// others lists the cached images but c's.
func (c cachedImage) others() []string {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), holdSuffix)
		if ok && strings.HasPrefix(name, imagePrefix) && name != c.name {
			names = append(names, name)
		}
	}
	return names
}

// flattenInto makes root, an empty dir, the image's rootfs, and returns the
// path of its python3 inside.
func flattenInto(ctx context.Context, img v1.Image, root string, opts ImageOptions) (string, error) {
	// Nobody else may even look in while the layers' content lands.
	if err := os.Chmod(root, 0o700); err != nil {
		return "", err
	}
	if err := image.Unpack(ctx, img, root, opts.MaxBytes); err != nil {
		return "", err
	}
	py, _, err := findImagePython(root)
	if err != nil {
		return "", err
	}
	if err := layOver(root, py); err != nil {
		return "", err
	}
	if err := normalizeTree(ctx, root); err != nil {
		return "", err
	}
	if opts.Prepare != nil {
		if err := opts.Prepare(ctx, root, py); err != nil {
			return "", fmt.Errorf("preparing the flattened image: %w", err)
		}
		// Whatever Prepare left, the cached tree keeps the invariants.
		if err := layOver(root, py); err != nil {
			return "", err
		}
		if err := normalizeTree(ctx, root); err != nil {
			return "", err
		}
	}
	if err := Check(root); err != nil {
		return "", err
	}
	return py, nil
}

// PlaceBytecode puts each file compiled under a PYTHONPYCACHEPREFIX (its
// path relative to the prefix, and its bytes) where the interpreter looks
// without one, in the rootfs at root: <prefix>/a/b/m.cpython-312.pyc is
// a/b/__pycache__/m.cpython-312.pyc, next to a/b/m.py. It returns how
// many it placed; a file beside no source file of root is passed over.
// (The compiler ran in a sandbox: what it returned is written as data,
// never through a link of the rootfs.)
func PlaceBytecode(root string, files iter.Seq2[string, []byte]) (int, error) {
	n := 0
	for path, data := range files {
		d, name := filepath.Split(path)
		if !strings.HasSuffix(name, ".pyc") || strings.Count(name, ".") < 2 {
			continue
		}
		src := filepath.Join("/", d, name[:strings.IndexByte(name, '.')]+".py")
		srcPath, err := securejoin.SecureJoin(root, src)
		if err != nil {
			return n, err
		}
		if fi, err := os.Lstat(srcPath); err != nil || !fi.Mode().IsRegular() {
			continue // not beside a source file of the image
		}
		cache := filepath.Join(filepath.Dir(srcPath), "__pycache__")
		if err := os.Mkdir(cache, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return n, fmt.Errorf("placing bytecode: %w", err)
		}
		if fi, err := os.Lstat(cache); err != nil || !fi.IsDir() {
			continue
		}
		out, err := os.OpenFile(filepath.Join(cache, name), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o644)
		if err != nil {
			return n, fmt.Errorf("placing bytecode: %w", err)
		}
		_, werr := out.Write(data)
		if cerr := out.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return n, fmt.Errorf("placing bytecode: %w", werr)
		}
		n++
	}
	return n, nil
}
