package rootfs

// An image rootfs (MCP_EXEC_ROOTFS_IMAGE) is the filesystem of a container
// image the operator supplies as a local file: a `docker save` tarball or an
// OCI image-layout dir. Nothing is pulled. FlattenImage applies its layers,
// lowest first, into one dir, lays the sandbox's own files over it, and caches
// the result by the image's config digest.
//
// Invariants a maintainer must keep:
//   - An image is data, never code run on the host: nothing in it is executed
//     while flattening (Prepare is the caller's, and runs it sandboxed), and
//     no link in it is followed out of the dir. A name with "..", and any
//     symlink met on the way to a name, is resolved as a process chrooted
//     into the dir would resolve it (securejoin), which is what Docker's
//     chrooted unpacker and containerd's RootPath do: an absolute link
//     points into the rootfs, never into the host. The last component of a
//     name is never followed: what is there is removed and replaced, never
//     written through.
//   - The flattened tree holds only dirs, regular files and symlinks, owned by
//     the flattening user (root, for a server run as root), readable by
//     everyone (the sandbox is uid 65532, "others"), with no setuid, setgid,
//     sticky (but /tmp's), group- or world-writable bit or file capability. Device
//     nodes, FIFOs and sockets in a layer are skipped: the runtime mounts
//     /dev, and a read-only root has no use for the rest.
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
	"archive/tar"
	"bufio"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// ImageEnv is the variable that names the image; errors name it so that the
// operator knows which setting to fix.
const ImageEnv = "MCP_EXEC_ROOTFS_IMAGE"

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
	for _, mp := range MountPoints() {
		fmt.Fprintf(h, "\x00%s", mp)
	}
	fmt.Fprintf(h, "\x00%s\x00%s\x00%s", PythonPath, strings.Join(imagePythons, ","), strings.Join(imageEtcDropped, ","))
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// holdSuffix ends the name of the file a process holding a cached image keeps
// shared-locked.
const holdSuffix = ".hold"

// DefaultImageMaxBytes bounds, when ImageOptions.MaxBytes is 0, both the
// uncompressed bytes read from an image's layers and the bytes written for
// its files: enough for a CUDA + PyTorch image, and a stop for a
// decompression bomb before it fills the disk.
const DefaultImageMaxBytes int64 = 16 << 30

// OCI annotations a layout's index names its images by. Skopeo and
// `podman save --format oci-dir` write the first (with the tag alone,
// "3.12-slim"); containerd and Docker 25+ also write the second (with the
// full reference).
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

// imagePythons are where an image's python3 is looked for, in the order of a
// Debian PATH: python:*-slim keeps it in /usr/local/bin, a distribution's
// image in /usr/bin.
var imagePythons = []string{"/usr/local/bin/python3", "/usr/bin/python3"}

// imageEtcDropped are the image's /etc files that go with its passwd and
// group: they describe accounts that no longer exist, and the shadow files
// would become readable by the sandbox.
var imageEtcDropped = []string{"shadow", "gshadow", "shadow-", "gshadow-", "passwd-", "group-"}

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
// src is a `docker save` tarball or an OCI image-layout dir, optionally
// followed by ":REF" to pick one image when it holds several: a repo tag of
// the tarball ("python:3.12-slim") or a layout's ref-name annotation
// ("3.12-slim", or the full reference containerd writes). The longest prefix
// of src that exists is the path. A layout entry that is an index for several
// platforms yields the linux/GOARCH one.
//
// A warm call reads the tarball's manifest.json and config (or the layout's
// index, manifest and config), never a layer. Several server processes may
// call it at once: the build runs under an flock on cacheDir/.lock (the lock
// Ensure takes, so both may share a cache dir), in a temp dir renamed into
// place. Every error names ImageEnv.
func FlattenImage(ctx context.Context, src, cacheDir string, opts ImageOptions) (Image, error) {
	if src == "" {
		return Image{}, fmt.Errorf("flattening %s: it is empty", ImageEnv)
	}
	if cacheDir == "" {
		return Image{}, fmt.Errorf("flattening %s=%s: no cache dir", ImageEnv, src)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultImageMaxBytes
	}
	if opts.MaxBytes < 0 {
		return Image{}, fmt.Errorf("flattening %s=%s: MaxBytes is %d, want > 0", ImageEnv, src, opts.MaxBytes)
	}
	img, digest, err := openImage(src)
	if err != nil {
		return Image{}, wrapImageErr(src, err)
	}
	name := imagePrefix + digest.Hex + "-" + overlayKey()
	c := imageCache{dir: cacheDir, name: name, digest: digest.String()}

	if im, err := c.lookup(); im.Dir != "" || err != nil {
		return im, wrapImageErr(src, err)
	}
	if err := makeImageCacheDir(cacheDir); err != nil {
		return Image{}, wrapImageErr(src, err)
	}
	unlock, err := lockImageCache(ctx, cacheDir)
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
	// What no process runs on goes now; a failure costs only disk, and the
	// next build retries.
	collectImages(cacheDir, name)
	return im, nil
}

