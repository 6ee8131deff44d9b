package rootfs

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/rootfs/image"
)

// localeDir is glibc's C.UTF-8 locale. The sandbox sets LANG=C.UTF-8; without
// it setlocale(LC_ALL, "") fails and so does user code that calls it.
const localeDir = "/usr/lib/locale/C.utf8"

// excludedTop are the stdlib's top-level dirs no sandboxed program needs: the regression
// tests, GUI modules (there is no display), and the pip bootstrapper (there
// is no network and the root is read-only).
var excludedTop = map[string]bool{
	"test":       true,
	"idlelib":    true,
	"tkinter":    true,
	"turtledemo": true,
	"ensurepip":  true,
}

// excludedRel are further stdlib paths, relative to the stdlib dir.
var excludedRel = map[string]bool{
	"lib2to3/tests": true,
}

// excludedModulePrefixes start the names of extension modules left out
// with their Python half: _tkinter (Debian's python3-tk puts it into
// lib-dynload) would pull in Tcl/Tk and X11 for a tkinter that is not there.
var excludedModulePrefixes = []string{"_tkinter."}

// excludedAnywhere: third-party packages are not part of the default rootfs;
// what a sandbox can import must not depend on what the host happens to have.
var excludedAnywhere = map[string]bool{
	"site-packages": true,
	"dist-packages": true,
}

type etcFile struct{ name, content string }

// EtcFile returns the content of a file of /etc every rootfs holds
// (passwd, group, hosts, hostname, nsswitch.conf), or "".
func EtcFile(name string) string {
	for _, f := range etcFiles {
		if f.name == name {
			return f.content
		}
	}
	return ""
}

// etcFiles are the /etc of every rootfs: enough for getpwuid, getgrgid and
// resolving localhost, nothing of the host's configuration. A package may
// add its own, from a constant (matplotlibRC).
// The ids must match policy.UID and policy.GID; rootfs does not import policy
// (docs/architecture.md), so a change there must be made here by hand; runtime's
// TestKeptInSync fails until it is.
var etcFiles = []etcFile{
	{"passwd", "root:x:0:0:root:/root:/sbin/nologin\nsandbox:x:65532:65532:sandbox:/tmp:/sbin/nologin\n"},
	{"group", "root:x:0:\nsandbox:x:65532:\n"},
	{"hosts", "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost sandbox\n"},
	{"hostname", "sandbox\n"},
	{"nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n"},
}

// Build builds a rootfs for py with opts into out, which must not exist. It
// builds in a temp dir next to out (same filesystem, so the final rename is
// atomic), calls validate(ctx, tmpDir) if validate is not nil, then renames
// the temp dir to out. On any error the temp dir is removed. Nothing is
// downloaded: a package opts names that the host lacks is a
// *MissingPackagesError (wrapped) that says how to install it.
func Build(ctx context.Context, py Interpreter, opts Options, out string, validate func(ctx context.Context, dir string) error) error {
	return build(ctx, py, opts, out, "", validate)
}

// build is Build that, if manifestPath is not empty, also writes there the
// manifest of what the rootfs was built from, before the rootfs appears: a
// rootfs in the cache always has one.
func build(ctx context.Context, py Interpreter, opts Options, out, manifestPath string, validate func(ctx context.Context, dir string) error) error {
	return buildFrom(ctx, dpkgDir, py, opts, out, manifestPath, validate)
}

