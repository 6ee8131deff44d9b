package rootfs

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// A real image: the host's python3 as a layer, flattened and run, and the
// benchmark against GNU tar.

// hostImage is the rootfs Build makes of the host's python3, as a one-layer
// `docker save` tarball, without its .pyc files (as python:*-slim ships
// none).
func hostImage(t *testing.T, work string) (Interpreter, string, int64) {
	t.Helper()
	py, root := builtRootfs(t)
	layerFile := filepath.Join(work, "python.layer.tar")
	size := tarDir(t, root, "", layerFile, map[string]bool{"__pycache__": true})
	return py, dockerSave(t, filepath.Join(work, "python.tar"), "host-python:test", []string{layerFile}, nil), size
}

// compileInChroot is a Prepare that byte-compiles the stdlib with the image's
// own python, chrooted as root into dir: what the runtime does in a sandbox.
func compileInChroot(stdlib string) func(ctx context.Context, dir, py string) error {
	return func(ctx context.Context, dir, py string) error {
		cmd := exec.CommandContext(ctx, py, "-m", "compileall", "-q", stdlib)
		cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: dir}
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("compileall: %v: %s", err, out)
		}
		return nil
	}
}

// TestFlattenImageHostPython flattens a real image, the host's python3, from
// a `docker save` tarball and from an OCI layout, runs it chrooted as the
// sandbox's uid, and checks the cache.
func TestFlattenImageHostPython(t *testing.T) {
	requireRoot(t)
	work := t.TempDir()
	py, src, layerSize := hostImage(t, work)
	cache := filepath.Join(work, "cache")
	var calls atomic.Int32
	compile := compileInChroot(py.Stdlib)
	prepare := func(ctx context.Context, dir, python string) error {
		calls.Add(1)
		start := time.Now()
		defer func() { t.Logf("Prepare (compileall of %s in a chroot): %v", py.Stdlib, time.Since(start)) }()
		return compile(ctx, dir, python)
	}

	start := time.Now()
	im := flatten(t, src, cache, ImageOptions{Prepare: prepare})
	cold := time.Since(start)
	t.Logf("flatten of a %d MiB docker save tarball (cold, with Prepare): %v", layerSize>>20, cold)

	major, minor, _ := strings.Cut(py.Version, ".")
	minor, _, _ = strings.Cut(minor, ".")
	if im.Python != PythonPath || im.PythonVersion != major+"."+minor {
		t.Errorf("FlattenImage: Python, PythonVersion = %q, %q, want %q, %q", im.Python, im.PythonVersion, PythonPath, major+"."+minor)
	}
	checkSafeTree(t, im.Dir)
	checkProbe(t, py, im.Dir)
	cmd := exec.Command(PythonPath, "-v", "-c", "import json")
	cmd.Env = []string{"PATH=/usr/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: im.Dir, Credential: &syscall.Credential{Uid: 65532, Gid: 65532, Groups: []uint32{}}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("python -v -c 'import json' in the flattened image: %v\n%s", err, out)
	} else if !bytes.Contains(out, []byte("code object from")) || bytes.Contains(out, []byte("bad mtime")) {
		t.Errorf("python -v -c 'import json' in the flattened image: want modules from the .pyc Prepare wrote; got\n%s", out)
	}

	start = time.Now()
	warm := flatten(t, src, cache, ImageOptions{Prepare: prepare})
	t.Logf("flatten again (warm: reads manifest.json and the config): %v", time.Since(start))

	lay := saveLayout(t, work, map[string]v1.Image{"test": mustTarballImage(t, src)})
	start = time.Now()
	fromLayout := flatten(t, lay+":test", cache, ImageOptions{Prepare: prepare})
	t.Logf("flatten of the same image as an OCI layout (warm): %v", time.Since(start))
	if n := calls.Load(); n != 1 || warm != im || fromLayout != im {
		t.Errorf("FlattenImage three times (tarball, tarball, layout): Prepare ran %d times, got %+v, %+v, %+v; want once, all equal", n, im, warm, fromLayout)
	}

	// The gzip-compressed layout, cold, without Prepare.
	start = time.Now()
	other := flatten(t, lay+":test", filepath.Join(work, "cache2"), ImageOptions{})
	t.Logf("flatten of the OCI layout (gzip layers, cold, no Prepare): %v", time.Since(start))
	if other.Digest != im.Digest {
		t.Errorf("the same image as a layout: digest %s, as a tarball %s; want equal", other.Digest, im.Digest)
	}
	checkProbe(t, py, other.Dir)
}