func wrapImageErr(src string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("flattening %s=%s: %w", ImageEnv, src, err)
}

// openImage opens the image src names and returns it with its config digest,
// checked against the config's content.
func openImage(src string) (v1.Image, v1.Hash, error) {
	p, ref, err := splitImageRef(src)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	var img v1.Image
	switch {
	case fi.IsDir():
		img, err = openLayout(p, ref)
	case fi.Mode().IsRegular():
		img, err = openTarball(p, ref)
	default:
		err = fmt.Errorf("%s is a %v, not a docker save tarball nor an OCI image-layout dir", p, fi.Mode().Type())
	}
	if err != nil {
		return nil, v1.Hash{}, err
	}

	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading the image's config: %w", err)
	}
	digest, err := img.ConfigName()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading the image's config: %w", err)
	}
	// The cache trusts the digest for everything below it; a layout's
	// manifest states it, so it is checked against what it names.
	sum := sha256.Sum256(raw)
	if digest.Algorithm != "sha256" || digest.Hex != hex.EncodeToString(sum[:]) {
		return nil, v1.Hash{}, fmt.Errorf("the image's config does not match its digest %s (sha256:%x): the image is corrupt", digest, sum)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading the image's config: %w", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, v1.Hash{}, fmt.Errorf("the image is for %s, not linux", cfg.OS)
	}
	if cfg.Architecture != "" && cfg.Architecture != goruntime.GOARCH {
		return nil, v1.Hash{}, fmt.Errorf("the image is for %s, this host runs %s", cfg.Architecture, goruntime.GOARCH)
	}
	return img, digest, nil
}

// splitImageRef splits src into an existing path and the ref after it: src
// itself when it exists, else its longest prefix before a ':' that does.
func splitImageRef(src string) (p, ref string, err error) {
	if _, err := os.Lstat(src); err == nil {
		return src, "", nil
	} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, unix.ENOTDIR) {
		return "", "", err
	}
	for i := strings.LastIndexByte(src, ':'); i > 0; i = strings.LastIndexByte(src[:i], ':') {
		if _, err := os.Lstat(src[:i]); err == nil && i+1 < len(src) {
			return src[:i], src[i+1:], nil
		}
	}
	return "", "", fmt.Errorf("%s does not exist", src)
}