// buildFrom is build taking packages from the dpkg database in dpkgDir.
func buildFrom(ctx context.Context, dpkgDir string, py Interpreter, opts Options, out, manifestPath string, validate func(ctx context.Context, dir string) error) (retErr error) {
	if err := py.checkPaths(); err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	// Checked now, normalized later: messages name packages as the user
	// did.
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	out, err := filepath.Abs(out)
	if err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	if _, err := os.Lstat(out); err == nil {
		return fmt.Errorf("building rootfs: %s already exists", out)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("building rootfs: %w", err)
	}

	// Staged next to out as a cache entry is: a killed build leaves what
	// Ensure removes when out is in its cache.
	parent, name := cache{dir: filepath.Dir(out)}, filepath.Base(out)
	tmp, err := parent.stage(name)
	if err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(tmp)
		}
	}()
	// MkdirTemp makes it 0700; uid 65532 must be able to enter the root.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}

	m, err := populate(ctx, dpkgDir, py, opts, tmp)
	if err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	if err := Check(tmp); err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	if validate != nil {
		if err := validate(ctx, tmp); err != nil {
			return fmt.Errorf("building rootfs: validating: %w", err)
		}
	}
	if manifestPath != "" {
		if err := writeManifest(manifestPath, m); err != nil {
			return fmt.Errorf("building rootfs: %w", err)
		}
		defer func() {
			if retErr != nil {
				os.Remove(manifestPath)
			}
		}()
	}
	if err := parent.publish(tmp, name); err != nil {
		return fmt.Errorf("building rootfs: %w", err)
	}
	return nil
}

func (py Interpreter) checkPaths() error {
	for _, f := range []struct{ name, path string }{
		{"Path", py.Path}, {"Stdlib", py.Stdlib}, {"PlatStdlib", py.PlatStdlib}, {"DynLoad", py.DynLoad},
	} {
		if !filepath.IsAbs(f.path) {
			return fmt.Errorf("interpreter %s is %q, want an absolute path", f.name, f.path)
		}
	}
	return nil
}

// builder reproduces host paths inside a rootfs. Every path keeps its host
// name, and every symlink met on the way (/lib64 -> usr/lib64,
// libz.so.1 -> libz.so.1.2.13) is recreated as a symlink, so that both the
// loader and Python's prefix detection find things where the host has them.
type builder struct {
	ctx  context.Context
	root string
	// made holds the host paths already reproduced: real dirs and files,
	// and symlinks.
	made  map[string]bool
	files []copyJob
	// src records the host paths the rootfs is made from; nil records
	// nothing.
	src *sources
	// dpkgDir is the dpkg database packages are taken from.
	dpkgDir string
	// keepTests keeps the tests/ trees of packages; only measurements
	// want them.
	keepTests bool
	// etc are files of /etc beyond etcFiles that a package needs.
	etc []etcFile
}

type copyJob struct {
	src  string // host path
	dst  string // path in the rootfs: src, or the name of a link to it
	info fs.FileInfo
}

// populate fills root and returns the manifest of what it copied and looked
// at.
func populate(ctx context.Context, dpkgDir string, py Interpreter, opts Options, root string) (*manifest, error) {
	b := &builder{ctx: ctx, root: root, made: map[string]bool{"/": true}, src: newSources(), dpkgDir: dpkgDir}
	if err := b.populate(py, opts); err != nil {
		return nil, err
	}
	return b.src.manifest(), nil
}

