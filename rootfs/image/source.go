package image

import (
	"archive/tar"
	"bufio"
	"cmp"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// OCI annotations a layout's index names its images by. Skopeo and
// `podman save --format oci-dir` write the first (with the tag alone,
// "3.12-slim"); containerd and Docker 25+ also write the second (with the
// full reference).
const (
	annotationRefName       = "org.opencontainers.image.ref.name"
	annotationContainerdRef = "io.containerd.image.name"
)

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
	if !tagged(m, tag) {
		return nil, fmt.Errorf("%s holds no image tagged %s; it holds %s", p, ref, strings.Join(all, ", "))
	}
	img, err := tarball.ImageFromPath(p, &tag)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", p, err)
	}
	return img, nil
}

// tagged says whether an image of m has tag, in any spelling of it
// ("img:two" is docker.io/library/img:two).
func tagged(m tarball.Manifest, tag name.Tag) bool {
	for _, d := range m {
		for _, t := range d.RepoTags {
			if rt, err := name.NewTag(t); err == nil && rt.Name() == tag.Name() {
				return true
			}
		}
	}
	return false
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
	d, err := pickManifest(idx, p, ref)
	if err != nil {
		return nil, err
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

// pickManifest picks the entry of the layout p's index that ref names, or
// its only one when ref is "".
func pickManifest(idx v1.ImageIndex, p, ref string) (v1.Descriptor, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("reading %s/index.json: %w", p, err)
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
		return v1.Descriptor{}, fmt.Errorf("%s holds no image", p)
	case ref == "" && len(picked) > 1:
		return v1.Descriptor{}, fmt.Errorf("%s holds %d images: %s; name one as %s:REF", p, len(picked), strings.Join(all, ", "), p)
	case len(picked) == 0:
		return v1.Descriptor{}, fmt.Errorf("%s holds no image named %s; it holds %s", p, ref, strings.Join(all, ", "))
	}
	d := picked[0]
	if slices.ContainsFunc(picked, func(o v1.Descriptor) bool { return o.Digest != d.Digest }) {
		return v1.Descriptor{}, fmt.Errorf("%s holds %d different images named %s", p, len(picked), ref)
	}
	return d, nil
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