// openTarball opens a `docker save` tarball (the format of Docker up to 24,
// and Docker 25+'s, which adds an OCI index next to manifest.json).
func openTarball(p, ref string) (v1.Image, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(p) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, notATarball(p, err)
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%s holds no image", p)
	}
	var all []string
	for _, d := range m {
		if len(d.RepoTags) == 0 {
			all = append(all, "(untagged "+d.Config+")")
		}
		all = append(all, d.RepoTags...)
	}
	if ref == "" {
		if len(m) > 1 {
			return nil, fmt.Errorf("%s holds %d images: %s; name one as %s:TAG", p, len(m), strings.Join(all, ", "), p)
		}
		img, err := tarball.ImageFromPath(p, nil)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", p, err)
		}
		return img, nil
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		return nil, fmt.Errorf("%q is not a tag: %w", ref, err)
	}
	found := false
	for _, d := range m {
		for _, t := range d.RepoTags {
			if rt, err := name.NewTag(t); err == nil && rt.Name() == tag.Name() {
				found = true
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("%s holds no image tagged %s; it holds %s", p, ref, strings.Join(all, ", "))
	}
	img, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	return img, nil
}

// notATarball explains why p is not a `docker save` tarball, recognizing the
// two mistakes a user makes most: a compressed one, and an OCI archive.
func notATarball(p string, cause error) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		return fmt.Errorf("%s is gzip-compressed; give the uncompressed `docker save` tarball (gunzip it)", p)
	case len(magic) == 4 && string(magic) == "\x28\xb5\x2f\xfd":
		return fmt.Errorf("%s is zstd-compressed; give the uncompressed `docker save` tarball", p)
	}
	tr := tar.NewReader(br)
	for range 64 {
		hdr, err := tr.Next()
		if err != nil {
			break
		}
		if path.Clean(hdr.Name) == "oci-layout" {
			return fmt.Errorf("%s is an OCI archive, not a `docker save` tarball; unpack it (mkdir DIR && tar -xf %s -C DIR) and name DIR", p, p)
		}
	}
	return fmt.Errorf("%s is not a `docker save` tarball nor an OCI image-layout dir: %w", p, cause)
}

// openLayout opens the image of an OCI image-layout dir, picked by ref when
// its index lists several.
func openLayout(p, ref string) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(p, "oci-layout")); err != nil {
		return nil, fmt.Errorf("%s is a dir but not an OCI image layout (no oci-layout file)", p)
	}
	lp, err := layout.FromPath(p)
	if err != nil {
		return nil, fmt.Errorf("%s is a dir but not an OCI image layout: %w", p, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading %s/index.json: %w", p, err)
	}
	var all []string
	var picked []v1.Descriptor
	for _, d := range im.Manifests {
		names := []string{d.Annotations[annotationRefName], d.Annotations[annotationContainerdRef]}
		if names[0] == "" && names[1] == "" {
			all = append(all, "(unnamed "+d.Digest.String()+")")
		} else {
			all = append(all, cmp.Or(names[0], names[1]))
		}
		if ref == "" || slices.Contains(names, ref) {
			picked = append(picked, d)
		}
	}
	switch {
	case len(im.Manifests) == 0:
		return nil, fmt.Errorf("%s holds no image", p)
	case ref == "" && len(picked) > 1:
		return nil, fmt.Errorf("%s holds %d images: %s; name one as %s:REF", p, len(picked), strings.Join(all, ", "), p)
	case len(picked) == 0:
		return nil, fmt.Errorf("%s holds no image named %s; it holds %s", p, ref, strings.Join(all, ", "))
	}
	d := picked[0]
	if len(picked) > 1 && !slices.ContainsFunc(picked, func(o v1.Descriptor) bool { return o.Digest != d.Digest }) {
		return nil, fmt.Errorf("%s holds %d different images named %s", p, len(picked), ref)
	}
	switch {
	case d.MediaType.IsImage():
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("reading image %s in %s: %w", d.Digest, p, err)
		}
		return img, nil
	case d.MediaType.IsIndex():
		sub, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, fmt.Errorf("reading index %s in %s: %w", d.Digest, p, err)
		}
		return platformImage(sub, p)
	default:
		return nil, fmt.Errorf("%s: entry %s is a %s, not an image", p, d.Digest, d.MediaType)
	}
}