func (b *builder) populate(py Interpreter, opts Options) error {
	// What the host lacks is said before anything is copied.
	var plan *hostPlan
	if opts.hasPackages() || opts.Shell {
		var err error
		if plan, err = planHost(py, opts, b.dpkgDir, b.src); err != nil {
			return err
		}
	}

	exe, err := b.place(py.Path)
	if err != nil {
		return err
	}

	// Stdlib, platstdlib and lib-dynload, each once even when nested.
	var trees []string
	for _, d := range []string{py.Stdlib, py.PlatStdlib, py.DynLoad} {
		b.src.stat(d)
		real, err := filepath.EvalSymlinks(d)
		if err != nil {
			return fmt.Errorf("copying %s: %w", d, err)
		}
		trees = append(trees, real)
	}
	// Parents sort before their children.
	slices.Sort(trees)
	var treeLinks, modules, kept []string
	for _, t := range trees {
		if slices.ContainsFunc(kept, func(k string) bool { return within(t, k) }) {
			continue
		}
		kept = append(kept, t)
		if _, err := b.place(t); err != nil {
			return err
		}
		links, elfs, err := b.copyTree(t)
		if err != nil {
			return err
		}
		treeLinks = append(treeLinks, links...)
		modules = append(modules, elfs...)
	}

	var pkgLinks []string
	if plan != nil && plan.sel != nil {
		links, elfs, err := b.packages(py, plan)
		if err != nil {
			return err
		}
		pkgLinks = links
		modules = append(modules, elfs...)
	}

	r, err := newResolver(b.src)
	if err != nil {
		return err
	}
	deps, err := r.closure(exe, modules)
	if err != nil {
		return err
	}
	if plan != nil && plan.busybox != "" {
		more, err := b.shell(r, plan.busybox)
		if err != nil {
			return err
		}
		deps = append(deps, more...)
	}
	for _, d := range deps {
		if _, err := b.place(d.path); err != nil {
			return err
		}
	}
	for _, d := range deps {
		if d.viaConf {
			if err := b.alias(d); err != nil {
				return err
			}
		}
	}

	// A link inside the stdlib is kept only when what it points to is in
	// the rootfs: a dangling one (Debian's sitecustomize.py ->
	// /etc/python3.X/sitecustomize.py) makes Python print an error at
	// every start.
	// So are the links of packages: matplotlib's to jquery, which is not
	// taken, would lead out of what the rootfs holds.
	for _, l := range append(treeLinks, pkgLinks...) {
		target, err := filepath.EvalSymlinks(l)
		if err != nil || !b.made[target] {
			continue
		}
		if _, err := b.place(l); err != nil {
			return err
		}
	}

	// Without it, a later one must still be noticed.
	b.src.stat(localeDir)
	if fi, err := os.Stat(localeDir); err == nil && fi.IsDir() {
		real, err := b.place(localeDir)
		if err != nil {
			return err
		}
		if _, _, err := b.copyTree(real); err != nil {
			return err
		}
	}

	if err := b.pythonLink(py.Path); err != nil {
		return err
	}
	if mp := PackagesDirMountPoint(py); mp != "" {
		if err := b.emptyDir(mp); err != nil {
			return err
		}
	}
	if plan.has("python3-matplotlib") {
		if err := b.matplotlibBackend(plan); err != nil {
			return err
		}
	}
	if err := b.preload(py, opts.Preload); err != nil {
		return err
	}
	if err := b.copyFiles(); err != nil {
		return err
	}
	if err := b.verifyInterpreter(py); err != nil {
		return err
	}
	return b.skeleton()
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// place reproduces the host path p in the rootfs, following it component by
// component as the kernel would, and returns its resolved host path. A
// regular file at the end is queued for copying; dirs are created empty.
func (b *builder) place(p string) (string, error) {
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("copying %s: not an absolute path", p)
	}
	todo := splitPath(p)
	cur := "/"
	for links := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			// cur has no symlinks left in it, so ".." is lexical.
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return "", fmt.Errorf("copying %s: %w", p, err)
		}
		if !fi.IsDir() {
			// Dirs met on the way (/usr/lib/x86_64-linux-gnu) change
			// with every package installed; what is taken from them
			// is recorded, not them.
			b.src.record(next, fi, nil)
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			if links++; links > 40 {
				return "", fmt.Errorf("copying %s: %w", p, unix.ELOOP)
			}
			target, err := os.Readlink(next)
			if err != nil {
				return "", fmt.Errorf("copying %s: %w", p, err)
			}
			dest := target
			if !filepath.IsAbs(dest) {
				dest = filepath.Join(cur, dest)
			}
			if within(filepath.Clean(dest), "/etc") {
				// Debian's alternatives (libblas.so.3 ->
				// /etc/alternatives/libblas.so.3-x86_64-linux-gnu ->
				// openblas-pthread/libblas.so.3): /etc in the rootfs is
				// the skeleton, so the file the chain ends in is copied
				// under the link's name.
				if len(todo) > 0 {
					return "", fmt.Errorf("copying %s: %s leads through /etc to a directory, which is not copied", p, next)
				}
				if err := b.materialize(next); err != nil {
					return "", err
				}
				return next, nil
			}
			if err := b.symlink(next, target); err != nil {
				return "", err
			}
			todo = append(splitPath(target), todo...)
			if filepath.IsAbs(target) {
				cur = "/"
			}
			continue
		case fi.IsDir():
			if err := b.mkdir(next); err != nil {
				return "", err
			}
		case fi.Mode().IsRegular():
			if len(todo) > 0 {
				return "", fmt.Errorf("copying %s: %s: %w", p, next, unix.ENOTDIR)
			}
			if err := b.addFile(next, fi); err != nil {
				return "", err
			}
		default:
			return "", fmt.Errorf("copying %s: %s is a %v, not a file, dir or symlink", p, next, fi.Mode().Type())
		}
		cur = next
	}
	return cur, nil
}

