package rootfs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// trials is a Prove that records what Open asked of it, as a sandbox would
// be asked, and answers version or err.
type trials struct {
	got     []Trial
	version string
	err     error
}

func (r *trials) prove(_ context.Context, t Trial) (string, error) {
	r.got = append(r.got, t)
	return r.version, r.err
}

// TestOpen checks what Open decides: what it builds, flattens or takes, and
// what it asks a sandbox to prove, when.
func TestOpen(t *testing.T) {
	py := hostPython(t)
	ctx := context.Background()
	work := publicTempDir(t)
	cache := filepath.Join(work, "cache")
	opts := Options{Preload: []string{"json"}}

	// Built here: proven once, before it enters the cache, with the preloads.
	r := &trials{version: "3.99.9"}
	built, err := Open(ctx, Source{Options: opts, CacheDir: cache}, r.prove)
	if err != nil {
		t.Fatalf("Open(built): %v", err)
	}
	if len(r.got) != 1 || !strings.HasPrefix(filepath.Base(r.got[0].Root.Dir), tempPrefix) || r.got[0].Root.Python != PythonPath ||
		!slices.Equal(r.got[0].Preload, opts.Preload) || r.got[0].Compile {
		t.Errorf("Open(built): trials %+v, want one, on the temp dir, with the preloads", r.got)
	}
	if filepath.Dir(built.Dir) != cache || built.Python != PythonPath || built.PythonVersion != py.Version || built.PackagesMount != "" {
		t.Errorf("Open(built) = %+v, want a generation in %s, %s, Python %s, no packages mount", built, cache, PythonPath, py.Version)
	}
	r.got = nil
	if again, err := Open(ctx, Source{Options: opts, CacheDir: cache}, r.prove); err != nil || again.Dir != built.Dir || len(r.got) != 0 {
		t.Errorf("Open(built) again = %+v, %v with %d trials; want %s, none", again, err, len(r.got), built.Dir)
	}

	// A packages dir of the operator's: proven at every start, mounted.
	pkgs := filepath.Join(work, "pkgs")
	if err := os.Mkdir(pkgs, 0o755); err != nil {
		t.Fatal(err)
	}
	withPkgs, err := Open(ctx, Source{Options: opts, CacheDir: cache, PackagesDir: pkgs}, r.prove)
	mount := PackagesDirMountPoint(py)
	if err != nil || withPkgs.PackagesMount != mount || withPkgs.PythonVersion != r.version || len(r.got) != 1 || r.got[0].Root.Dir != built.Dir || r.got[0].Root.PackagesMount != mount {
		t.Errorf("Open(built, packages dir) = %+v, %v with trials %+v; want mount %s, version %s, one trial of it", withPkgs, err, r.got, mount, r.version)
	}

	// An operator's rootfs: proven at every start, never built.
	r.got = nil
	op, err := Open(ctx, Source{Dir: built.Dir}, r.prove)
	want := Root{Dir: built.Dir, Python: PythonPath, PythonVersion: r.version}
	if err != nil || !reflect.DeepEqual(op, want) || len(r.got) != 1 || r.got[0].Root.Dir != built.Dir || r.got[0].Compile {
		t.Errorf("Open(dir) = %+v, %v with trials %+v; want %+v, one trial of it", op, err, r.got, want)
	}
}

// TestOpenImage checks that an image is byte-compiled in a sandbox before it
// is cached, then proven at every start.
func TestOpenImage(t *testing.T) {
	work := publicTempDir(t)
	src := saveLayout(t, work, map[string]v1.Image{"": imageOf(t, layerOf(t, fakePython("usr/bin")...))})
	r := &trials{version: "3.12.1"}
	root, err := Open(context.Background(), Source{Image: src, CacheDir: filepath.Join(work, "cache")}, r.prove)
	if err != nil {
		t.Fatalf("Open(image): %v", err)
	}
	if len(r.got) != 2 || !r.got[0].Compile || r.got[0].Root.Python != "/usr/bin/python3" || r.got[1].Compile || r.got[1].Root.Dir != root.Dir {
		t.Errorf("Open(image): trials %+v; want a compile in the temp dir, then a proof of %s", r.got, root.Dir)
	}
	if !strings.HasPrefix(root.Digest, "sha256:") || root.PythonVersion != r.version || root.Python != "/usr/bin/python3" {
		t.Errorf("Open(image) = %+v, want its digest, version %s, /usr/bin/python3", root, r.version)
	}
}

// TestOpenRefuses checks that each refusal names the variable to fix, and
// that nothing is proven of what is refused before.
func TestOpenRefuses(t *testing.T) {
	hidden := filepath.Join(t.TempDir(), "rootfs")
	_, plain := builtRootfs(t)
	if err := os.Symlink(plain, hidden); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(hidden), 0o700); err != nil {
		t.Fatal(err)
	}
	failing := errors.New("python did not start")
	tests := []struct {
		name     string
		src      Source
		proveErr error
		want     string
		trials   int
	}{
		{"no rootfs", Source{Dir: "/nonexistent"}, nil, "{Rootfs}=/nonexistent is not a usable rootfs", 0},
		{"unreachable", Source{Dir: hidden}, nil, "{Rootfs}=" + hidden + ": ", 0},
		{"no image", Source{Image: "/nonexistent.tar"}, nil, imageField + "=/nonexistent.tar: ", 0},
		{"unproven", Source{Dir: reachableRootfs(t)}, failing, "the rootfs ", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &trials{err: tt.proveErr}
			_, err := Open(context.Background(), tt.src, r.prove)
			if err == nil || !strings.Contains(err.Error(), tt.want) || len(r.got) != tt.trials {
				t.Errorf("Open(%+v) = %v with %d trials, want an error saying %q after %d", tt.src, err, len(r.got), tt.want, tt.trials)
			}
			if tt.proveErr != nil && !errors.Is(err, tt.proveErr) {
				t.Errorf("Open(%+v) = %v, want it to wrap %v", tt.src, err, tt.proveErr)
			}
		})
	}
	if _, err := Open(context.Background(), Source{}, nil); err == nil {
		t.Errorf("Open without a sandbox to prove in: no error")
	}
}

// reachableRootfs builds the host's rootfs where the sandbox's uids reach it.
func reachableRootfs(t *testing.T) string {
	t.Helper()
	py := hostPython(t)
	dir := filepath.Join(publicTempDir(t), "rootfs")
	if err := Build(context.Background(), py, Options{}, dir, nil); err != nil {
		t.Fatal(err)
	}
	return dir
}