// platformImage picks linux/GOARCH from a multi-platform index.
func platformImage(idx v1.ImageIndex, p string) (v1.Image, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	var seen []string
	for _, d := range im.Manifests {
		if d.Platform == nil || !d.MediaType.IsImage() {
			continue
		}
		seen = append(seen, d.Platform.OS+"/"+d.Platform.Architecture)
		if d.Platform.OS == "linux" && d.Platform.Architecture == goruntime.GOARCH {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, fmt.Errorf("reading image %s in %s: %w", d.Digest, p, err)
			}
			return img, nil
		}
	}
	return nil, fmt.Errorf("%s has no image for linux/%s, only for %s", p, goruntime.GOARCH, strings.Join(seen, ", "))
}

// imageCache names one image's entries in a cache dir:
//
//	image-<hex>-<overlay>/       the flattened rootfs
//	image-<hex>-<overlay>.hold   shared-locked by every process using it
//	.lock                        the flock every build and removal holds (Ensure's)
//	.building-*, .removing-*     what a killed build or removal left
type imageCache struct {
	dir, name, digest string
}

// lookup returns the cached image when it is complete, and holds it for the
// life of the process. A dir without its hold file was not made by
// FlattenImage; it is reported, never replaced behind the user's back.
func (c imageCache) lookup() (Image, error) {
	dir := filepath.Join(c.dir, c.name)
	f, err := openHold(dir + holdSuffix)
	if err != nil {
		if _, statErr := os.Lstat(dir); statErr == nil && errors.Is(err, fs.ErrNotExist) {
			return Image{}, fmt.Errorf("cache entry %s has no %s; remove it to flatten the image again", dir, holdSuffix)
		}
		return Image{}, nil
	}
	if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
		// A killed build or removal; the build under the lock redoes it.
		f.Close()
		return Image{}, nil
	}
	im, err := describeImage(dir, c.digest)
	if err != nil {
		f.Close()
		return Image{}, fmt.Errorf("cached image %s is damaged (%w); remove it to flatten the image again", dir, err)
	}
	holdImage(dir, f)
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

