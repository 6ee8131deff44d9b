package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/inhuman/mcp-exec/policy"
)

// MatplotlibBackend is the MPLBACKEND value that makes matplotlib use the
// backend Build writes into a rootfs with matplotlib: Agg, with plt.show()
// saving every open figure to /tmp/outputs as PNG and closing them, named
// as the sandbox's driver names them (figure-1.png, figure-2.png, ...; in
// a persistent session figure-C-1.png, C the call's number; an existing
// file is never overwritten). fig.show() saves that one figure, which
// plt.show() then does not save again. (The driver also saves and closes,
// at the end of each call, the figures the code left open.)
const MatplotlibBackend = "module://" + matplotlibBackendModule

const matplotlibBackendModule = "mcp_exec_backend"

// matplotlibBackendSource is the backend module. matplotlib takes
// FigureCanvas and show from it and derives the rest. It is written by the
// builder, never taken from the host, and compiled at each import: the root
// is read-only, and the module is a few lines.
const matplotlibBackendSource = `"""matplotlib backend of mcp-exec's sandbox: Agg, and show() saves.

plt.show() writes every open figure as PNG to ` + policy.OutputsDir + `, named as
the sandbox's driver names figures (figure-1.png, figure-2.png, ...), never
over an existing file, and closes the figures: the caller gets them back as
files. fig.show() writes that figure, and plt.show() does not write it
again.
"""
import os
import sys

from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

# ` + policy.OutputsDir + ` in the sandbox; the call's own dir under the process
# runtime, whose temp dir is the call's working dir.
OUTPUTS = os.path.join(os.environ.get("TMPDIR") or "` + policy.WorkDir + `", "` + policy.OutputsName + `")
_next = 1


def _save(figure):
    # The driver's naming, where it runs (every sandbox); this one's own
    # for an interpreter without it.
    driver = sys.modules.get("_mcp_exec_display")
    if driver is not None:
        driver.save_figure(figure)
        return
    global _next
    os.makedirs(OUTPUTS, exist_ok=True)
    while True:
        path = os.path.join(OUTPUTS, "figure-%d.png" % _next)
        _next += 1
        try:
            f = open(path, "xb")
        except FileExistsError:
            continue
        with f:
            # Tight: nothing drawn past the figure edge (a long tick label)
            # is cut off.
            figure.savefig(f, format="png", bbox_inches="tight")
        return


class FigureManager(FigureManagerBase):
    _saved = False

    def show(self):
        if not self._saved:
            _save(self.canvas.figure)
        self._saved = True


class FigureCanvas(FigureCanvasAgg):
    manager_class = FigureManager


def show(*args, **kwargs):
    managers = sorted(Gcf.get_all_fig_managers(), key=lambda m: str(m.num).zfill(12))
    for manager in managers:
        if not getattr(manager, "_saved", False):
            _save(manager.canvas.figure)
    Gcf.destroy_all()
`

// WriteMatplotlibBackend writes the backend module into dir, for an
// interpreter that does not run on a rootfs of this package (the process
// runtime): put dir on its PYTHONPATH and set MPLBACKEND.
func WriteMatplotlibBackend(dir string) error {
	p := filepath.Join(dir, matplotlibBackendModule+".py")
	if err := os.WriteFile(p, []byte(matplotlibBackendSource), 0o644); err != nil {
		return fmt.Errorf("writing the matplotlib backend: %w", err)
	}
	return os.Chmod(p, 0o644)
}

// matplotlibRC is the rootfs's /etc/matplotlibrc, the one file of /etc a
// package adds. Debian's matplotlib reads its rc file from /etc (the host's
// asks for TkAgg) and its defaults from mpl-data; this one only makes the
// sandbox's backend the default, so that plt.show() saves even where
// MPLBACKEND is not set.
const matplotlibRC = "backend: " + MatplotlibBackend + "\n"

// shareSkipped are the dirs of /usr/share whose files a data package never
// needs at run time.
var shareSkipped = map[string]bool{
	"doc": true, "doc-base": true, "man": true, "info": true,
	"lintian": true, "bug": true, "menu": true,
}

// hostPlan is what a build takes from the host's packages, decided before
// anything is copied.
type hostPlan struct {
	db  *dpkgDB
	sel *selection // nil without packages
	// busybox is the host path of busybox, "" without a shell.
	busybox string
	// trees are where the python3-* packages' files are taken from.
	trees []string
}

