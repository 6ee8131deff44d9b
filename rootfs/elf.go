package rootfs

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The dynamic loader reads /etc/ld.so.conf only through ldconfig's cache; it
// is where distributions list their extra library dirs.
const ldSoConf = "/etc/ld.so.conf"

// resolver finds the shared libraries ELF objects need the way the dynamic
// loader will at run time, reading the objects themselves rather than running
// ldd: ldd executes the loader on the file, and a hard-coded list of libraries
// goes stale with the next distribution upgrade.
type resolver struct {
	// confDirs are the dirs of /etc/ld.so.conf, in order. The loader knows
	// them only through /etc/ld.so.cache, which a rootfs does not have.
	confDirs []string
	// isELF caches candidate checks: one libc is offered to every object.
	isELF map[string]elfKind
	// src records every path looked at, found or not: a library that
	// appears earlier in the search order changes the answer. nil records
	// nothing.
	src *sources
}

// elfKind is what must agree between an object and a library it loads.
type elfKind struct {
	class   elf.Class
	machine elf.Machine
}

// elfObject is what the loader reads from an ELF file to load its deps.
type elfObject struct {
	kind    elfKind
	interp  string   // PT_INTERP: the loader the kernel starts
	needed  []string // DT_NEEDED
	rpath   []string // DT_RPATH, unexpanded
	runpath []string // DT_RUNPATH, unexpanded
}

// dependency is a file the loader will open to run an object.
type dependency struct {
	path     string // where it was found (not symlink-resolved; the name the loader opens)
	name     string // the DT_NEEDED entry, or the PT_INTERP path
	neededBy string
	kind     elfKind
	// viaConf is set when only an /etc/ld.so.conf dir had it: the rootfs has
	// no ld.so.cache, so the loader will not look there on its own.
	viaConf bool
}

// newResolver reads the host's ld.so.conf; src (may be nil) records the
// files it reads and every path the resolver then looks at.
func newResolver(src *sources) (*resolver, error) {
	dirs, err := readLdSoConf(ldSoConf, 0, src)
	if err != nil {
		return nil, err
	}
	return &resolver{confDirs: dirs, isELF: map[string]elfKind{}, src: src}, nil
}

// readLdSoConf returns the library dirs listed in an ld.so.conf file, following
// its include lines (globs relative to the file's dir, like ldconfig). src
// (may be nil) records the files read and the dirs globbed.
func readLdSoConf(path string, depth int, src *sources) ([]string, error) {
	if depth > 16 {
		return nil, fmt.Errorf("reading %s: includes nested too deep", path)
	}
	src.stat(path)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		// musl and some minimal images have none; the defaults then apply.
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	var dirs []string
	for _, line := range strings.Split(string(data), "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "include":
			for _, pattern := range fields[1:] {
				if !filepath.IsAbs(pattern) {
					pattern = filepath.Join(filepath.Dir(path), pattern)
				}
				// Its mtime moves when a file is added there.
				src.stat(filepath.Dir(pattern))
				matches, err := filepath.Glob(pattern)
				if err != nil {
					return nil, fmt.Errorf("reading %s: include %s: %w", path, pattern, err)
				}
				for _, m := range matches {
					sub, err := readLdSoConf(m, depth+1, src)
					if err != nil {
						return nil, err
					}
					dirs = append(dirs, sub...)
				}
			}
		case "hwcap":
			// Obsolete; ldconfig ignores it too.
		default:
			// ldconfig also accepts several dirs on a line, split by
			// colons or commas, and an old "dir=TYPE" suffix.
			for _, f := range strings.FieldsFunc(line, func(r rune) bool {
				return r == ':' || r == ',' || r == ' ' || r == '\t'
			}) {
				if i := strings.IndexByte(f, '='); i >= 0 {
					f = f[:i]
				}
				if filepath.IsAbs(f) {
					dirs = append(dirs, filepath.Clean(f))
				}
			}
		}
	}
	return dirs, nil
}