// openHold opens a hold file and takes a shared flock on it without waiting:
// an exclusive holder is removing its image.
func openHold(p string) (*os.File, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	ok, err := imageFlock(f, unix.LOCK_SH)
	if err == nil && !ok {
		err = fmt.Errorf("%s is being removed", p)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if fi.Sys().(*syscall.Stat_t).Nlink == 0 {
		// Removed, with its image, between the open and the lock.
		f.Close()
		return nil, fmt.Errorf("%s was removed", p)
	}
	return f, nil
}

// heldImages keeps open, for the life of the process, the hold file of every
// image FlattenImage returned, so that no other process removes a rootfs this
// one runs containers on; the kernel drops the locks when the process exits.
// What is held is a regular file, never a dir: a dir fd in a process that
// starts containers is one leak away from an escape (CVE-2024-21626). It is
// keyed by the file's identity, so that a cache wiped and rebuilt under the
// same names is held anew.
var heldImages = struct {
	sync.Mutex
	files map[[2]uint64]heldImage
}{files: map[[2]uint64]heldImage{}}

type heldImage struct {
	dir string
	f   *os.File
}

// holdImage keeps f, dir's hold file, open for the life of the process, or
// closes it if the process already holds that file.
func holdImage(dir string, f *os.File) {
	fi, err := f.Stat()
	if err != nil {
		// Unheld, a later build elsewhere may remove it; never seen.
		f.Close()
		return
	}
	st := fi.Sys().(*syscall.Stat_t)
	id := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
	heldImages.Lock()
	defer heldImages.Unlock()
	if _, ok := heldImages.files[id]; ok {
		f.Close()
		return
	}
	heldImages.files[id] = heldImage{dir: dir, f: f}
}

// build flattens img into the cache. The caller holds the cache lock.
func (c imageCache) build(ctx context.Context, img v1.Image, opts ImageOptions) (_ Image, retErr error) {
	if err := removeImageLeftovers(c.dir); err != nil {
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

	tmp, err := os.MkdirTemp(c.dir, tempPrefix+c.name+"-")
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

	hf, err := os.OpenFile(holdPath, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return Image{}, err
	}
	defer func() {
		if retErr != nil {
			hf.Close()
			os.Remove(holdPath)
		}
	}()
	// Nothing else has the new file open yet: no lock is held elsewhere.
	if ok, err := imageFlock(hf, unix.LOCK_SH); !ok {
		return Image{}, fmt.Errorf("locking %s: %w", holdPath, cmp.Or(err, errors.New("held elsewhere")))
	}
	if err := renameDirNoReplace(tmp, dir); err != nil {
		return Image{}, err
	}
	im, err := describeImage(dir, c.digest)
	if err != nil {
		return Image{}, err
	}
	if im.Python != py {
		return Image{}, fmt.Errorf("python3 moved from %s to %s while caching", py, im.Python)
	}
	holdImage(dir, hf)
	return im, nil
}

// flattenInto makes root, an empty dir, the image's rootfs, and returns the
// path of its python3 inside.
func flattenInto(ctx context.Context, img v1.Image, root string, opts ImageOptions) (string, error) {
	// Nobody else may even look in while the layers' content lands.
	if err := os.Chmod(root, 0o700); err != nil {
		return "", err
	}
	if err := extractLayers(ctx, img, root, opts.MaxBytes); err != nil {
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

// extractLayers applies img's layers to root, lowest first, checking each
// one's uncompressed content against the diff ID its config states.
func extractLayers(ctx context.Context, img v1.Image, root string, maxBytes int64) error {
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the image's config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("reading the image's layers: %w", err)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return fmt.Errorf("the image has %d layers but its config names %d", len(layers), len(cfg.RootFS.DiffIDs))
	}
	x := &extractor{
		ctx:   ctx,
		root:  root,
		read:  budget{max: maxBytes, what: "the image's layers unpack to"},
		wrote: budget{max: maxBytes, what: "the image's files take"},
		buf:   make([]byte, 1<<20),
	}
	for i, l := range layers {
		if err := x.layer(l, cfg.RootFS.DiffIDs[i]); err != nil {
			return fmt.Errorf("applying layer %d of %d (%s): %w", i+1, len(layers), cfg.RootFS.DiffIDs[i], err)
		}
	}
	return nil
}

// budget counts bytes against a limit.
type budget struct {
	max, used int64
	what      string
}

func (b *budget) take(n int64) error {
	b.used += n
	if b.used > b.max {
		return fmt.Errorf("%s more than %d bytes, the limit", b.what, b.max)
	}
	return nil
}

// extractor applies layers to root.
type extractor struct {
	ctx         context.Context
	root        string
	read, wrote budget
	buf         []byte
	// created holds the host paths the current layer created or replaced,
	// and their parents: an opaque whiteout removes only what lower
	// layers left in its dir.
	created map[string]bool
	// lastDir is the image dir mkdirAll resolved last, to lastReal.
	lastDir, lastReal string
}

// countingReader stops a layer at the read budget and when ctx is done, so
// that no layer, however it decompresses, runs unbounded.
type countingReader struct {
	x *extractor
	r io.Reader
}

func (c countingReader) Read(p []byte) (int, error) {
	if err := c.x.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	if berr := c.x.read.take(int64(n)); berr != nil {
		return n, berr
	}
	return n, err
}

func (x *extractor) layer(l v1.Layer, diffID v1.Hash) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	r := newReadAhead(io.TeeReader(countingReader{x: x, r: rc}, h), 4, 1<<20)
	defer r.stop()
	x.created = map[string]bool{}
	x.lastDir = ""
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if err := x.entry(tr, hdr); err != nil {
			return fmt.Errorf("%s: %w", hdr.Name, err)
		}
	}
	// The diff ID covers the tar's padding too.
	if _, err := io.CopyBuffer(io.Discard, r, x.buf); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); diffID.Algorithm != "sha256" || got != diffID.Hex {
		return fmt.Errorf("its content is sha256:%s, not what the image's config says: the image is corrupt", got)
	}
	return nil
}