func (p *hostPlan) has(name string) bool {
	return p != nil && p.sel.has(name)
}

// planHost resolves opts against the host's dpkg database in
// dpkgDir; src (may be nil) records what decided it. All that the host lacks
// is said in one error.
func planHost(py Interpreter, opts Options, dpkgDir string, src *sources) (*hostPlan, error) {
	db, err := readDpkg(dpkgDir)
	if err != nil {
		return nil, err
	}
	plan := &hostPlan{db: db, trees: packageTrees(py)}
	var errs []error
	if opts.hasPackages() {
		reqs, err := opts.requests()
		if err != nil {
			return nil, err
		}
		if plan.sel, err = db.selectPackages(reqs, src); err != nil {
			errs = append(errs, err)
		} else if err := plan.checkTrees(py, src); err != nil {
			errs = append(errs, err)
		}
	}
	if opts.Shell {
		if plan.busybox, err = findBusybox(db, src); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return plan, nil
}

// packageTrees are the dirs python3-* packages' files are taken from: the
// interpreter's site dirs, but for the packages dir mount point, and its
// stdlib (python3-distutils installs there).
func packageTrees(py Interpreter) []string {
	mp := PackagesDirMountPoint(py)
	var trees []string
	for _, d := range py.SitePackages {
		if d != mp {
			trees = append(trees, d)
		}
	}
	return append(trees, py.Stdlib, py.PlatStdlib)
}

func treeOf(p string, trees []string) string {
	for _, t := range trees {
		if within(p, t) && p != t {
			return t
		}
	}
	return ""
}

// checkTrees refuses named packages whose modules lie where the interpreter
// does not import from: Debian's packages are for Debian's python3, not for
// a pyenv or a /usr/local one.
func (p *hostPlan) checkTrees(py Interpreter, src *sources) error {
	for _, pkg := range p.sel.named {
		files, err := p.db.files(pkg, src)
		if err != nil {
			return err
		}
		inside, outside := false, ""
		for _, f := range files {
			if !strings.HasSuffix(f, ".py") {
				continue
			}
			if treeOf(f, p.trees) != "" {
				inside = true
				break
			}
			if outside == "" && strings.Contains(f, "/python3") {
				outside = filepath.Dir(f)
			}
		}
		if !inside && outside != "" {
			return fmt.Errorf("{Packages}: %s installs its modules in %s, where python %s (%s) does not import from; use the distribution's python3, /usr/bin/python3",
				pkg.name, outside, py.Version, py.Path)
		}
	}
	return nil
}

// findBusybox returns the busybox executable of Debian's busybox-static.
func findBusybox(db *dpkgDB, src *sources) (string, error) {
	const pkg = "busybox-static"
	p := db.lookup(pkg)
	if p == nil {
		src.stat(filepath.Join(db.dir, "info", pkg+".list"))
		return "", fmt.Errorf("{Shell}: %s is not installed on this host; install it with: apt-get install -y %s", pkg, pkg)
	}
	files, err := db.files(p, src)
	if err != nil {
		return "", err
	}
	for _, f := range files {
		if filepath.Base(f) != "busybox" {
			continue
		}
		if fi, err := os.Stat(f); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", fmt.Errorf("{Shell}: %s lists no busybox executable that exists; reinstall it with: apt-get install --reinstall -y %s", pkg, pkg)
}

// cacheTag is the interpreter's sys.implementation.cache_tag, which names
// its compiled modules: cpython-311 for 3.11.
func cacheTag(py Interpreter) string {
	parts := strings.SplitN(py.Version, ".", 3)
	if len(parts) < 2 {
		return ""
	}
	return "cpython-" + parts[0] + parts[1]
}

// inTestsDir says whether f lies in a tests/ dir below tree: the packages'
// own test suites, ~30% of numpy, pandas, scipy and sympy, which no user
// code imports.
func inTestsDir(f, tree string) bool {
	rel, err := filepath.Rel(tree, filepath.Dir(f))
	if err != nil {
		return false
	}
	return strings.Contains("/"+rel+"/", "/tests/")
}

// packages queues the files of the planned packages: of python3-* ones,
// those in the interpreter's trees (but tests/), with the compiled modules
// Debian made at install time (they are in no file list); of data packages,
// those under /usr/share (but docs). It returns the links met, kept later
// only if they lead to something the rootfs holds, and the ELF files, whose
// libraries must be resolved.
func (b *builder) packages(py Interpreter, plan *hostPlan) (links, elfs []string, err error) {
	tag := cacheTag(py)
	take := func(pkg *debPackage, f string, python bool) error {
		if err := b.ctx.Err(); err != nil {
			return err
		}
		fi, err := os.Lstat(f)
		if err != nil {
			b.src.record(f, fi, err)
			return fmt.Errorf("copying %s of %s: %w; reinstall it with: apt-get install --reinstall -y %s", f, pkg.name, err, pkg.name)
		}
		switch {
		case fi.IsDir():
			// Made when something in it is; an empty one is no use.
			return nil
		case fi.Mode()&fs.ModeSymlink != 0:
			b.src.record(f, fi, nil)
			links = append(links, f)
			return nil
		case !fi.Mode().IsRegular():
			return nil
		}
		if _, err := b.place(f); err != nil {
			return err
		}
		if !python {
			return nil
		}
		if strings.HasSuffix(f, ".py") && tag != "" {
			pyc := filepath.Join(filepath.Dir(f), "__pycache__", strings.TrimSuffix(filepath.Base(f), ".py")+"."+tag+".pyc")
			if fi, err := os.Lstat(pyc); err == nil && fi.Mode().IsRegular() {
				if _, err := b.place(pyc); err != nil {
					return err
				}
			}
		}
		if (isSharedObject(filepath.Base(f)) || fi.Mode()&0o111 != 0) && isELFFile(f) {
			elfs = append(elfs, f)
		}
		return nil
	}

	for _, pkg := range plan.sel.python {
		files, err := plan.db.files(pkg, b.src)
		if err != nil {
			return nil, nil, err
		}
		for _, f := range files {
			tree := treeOf(f, plan.trees)
			if tree == "" || !b.keepTests && inTestsDir(f, tree) {
				continue
			}
			if err := take(pkg, f, true); err != nil {
				return nil, nil, err
			}
		}
	}
	for _, pkg := range plan.sel.data {
		files, err := plan.db.files(pkg, b.src)
		if err != nil {
			return nil, nil, err
		}
		for _, f := range files {
			rel, ok := strings.CutPrefix(f, "/usr/share/")
			if !ok {
				continue
			}
			top, _, _ := strings.Cut(rel, "/")
			if shareSkipped[top] {
				continue
			}
			if err := take(pkg, f, false); err != nil {
				return nil, nil, err
			}
		}
	}
	return links, elfs, nil
}

// matplotlibBackend writes the backend module next to matplotlib.
func (b *builder) matplotlibBackend(plan *hostPlan) error {
	pkg := plan.db.lookup("python3-matplotlib")
	files, err := plan.db.files(pkg, nil)
	if err != nil {
		return err
	}
	site := ""
	for _, f := range files {
		if strings.HasSuffix(f, "/matplotlib/__init__.py") && treeOf(f, plan.trees) != "" {
			site = filepath.Dir(filepath.Dir(f))
			break
		}
	}
	if site == "" {
		return fmt.Errorf("writing the matplotlib backend: %s has no matplotlib/__init__.py", pkg.name)
	}
	real, err := filepath.EvalSymlinks(site)
	if err != nil || !b.made[real] {
		return fmt.Errorf("writing the matplotlib backend: %s is not in the rootfs (%v)", site, err)
	}
	p := filepath.Join(real, matplotlibBackendModule+".py")
	if b.made[p] {
		return fmt.Errorf("writing the matplotlib backend: %s is already taken", p)
	}
	if err := b.claim(p); err != nil {
		return err
	}
	dst := filepath.Join(b.root, p)
	if err := os.WriteFile(dst, []byte(matplotlibBackendSource), 0o644); err != nil {
		return fmt.Errorf("writing the matplotlib backend: %w", err)
	}
	if err := os.Chmod(dst, 0o644); err != nil {
		return fmt.Errorf("writing the matplotlib backend: %w", err)
	}
	b.made[p] = true
	b.etc = append(b.etc, etcFile{"matplotlibrc", matplotlibRC})
	return nil
}

// emptyDir makes p an empty dir of the rootfs, with real dirs all the way:
// a mount onto it must not follow a link.
func (b *builder) emptyDir(p string) error {
	cur := "/"
	for _, c := range splitPath(p) {
		cur = filepath.Join(cur, c)
		if !b.made[cur] {
			if err := b.mkdir(cur); err != nil {
				return err
			}
			continue
		}
		fi, err := os.Lstat(filepath.Join(b.root, cur))
		if err != nil || !fi.IsDir() {
			return fmt.Errorf("creating mount point %s: %s is not a directory in the rootfs", p, cur)
		}
	}
	for q := range b.made {
		if within(q, p) && q != p {
			return fmt.Errorf("creating mount point %s: the rootfs already holds %s there", p, q)
		}
	}
	return nil
}

// PackagesDirMountPoint is the empty dir every rootfs built for py has where
// a dir of Python packages (MCP_EXEC_PACKAGES_DIR) can be mounted read-only
// and be imported without setting PYTHONPATH: the first of py's site dirs,
// which site adds to sys.path when it exists, before the distribution's
// own (/usr/local/lib/python3.X/dist-packages for Debian's python). It is ""
// for an Interpreter that lists no site dirs.
func PackagesDirMountPoint(py Interpreter) string {
	if len(py.SitePackages) == 0 {
		return ""
	}
	return py.SitePackages[0]
}

// Contents is what a rootfs built with some Options offers the code run in
// it, for the tool's description.
type Contents struct {
	// Modules are the top-level public modules the named packages install,
	// sorted without regard to case: for the 0.5.4 set jinja2, matplotlib,
	// mpl_toolkits, numpy, pandas, PIL, pylab, yaml. What they depend on
	// (dateutil, pytz, ...) is importable too, and not listed.
	Modules []string
	// Shell says whether /bin/sh and busybox's applets are there.
	Shell bool
	// Env are the KEY=VALUE entries the sandbox's environment needs for
	// the rootfs to work as described: MPLBACKEND with matplotlib.
	Env []string
}

// Describe says what a rootfs built for py with opts offers, reading the
// host's dpkg database as Build does: it fails as Build would when the host
// lacks a package, and costs a few ms, so it is the check to run at start.
func Describe(py Interpreter, opts Options) (Contents, error) {
	return describeFrom(dpkgDir, py, opts)
}

func describeFrom(dpkgDir string, py Interpreter, opts Options) (Contents, error) {
	if err := opts.Validate(); err != nil {
		return Contents{}, err
	}
	c := Contents{Shell: opts.Shell}
	if !opts.hasPackages() && !opts.Shell {
		return c, nil
	}
	plan, err := planHost(py, opts, dpkgDir, nil)
	if err != nil {
		return Contents{}, err
	}
	if plan.sel == nil {
		return c, nil
	}
	seen := map[string]bool{}
	for _, pkg := range plan.sel.named {
		files, err := plan.db.files(pkg, nil)
		if err != nil {
			return Contents{}, err
		}
		for _, f := range files {
			if m := topModule(f, plan.trees); m != "" && !seen[m] {
				seen[m] = true
				c.Modules = append(c.Modules, m)
			}
		}
	}
	slices.SortFunc(c.Modules, func(a, b string) int {
		return strings.Compare(strings.ToLower(a), strings.ToLower(b))
	})
	if plan.has("python3-matplotlib") {
		c.Env = append(c.Env, "MPLBACKEND="+MatplotlibBackend)
	}
	return c, nil
}

// topModule is the public top-level module a package file makes
// importable, or "": numpy for .../dist-packages/numpy/core/x.py, pylab for
// .../dist-packages/pylab.py; nothing for a private _yaml.
func topModule(f string, trees []string) string {
	tree := treeOf(f, trees)
	if tree == "" {
		return ""
	}
	if !strings.HasSuffix(f, ".py") && !strings.HasSuffix(f, ".so") {
		return ""
	}
	rel, _ := filepath.Rel(tree, f)
	top, _, isDir := strings.Cut(rel, "/")
	if !isDir {
		// pylab.py, or _foo.cpython-311-x86_64-linux-gnu.so.
		top, _, _ = strings.Cut(top, ".")
	}
	if top == "" || top == "tests" || strings.HasPrefix(top, "_") || strings.ContainsAny(top, ".-") {
		return ""
	}
	return top
}
