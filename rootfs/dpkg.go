package rootfs

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// dpkgDir is dpkg's database: status says what is installed, info/<p>.list
// which files each package installed.
const dpkgDir = "/var/lib/dpkg"

// debPackage is what the builder reads of an installed package's stanza in
// dpkg's status file.
type debPackage struct {
	name string
	arch string
	// depends are Depends and Pre-Depends: groups of alternatives, each
	// a package name without version or architecture qualifier.
	depends  [][]string
	provides []string
	// multiArchSame packages are co-installable for several
	// architectures, and dpkg names their lists <name>:<arch>.list.
	multiArchSame bool
}

// dpkgDB is the host's dpkg database, read once per build.
type dpkgDB struct {
	dir string
	// native is dpkg's own architecture: of two installed instances of
	// a Multi-Arch package, the one Python can load.
	native string
	// installed are the packages whose status is "install ok installed",
	// by name.
	installed map[string][]*debPackage
	// providers lists, for a virtual package, who provides it.
	providers map[string][]*debPackage
}

// readDpkg reads the status file of the dpkg database in dir. It is not put
// in the manifest: it changes with every package installed anywhere, and
// what the build took from it shows in the .list files and the files they
// name, which are.
func readDpkg(dir string) (*dpkgDB, error) {
	data, err := os.ReadFile(filepath.Join(dir, "status"))
	if err != nil {
		return nil, fmt.Errorf("reading the dpkg database: %w", err)
	}
	db := &dpkgDB{dir: dir, installed: map[string][]*debPackage{}, providers: map[string][]*debPackage{}}
	for _, stanza := range bytes.Split(data, []byte("\n\n")) {
		fields := parseStanza(stanza)
		if fields["Package"] == "" || fields["Status"] != "install ok installed" {
			continue
		}
		p := &debPackage{name: fields["Package"], arch: fields["Architecture"], multiArchSame: fields["Multi-Arch"] == "same"}
		for _, f := range []string{"Pre-Depends", "Depends"} {
			p.depends = append(p.depends, parseDepends(fields[f])...)
		}
		for _, g := range parseDepends(fields["Provides"]) {
			p.provides = append(p.provides, g[0])
		}
		db.installed[p.name] = append(db.installed[p.name], p)
		for _, v := range p.provides {
			db.providers[v] = append(db.providers[v], p)
		}
		if p.name == "dpkg" {
			db.native = p.arch
		}
	}
	return db, nil
}

// parseStanza returns the single-line fields of a deb822 stanza; the
// continuation lines of multi-line fields (Description, Conffiles) are
// dropped.
func parseStanza(stanza []byte) map[string]string {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(stanza))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

// parseDepends splits a Depends-style field into groups of alternatives,
// keeping only the package names: "a (>= 1) | b:any, c" is [[a b] [c]].
func parseDepends(field string) [][]string {
	var groups [][]string
	for _, g := range strings.Split(field, ",") {
		var alts []string
		for _, a := range strings.Split(g, "|") {
			name := strings.TrimSpace(a)
			if i := strings.IndexAny(name, " ([<"); i >= 0 {
				name = name[:i]
			}
			name, _, _ = strings.Cut(name, ":")
			if name != "" {
				alts = append(alts, name)
			}
		}
		if len(alts) > 0 {
			groups = append(groups, alts)
		}
	}
	return groups
}

// lookup returns the installed package called name, or one that provides
// it, or nil. Of several instances, the native or Architecture: all one.
func (db *dpkgDB) lookup(name string) *debPackage {
	pick := func(ps []*debPackage) *debPackage {
		for _, p := range ps {
			if p.arch == db.native || p.arch == "all" {
				return p
			}
		}
		if len(ps) > 0 {
			return ps[0]
		}
		return nil
	}
	if p := pick(db.installed[name]); p != nil {
		return p
	}
	return pick(db.providers[name])
}

// listPath is where dpkg lists the files p installed: info/<name>.list, or
// info/<name>:<arch>.list for a Multi-Arch: same package.
func (db *dpkgDB) listPath(p *debPackage) string {
	if p.multiArchSame {
		return filepath.Join(db.dir, "info", p.name+":"+p.arch+".list")
	}
	return filepath.Join(db.dir, "info", p.name+".list")
}