func splitPath(p string) []string {
	return strings.Split(strings.Trim(p, "/"), "/")
}

// claim refuses paths below a mount point: the runtime mounts over those
// dirs, hiding whatever the rootfs holds there.
func (b *builder) claim(p string) error {
	for _, mp := range madeMountPoints() {
		if within(p, mp) {
			return fmt.Errorf("copying %s: it lies in %s, which the sandbox mounts over", p, mp)
		}
	}
	return nil
}

func (b *builder) mkdir(p string) error {
	if b.made[p] {
		return nil
	}
	if err := b.claim(p); err != nil {
		return err
	}
	dst := filepath.Join(b.root, p)
	if err := os.Mkdir(dst, 0o755); err != nil {
		return fmt.Errorf("copying %s: %w", p, err)
	}
	// Mkdir honours the umask; the mode must not.
	if err := os.Chmod(dst, 0o755); err != nil {
		return fmt.Errorf("copying %s: %w", p, err)
	}
	b.made[p] = true
	return nil
}

func (b *builder) symlink(p, target string) error {
	if b.made[p] {
		return nil
	}
	if err := b.claim(p); err != nil {
		return err
	}
	if err := os.Symlink(target, filepath.Join(b.root, p)); err != nil {
		return fmt.Errorf("copying %s: %w", p, err)
	}
	b.made[p] = true
	return nil
}

func (b *builder) addFile(p string, fi fs.FileInfo) error {
	return b.addFileAs(p, p, fi)
}

// addFileAs queues the host file src to be copied to dst in the rootfs.
func (b *builder) addFileAs(src, dst string, fi fs.FileInfo) error {
	if b.made[dst] {
		return nil
	}
	if err := b.claim(dst); err != nil {
		return err
	}
	b.files = append(b.files, copyJob{src: src, dst: dst, info: fi})
	b.made[dst] = true
	return nil
}

// materialize queues a copy, under the name of the host link link, of the
// regular file its chain of links ends in, and records every link of the
// chain: update-alternatives switching OpenBLAS for the reference BLAS must
// rebuild.
func (b *builder) materialize(link string) error {
	if b.made[link] {
		return nil
	}
	p := link
	for hops := 0; ; hops++ {
		if hops > 40 {
			return fmt.Errorf("copying %s: %w", link, unix.ELOOP)
		}
		fi, err := os.Lstat(p)
		b.src.record(p, fi, err)
		if err != nil {
			return fmt.Errorf("copying %s: %w", link, err)
		}
		if fi.Mode().IsRegular() {
			return b.addFileAs(p, link, fi)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return fmt.Errorf("copying %s: it leads to %s, a %v, not a file", link, p, fi.Mode().Type())
		}
		target, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("copying %s: %w", link, err)
		}
		if !filepath.IsAbs(target) {
			target = filepath.Join(filepath.Dir(p), target)
		}
		// Links in the dirs on the way are followed, not recorded: the
		// last hop of the chain is what alternatives change.
		dir, err := filepath.EvalSymlinks(filepath.Dir(target))
		if err != nil {
			return fmt.Errorf("copying %s: %w", link, err)
		}
		p = filepath.Join(dir, filepath.Base(target))
	}
}