// readAhead reads r in a goroutine, up to a few chunks ahead of its reader:
// decompressing and hashing a layer then overlap with writing its files, as
// with tar -z's separate gzip. Reading r stops at its first error, which
// Read returns once the chunks before it are read.
type readAhead struct {
	full, free   chan []byte
	done, exited chan struct{}
	err          error // set before full is closed
	cur, back    []byte
}

func newReadAhead(r io.Reader, chunks, size int) *readAhead {
	ra := &readAhead{
		full:   make(chan []byte, chunks),
		free:   make(chan []byte, chunks),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
	for range chunks {
		ra.free <- make([]byte, size)
	}
	go ra.run(r)
	return ra
}

func (ra *readAhead) run(r io.Reader) {
	defer close(ra.exited)
	defer close(ra.full)
	for {
		var buf []byte
		select {
		case buf = <-ra.free:
		case <-ra.done:
			return
		}
		n, err := io.ReadFull(r, buf)
		if n > 0 {
			// There are as many slots as buffers: this never waits.
			ra.full <- buf[:n]
		}
		if err != nil {
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = io.EOF
			}
			ra.err = err
			return
		}
	}
}

func (ra *readAhead) Read(p []byte) (int, error) {
	for len(ra.cur) == 0 {
		if ra.back != nil {
			ra.free <- ra.back[:cap(ra.back)]
			ra.back = nil
		}
		b, ok := <-ra.full
		if !ok {
			return 0, ra.err
		}
		ra.cur, ra.back = b, b
	}
	n := copy(p, ra.cur)
	ra.cur = ra.cur[n:]
	return n, nil
}

// stop ends the goroutine and waits for it, so that what it reads can be
// closed.
func (ra *readAhead) stop() {
	close(ra.done)
	<-ra.exited
}

// entry applies one tar entry.
func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	if err := x.ctx.Err(); err != nil {
		return err
	}
	// Cleaned from "/", ".." stops at the image's root.
	p := path.Clean("/" + hdr.Name)
	if p == "/" {
		return nil
	}
	dir, base := path.Split(p)
	if strings.HasPrefix(base, ".wh.") {
		switch {
		case base == ".wh..wh..opq":
			return x.opaque(dir)
		case strings.HasPrefix(base, ".wh..wh."):
			// AUFS bookkeeping (.wh..wh.plnk), no file of the image.
			return nil
		default:
			return x.whiteout(dir, strings.TrimPrefix(base, ".wh."))
		}
	}

	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse, '\x00':
	case tar.TypeDir, tar.TypeSymlink, tar.TypeLink:
	default:
		// Devices, FIFOs and anything unknown: see the invariants.
		return nil
	}
	parent, err := x.mkdirAll(dir)
	if err != nil {
		return err
	}
	target := filepath.Join(parent, base)
	if hdr.Typeflag == tar.TypeDir || hdr.Typeflag == tar.TypeSymlink {
		// A dir "a/b" where a/b is (or will be) a link resolves
		// differently from now on.
		x.lastDir = ""
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		fi, err := os.Lstat(target)
		if err == nil && fi.IsDir() {
			break
		}
		if err := x.clear(target); err != nil {
			return err
		}
		if err := os.Mkdir(target, 0o755); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := x.clear(target); err != nil {
			return err
		}
		if err := os.Symlink(hdr.Linkname, target); err != nil {
			return err
		}
	case tar.TypeLink:
		if err := x.hardlink(hdr.Linkname, target); err != nil {
			return err
		}
	default:
		if err := x.file(tr, hdr, target); err != nil {
			return err
		}
	}
	x.markCreated(target)
	return nil
}