// files returns the paths p installed, in dpkg's order (a dir before what is
// in it). src records the list file: an upgrade, a reinstall or a removal
// rewrites or removes it, and so rebuilds.
func (db *dpkgDB) files(p *debPackage, src *sources) ([]string, error) {
	path := db.listPath(p)
	src.stat(path)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the file list of %s: %w", p.name, err)
	}
	var files []string
	for _, line := range strings.Split(string(data), "\n") {
		// "/." is how dpkg lists the root.
		if line == "" || line == "/." || !filepath.IsAbs(line) {
			continue
		}
		files = append(files, filepath.Clean(line))
	}
	return files, nil
}

// neverTaken are packages that Debian's Depends pull in but that no import
// needs at run time in a sandbox without a display, a compiler or a browser.
// They are left out when reached as a dependency; named, they are taken.
var neverTaken = map[string]string{
	"python3-tk":          "Tk, a GUI: there is no display",
	"python3-pil.imagetk": "Pillow's Tk bridge: there is no display",
	"python3-pythran":     "a compiler that built scipy; it pulls in python3-dev and, beyond python3-*, g++",
	"python3-dev":         "headers and python3-config, for building extensions",
	"python3-all":         "a metapackage for building for every Python",
	"python3-all-dev":     "a metapackage for building for every Python",
	"debconf":             "answers the questions packages ask when installed",
	"libjs-jquery":        "JavaScript for matplotlib's web backend, which needs a browser",
	"libjs-jquery-ui":     "JavaScript for matplotlib's web backend, which needs a browser",
	"unicode-data":        "the Unicode database as text; fontTools uses the stdlib's unicodedata",
}

// extrasOnly are packages whose Depends list every optional extra of the
// Python project: reached as a dependency, only their own files are taken.
// matplotlib needs fontTools' core (for PDF and PS fonts); its Depends would
// add scipy, sympy, lxml and fs, several times matplotlib's size.
var extrasOnly = map[string]bool{
	"python3-fonttools": true,
}

// selection is what a set of named packages takes from the host.
type selection struct {
	// python are the python3-* packages: the named ones and their python3-*
	// dependencies, recursively; only their Python files are taken.
	python []*debPackage
	// data are the Architecture: all packages these depend on, recursively
	// through such packages: tzdata's zoneinfo, matplotlib's mpl-data,
	// fonts. Their files under /usr/share are taken.
	data []*debPackage
	// named are the requests' packages, in the requests' order.
	named []*debPackage
}

// missing is a package the host lacks.
type missing struct {
	asked    string // as the user named it, or the Debian name of a dependency
	deb      string
	neededBy string // "" for a named package
	// inDebian says whether the host's package lists (apt-cache) have
	// it: unknown when they could not be asked.
	inDebian availability
}

type availability int

const (
	unknown availability = iota
	available
	unavailable
)

// aptHas asks the host's package lists whether Debian has package deb: a
// hint worth its cost (apt-cache reads them all) only once a package is
// missing. A test replaces it.
var aptHas = func(deb string) availability {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return unknown
	}
	err := exec.Command("apt-cache", "show", "-q", deb).Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return available
	case errors.As(err, &ee) && ee.ExitCode() == 100:
		// "E: No packages found", or a purely virtual name.
		return unavailable
	}
	return unknown
}

// MissingPackagesError says which packages the host lacks and how to
// install them.
type MissingPackagesError struct {
	missing []missing
}