// copyTree reproduces the real dir tree below dir, minus the exclusions.
// Symlinks are returned rather than copied: whether to keep one depends on
// what else ends up in the rootfs. So are the ELF files, whose libraries
// must be resolved.
func (b *builder) copyTree(dir string) (links, elfs []string, err error) {
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("copying %s: %w", p, err)
		}
		if err := b.ctx.Err(); err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		switch t := d.Type(); {
		case t&fs.ModeSymlink != 0:
			b.src.stat(p)
			links = append(links, p)
		case d.IsDir():
			if excludedAnywhere[d.Name()] || excludedTop[rel] || excludedRel[rel] {
				return filepath.SkipDir
			}
			// Its mtime tells of a file added or removed since.
			fi, err := d.Info()
			b.src.record(p, fi, err)
			return b.mkdir(p)
		case t.IsRegular():
			// Static archives (libpython3.X.a in config-3.X-*) are half
			// the size of the stdlib and need a linker to be of any use.
			if strings.HasSuffix(d.Name(), ".a") {
				return nil
			}
			for _, prefix := range excludedModulePrefixes {
				if strings.HasPrefix(d.Name(), prefix) {
					return nil
				}
			}
			fi, err := d.Info()
			if err != nil {
				return fmt.Errorf("copying %s: %w", p, err)
			}
			b.src.record(p, fi, nil)
			if err := b.addFile(p, fi); err != nil {
				return err
			}
			if isSharedObject(d.Name()) && isELFFile(p) {
				elfs = append(elfs, p)
			}
		}
		// Sockets, fifos and devices have no place in a read-only root.
		return nil
	})
	return links, elfs, err
}

func isSharedObject(name string) bool {
	return strings.HasSuffix(name, ".so") || strings.Contains(name, ".so.")
}

func isELFFile(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	magic := make([]byte, 4)
	_, err = f.ReadAt(magic, 0)
	return err == nil && bytes.Equal(magic, []byte(elf.ELFMAG))
}

// alias makes a library that the host's loader finds through ld.so.cache
// (an /etc/ld.so.conf dir such as /usr/local/lib) findable without one: a
// link in the first default dir.
func (b *builder) alias(d dependency) error {
	for _, dir := range defaultDirs(d.kind) {
		if _, err := os.Stat(dir); err != nil {
			continue
		}
		real, err := b.place(dir)
		if err != nil {
			return err
		}
		link := filepath.Join(real, filepath.Base(d.name))
		if b.made[link] {
			// Another library of that name is already there; the loader
			// would take it, and so would the host's without the cache.
			return nil
		}
		return b.symlink(link, d.path)
	}
	return fmt.Errorf("copying %s: no default library dir to make it findable in", d.path)
}

// pythonLink makes PythonPath run the interpreter, whatever its host path.
func (b *builder) pythonLink(exe string) error {
	if exe == PythonPath {
		return nil
	}
	dir := filepath.Dir(PythonPath)
	real := dir
	if _, err := os.Stat(dir); err == nil {
		if real, err = b.place(dir); err != nil {
			return err
		}
	} else if err := b.mkdirAll(dir); err != nil {
		return err
	}
	link := filepath.Join(real, filepath.Base(PythonPath))
	target := exe
	if filepath.Dir(exe) == real {
		target = filepath.Base(exe)
	}
	if b.made[link] {
		return fmt.Errorf("copying %s: %s is already taken", exe, link)
	}
	return b.symlink(link, target)
}

func (b *builder) mkdirAll(p string) error {
	if p == "/" {
		return nil
	}
	if err := b.mkdirAll(filepath.Dir(p)); err != nil {
		return err
	}
	return b.mkdir(p)
}

// copyFiles copies the queued files with a few workers: a stdlib is a few
// thousand small files, and waiting on them one at a time dominates a build.
func (b *builder) copyFiles() error {
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	jobs := make(chan copyJob)
	var (
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	workers := min(runtime.GOMAXPROCS(0)*2, 16)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				if err := copyFile(j.src, filepath.Join(b.root, j.dst), j.info); err != nil {
					once.Do(func() { firstErr = err; cancel() })
				}
			}
		}()
	}
