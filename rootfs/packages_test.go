package rootfs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// fakePackages gives py (from fakeHostPython) site dirs, and lays out a
// dpkg database of two packages installed in the second: python3-fake
// (named) and python3-fakedep (its dependency).
func fakePackages(t *testing.T, py *Interpreter) (dpkg, site string) {
	t.Helper()
	root := filepath.Dir(filepath.Dir(py.Stdlib))
	site = filepath.Join(root, "lib/python3/dist-packages")
	py.SitePackages = []string{filepath.Join(root, "local/dist-packages"), site}
	pyc := "__init__." + cacheTag(*py) + ".pyc"
	files := map[string]string{
		"fake/__init__.py":             "x = 1\n",
		"fake/__pycache__/" + pyc:      "compiled\n",
		"fake/tests/test_fake.py":      "assert True\n",
		"fake/core.cpython-311-fake.c": "/* not ELF */\n",
		"fakedep.py":                   "y = 2\n",
	}
	for name, content := range files {
		p := filepath.Join(site, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// A link to what no package here installs: dropped.
	if err := os.Symlink("/usr/share/javascript/jquery.js", filepath.Join(site, "fake/jquery.js")); err != nil {
		t.Fatal(err)
	}
	status := stanza("dpkg", "amd64", "") + "\n" +
		stanza("python3-fake", "all", "python3:any, python3-fakedep (>= 1)") + "\n" +
		stanza("python3-fakedep", "all", "python3:any")
	dpkg = fakeDpkg(t, status, map[string][]string{
		"python3-fake": {
			site, filepath.Join(site, "fake"), filepath.Join(site, "fake/__init__.py"),
			filepath.Join(site, "fake/tests"), filepath.Join(site, "fake/tests/test_fake.py"),
			filepath.Join(site, "fake/jquery.js"), "/usr/share/doc/python3-fake",
		},
		"python3-fakedep": {filepath.Join(site, "fakedep.py")},
	})
	agePastClock(t, site)
	return dpkg, site
}

// Packages are cached per option set and rebuilt when a file they were
// taken from, or a package's file list, changes; a package removed since
// fails with the line that installs it.
func TestEnsurePackagesRebuildsWhenHostChanges(t *testing.T) {
	py := fakeHostPython(t)
	noApt(t)
	dpkg, site := fakePackages(t, &py)
	cache := t.TempDir()
	ctx := context.Background()
	var builds atomic.Int32
	build := func(ctx context.Context, py Interpreter, opts Options, out, manifestPath string, validate func(context.Context, string) error) error {
		builds.Add(1)
		return buildFrom(ctx, dpkg, py, opts, out, manifestPath, validate)
	}
	opts := Options{Packages: []string{"fake"}}

	dir, err := ensure(ctx, py, opts, cache, nil, build)
	if err != nil {
		t.Fatalf("Ensure(fake): %v", err)
	}
	exists := func(p string) bool {
		_, err := os.Lstat(filepath.Join(dir, p))
		return err == nil
	}
	for _, p := range []string{"fake/__init__.py", "fake/__pycache__/__init__." + cacheTag(py) + ".pyc", "fakedep.py"} {
		if !exists(filepath.Join(site, p)) {
			t.Errorf("rootfs with fake: %s is missing", p)
		}
	}
	for _, p := range []string{"fake/tests", "fake/jquery.js", "/usr/share/doc"} {
		if exists(filepath.Join(site, p)) {
			t.Errorf("rootfs with fake: %s is there; want it left out", p)
		}
	}
	if entries, err := os.ReadDir(filepath.Join(dir, py.SitePackages[0])); err != nil || len(entries) != 0 {
		t.Errorf("packages dir mount point %s: %d entries, err %v; want an empty dir", py.SitePackages[0], len(entries), err)
	}

	if again, err := ensure(ctx, py, Options{Packages: []string{"python3-fake", "Fake"}}, cache, nil, build); err != nil || again != dir || builds.Load() != 1 {
		t.Errorf("Ensure with the same packages spelled otherwise = %q, %v (builds %d); want %s, 1 build", again, err, builds.Load(), dir)
	}
	stdlib, err := ensure(ctx, py, Options{}, cache, nil, build)
	if err != nil || stdlib == dir || builds.Load() != 2 {
		t.Errorf("Ensure without packages = %q, %v (builds %d); want another rootfs than %s", stdlib, err, builds.Load(), dir)
	}
	if _, err := os.Lstat(filepath.Join(stdlib, site, "fakedep.py")); err == nil {
		t.Errorf("rootfs without packages holds fakedep.py")
	}

	c := cacheEntry{dir: cache, key: mustNormalize(t, opts).key(py)}
	later := time.Now().Add(time.Hour)
	steps := []struct {
		name   string
		change func() error
		want   string // what lookup must say is stale
	}{
		{"dependency's file touched", func() error {
			return os.Chtimes(filepath.Join(site, "fakedep.py"), later, later)
		}, filepath.Join(site, "fakedep.py") + ": mtime"},
		{"package reinstalled with another file", func() error {
			p := filepath.Join(site, "fake/more.py")
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				return err
			}
			list := filepath.Join(dpkg, "info/python3-fake.list")
			data, err := os.ReadFile(list)
			if err != nil {
				return err
			}
			tmp := list + ".new"
			if err := os.WriteFile(tmp, append(data, p+"\n"...), 0o644); err != nil {
				return err
			}
			return os.Rename(tmp, list)
		}, filepath.Join(dpkg, "info/python3-fake.list") + ": "},
	}
	for _, st := range steps {
		n := builds.Load()
		if err := st.change(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if d, why, err := c.lookup(); d != "" || err != nil || !strings.Contains(why, st.want) {
			t.Errorf("%s: lookup() = %q, %q, %v; want it stale because %q", st.name, d, why, err, st.want)
		}
		got, err := ensure(ctx, py, opts, cache, nil, build)
		if err != nil || got == dir || builds.Load() != n+1 {
			t.Errorf("%s: Ensure = %q, %v (builds %d); want a new generation", st.name, got, err, builds.Load()-n)
		}
		dir = got
	}
	if _, err := os.Lstat(filepath.Join(dir, site, "fake/more.py")); err != nil {
		t.Errorf("the file a reinstall added is not in the new generation: %v", err)
	}

	// Removed: dpkg drops the stanza and the list.
	status := stanza("dpkg", "amd64", "") + "\n" + stanza("python3-fake", "all", "python3:any, python3-fakedep (>= 1)")
	if err := os.WriteFile(filepath.Join(dpkg, "status"), []byte(status), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dpkg, "info/python3-fakedep.list")); err != nil {
		t.Fatal(err)
	}
	_, err = ensure(ctx, py, opts, cache, nil, build)
	want := "{Packages}: python3-fakedep (needed by python3-fake) is not installed on this host; install it with: apt-get install -y python3-fakedep"
	var missing *MissingPackagesError
	if !errors.As(err, &missing) || !strings.Contains(err.Error(), want) {
		t.Errorf("Ensure after a dependency was removed = %v, want a *MissingPackagesError saying %q", err, want)
	}

	got, err := describeFrom(dpkg, py, Options{Packages: []string{"python3-fake"}, Shell: false})
	if err == nil {
		t.Errorf("Describe after a dependency was removed = %+v, want the same error", got)
	}
}

func TestDescribeFake(t *testing.T) {
	py := fakeHostPython(t)
	dpkg, _ := fakePackages(t, &py)
	got, err := describeFrom(dpkg, py, Options{Packages: []string{"fake", "fakedep"}})
	if err != nil {
		t.Fatal(err)
	}
	if g, want := fmt.Sprintf("%q %v %q", got.Modules, got.Shell, got.Env), `["fake" "fakedep"] false []`; g != want {
		t.Errorf("Describe(fake, fakedep) = %s, want %s", g, want)
	}
	_, err = describeFrom(dpkg, py, Options{Shell: true})
	if want := "{Shell}: busybox-static is not installed on this host; install it with: apt-get install -y busybox-static"; err == nil || err.Error() != want {
		t.Errorf("Describe(shell) without busybox-static = %v, want %q", err, want)
	}
}

func TestTopModule(t *testing.T) {
	trees := []string{"/usr/lib/python3/dist-packages", "/usr/lib/python3.11"}
	tests := []struct{ path, want string }{
		{"/usr/lib/python3/dist-packages/numpy/__init__.py", "numpy"},
		{"/usr/lib/python3/dist-packages/numpy/core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so", "numpy"},
		{"/usr/lib/python3/dist-packages/pylab.py", "pylab"},
		{"/usr/lib/python3/dist-packages/PIL/Image.py", "PIL"},
		{"/usr/lib/python3/dist-packages/yaml_ext.cpython-311-x86_64-linux-gnu.so", "yaml_ext"},
		{"/usr/lib/python3/dist-packages/_yaml/__init__.py", ""},
		{"/usr/lib/python3/dist-packages/numpy-1.24.2.egg-info/PKG-INFO", ""},
		{"/usr/lib/python3/dist-packages/PyYAML-6.0.dist-info/RECORD", ""},
		{"/usr/lib/python3/dist-packages/matplotlib-3.6.3-nspkg.pth", ""},
		{"/usr/lib/python3/dist-packages/tests/test_x.py", ""},
		{"/usr/lib/python3/dist-packages", ""},
		{"/usr/lib/python3.11/distutils/core.py", "distutils"},
		{"/usr/share/doc/python3-numpy/copyright", ""},
	}
	for _, tt := range tests {
		if got := topModule(tt.path, trees); got != tt.want {
			t.Errorf("topModule(%s) = %q, want %q", tt.path, got, tt.want)
		}
	}
}

// The 0.5.4 image's packages, and the shell.
var (
	set054     = []string{"numpy", "pandas", "matplotlib", "pillow", "pyyaml", "jinja2"}
	set054Debs = []string{"python3-numpy", "python3-pandas", "python3-matplotlib", "python3-pil", "python3-yaml", "python3-jinja2"}
)

// requireHostPackages is the one place that decides whether a test that
// takes the host's Debian packages can run: under CI a missing one fails.
func requireHostPackages(t *testing.T, debs ...string) {
	t.Helper()
	db, err := readDpkg(dpkgDir)
	var missing []string
	for _, d := range debs {
		if err != nil || db.lookup(d) == nil {
			missing = append(missing, d)
		}
	}
	if len(missing) == 0 {
		return
	}
	testenv.Missing(t, "this test needs the host's Debian packages; install them with: apt-get install -y %s", strings.Join(missing, " "))
}

// hostDebianPython is Debian's python3, whose site dirs hold the python3-*
// packages.
func hostDebianPython(t *testing.T) Interpreter {
	t.Helper()
	py := hostPython(t)
	if !slices.Contains(py.SitePackages, "/usr/lib/python3/dist-packages") {
		testenv.Missing(t, "python %s does not import from /usr/lib/python3/dist-packages; the package tests need Debian's python3", py.Path)
	}
	return py
}

type packagesBuild struct {
	once     sync.Once
	dir      string
	manifest *manifest
	elapsed  time.Duration
	err      error
}

var packagesBuilds = struct {
	sync.Mutex
	m map[string]*packagesBuild
}{m: map[string]*packagesBuild{}}

// builtWith builds, once per test binary, the rootfs of the host's python3
// with opts, and returns it and its manifest.
func builtWith(t *testing.T, opts Options) (Interpreter, string, *manifest) {
	t.Helper()
	py := hostDebianPython(t)
	n, err := opts.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	packagesBuilds.Lock()
	b := packagesBuilds.m[n.String()]
	if b == nil {
		b = &packagesBuild{}
		packagesBuilds.m[n.String()] = b
	}
	packagesBuilds.Unlock()
	b.once.Do(func() {
		b.dir = filepath.Join(testDir, fmt.Sprintf("rootfs-%s", n.key(py)))
		start := time.Now()
		b.err = buildFrom(context.Background(), dpkgDir, py, opts, b.dir, b.dir+manifestSuffix, nil)
		b.elapsed = time.Since(start)
		if b.err == nil {
			b.manifest, b.err = readManifest(b.dir + manifestSuffix)
		}
	})
	if b.err != nil {
		t.Fatalf("Build(%s, %s): %v", py.Path, n, b.err)
	}
	return py, b.dir, b.manifest
}

// sandboxed returns a command that runs args chrooted into root as uid
// 65532, as the sandbox would: in private mount and pid namespaces, with a
// fresh proc on /proc, tmp (a host dir the test then reads) on /tmp, and
// the sandbox's environment plus env.
func sandboxed(t *testing.T, root, tmp string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	requireRoot(t)
	tools := map[string]string{}
	for _, tool := range []string{"unshare", "mount", "chroot"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			testenv.Missing(t, "no %s: %v (install util-linux and coreutils)", tool, err)
		}
		tools[tool] = p
	}
	if err := os.Chmod(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	script := `root=$1 tmp=$2 mount=$3 chroot=$4; shift 4
"$mount" --bind "$tmp" "$root/tmp" && exec "$chroot" --userspec=65532:65532 --groups=65532 "$root" "$@"`
	cmdArgs := append([]string{"--mount", "--propagation", "private", "--pid", "--fork", "--mount-proc=" + filepath.Join(root, "proc"),
		"--", "/bin/sh", "-c", script, "sh", root, tmp, tools["mount"], tools["chroot"]}, args...)
	cmd := exec.Command(tools["unshare"], cmdArgs...)
	cmd.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8", "HOME=/tmp"}, env...)
	cmd.Dir = "/"
	return cmd
}

// runSandboxed runs a sandboxed command and returns its stdout; it fails on
// a non-zero exit or anything on stderr.
func runSandboxed(t *testing.T, root, tmp string, env []string, args ...string) string {
	t.Helper()
	cmd := sandboxed(t, root, tmp, env, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("running %q chrooted into %s: %v\nstdout:\n%s\nstderr:\n%s", args, root, err, stdout.String(), stderr.String())
	}
	if stderr.Len() > 0 {
		t.Errorf("running %q chrooted into %s: stderr = %q, want empty", args, root, stderr.String())
	}
	return stdout.String()
}

// plotScript is the typical analysis: a CSV through pandas into a plot,
// shown; then another figure shown by pyplot, and one by itself (which
// pyplot must not save again).
const plotScript = `
import io, json, os, time
start = time.monotonic()
import numpy, pandas, matplotlib
imported = time.monotonic() - start
import matplotlib.pyplot as plt
df = pandas.read_csv(io.StringIO("day,sales\n1,3\n2,5\n3,4\n"))
df["double"] = numpy.asarray(df["sales"]) * 2
df.plot(x="day", y=["sales", "double"])
plt.show()
plt.figure()
plt.bar(["a", "b"], [1, 2])
plt.title("caf\u00e9 \u2013 \u03c0")
plt.show()
fig, ax = plt.subplots()
ax.scatter([1, 2], [2, 1])
fig.show()
plt.show()
print(json.dumps({
    "backend": matplotlib.get_backend(),
    "outputs": sorted(os.listdir("/tmp/outputs")),
    "figures": plt.get_fignums(),
    "import_seconds": imported,
    "tz": str(pandas.Timestamp("2024-01-01", tz="Europe/Paris")),
}))
`

func TestPackagesPlotChrooted(t *testing.T) {
	requireRoot(t)
	requireHostPackages(t, append(slices.Clone(set054Debs), "busybox-static")...)
	opts := Options{Packages: set054, Shell: true}
	py, root, _ := builtWith(t, opts)
	contents, err := Describe(py, opts)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// A file of that name is the user's: never overwritten.
	outputs := filepath.Join(tmp, "outputs")
	if err := os.Mkdir(outputs, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outputs, "figure-1.png"), []byte("mine"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(outputs, 0o777); err != nil {
		t.Fatal(err)
	}
	out := runSandboxed(t, root, tmp, contents.Env, PythonPath, "-c", plotScript)
	var got struct {
		Backend       string   `json:"backend"`
		Outputs       []string `json:"outputs"`
		Figures       []int    `json:"figures"`
		ImportSeconds float64  `json:"import_seconds"`
		TZ            string   `json:"tz"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("plot script output %q: %v", out, err)
	}
	if got.Backend != MatplotlibBackend || strings.Join(got.Outputs, " ") != "figure-1.png figure-2.png figure-3.png figure-4.png" || len(got.Figures) != 0 {
		t.Errorf("plot script: backend %q, outputs %q, figures left open %v; want %s, figure-1.png (the user's) to figure-4.png, none",
			got.Backend, got.Outputs, got.Figures, MatplotlibBackend)
	}
	if got.TZ != "2024-01-01 00:00:00+01:00" {
		t.Errorf("pandas.Timestamp in Europe/Paris = %q, want 2024-01-01 00:00:00+01:00 (zoneinfo)", got.TZ)
	}
	if data, err := os.ReadFile(filepath.Join(outputs, "figure-1.png")); err != nil || string(data) != "mine" {
		t.Errorf("figure-1.png, there before = %q, %v; want it untouched", data, err)
	}
	for _, name := range []string{"figure-2.png", "figure-3.png", "figure-4.png"} {
		data, err := os.ReadFile(filepath.Join(outputs, name))
		if err != nil || !bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")) || len(data) < 1000 {
			t.Errorf("%s: %d bytes, err %v; want a PNG", name, len(data), err)
		}
	}
	t.Logf("import numpy, pandas, matplotlib in the chroot: %.2fs", got.ImportSeconds)
}

func TestPackagesImportChrooted(t *testing.T) {
	requireRoot(t)
	requireHostPackages(t, append(slices.Clone(set054Debs), "busybox-static")...)
	_, root, _ := builtWith(t, Options{Packages: set054, Shell: true})
	const script = `
import json, subprocess, os, sys
import yaml, jinja2, PIL.Image, numpy
img = PIL.Image.new("RGB", (4, 4), "red")
img.save("/tmp/x.jpg"); img.save("/tmp/x.webp"); img.save("/tmp/x.tiff")
import matplotlib.pyplot as plt
plt.plot([1, 2]); plt.savefig("/tmp/x.pdf"); plt.savefig("/tmp/x.svg")
a = numpy.random.default_rng(0).random((50, 50))
def importable(m):
    try:
        __import__(m)
        return True
    except ImportError:
        return False
print(json.dumps({
    "yaml": yaml.safe_load("a: [1, 2]"),
    "jinja2": jinja2.Template("{{ x }}!").render(x="hi"),
    "inv": bool(numpy.allclose(a @ numpy.linalg.inv(a), numpy.eye(50))),
    "shell": subprocess.run("echo $((6*7)) | cat", shell=True, capture_output=True, text=True).stdout,
    "system": os.system("true"),
    "host_only": [m for m in ("pip", "apt", "apt_pkg", "tkinter", "_tkinter", "scipy", "sympy", "lxml") if importable(m)],
    "backend": plt.get_backend(),
}))
`
	out := runSandboxed(t, root, t.TempDir(), nil, PythonPath, "-c", script)
	// No MPLBACKEND: the rootfs's /etc/matplotlibrc makes the sandbox's
	// backend the default.
	want := `{"yaml": {"a": [1, 2]}, "jinja2": "hi!", "inv": true, "shell": "42\n", "system": 0, "host_only": [], "backend": "module://mcp_exec_backend"}`
	if strings.TrimSpace(out) != want {
		t.Errorf("imports in the rootfs printed\n%s\nwant\n%s", out, want)
	}

	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	// ls hides dot entries (/.mcp-exec).
	entries = slices.DeleteFunc(entries, func(e os.DirEntry) bool { return strings.HasPrefix(e.Name(), ".") })
	if got, want := strings.TrimSpace(runSandboxed(t, root, t.TempDir(), nil, "/bin/sh", "-c", "ls / | wc -l")), fmt.Sprint(len(entries)); got != want {
		t.Errorf("sh -c 'ls / | wc -l' = %q, want %s", got, want)
	}
}

func TestPackagesScipySympyChrooted(t *testing.T) {
	requireRoot(t)
	requireHostPackages(t, "python3-scipy", "python3-sympy")
	_, root, _ := builtWith(t, Options{Packages: []string{"scipy", "sympy"}})
	const script = `
import scipy, scipy.linalg, scipy.optimize, scipy.stats, sympy
x = sympy.symbols("x")
print(sympy.integrate(x**2, (x, 0, 3)), round(float(scipy.optimize.brentq(lambda v: v*v - 2, 0, 2)), 6), round(float(scipy.stats.norm.cdf(0)), 3))
`
	if got, want := strings.TrimSpace(runSandboxed(t, root, t.TempDir(), nil, PythonPath, "-c", script)), "9 1.414214 0.5"; got != want {
		t.Errorf("scipy and sympy in the rootfs printed %q, want %q", got, want)
	}
}

// Debian byte-compiles packages at install into __pycache__, in no file
// list: the rootfs must have the .pyc files, or every call recompiles
// numpy and pandas, unable to cache them on a read-only root.
func TestPackagesPycUsed(t *testing.T) {
	requireRoot(t)
	requireHostPackages(t, append(slices.Clone(set054Debs), "busybox-static")...)
	_, root, _ := builtWith(t, Options{Packages: set054, Shell: true})
	cmd := sandboxed(t, root, t.TempDir(), nil, PythonPath, "-v", "-c", "import numpy, pandas, matplotlib.pyplot, PIL.Image, yaml, jinja2")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python -v -c 'import numpy, ...': %v\n%s", err, out)
	}
	var fromSource []string
	loaded := 0
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "# code object from ") {
			loaded++
			if !strings.HasSuffix(line, ".pyc'") && !strings.HasSuffix(line, ".pyc") {
				fromSource = append(fromSource, line)
			}
		}
	}
	if loaded < 300 || len(fromSource) > 0 {
		t.Errorf("python -v -c 'import numpy, ...': %d modules loaded, %d compiled from source (%q); want hundreds, all from .pyc", loaded, len(fromSource), fromSource)
	}
}

func TestPackagesLayout(t *testing.T) {
	requireHostPackages(t, append(slices.Clone(set054Debs), "busybox-static")...)
	opts := Options{Packages: set054, Shell: true}
	py, root, m := builtWith(t, opts)
	files, size := checkLayout(t, root)
	t.Logf("rootfs with %s: %d files, %.1f MiB", opts, files, float64(size)/(1<<20))

	etc, err := os.ReadDir(filepath.Join(root, "etc"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range etc {
		names = append(names, e.Name())
	}
	if got, want := strings.Join(names, " "), "group hostname hosts matplotlibrc nsswitch.conf passwd"; got != want {
		t.Errorf("/etc holds %q, want %q (nothing of the host's /etc: no alternatives)", got, want)
	}
	if data, err := os.ReadFile(filepath.Join(root, "etc/matplotlibrc")); err != nil || string(data) != matplotlibRC {
		t.Errorf("/etc/matplotlibrc = %q, %v; want %q", data, err, matplotlibRC)
	}

	// libblas.so.3 reaches OpenBLAS through /etc/alternatives: a copy
	// under the link's name, with the chain in the manifest.
	blas := "/usr/lib/x86_64-linux-gnu/libblas.so.3"
	if fi, err := os.Lstat(filepath.Join(root, blas)); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("%s in the rootfs: %v (err %v), want a regular file", blas, fi, err)
	}
	recorded := map[string]sourceKind{}
	for _, s := range m.Sources {
		recorded[s.Path] = s.Kind
	}
	for p, kind := range map[string]sourceKind{
		blas: kindLink,
		"/etc/alternatives/libblas.so.3-x86_64-linux-gnu":  kindLink,
		"/var/lib/dpkg/info/python3-numpy.list":            kindFile,
		"/var/lib/dpkg/info/tzdata.list":                   kindFile,
		"/usr/share/zoneinfo/Europe/Paris":                 kindFile,
		"/usr/lib/python3/dist-packages/numpy/__init__.py": kindFile,
		"/usr/bin/busybox":                                 kindFile,
	} {
		if recorded[p] != kind {
			t.Errorf("manifest: %s is %q, want %q", p, recorded[p], kind)
		}
	}

	mp := PackagesDirMountPoint(py)
	if entries, err := os.ReadDir(filepath.Join(root, mp)); err != nil || len(entries) != 0 {
		t.Errorf("packages dir mount point %s: %d entries, err %v; want an empty dir", mp, len(entries), err)
	}

	// Only what the selected packages installed, the backend and Debian's
	// compiled modules are in dist-packages; no tests/ tree anywhere.
	plan, err := planHost(py, mustNormalize(t, opts), dpkgDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{"__pycache__": true, matplotlibBackendModule + ".py": true}
	for _, p := range plan.sel.python {
		files, err := plan.db.files(p, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if rel, ok := strings.CutPrefix(f, "/usr/lib/python3/dist-packages/"); ok {
				top, _, _ := strings.Cut(rel, "/")
				allowed[top] = true
			}
		}
	}
	dist, err := os.ReadDir(filepath.Join(root, "/usr/lib/python3/dist-packages"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range dist {
		if !allowed[e.Name()] {
			t.Errorf("/usr/lib/python3/dist-packages/%s is in the rootfs; no selected package installed it", e.Name())
		}
	}
	share, err := os.ReadDir(filepath.Join(root, "/usr/share"))
	if err != nil {
		t.Fatal(err)
	}
	var shareNames []string
	for _, e := range share {
		shareNames = append(shareNames, e.Name())
	}
	if got, want := strings.Join(shareNames, " "), "fonts matplotlib zoneinfo"; got != want {
		t.Errorf("/usr/share holds %q, want %q", got, want)
	}
	filepath.WalkDir(filepath.Join(root, "/usr/lib/python3/dist-packages"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && d.Name() == "tests" {
			t.Errorf("%s is in the rootfs; want tests/ trees left out", strings.TrimPrefix(p, root))
			return filepath.SkipDir
		}
		return nil
	})
	for _, p := range []string{"/bin/sh", "/bin/ls", "/usr/bin/awk", "/usr/bin/env"} {
		if target, err := os.Readlink(filepath.Join(root, "/usr/bin", filepath.Base(p))); err != nil || target != "busybox" {
			t.Errorf("%s -> %q (err %v), want busybox", p, target, err)
		}
	}
}

func mustNormalize(t *testing.T, o Options) Options {
	t.Helper()
	n, err := o.Normalize()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDescribeHost(t *testing.T) {
	requireHostPackages(t, append(slices.Clone(set054Debs), "busybox-static")...)
	py := hostDebianPython(t)
	got, err := Describe(py, Options{Packages: set054, Shell: true})
	if err != nil {
		t.Fatal(err)
	}
	if g, want := fmt.Sprintf("%q %v %q", got.Modules, got.Shell, got.Env),
		`["jinja2" "matplotlib" "mpl_toolkits" "numpy" "pandas" "PIL" "pylab" "yaml"] true ["MPLBACKEND=module://mcp_exec_backend"]`; g != want {
		t.Errorf("Describe(0.5.4 set, shell) = %s, want %s", g, want)
	}
	if got, err := Describe(py, Options{}); err != nil || len(got.Modules) != 0 || got.Shell || len(got.Env) != 0 {
		t.Errorf("Describe(Options{}) = %+v, %v; want nothing", got, err)
	}
}

// A package the host lacks fails the build, before anything is copied,
// with the line that installs it; nothing is left behind.
func TestBuildMissingPackage(t *testing.T) {
	py := hostPython(t)
	noApt(t)
	parent := t.TempDir()
	out := filepath.Join(parent, "rootfs")
	err := Build(context.Background(), py, Options{Packages: []string{"json", "mcp-exec-surely-not-a-package"}}, out, nil)
	want := "{Packages}: json and mcp-exec-surely-not-a-package are not installed on this host; install them with: apt-get install -y python3-json python3-mcp-exec-surely-not-a-package"
	var missing *MissingPackagesError
	if !errors.As(err, &missing) || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("Build with packages the host lacks = %v,\nwant a *MissingPackagesError ending %q", err, want)
	}
	if missing != nil && strings.Join(missing.Packages(), " ") != "python3-json python3-mcp-exec-surely-not-a-package" {
		t.Errorf("MissingPackagesError.Packages() = %q", missing.Packages())
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("a failed build left %d entries in %s", len(entries), parent)
	}
}

// noApt makes the host's package lists unknown to the test: whether Debian
// has a package is TestMissingPackagesError's to check, and the answer
// depends on the host's lists.
func noApt(t *testing.T) {
	saved := aptHas
	aptHas = func(string) availability { return unknown }
	t.Cleanup(func() { aptHas = saved })
}