func (e *MissingPackagesError) Error() string {
	var what, install, none, pip []string
	for _, m := range e.missing {
		w := m.asked
		if m.neededBy != "" {
			w += " (needed by " + m.neededBy + ")"
		}
		what = append(what, w)
		switch {
		case m.inDebian == unavailable:
			if !slices.Contains(none, m.deb) {
				none = append(none, m.deb)
				pip = append(pip, strings.TrimPrefix(m.asked, "python3-"))
			}
		case !slices.Contains(install, m.deb):
			install = append(install, m.deb)
		}
	}
	verb := "is"
	if len(what) > 1 {
		verb = "are"
	}
	msg := fmt.Sprintf("{Packages}: %s %s not installed on this host", joinAnd(what), verb)
	if len(install) > 0 {
		it := "it"
		if len(install) > 1 {
			it = "them"
		}
		if len(none) > 0 {
			it = strings.Join(install, " and ")
		}
		msg += fmt.Sprintf("; install %s with: apt-get install -y %s", it, strings.Join(install, " "))
	}
	if len(none) > 0 {
		msg += fmt.Sprintf("; Debian has no package %s (apt-cache found none: check the name, or run apt-get update first); "+
			"a package Debian lacks can come from a directory of packages instead: pip install --target DIR %s, then {PackagesDir}=DIR",
			joinOr(none), strings.Join(pip, " "))
	}
	return msg
}

func joinOr(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}

// Packages are the Debian packages to install, each once.
func (e *MissingPackagesError) Packages() []string {
	var debs []string
	for _, m := range e.missing {
		if !slices.Contains(debs, m.deb) {
			debs = append(debs, m.deb)
		}
	}
	return debs
}

func joinAnd(s []string) string {
	if len(s) <= 1 {
		return strings.Join(s, "")
	}
	return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
}

// selectPackages resolves the requests against the host's packages: each
// named package, then, breadth first, the python3-* packages they depend on
// and the Architecture: all data packages those depend on. A dependency
// group is satisfied by its first installed alternative, as dpkg satisfied
// it. A named package or python3-* dependency that is not installed is a
// *MissingPackagesError listing all of them. src records the list files of
// the alternatives passed over: installing one changes the choice.
func (db *dpkgDB) selectPackages(reqs []request, src *sources) (*selection, error) {
	sel := &selection{}
	taken := map[string]bool{}
	var miss []missing
	type item struct {
		p     *debPackage
		named bool
	}
	var queue []item
	for _, r := range reqs {
		p := db.lookup(r.deb)
		if p == nil {
			miss = append(miss, missing{asked: r.asked, deb: r.deb})
			continue
		}
		sel.named = append(sel.named, p)
		if !taken[p.name] {
			taken[p.name] = true
			queue = append(queue, item{p, true})
		}
	}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		isPython := strings.HasPrefix(it.p.name, "python3-")
		if isPython {
			sel.python = append(sel.python, it.p)
		} else {
			sel.data = append(sel.data, it.p)
		}
		if isPython && extrasOnly[it.p.name] && !it.named {
			continue
		}
		for _, group := range it.p.depends {
			var dep *debPackage
			for _, alt := range group {
				if dep = db.lookup(alt); dep != nil {
					break
				}
				if strings.HasPrefix(alt, "python3-") {
					src.stat(filepath.Join(db.dir, "info", alt+".list"))
				}
			}
			if dep == nil {
				// dpkg keeps Depends met; a python3-* one missing is a
				// forced install or a half-removed package.
				if first := group[0]; strings.HasPrefix(first, "python3-") && neverTaken[first] == "" {
					miss = append(miss, missing{asked: first, deb: first, neededBy: it.p.name})
				}
				continue
			}
			if taken[dep.name] || neverTaken[dep.name] != "" {
				continue
			}
			switch {
			case strings.HasPrefix(dep.name, "python3-"):
				// Data packages lead only to data: a python3-* package
				// is reached through another python3-* one.
				if !isPython {
					continue
				}
			case dep.arch == "all":
			default:
				// Libraries are found from the ELF files, not from here.
				continue
			}
			taken[dep.name] = true
			queue = append(queue, item{dep, false})
		}
	}
	if len(miss) > 0 {
		for i := range miss {
			miss[i].inDebian = aptHas(miss[i].deb)
		}
		return nil, &MissingPackagesError{missing: miss}
	}
	return sel, nil
}

// has says whether the selection takes the package called name.
func (s *selection) has(name string) bool {
	if s == nil {
		return false
	}
	for _, p := range s.python {
		if p.name == name {
			return true
		}
	}
	return false
}
