// Package image reads a container image from a local file, a `docker save`
// tarball or an OCI image-layout dir, and applies its layers, lowest first,
// to a dir. Nothing is pulled, and nothing of the image is run: it knows
// nothing of sandboxes, of the rootfs a server uses, or of caches; rootfs
// flattens an image with it and lays the sandbox's own files over the
// result.
//
// Invariants a maintainer must keep:
//   - An image is data, never code run on the host, and no link in it is
//     followed out of the dir. A name with "..", and any symlink met on the
//     way to a name, is resolved as a process chrooted into the dir would
//     resolve it (securejoin), which is what Docker's chrooted unpacker and
//     containerd's RootPath do: an absolute link points into the dir, never
//     into the host. The last component of a name is never followed: what is
//     there is removed and replaced, never written through.
//   - Apply makes only dirs, regular files, symlinks and hard links within
//     the dir, owned by the applying user, with no setuid, setgid or sticky
//     bit, nothing group- or world-writable, and no xattr (so no file
//     capability). Device nodes, FIFOs, sockets and unknown types in a layer
//     are skipped.
//   - What a layer costs is bounded twice, across all the layers of an
//     image: the uncompressed bytes read, and the bytes written for files (a
//     sparse file counts its full size). A decompression bomb stops at the
//     first, a header promising a terabyte at the second.
//   - The image's config digest is checked against the config's content, and
//     each layer's uncompressed content against the diff ID the config
//     states: a caller may key a cache by the digest alone.
//   - The image's config (Env, Entrypoint, User, WorkingDir) is never read
//     for use: the sandbox's environment is an allowlist and its process is
//     fixed.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	goruntime "runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Open opens the image src names and returns it with its config digest,
// checked against the config's content.
//
// src is a `docker save` tarball or an OCI image-layout dir, optionally
// followed by ":REF" to pick one image when it holds several: a repo tag of
// the tarball ("python:3.12-slim") or a layout's ref-name annotation
// ("3.12-slim", or the full reference containerd writes). The longest prefix
// of src that exists is the path. A layout entry that is an index for several
// platforms yields the linux/GOARCH one. Opening reads the tarball's
// manifest.json and config (or the layout's index, manifest and config),
// never a layer.
func Open(src string) (v1.Image, v1.Hash, error) {
	p, ref, err := splitRef(src)
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
	digest, err := checkConfig(img)
	if err != nil {
		return nil, v1.Hash{}, err
	}
	return img, digest, nil
}

// checkConfig returns img's config digest once the config matches it and
// names this host's platform.
func checkConfig(img v1.Image) (v1.Hash, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading the image's config: %w", err)
	}
	digest, err := img.ConfigName()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading the image's config: %w", err)
	}
	// A cache trusts the digest for everything below it; a layout's
	// manifest states it, so it is checked against what it names.
	sum := sha256.Sum256(raw)
	if digest.Algorithm != "sha256" || digest.Hex != hex.EncodeToString(sum[:]) {
		return v1.Hash{}, fmt.Errorf("the image's config does not match its digest %s (sha256:%x): the image is corrupt", digest, sum)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("reading the image's config: %w", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return v1.Hash{}, fmt.Errorf("the image is for %s, not linux", cfg.OS)
	}
	if cfg.Architecture != "" && cfg.Architecture != goruntime.GOARCH {
		return v1.Hash{}, fmt.Errorf("the image is for %s, this host runs %s", cfg.Architecture, goruntime.GOARCH)
	}
	return digest, nil
}

// splitRef splits src into an existing path and the ref after it: src
// itself when it exists, else its longest prefix before a ':' that does.
func splitRef(src string) (p, ref string, err error) {
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

// Unpack applies img's layers to root, an empty dir, lowest first, checking
// each one's uncompressed content against the diff ID its config states.
// maxBytes bounds, across all layers, both the bytes read and the bytes
// written (see Budget).
func Unpack(ctx context.Context, img v1.Image, root string, maxBytes int64) error {
	cfg, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("reading the image's config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("reading the image's layers: %w", err)
	}
	diffIDs := cfg.RootFS.DiffIDs
	if len(layers) != len(diffIDs) {
		return fmt.Errorf("the image has %d layers but its config names %d", len(layers), len(diffIDs))
	}
	b := NewBudget(maxBytes)
	for i, l := range layers {
		if err := applyLayer(ctx, root, l, diffIDs[i], b); err != nil {
			return fmt.Errorf("applying layer %d of %d (%s): %w", i+1, len(layers), diffIDs[i], err)
		}
	}
	return nil
}

// applyLayer applies l, hashing what Apply reads of it: the diff ID covers
// the tar's padding too, which Apply reads to the end.
func applyLayer(ctx context.Context, root string, l v1.Layer, diffID v1.Hash, b *Budget) error {
	rc, err := l.Uncompressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	h := sha256.New()
	if err := Apply(ctx, root, io.TeeReader(rc, h), b); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); diffID.Algorithm != "sha256" || got != diffID.Hex {
		return fmt.Errorf("its content is sha256:%s, not what the image's config says: the image is corrupt", got)
	}
	return nil
}