// mkdirAll resolves dir, an image path, inside root as a chrooted process
// would, creates what is missing of it, and returns its host path. Entries
// come grouped by dir, so the last answer is kept until something is
// removed or a symlink or dir appears, which may change it.
func (x *extractor) mkdirAll(dir string) (string, error) {
	if x.lastDir != "" && dir == x.lastDir {
		return x.lastReal, nil
	}
	real, err := securejoin.SecureJoin(x.root, dir)
	if err != nil {
		return "", err
	}
	// SecureJoin resolved every symlink there is, so MkdirAll follows
	// none; nothing else writes in root.
	if fi, err := os.Lstat(real); err != nil || !fi.IsDir() {
		if err := os.MkdirAll(real, 0o755); err != nil {
			return "", err
		}
		x.markCreated(real)
	}
	x.lastDir, x.lastReal = dir, real
	return real, nil
}

// markCreated records p and its parents as the current layer's.
func (x *extractor) markCreated(p string) {
	for ; p != x.root && len(p) > len(x.root); p = filepath.Dir(p) {
		if x.created[p] {
			return
		}
		x.created[p] = true
	}
}

// clear removes whatever is at target (a host path whose parent is resolved),
// without following it: a symlink goes, not what it points to.
func (x *extractor) clear(target string) error {
	if _, err := os.Lstat(target); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	x.lastDir = ""
	return os.RemoveAll(target)
}

