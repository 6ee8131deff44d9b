package rootfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/inhuman/mcp-exec/policy"
)

// Source is which rootfs a configuration asks for: the settings that decide
// it, as the operator gave them. Its zero value is the stdlib-only rootfs
// built from the host's python3 into DefaultCacheDir.
type Source struct {
	// Dir is a rootfs of the operator's making (MCP_EXEC_ROOTFS), used as
	// it is. "" builds one from Python, unless Image is set.
	Dir string
	// Image is a container image (MCP_EXEC_ROOTFS_IMAGE) whose filesystem
	// becomes the rootfs, flattened into CacheDir (see FlattenImage).
	Image string
	// Python is the host interpreter (MCP_EXEC_PYTHON) a rootfs is built
	// from, and that reads what Options' packages hold for a Dir built with
	// them; "" is FindPython's default.
	Python string
	// Options say what a built rootfs holds (MCP_EXEC_PACKAGES,
	// MCP_EXEC_SHELL, MCP_EXEC_PRELOAD); for a Dir, what it was built with.
	Options Options
	// PackagesDir is a dir of Python packages (MCP_EXEC_PACKAGES_DIR) to be
	// mounted read-only on the import path; "" for none.
	PackagesDir string
	// DataDir is a dir of the operator's data (MCP_EXEC_DATA_DIR) to be
	// mounted read-only at policy.DataDir; "" for none. The rootfs must
	// have that mount point, and the proof lists it in the sandbox.
	DataDir string
	// CacheDir is where a rootfs is built and an image flattened; "" is
	// DefaultCacheDir().
	CacheDir string
}

// Root is the rootfs Open found: every sandbox's root.
type Root struct {
	// Dir is the rootfs: shared, read-only, and kept as it is for as long as
	// the calling process lives.
	Dir string
	// Python is the interpreter's absolute path inside Dir.
	Python string
	// PythonVersion is the interpreter's version, as the sandbox's python
	// printed it when Open proved the rootfs, else as the host's reported it
	// when the rootfs was built from it; "" when neither said.
	PythonVersion string
	// Contents is what the rootfs offers beyond the stdlib.
	Contents Contents
	// PackagesMount is where Source.PackagesDir is mounted in Dir; "" when
	// there is none.
	PackagesMount string
	// Digest is the image's config digest for a Source.Image, else "".
	Digest string
}

// Trial is what Open asks of a real sandbox: to run Python on a rootfs, for
// only a sandbox can say whether Python runs there, and rootfs knows nothing
// of sandboxes.
type Trial struct {
	// Root is the rootfs to run on, whose Dir may be a temp dir not yet in
	// the cache, and PackagesMount where the packages dir is mounted.
	Root Root
	// Preload are modules the interpreter must have imported as it
	// started (Options.Preload), each checked with its own error.
	Preload []string
	// Compile asks for Python's path to be byte-compiled into Root.Dir, an
	// image's tree before it is cached, instead of proving it: a read-only
	// root cannot cache bytecode, and python:*-slim ships none.
	Compile bool
}

// Prove runs Python in a real sandbox as t asks: the interpreter starts,
// imports the stdlib's core and t.Root.Contents.Modules, and prints its
// version, which Prove returns. Any failure is an error.
type Prove func(ctx context.Context, t Trial) (version string, err error)

// Open finds, builds or flattens the rootfs src asks for, and proves it with
// prove. A rootfs built here is proven once, before it enters the cache, and
// not again at every start; a rootfs or packages dir of the operator's
// making (src.Dir, src.Image, src.PackagesDir, src.DataDir) is proven once
// per start, with the packages and data dirs mounted. Errors name the
// variable to fix.
func Open(ctx context.Context, src Source, prove Prove) (Root, error) {
	if prove == nil {
		return Root{}, errors.New("opening the rootfs: no sandbox to prove it in")
	}
	if src.CacheDir == "" {
		src.CacheDir = DefaultCacheDir()
	}
	var (
		root Root
		// known is where a rootfs built here has its interpreter's
		// packages dir mount point.
		known string
		err   error
	)
	switch {
	case src.Image != "":
		root, err = openImage(ctx, src, prove)
	case src.Dir == "":
		root, known, err = openBuilt(ctx, src, prove)
	default:
		root, err = openDir(ctx, src)
	}
	if err != nil {
		return Root{}, err
	}
	if src.PackagesDir != "" {
		if root.PackagesMount, err = packagesMountIn(root.Dir, known); err != nil {
			return Root{}, err
		}
		if err := CheckPackagesDir(src.PackagesDir, root.Dir); err != nil {
			return Root{}, err
		}
	}
	if src.DataDir != "" {
		if err := dataMountIn(root.Dir); err != nil {
			return Root{}, err
		}
	}
	if src.Dir != "" || src.Image != "" || src.PackagesDir != "" || src.DataDir != "" {
		version, err := prove(ctx, Trial{Root: root})
		if err != nil {
			return Root{}, fmt.Errorf("the rootfs %s: %w", root.Dir, err)
		}
		root.PythonVersion = version
	}
	return root, nil
}