feed:
	for _, j := range b.files {
		select {
		case jobs <- j:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return b.ctx.Err()
}

func copyFile(src, dst string, fi fs.FileInfo) (retErr error) {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer in.Close()
	// The rule every file of a rootfs keeps, copied here or from an image.
	mode := image.FileMode(fi.Mode())
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer func() {
		if err := out.Close(); err != nil && retErr == nil {
			retErr = fmt.Errorf("copying %s: %w", src, err)
		}
	}()
	// ReadFrom uses copy_file_range, which on most filesystems shares or
	// copies the data in the kernel.
	if _, err := out.ReadFrom(in); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	// OpenFile honours the umask; the mode must not.
	if err := out.Chmod(mode); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	// A .pyc records its source's mtime; a newer copy of the .py would make
	// Python recompile every module at every start, unable to cache the
	// result on a read-only root.
	if err := os.Chtimes(dst, fi.ModTime(), fi.ModTime()); err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}

// verifyInterpreter catches an interpreter replaced (a package upgrade)
// between FindPython and Build, which would cache a rootfs under the wrong key.
func (b *builder) verifyInterpreter(py Interpreter) error {
	if py.Hash == "" {
		return nil
	}
	sum, err := fileSHA256(filepath.Join(b.root, py.Path))
	if err != nil {
		return fmt.Errorf("copying %s: %w", py.Path, err)
	}
	if sum != py.Hash {
		return fmt.Errorf("copying %s: its content changed since it was inspected (sha256 %s, want %s)", py.Path, sum, py.Hash)
	}
	return nil
}

// skeleton adds what the host does not provide: the mount points and /etc.
func (b *builder) skeleton() error {
	for _, mp := range madeMountPoints() {
		dst := filepath.Join(b.root, mp)
		if err := os.Mkdir(dst, 0o755); err != nil {
			return fmt.Errorf("creating mount point %s: %w", mp, err)
		}
		mode := fs.FileMode(0o755)
		if mp == "/tmp" {
			// Only a tmpfs is ever mounted there, but a runtime that
			// forgot would still leave a usable /tmp.
			mode = 0o777 | fs.ModeSticky
		}
		if err := os.Chmod(dst, mode); err != nil {
			return fmt.Errorf("creating mount point %s: %w", mp, err)
		}
	}
	etc := filepath.Join(b.root, "etc")
	if err := os.Mkdir(etc, 0o755); err != nil {
		return fmt.Errorf("creating /etc: %w", err)
	}
	if err := os.Chmod(etc, 0o755); err != nil {
		return fmt.Errorf("creating /etc: %w", err)
	}
	for _, f := range append(slices.Clone(etcFiles), b.etc...) {
		p := filepath.Join(etc, f.name)
		if err := os.WriteFile(p, []byte(f.content), 0o644); err != nil {
			return fmt.Errorf("creating /etc/%s: %w", f.name, err)
		}
		if err := os.Chmod(p, 0o644); err != nil {
			return fmt.Errorf("creating /etc/%s: %w", f.name, err)
		}
	}
	return nil
}

// preloadFile is the .pth file that imports the preloaded modules. site
// executes its "import" line as the interpreter starts; it leaves nothing
// in sys.modules but the modules themselves.
const preloadFile = "mcp_exec_preload.pth"

// preload writes preloadFile into the interpreter's first site dir that a
// packages dir is not mounted over.
func (b *builder) preload(py Interpreter, modules []string) error {
	if len(modules) == 0 {
		return nil
	}
	site := ""
	for _, d := range py.SitePackages {
		if d != PackagesDirMountPoint(py) {
			site = d
			break
		}
	}
	if site == "" {
		return fmt.Errorf("{Preload}: the interpreter %s has no site dir to import from", py.Path)
	}
	if !b.made[site] {
		if err := b.emptyDir(site); err != nil {
			return err
		}
	}
	real, err := resolveIn(b.root, site)
	if err != nil {
		return fmt.Errorf("{Preload}: %w", err)
	}
	p := filepath.Join(real, preloadFile)
	if err := os.WriteFile(p, []byte("import "+strings.Join(modules, ", ")+"\n"), 0o644); err != nil {
		return fmt.Errorf("{Preload}: %w", err)
	}
	return os.Chmod(p, 0o644)
}