func (x *extractor) file(tr *tar.Reader, hdr *tar.Header, target string) (retErr error) {
	if hdr.Size < 0 {
		return fmt.Errorf("size %d", hdr.Size)
	}
	if err := x.wrote.take(hdr.Size); err != nil {
		return err
	}
	// Never into an existing file: a hard link to it elsewhere would change
	// too. Most names are new; what is there is removed only when the
	// create says so, which saves an lstat per file.
	const flags = unix.O_WRONLY | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Open(target, flags, 0o600)
	if errors.Is(err, unix.EEXIST) {
		if err := x.clear(target); err != nil {
			return err
		}
		fd, err = unix.Open(target, flags, 0o600)
	}
	if err != nil {
		return &os.PathError{Op: "create", Path: target, Err: err}
	}
	defer func() {
		if err := unix.Close(fd); err != nil && retErr == nil {
			retErr = &os.PathError{Op: "close", Path: target, Err: err}
		}
	}()
	if _, err := io.CopyBuffer(fdWriter(fd), tr, x.buf); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, uint32(imageFileMode(hdr.FileInfo().Mode()))); err != nil {
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

// hardlink links target to the image path linkname, resolved inside root.
func (x *extractor) hardlink(linkname, target string) error {
	lp := path.Clean("/" + linkname)
	ldir, lbase := path.Split(lp)
	real, err := securejoin.SecureJoin(x.root, ldir)
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
	if err := x.clear(target); err != nil {
		return err
	}
	// link(2) does not follow src when it is a symlink.
	return os.Link(src, target)
}

// whiteout removes name, in the image dir dir, as a lower layer left it.
func (x *extractor) whiteout(dir, name string) error {
	if name == "" || name == "." || name == ".." {
		return nil
	}
	real, err := securejoin.SecureJoin(x.root, dir)
	if err != nil {
		return err
	}
	target := filepath.Join(real, name)
	if x.created[target] {
		return nil
	}
	return x.clear(target)
}

// opaque empties the image dir dir of what lower layers left in it.
func (x *extractor) opaque(dir string) error {
	x.lastDir = ""
	real, err := securejoin.SecureJoin(x.root, dir)
	if err != nil {
		return err
	}
	if err := x.removeLower(real); err != nil {
		return err
	}
	x.markCreated(real)
	return nil
}

func (x *extractor) removeLower(dir string) error {
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
		case !x.created[p]:
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		case e.IsDir():
			if err := x.removeLower(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// imageFileMode is the mode a file of an image gets: readable (and, if
// anyone may run it, runnable) by the sandbox, which is "others"; no setuid,
// setgid or sticky bit, nothing group- or world-writable: the cache is
// shared by every server, and a group-writable file in it is one whoever
// shares the group could change under every sandbox. The same rule as
// build.go's fileMode, kept apart so that the two may change independently.
func imageFileMode(m fs.FileMode) fs.FileMode {
	perm := m.Perm()&^0o022 | 0o004
	if perm&0o111 != 0 {
		perm |= 0o001
	}
	return perm
}

// imageDirMode is every dir's mode: a restrictive one would only hide files
// from the sandbox, which must read all of them.
const imageDirMode fs.FileMode = 0o755

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
	if err := os.Mkdir(etc, imageDirMode); err != nil && !errors.Is(err, fs.ErrExist) {
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
	for _, mp := range MountPoints() {
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
	if err := os.MkdirAll(bin, imageDirMode); err != nil {
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
			if err := os.Mkdir(cur, imageDirMode); err != nil {
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
	if err := os.Mkdir(cur, imageDirMode); err != nil {
		return fmt.Errorf("creating mount point %s: %w", mp, err)
	}
	mode := imageDirMode
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
			want = imageDirMode
			if p == filepath.Join(root, "tmp") {
				want = 0o777 | fs.ModeSticky
			}
		default:
			want = imageFileMode(fi.Mode())
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
	return os.Chmod(root, imageDirMode)
}

// makeImageCacheDir creates the cache dir 0755: the sandbox reads through it.
func makeImageCacheDir(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating cache dir: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("creating cache dir: %w", err)
	}
	return nil
}

// lockImageCache takes the exclusive flock on dir/.lock, the one Ensure
// takes, so that an image and the default rootfs may share a cache dir.
// flock(2) cannot wait on a context, so it retries in steps.
func lockImageCache(ctx context.Context, dir string) (unlock func(), err error) {
	p := filepath.Join(dir, ".lock")
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the cache lock: %w", err)
	}
	for {
		ok, err := imageFlock(f, unix.LOCK_EX)
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
			return nil, fmt.Errorf("waiting for the build in %s: %w", dir, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// imageFlock tries once to take an flock of kind how; ok is false when
// another open file holds a conflicting one. (ensure.go's flockNB, kept apart
// while both change.)
func imageFlock(f *os.File, how int) (ok bool, err error) {
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

// renameDirNoReplace renames without replacing: rename(2) of a dir onto an
// empty dir succeeds, which would hide a concurrent mistake. (build.go's
// renameNoReplace, kept apart while both change.)
func renameDirNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if _, statErr := os.Lstat(to); statErr == nil {
			return &os.LinkError{Op: "rename", Old: from, New: to, Err: unix.EEXIST}
		}
		return os.Rename(from, to)
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// removeImageLeftovers removes what a killed build or removal left. The
// caller holds the cache lock, so none is running.
func removeImageLeftovers(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) && !strings.HasPrefix(e.Name(), trashPrefix) {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("removing the leftovers of a killed build: %w", err)
		}
	}
	return nil
}

// collectImages removes the cached images, but keep, that no process holds.
// The caller holds the cache lock. It is best effort.
func collectImages(cacheDir, keep string) {
	entries, err := os.ReadDir(cacheDir)
	if err != nil {
		return
	}
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), holdSuffix)
		if !ok || !strings.HasPrefix(name, imagePrefix) || name == keep {
			continue
		}
		removeImage(cacheDir, name)
	}
}

// removeImage removes a cached image unless a process holds it. The dir goes
// first, away from its name, so that no one takes it half removed; then the
// hold file, so that a process that opened it before finds it unlinked once
// it gets its shared lock.
func removeImage(cacheDir, name string) error {
	dir := filepath.Join(cacheDir, name)
	f, err := os.Open(dir + holdSuffix)
	if err != nil {
		return err
	}
	defer f.Close()
	if ok, err := imageFlock(f, unix.LOCK_EX); err != nil || !ok {
		return err
	}
	trash := filepath.Join(cacheDir, trashPrefix+name)
	if err := os.Rename(dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := os.Remove(dir + holdSuffix); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}