func readELF(path string) (*elfObject, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	obj := &elfObject{kind: elfKind{f.Class, f.Machine}}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return nil, fmt.Errorf("reading PT_INTERP: %w", err)
		}
		obj.interp = strings.TrimRight(string(b), "\x00")
	}
	if obj.needed, err = f.DynString(elf.DT_NEEDED); err != nil {
		return nil, fmt.Errorf("reading DT_NEEDED: %w", err)
	}
	rpath, err := f.DynString(elf.DT_RPATH)
	if err != nil {
		return nil, fmt.Errorf("reading DT_RPATH: %w", err)
	}
	runpath, err := f.DynString(elf.DT_RUNPATH)
	if err != nil {
		return nil, fmt.Errorf("reading DT_RUNPATH: %w", err)
	}
	for _, s := range rpath {
		obj.rpath = append(obj.rpath, strings.Split(s, ":")...)
	}
	for _, s := range runpath {
		obj.runpath = append(obj.runpath, strings.Split(s, ":")...)
	}
	return obj, nil
}

// expandOrigin expands $ORIGIN in a DT_RPATH or DT_RUNPATH list; origin is
// the dir of the object that carries the list. Elements the loader would not
// use as a dir are dropped: empty ones (the cwd, meaningless in a sandbox)
// and those with $LIB or $PLATFORM, which no Python we know of uses — a
// library found only that way is then reported missing rather than guessed.
func expandOrigin(dirs []string, origin string) []string {
	var out []string
	for _, d := range dirs {
		d = strings.ReplaceAll(d, "${ORIGIN}", origin)
		d = strings.ReplaceAll(d, "$ORIGIN", origin)
		if d == "" || strings.Contains(d, "$") || !filepath.IsAbs(d) {
			continue
		}
		out = append(out, filepath.Clean(d))
	}
	return out
}

// multiarchTriplets are Debian's names for the per-machine library dirs.
var multiarchTriplets = map[elfKind]string{
	{elf.ELFCLASS64, elf.EM_X86_64}:  "x86_64-linux-gnu",
	{elf.ELFCLASS32, elf.EM_X86_64}:  "x86_64-linux-gnux32",
	{elf.ELFCLASS32, elf.EM_386}:     "i386-linux-gnu",
	{elf.ELFCLASS64, elf.EM_AARCH64}: "aarch64-linux-gnu",
	{elf.ELFCLASS32, elf.EM_ARM}:     "arm-linux-gnueabihf",
	{elf.ELFCLASS64, elf.EM_PPC64}:   "powerpc64le-linux-gnu",
	{elf.ELFCLASS64, elf.EM_S390}:    "s390x-linux-gnu",
	{elf.ELFCLASS64, elf.EM_RISCV}:   "riscv64-linux-gnu",
}

// defaultDirs are the dirs the loader searches last, without being told.
// Which of them a given loader was compiled with differs between
// distributions; the class/machine check keeps a wrong guess harmless.
func defaultDirs(k elfKind) []string {
	var dirs []string
	if t, ok := multiarchTriplets[k]; ok {
		dirs = append(dirs, "/lib/"+t, "/usr/lib/"+t)
	}
	dirs = append(dirs, "/lib", "/usr/lib")
	if k.class == elf.ELFCLASS64 {
		dirs = append(dirs, "/lib64", "/usr/lib64")
	} else {
		dirs = append(dirs, "/lib32", "/usr/lib32")
	}
	return dirs
}

// pending is an object whose deps are still to be resolved.
type pending struct {
	path string // as the loader opens it; $ORIGIN is its dir
	// inherited are the expanded DT_RPATHs of the objects that load it: the
	// loader searches them too, unless the object has a DT_RUNPATH.
	inherited []string
}

