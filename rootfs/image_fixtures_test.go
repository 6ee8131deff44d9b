package rootfs

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The images the image tests flatten: layers built entry by entry, saved
// as `docker save` tarballs and OCI layouts.

// tarEntry is one entry of a layer a test builds.
type tarEntry struct {
	hdr  tar.Header
	body string
}

func regEntry(name, body string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body))}, body: body}
}

func dirEntry(name string, mode int64) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}}
}

func symlinkEntry(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}}
}

func hardlinkEntry(name, target string) tarEntry {
	return tarEntry{hdr: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644}}
}

// fakePython is the least findImagePython accepts, python3 -> python3.12 in
// bin: never run, so no real interpreter is needed.
func fakePython(bin string) []tarEntry {
	var es []tarEntry
	for p := bin; p != "."; p = path.Dir(p) {
		es = append([]tarEntry{dirEntry(p, 0o755)}, es...)
	}
	return append(es,
		regEntry(bin+"/python3.12", "#!/bin/false\n", 0o755),
		symlinkEntry(bin+"/python3", "python3.12"))
}

func layerBytes(t testing.TB, entries ...tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := e.hdr
		if hdr.ModTime.IsZero() {
			hdr.ModTime = time.Unix(1700000000, 0)
		}
		if err := tw.WriteHeader(&hdr); err != nil {
			t.Fatalf("writing %s: %v", hdr.Name, err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil {
			t.Fatalf("writing %s: %v", hdr.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func bytesLayer(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func layerOf(t testing.TB, entries ...tarEntry) v1.Layer {
	t.Helper()
	return bytesLayer(t, layerBytes(t, entries...))
}

// imageOf stacks layers into an image for this host's platform.
func imageOf(t testing.TB, layers ...v1.Layer) v1.Image {
	t.Helper()
	return imageFor(t, goruntime.GOARCH, layers...)
}

func imageFor(t testing.TB, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// saveTarball writes imgs, by tag, as go-containerregistry writes a
// `docker save` tarball (gzip-compressed layers).
func saveTarball(t testing.TB, dir string, imgs map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for tag, img := range imgs {
		ref, err := name.NewTag(tag)
		if err != nil {
			t.Fatal(err)
		}
		refs[ref] = img
	}
	p := filepath.Join(dir, "image.tar")
	if err := tarball.MultiRefWriteToFile(p, refs); err != nil {
		t.Fatal(err)
	}
	return p
}

// saveLayout writes imgs as an OCI image layout, each named by its key in
// the ref-name annotation ("" for none).
func saveLayout(t testing.TB, dir string, imgs map[string]v1.Image) string {
	t.Helper()
	p := filepath.Join(dir, "layout")
	lp, err := layout.Write(p, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	refs := slices.Sorted(func(yield func(string) bool) {
		for r := range imgs {
			if !yield(r) {
				return
			}
		}
	})
	for _, ref := range refs {
		var opts []layout.Option
		if ref != "" {
			opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref}))
		}
		if err := lp.AppendImage(imgs[ref], opts...); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// dockerSave writes a tarball as `docker save` (before Docker 25) does:
// manifest.json, the config, and each layer uncompressed as <n>/layer.tar.
// diffIDs, when not nil, replace the layers' true digests in the config.
func dockerSave(t testing.TB, out, tag string, layerFiles []string, diffIDs []string) string {
	t.Helper()
	if diffIDs == nil {
		for _, lf := range layerFiles {
			diffIDs = append(diffIDs, "sha256:"+fileSHA256Hex(t, lf))
		}
	}
	cfg, err := json.Marshal(map[string]any{
		"architecture": goruntime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Env": []string{"PATH=/usr/local/bin:/usr/bin:/bin"}},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cfg)
	cfgName := hex.EncodeToString(sum[:]) + ".json"
	var layerNames []string
	for i := range layerFiles {
		layerNames = append(layerNames, fmt.Sprintf("%d/layer.tar", i))
	}
	manifest, err := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": []string{tag}, "Layers": layerNames}})
	if err != nil {
		t.Fatal(err)
	}

	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	add := func(name string, size int64, r io.Reader) {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(tw, r); err != nil {
			t.Fatal(err)
		}
	}
	add(cfgName, int64(len(cfg)), bytes.NewReader(cfg))
	for i, lf := range layerFiles {
		lfile, err := os.Open(lf)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := lfile.Stat()
		if err != nil {
			t.Fatal(err)
		}
		add(layerNames[i], fi.Size(), lfile)
		lfile.Close()
	}
	add("manifest.json", int64(len(manifest)), bytes.NewReader(manifest))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	return out
}

func fileSHA256Hex(t testing.TB, p string) string {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// tarDir writes the tree at dir as a layer file, its paths under prefix,
// leaving out the dirs skip names.
func tarDir(t testing.TB, dir, prefix, out string, skip map[string]bool) int64 {
	t.Helper()
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	tw := tar.NewWriter(bw)
	var prefixDirs []string
	for p := prefix; p != "." && p != ""; p = path.Dir(p) {
		prefixDirs = append([]string{p}, prefixDirs...)
	}
	for _, p := range prefixDirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: 0o755}); err != nil {
			t.Fatal(err)
		}
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if d.IsDir() && skip[d.Name()] {
			return filepath.SkipDir
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if d.Type()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return nil // a socket or such: not in a layer
		}
		hdr.Name = path.Join(prefix, filepath.ToSlash(rel))
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			if _, err := io.Copy(tw, in); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := bw.Flush(); err != nil {
		t.Fatal(err)
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func entryNames(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// releaseImage drops this process's hold on dir, as its exit would.
func releaseImage(dir string) {
	release(dir)
}

func flatten(t testing.TB, src, cache string, opts ImageOptions) Image {
	t.Helper()
	im, err := FlattenImage(context.Background(), src, cache, opts)
	if err != nil {
		t.Fatalf("FlattenImage(%s): %v", src, err)
	}
	return im
}