func mustTarballImage(t testing.TB, p string) v1.Image {
	t.Helper()
	img, err := tarball.ImageFromPath(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// BenchmarkFlattenImage flattens images of the host's python3 rootfs, alone
// and with the host's dist-packages (numpy, pandas, …) as a second layer,
// from a `docker save` tarball (uncompressed layers) and an OCI layout (gzip),
// against GNU tar extracting the same layers in the same run.
//
//	go test -tags seccomp ./rootfs/ -run '^$' -bench FlattenImage -benchtime 1x
func BenchmarkFlattenImage(b *testing.B) {
	py := hostPython(b)
	work := b.TempDir()
	root := filepath.Join(work, "rootfs")
	if err := Build(context.Background(), py, Options{}, root, nil); err != nil {
		b.Fatal(err)
	}
	pyLayer := filepath.Join(work, "python.layer.tar")
	tarDir(b, root, "", pyLayer, nil)
	sets := []struct {
		name   string
		layers []string
	}{{"python", []string{pyLayer}}}
	const distPackages = "/usr/lib/python3/dist-packages"
	if _, err := os.Stat(distPackages + "/numpy"); err == nil {
		dp := filepath.Join(work, "dist-packages.layer.tar")
		tarDir(b, distPackages, strings.TrimPrefix(distPackages, "/"), dp, nil)
		sets = append(sets, struct {
			name   string
			layers []string
		}{"python+dist-packages", []string{pyLayer, dp}})
	}
	for _, set := range sets {
		var size int64
		for _, l := range set.layers {
			fi, err := os.Stat(l)
			if err != nil {
				b.Fatal(err)
			}
			size += fi.Size()
		}
		src := dockerSave(b, filepath.Join(work, set.name+".tar"), "bench:1", set.layers, nil)
		layDir := filepath.Join(work, set.name+"-layout")
		os.Mkdir(layDir, 0o755)
		lay := saveLayout(b, layDir, map[string]v1.Image{"": mustTarballImage(b, src)})

		for _, format := range []struct {
			name, src string
			tarFlags  string
			layers    func() []string
		}{
			{"docker-save", src, "-xf", func() []string { return set.layers }},
			{"oci-layout", lay, "-xzf", func() []string { return layoutBlobs(b, lay) }},
		} {
			b.Run(set.name+"/"+format.name, func(b *testing.B) {
				b.SetBytes(size)
				var flat, base time.Duration
				for i := 0; b.Loop(); i++ {
					cache := filepath.Join(work, fmt.Sprintf("cache-%s-%s-%d", set.name, format.name, i))
					start := time.Now()
					im := flatten(b, format.src, cache, ImageOptions{})
					flat += time.Since(start)
					releaseImage(im.Dir)

					b.StopTimer()
					dst := filepath.Join(work, fmt.Sprintf("tar-%s-%s-%d", set.name, format.name, i))
					os.Mkdir(dst, 0o755)
					start = time.Now()
					for _, l := range format.layers() {
						if out, err := exec.Command("tar", format.tarFlags, l, "-C", dst).CombinedOutput(); err != nil {
							b.Fatalf("tar %s: %v: %s", l, err, out)
						}
					}
					base += time.Since(start)
					os.RemoveAll(dst)
					os.RemoveAll(cache)
					b.StartTimer()
				}
				b.ReportMetric(float64(size>>20), "MiB")
				b.ReportMetric(float64(flat)/float64(base), "x-gnu-tar")
			})
		}
	}
}

// layoutBlobs lists the layer blobs of a one-image layout, lowest first.
func layoutBlobs(t testing.TB, lay string) []string {
	t.Helper()
	lp, err := layout.FromPath(lay)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range m.Layers {
		out = append(out, filepath.Join(lay, "blobs", l.Digest.Algorithm, l.Digest.Hex))
	}
	return out
}