// openImage flattens src.Image, byte-compiled in a sandbox before it is
// cached.
func openImage(ctx context.Context, src Source, prove Prove) (Root, error) {
	im, err := FlattenImage(ctx, src.Image, src.CacheDir, ImageOptions{
		Prepare: func(ctx context.Context, dir, python string) error {
			_, err := prove(ctx, Trial{Root: Root{Dir: dir, Python: python}, Compile: true})
			return err
		},
	})
	if err != nil {
		return Root{}, err
	}
	return Root{Dir: im.Dir, Python: im.Python, PythonVersion: im.PythonVersion, Digest: im.Digest}, nil
}

// openBuilt builds the rootfs of src.Options from the host's python into the
// cache, or finds it there, and returns it with its packages dir mount
// point.
func openBuilt(ctx context.Context, src Source, prove Prove) (Root, string, error) {
	py, err := FindPython(ctx, src.Python)
	if err != nil {
		return Root{}, "", fmt.Errorf("finding python ({Python}): %w", err)
	}
	// What the packages bring, or the exact apt-get line when one is
	// missing, before anything is built.
	contents, err := Describe(py, src.Options)
	if err != nil {
		return Root{}, "", err
	}
	dir, err := Ensure(ctx, py, src.Options, src.CacheDir, func(ctx context.Context, dir string) error {
		t := Trial{Root: Root{Dir: dir, Python: PythonPath, Contents: contents}, Preload: src.Options.Preload}
		_, err := prove(ctx, t)
		return err
	})
	if err != nil {
		return Root{}, "", fmt.Errorf("preparing the rootfs: %w", err)
	}
	root := Root{Dir: dir, Python: PythonPath, PythonVersion: py.Version, Contents: contents}
	return root, PackagesDirMountPoint(py), nil
}

// openDir checks the operator's src.Dir, and says what it holds when it was
// built with packages (mcp-exec rootfs build --packages, as the container
// image does): the same settings say so, and the start-up proof imports them.
func openDir(ctx context.Context, src Source) (Root, error) {
	dir, err := filepath.Abs(src.Dir)
	if err != nil {
		return Root{}, fmt.Errorf("{Rootfs}: %w", err)
	}
	if err := Check(dir); err != nil {
		return Root{}, fmt.Errorf("{Rootfs}=%s is not a usable rootfs: %w", dir, err)
	}
	if err := searchableByOthers(dir); err != nil {
		return Root{}, fmt.Errorf("{Rootfs}=%s: %w", dir, err)
	}
	root := Root{Dir: dir, Python: PythonPath}
	if o := src.Options; len(o.Packages) > 0 || o.Shell {
		py, err := FindPython(ctx, src.Python)
		if err != nil {
			return Root{}, fmt.Errorf("finding python ({Python}) to describe {Packages}: %w", err)
		}
		if root.Contents, err = Describe(py, o); err != nil {
			return Root{}, err
		}
	}
	return root, nil
}

// searchableByOthers checks that every directory on the way to dir lets
// others pass: the sandbox's root is an unprivileged uid of the host (its
// call slot's), which mounts the rootfs from inside its user namespace.
func searchableByOthers(dir string) error {
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("%s has mode %v: the sandbox's unprivileged uids cannot reach the rootfs through it (chmod o+x %s)", p, fi.Mode().Perm(), p)
		}
		if p == "/" {
			return nil
		}
	}
}

// packagesMountIn finds where a packages dir goes in a rootfs: the
// interpreter's own mount point when the rootfs was built here, else the
// one dist-packages mount point an operator's rootfs has.
func packagesMountIn(rootfsDir, known string) (string, error) {
	if known != "" {
		return known, nil
	}
	matches, _ := filepath.Glob(filepath.Join(rootfsDir, "usr/local/lib/python3*/dist-packages"))
	if len(matches) != 1 {
		return "", fmt.Errorf("{PackagesDir}: the rootfs %s has %d /usr/local/lib/python3.X/dist-packages dirs to mount it on, want exactly 1 (mcp-exec rootfs build makes one)", rootfsDir, len(matches))
	}
	rel, _ := filepath.Rel(rootfsDir, matches[0])
	return "/" + rel, nil
}

// dataMountIn checks that a rootfs has the data dir's mount point: a real
// dir, not a link the mount would follow out of the rootfs.
func dataMountIn(rootfsDir string) error {
	fi, err := os.Lstat(filepath.Join(rootfsDir, policy.DataDir))
	if err != nil || !fi.IsDir() {
		return fmt.Errorf("{DataDir}: the rootfs %s has no directory %s to mount it on (every rootfs mcp-exec makes has one: rebuild it with mcp-exec rootfs build, or make that empty directory)", rootfsDir, policy.DataDir)
	}
	return nil
}
