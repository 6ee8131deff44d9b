package rootfs

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"
)

// maxPackagesDirProblems caps how many missing libraries CheckPackagesDir
// names: a wheel built for another system misses the same few everywhere.
const maxPackagesDirProblems = 10

// CheckPackagesDir checks that the extension modules in dir, a dir of Python
// packages (pip install --target dir ...) to be mounted read-only at
// PackagesDirMountPoint, can be loaded in the rootfs rootfsDir: that every
// library each ELF shared object under dir needs (DT_NEEDED) is found as the
// loader would find it, through the object's DT_RPATH or DT_RUNPATH inside
// dir ($ORIGIN/../numpy.libs, as manylinux wheels carry), or in the rootfs's
// library dirs. Libraries found in dir are checked in turn; those of the
// rootfs were checked when it was built.
//
// Symlinks under dir are not followed, and an $ORIGIN path leading out of
// dir finds nothing: inside the sandbox it would lead elsewhere. Symbol
// versions (a wheel needing a newer glibc) are not checked.
//
// The error names MCP_EXEC_PACKAGES_DIR, and each object and the library it
// lacks.
func CheckPackagesDir(dir, rootfsDir string) error {
	// Its own path may hold links; below it, none is followed.
	dir, err := filepath.EvalSymlinks(dir)
	if err == nil {
		dir, err = filepath.Abs(dir)
	}
	if err != nil {
		return fmt.Errorf("{PackagesDir}: %w", err)
	}
	if err := readableByOthers(dir); err != nil {
		return fmt.Errorf("{PackagesDir}: %w", err)
	}
	want := elfKind{}
	if exe, err := resolveIn(rootfsDir, PythonPath); err == nil {
		if obj, err := readELF(exe); err == nil {
			want = obj.kind
		}
	}
	c := &dirChecker{dir: dir, rootfs: rootfsDir, r: &resolver{isELF: map[string]elfKind{}}, want: want, seen: map[string]bool{}}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() && isSharedObject(d.Name()) && isELFFile(p) {
			c.check(p, nil)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("{PackagesDir}: checking %s: %w", dir, err)
	}
	if len(c.problems) == 0 {
		return nil
	}
	msg := strings.Join(c.problems[:min(len(c.problems), maxPackagesDirProblems)], "; ")
	if n := len(c.problems) - maxPackagesDirProblems; n > 0 {
		msg += fmt.Sprintf("; and %d more", n)
	}
	return fmt.Errorf("{PackagesDir}: %s: shared objects cannot be loaded in the sandbox: %s", dir, msg)
}

// readableByOthers checks that the sandbox's user — an unprivileged uid
// the host knows nothing of, "others" to every file — can read all of dir:
// else the server would start with the packages silently missing from
// every sandbox. (The dirs above it do not matter: the runtime binds it
// from outside the sandbox.)
func readableByOthers(dir string) error {
	var bad []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		need := fs.FileMode(0o004)
		if d.IsDir() {
			need = 0o005
		}
		if d.Type()&fs.ModeSymlink == 0 && fi.Mode().Perm()&need != need {
			bad = append(bad, fmt.Sprintf("%s (mode %v)", p, fi.Mode().Perm()))
			if d.IsDir() {
				return fs.SkipDir
			}
		}
		if len(bad) >= maxPackagesDirProblems {
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("checking %s: %w", dir, err)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%s is not all readable by the sandbox's user, an unprivileged uid that is \"others\" to these files: %s; make it readable by all (chmod -R o+rX %s)",
			dir, strings.Join(bad, ", "), dir)
	}
	return nil
}

// dirChecker checks the objects of one packages dir.
type dirChecker struct {
	dir, rootfs string
	r           *resolver
	want        elfKind // the rootfs python's; zero when unknown
	seen        map[string]bool
	problems    []string
}

// searchDir is a dir the loader searches for an object's libraries: one
// under the packages dir (a host path), or one of the rootfs.
type searchDir struct {
	path  string
	inDir bool
}

// searchDirs turns a DT_RPATH or DT_RUNPATH into dirs: $ORIGIN ones under
// the packages dir, absolute ones in the rootfs. An $ORIGIN path leading out
// of the packages dir lands elsewhere in the sandbox, and is not guessed.
func (c *dirChecker) searchDirs(list []string, origin string) []searchDir {
	var dirs []searchDir
	for _, d := range list {
		if strings.Contains(d, "$ORIGIN") || strings.Contains(d, "${ORIGIN}") {
			for _, e := range expandOrigin([]string{d}, origin) {
				if within(e, c.dir) {
					dirs = append(dirs, searchDir{path: e, inDir: true})
				}
			}
			continue
		}
		for _, e := range expandOrigin([]string{d}, origin) {
			dirs = append(dirs, searchDir{path: e})
		}
	}
	return dirs
}

// check checks the object at p (a host path under c.dir) and, in turn, the
// libraries it finds under c.dir. inherited are the DT_RPATH dirs of the
// objects that load it.
func (c *dirChecker) check(p string, inherited []searchDir) {
	if c.seen[p] {
		return
	}
	c.seen[p] = true
	rel := strings.TrimPrefix(p, c.dir+"/")
	obj, err := readELF(p)
	if err != nil {
		c.problems = append(c.problems, fmt.Sprintf("%s: reading it: %v", rel, err))
		return
	}
	if c.want != (elfKind{}) && obj.kind != c.want {
		c.problems = append(c.problems, fmt.Sprintf("%s is a %v %v object, and the sandbox's python a %v %v one", rel, obj.kind.class, obj.kind.machine, c.want.class, c.want.machine))
		return
	}
	origin := filepath.Dir(p)
	rpath := c.searchDirs(obj.rpath, origin)
	runpath := c.searchDirs(obj.runpath, origin)
	var search []searchDir
	childInherited := inherited
	if len(obj.runpath) == 0 {
		search = append(append(search, rpath...), inherited...)
		childInherited = append(append([]searchDir(nil), rpath...), inherited...)
	}
	search = append(search, runpath...)
	for _, name := range obj.needed {
		found, inDir := c.find(name, obj.kind, search)
		switch {
		case found == "":
			c.problems = append(c.problems, fmt.Sprintf("%s needs %s, which is neither in the rootfs nor found through its RUNPATH", rel, name))
		case inDir:
			c.check(found, childInherited)
		}
	}
}

// find looks name up as the loader would: in search, then in the rootfs's
// default dirs (the rootfs has no ld.so.cache). inDir says the library is in
// the packages dir.
func (c *dirChecker) find(name string, k elfKind, search []searchDir) (path string, inDir bool) {
	inRootfs := func(p string) string {
		if full, err := resolveIn(c.rootfs, p); err == nil && c.r.matches(full, k) {
			return full
		}
		return ""
	}
	if strings.Contains(name, "/") {
		return inRootfs(name), false
	}
	for _, d := range search {
		if !d.inDir {
			if p := inRootfs(filepath.Join(d.path, name)); p != "" {
				return p, false
			}
			continue
		}
		rel, err := filepath.Rel(c.dir, filepath.Join(d.path, name))
		if err != nil {
			continue
		}
		// Links inside the dir are followed as the sandbox would, never
		// out of it.
		if p, err := securejoin.SecureJoin(c.dir, rel); err == nil && c.r.matches(p, k) {
			return p, true
		}
	}
	for _, d := range defaultDirs(k) {
		if p := inRootfs(filepath.Join(d, name)); p != "" {
			return p, false
		}
	}
	return "", false
}