// closure returns every file the loader opens to run exe and to dlopen each
// of modules: the loaders named by PT_INTERP and all libraries, transitively,
// in a stable order. A library that cannot be found is an error naming it and
// the object that needs it.
func (r *resolver) closure(exe string, modules []string) ([]dependency, error) {
	var deps []dependency
	seen := map[string]bool{exe: true}
	queue := []pending{{path: exe}}
	first := true
	for len(queue) > 0 {
		cur := queue[0]
		queue = queue[1:]
		obj, err := readELF(cur.path)
		if err != nil {
			return nil, fmt.Errorf("reading ELF file %s: %w", cur.path, err)
		}
		origin := filepath.Dir(cur.path)
		if first {
			// The kernel gives the loader the executable's resolved path.
			if real, err := filepath.EvalSymlinks(cur.path); err == nil {
				origin = filepath.Dir(real)
			}
		}
		rpath := expandOrigin(obj.rpath, origin)
		runpath := expandOrigin(obj.runpath, origin)
		// What the objects this one loads inherit (glibc's l_loader chain).
		childInherited := cur.inherited
		if len(obj.runpath) == 0 {
			childInherited = append(append([]string(nil), rpath...), cur.inherited...)
		}
		if first {
			// Python dlopens lib-dynload modules; the executable is
			// their loader.
			for _, m := range modules {
				if !seen[m] {
					seen[m] = true
					queue = append(queue, pending{path: m, inherited: childInherited})
				}
			}
			first = false
		}

		if obj.interp != "" && !seen[obj.interp] {
			seen[obj.interp] = true
			if _, err := os.Stat(obj.interp); err != nil {
				return nil, fmt.Errorf("loader %s needed by %s not found: %w", obj.interp, cur.path, err)
			}
			deps = append(deps, dependency{path: obj.interp, name: obj.interp, neededBy: cur.path, kind: obj.kind})
			queue = append(queue, pending{path: obj.interp})
		}

		for _, name := range obj.needed {
			var search []string
			if len(obj.runpath) == 0 {
				search = append(append(search, rpath...), cur.inherited...)
			}
			search = append(search, runpath...)
			found, viaConf, err := r.find(name, obj.kind, search)
			if err != nil {
				return nil, fmt.Errorf("library %s needed by %s: %w", name, cur.path, err)
			}
			if seen[found] {
				continue
			}
			seen[found] = true
			deps = append(deps, dependency{path: found, name: name, neededBy: cur.path, kind: obj.kind, viaConf: viaConf})
			queue = append(queue, pending{path: found, inherited: childInherited})
		}
	}
	return deps, nil
}

// find looks name up in search, then the ld.so.conf dirs, then the default
// dirs, and takes the first ELF file of the same class and machine, as the
// loader does (it skips a 32-bit libc in a dir shared with 64-bit ones).
func (r *resolver) find(name string, k elfKind, search []string) (path string, viaConf bool, err error) {
	if strings.Contains(name, "/") {
		if r.matches(name, k) {
			return name, false, nil
		}
		return "", false, fmt.Errorf("not found or not a %v %v ELF file", k.class, k.machine)
	}
	defaults := defaultDirs(k)
	for _, d := range search {
		if p := filepath.Join(d, name); r.matches(p, k) {
			return p, false, nil
		}
	}
	for _, d := range r.confDirs {
		if p := filepath.Join(d, name); r.matches(p, k) {
			isDefault := false
			for _, dd := range defaults {
				isDefault = isDefault || dd == d
			}
			return p, !isDefault, nil
		}
	}
	for _, d := range defaults {
		if p := filepath.Join(d, name); r.matches(p, k) {
			return p, false, nil
		}
	}
	all := append(append(append([]string(nil), search...), r.confDirs...), defaults...)
	return "", false, fmt.Errorf("not found (no %v %v ELF file of that name in %s)", k.class, k.machine, strings.Join(all, ":"))
}

func (r *resolver) matches(path string, k elfKind) bool {
	if got, ok := r.isELF[path]; ok {
		return got == k
	}
	r.src.stat(path)
	var got elfKind // zero: not an ELF file
	if f, err := elf.Open(path); err == nil {
		got = elfKind{f.Class, f.Machine}
		f.Close()
	}
	r.isELF[path] = got
	return got == k
}
