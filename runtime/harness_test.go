package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// need ends a sandbox test whose prerequisite is missing (testenv's rule:
// a failure under CI=true, a skip elsewhere).
func need(t *testing.T, format string, args ...any) {
	t.Helper()
	testenv.Missing(t, format, args...)
}

var shared struct {
	once   sync.Once
	rootfs string
	err    error
}

// sharedRootfs builds (or finds in the cache) the rootfs every sandbox test
// uses, once per test binary.
func sharedRootfs() (string, error) {
	shared.once.Do(func() {
		py, err := rootfs.FindPython(context.Background(), "")
		if err != nil {
			shared.err = err
			return
		}
		shared.rootfs, shared.err = rootfs.Ensure(context.Background(), py, rootfs.Options{}, rootfs.DefaultCacheDir(), nil)
	})
	return shared.rootfs, shared.err
}

// batteries is the rootfs with what MCP_EXEC_PACKAGES (mcp-exec 0.5.4's
// set) and MCP_EXEC_SHELL add, with the environment its packages need,
// built once per test binary.
var batteries struct {
	once     sync.Once
	rootfs   string
	env      []string
	mount    string
	err      error
	missing  bool
	packages []string
}

// batteryPackages is mcp-exec 0.5.4's set, what the image enables.
var batteryPackages = []string{"numpy", "pandas", "matplotlib", "pillow", "pyyaml", "jinja2"}

func batteriesRootfs() {
	batteries.once.Do(func() {
		py, err := rootfs.FindPython(context.Background(), "")
		if err != nil {
			batteries.err = err
			return
		}
		opts := rootfs.Options{Packages: batteryPackages, Shell: true}
		contents, err := rootfs.Describe(py, opts)
		if err != nil {
			// The host lacks a package: the error is the apt-get line.
			batteries.err, batteries.missing = err, true
			return
		}
		batteries.env, batteries.mount = contents.Env, rootfs.PackagesDirMountPoint(py)
		batteries.rootfs, batteries.err = rootfs.Ensure(context.Background(), py, opts, rootfs.DefaultCacheDir(), nil)
	})
}

// probePackage is the module of the packages dir the batteries harness
// mounts (MCP_EXEC_PACKAGES_DIR).
const probePackage = "mcp_exec_probe_pkg"

// withBatteries makes h's sandboxes run on the batteries rootfs with a
// packages dir mounted.
func withBatteries(t *testing.T, h *harness) {
	t.Helper()
	batteriesRootfs()
	if batteries.err != nil {
		need(t, "the rootfs with packages and a shell could not be built: %v", batteries.err)
	}
	dir := filepath.Join(t.TempDir(), "pydeps")
	if err := os.MkdirAll(filepath.Join(dir, probePackage), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, probePackage, "__init__.py"), []byte("VALUE = 42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(dir), dir, filepath.Join(dir, probePackage)} {
		os.Chmod(d, 0o755)
	}
	h.cfg.Rootfs = batteries.rootfs
	h.cfg.Env = append(h.cfg.Env, batteries.env...)
	h.cfg.PackagesDir, h.cfg.PackagesMount = dir, batteries.mount
}

// testRootfs is the one helper that decides whether sandbox tests can run
// here, and returns the rootfs they use.
func testRootfs(t *testing.T) string {
	t.Helper()
	testenv.Real(t)
	if os.Geteuid() != 0 {
		need(t, "root is required to create containers (run the tests as root)")
	}
	dir, err := sharedRootfs()
	if err != nil {
		need(t, "a Python rootfs could not be built from the host's python3: %v", err)
	}
	return dir
}

// benchRootfs is testRootfs for benchmarks.
func benchRootfs(b *testing.B) string {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("root is required to create containers")
	}
	dir, err := sharedRootfs()
	if err != nil {
		b.Fatalf("building the rootfs: %v", err)
	}
	return dir
}

// runtimeKinds are the runtimes every sandbox property is tested against.
func runtimeKinds(t *testing.T) []runtime.Kind {
	testenv.Real(t)
	kinds := []runtime.Kind{runtime.Libcontainer}
	if runscAvailable(t) {
		kinds = append(kinds, runtime.Runsc)
	}
	return kinds
}

// variant is one way the container runtimes make a sandbox: each
// runtime's forks of a template (a server's default), and a fresh
// container, or gVisor sandbox, per call (MCP_EXEC_FORK=false).
type variant struct {
	name string
	kind runtime.Kind
	fork bool
}

// variants are every runtime of runtimeKinds, fresh and forked: runsc's
// forks are "runsc", a gVisor sandbox per call "runsc-fresh".
func variants(t *testing.T) []variant {
	var vs []variant
	for _, kind := range runtimeKinds(t) {
		switch kind {
		case runtime.Libcontainer:
			vs = append(vs, variant{string(kind), kind, false}, variant{"libcontainer-fork", kind, true})
		case runtime.Runsc:
			vs = append(vs, variant{string(kind), kind, true}, variant{"runsc-fresh", kind, false})
		default:
			vs = append(vs, variant{string(kind), kind, false})
		}
	}
	return vs
}

// fresh: a container or gVisor sandbox per call, not a fork.
func (v variant) fresh() bool {
	return !v.fork && (v.kind == runtime.Libcontainer || v.kind == runtime.Runsc)
}

func (v variant) harness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	if v.fork {
		return newForkHarnessKind(t, v.kind, limits)
	}
	return newHarness(t, v.kind, limits)
}

// A mode is a way of making a sandbox that can change a property. Each
// property test declares the modes that can change it; by default it runs
// once on each runtime plus once per declared mode, and under
// MCP_EXEC_TEST_MATRIX=full in every mode (testenv.Full).
type mode uint

const (
	// modeNone: a property no mode can change, run plainly on each runtime.
	modeNone mode = 0
	// modePooled: the sandbox was prepared ahead by a pool, before its call:
	// for what preparation touches (the interpreter, the environment,
	// the working dir, the limits' accounting).
	modePooled mode = 1 << (iota - 1)
	// modeSession: the call is a persistent session's second, after a call
	// that left a variable, a file and a thread: for what a call must not
	// inherit, and what a session's sandbox must still hold.
	modeSession
	// modeBatteries: the rootfs with packages and a shell, a packages dir
	// mounted: for mounts, imports and the shell.
	modeBatteries
	// modeOldGVisor: Debian's runsc (2022-12, ptrace), the fallback when
	// the pinned current gVisor is not installed: for what a syscall-level
	// difference between gVisor versions can change.
	modeOldGVisor
	// modeFresh: libcontainer making a fresh container, and runsc a
	// gVisor sandbox, per call (MCP_EXEC_FORK=false) beside their
	// default, forks of a template: for
	// what making the sandbox can change (its identity, namespaces,
	// mounts, filter, limits). What the init and the interpreter do once
	// the sandbox is made is the same in both.
	modeFresh

	allModes = modePooled | modeSession | modeBatteries | modeOldGVisor | modeFresh
)

// run says whether a property that declared modes runs in m.
func (modes mode) run(m mode) bool { return testenv.Full() || modes&m != 0 }

// forEachRuntime runs f as a parallel subtest on each container runtime
// (libcontainer, its forks of a template, runsc), each on a sandbox
// prepared for its call, and again in each mode the property declares.
func forEachRuntime(t *testing.T, modes mode, f func(t *testing.T, h *harness)) {
	t.Helper()
	testenv.Real(t)
	forEachContainerRuntime(t, modes, f)
}

// forEachRuntimeAndProcess is forEachRuntime for a property the process
// runtime claims too: it runs f on the process runtime first (and pooled
// or in a session when declared), which needs neither root nor
// containers, so that make unit (-short) runs it; then on the container
// runtimes when the machine has them.
func forEachRuntimeAndProcess(t *testing.T, modes mode, f func(t *testing.T, h *harness)) {
	t.Helper()
	for _, m := range []struct {
		suffix string
		mode   mode
		set    func(h *harness)
	}{
		{"", 0, func(*harness) {}},
		{"-pooled", modePooled, func(h *harness) { h.pooled = true }},
		{"-session", modeSession, func(h *harness) { h.session = true }},
	} {
		if m.mode != 0 && !modes.run(m.mode) {
			continue
		}
		t.Run("process"+m.suffix, func(t *testing.T) {
			testenv.Parallel(t)
			h := newProcessHarness(t, policy.DefaultLimits())
			m.set(h)
			f(t, h)
		})
	}
	// Where the host refuses the process runtime namespaces of its own
	// (the 0.5.4 deployment's flags): what its confinement is then.
	t.Run("process-nonamespaces", func(t *testing.T) {
		testenv.Parallel(t)
		f(t, newProcessHarnessNamespaces(t, policy.DefaultLimits(), runtime.NamespacesOff))
	})
	if testing.Short() {
		return
	}
	forEachContainerRuntime(t, modes, f)
}

// containerModes are the modes a container runtime's sandbox can be made
// in, besides the plain one.
var containerModes = []struct {
	suffix string
	mode   mode
	set    func(t *testing.T, h *harness)
}{
	{"-pooled", modePooled, func(_ *testing.T, h *harness) { h.pooled = true }},
	{"-session", modeSession, func(_ *testing.T, h *harness) { h.session = true }},
	{"-batteries", modeBatteries, withBatteries},
}

// forEachContainerRuntime runs f on the variants a server uses by default
// (libcontainer's forks of a template, and runsc), and in each declared
// mode on them; a fresh libcontainer container (MCP_EXEC_FORK=false) where
// the property declares modeFresh, and in every mode under the full
// matrix.
func forEachContainerRuntime(t *testing.T, modes mode, f func(t *testing.T, h *harness)) {
	t.Helper()
	for _, v := range variants(t) {
		if v.fresh() && !modes.run(modeFresh) {
			continue
		}
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			f(t, v.harness(t, policy.DefaultLimits()))
		})
		for _, m := range containerModes {
			if !modes.run(m.mode) || (v.fresh() && !testenv.Full()) {
				continue
			}
			t.Run(v.name+m.suffix, func(t *testing.T) {
				testenv.Parallel(t)
				h := v.harness(t, policy.DefaultLimits())
				m.set(t, h)
				f(t, h)
			})
		}
		if v.kind == runtime.Runsc && v.fork && modes.run(modeSession) {
			// A session's second call on a session parked between the
			// two: restored, it must hold what it held.
			t.Run("runsc-parked", func(t *testing.T) {
				testenv.Parallel(t)
				h := newParkedHarness(t, time.Millisecond)
				h.session = true
				f(t, h)
			})
		}
		if v.kind == runtime.Runsc && v.fork && modes.run(modeOldGVisor) {
			t.Run("runsc-debian", func(t *testing.T) {
				testenv.Parallel(t)
				f(t, newHarnessConfig(t, v.kind, policy.DefaultLimits(), runtime.Config{RunscPath: debianRunsc(t)}))
			})
		}
	}
}

// harness is one runtime instance with its own state dir, checked for
// leftovers after every run and at the end.
type harness struct {
	t    *testing.T
	kind runtime.Kind
	rt   runtime.Runtime
	cfg  bundle.Config

	// pooled: calls run on sandboxes a Pool prepared ahead with cfg.
	pooled bool
	// session: each call is the second of a persistent session, after a
	// call that left a variable, a file and a thread behind.
	session bool
	// sessions configures the sessions openSession starts.
	sessions runtime.SessionConfig
	pool     *runtime.Pool
	poolCfg  bundle.Config
}

// pooledSandbox takes a sandbox the pool prepared before the call, making
// a new pool when the test changed cfg since.
func (h *harness) pooledSandbox() (runtime.Sandbox, *bundle.Bundle, func()) {
	h.t.Helper()
	if h.pool != nil && !reflect.DeepEqual(h.poolCfg, h.cfg) {
		h.pool.Close()
		h.pool = nil
	}
	if h.pool == nil {
		h.poolCfg = h.cfg
		h.pool = runtime.NewPool(runtime.PoolConfig{Size: 1, Runtime: h.rt, Config: h.cfg})
		pool := h.pool
		h.t.Cleanup(pool.Close)
	}
	// Prepared ahead, not on the call's time.
	testenv.Eventually(h.t, "the pool to prepare a sandbox", func() bool {
		st, ready := h.pool.Stats()
		if st.Failed > 0 {
			h.t.Fatalf("the pool failed to prepare a sandbox (%+v)", st)
		}
		return ready > 0
	})
	sb, warm, done, err := h.pool.Get(context.Background())
	if err != nil || !warm {
		h.t.Fatalf("pool.Get: warm %v, %v", warm, err)
	}
	return sb, runtime.BundleOf(sb), done
}

func newHarness(t *testing.T, kind runtime.Kind, limits policy.Limits) *harness {
	t.Helper()
	return newHarnessConfig(t, kind, limits, runtime.Config{})
}

// newHarnessConfig is newHarness with the runtime configured by rcfg (its
// state dir is the test's own).
func newHarnessConfig(t *testing.T, kind runtime.Kind, limits policy.Limits, rcfg runtime.Config) *harness {
	t.Helper()
	dir := testRootfs(t)
	if kind == runtime.Libcontainer {
		if err := runtime.LibcontainerUsable(); err != nil {
			need(t, "%v", err)
		}
	}
	rcfg.StateDir = filepath.Join(t.TempDir(), "state")
	rt, err := runtime.New(kind, rcfg)
	if err != nil {
		t.Fatalf("runtime.New(%s): %v", kind, err)
	}
	h := &harness{t: t, kind: kind, rt: rt, cfg: testBundleConfig(dir, rt, limits)}
	inst, instDir := runtime.InstanceID(rt), runtime.InstanceDir(rt)
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("closing runtime: %v", err)
		}
		if _, err := os.Stat(instDir); !os.IsNotExist(err) {
			t.Errorf("instance dir %s still exists after Close (err=%v)", instDir, err)
		}
		assertNoCgroups(t, inst, false)
	})
	return h
}

// newProcessHarness is a process runtime with its calls' dirs in a temp
// dir of the test's, on the host's interpreter, each call in namespaces of
// its own: a host that refuses them cannot run these tests.
func newProcessHarness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	return newProcessHarnessNamespaces(t, limits, runtime.NamespacesOn)
}

// newProcessHarnessNamespaces is newProcessHarness with namespaces as ns
// says.
func newProcessHarnessNamespaces(t *testing.T, limits policy.Limits, ns runtime.Namespaces) *harness {
	t.Helper()
	py, err := rootfs.FindPython(context.Background(), "")
	if err != nil {
		need(t, "the process runtime runs the host's python3, which is not usable: %v", err)
	}
	// On a tmpfs when the host has one, as the 0.5.4 deployment's /tmp
	// is: this host's disk takes seconds for the thousands of files some
	// tests make.
	work, err := os.MkdirTemp("/dev/shm", "mcp-exec-test-")
	if err != nil {
		work = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(work) })
	}
	// A call's own uid (under root) passes through to its dir.
	for _, d := range []string{filepath.Dir(work), work} {
		if d != "/dev/shm" {
			if err := os.Chmod(d, 0o711); err != nil {
				t.Fatal(err)
			}
		}
	}
	rt, err := runtime.New(runtime.Process, runtime.Config{StateDir: filepath.Join(t.TempDir(), "state"), WorkDir: work, ProcessNamespaces: ns})
	if err != nil && ns == runtime.NamespacesOn && strings.Contains(err.Error(), "refuses the process runtime namespaces") {
		need(t, "%v", err)
	}
	if err != nil {
		t.Fatalf("runtime.New(process): %v", err)
	}
	cfg := testBundleConfig("/", rt, limits)
	cfg.Python = py.Path
	h := &harness{t: t, kind: runtime.Process, rt: rt, cfg: cfg}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("closing runtime: %v", err)
		}
		if entries, _ := os.ReadDir(work); len(entries) != 0 {
			t.Errorf("the process runtime left %d entries in its dir %s", len(entries), work)
		}
	})
	return h
}

// testBundleConfig is the contract's defaults for a harness's bundles.
func testBundleConfig(rootfsDir string, rt runtime.Runtime, limits policy.Limits) bundle.Config {
	return bundle.Config{Rootfs: rootfsDir, Python: rootfs.PythonPath, Limits: limits, InitDir: runtime.InitDir(rt),
		CallCaps: policy.DefaultCallCaps()}
}

type runOpts struct {
	files     []runtime.File
	stdin     []byte
	timeout   time.Duration
	maxOutput int64
	cpuLimit  time.Duration
	live      *runtime.Live
	ctx       context.Context
	egress    runtime.Egress
}

// run runs code in a fresh container and asserts that nothing of it is
// left behind.
func (h *harness) run(code string, opts ...func(*runOpts)) (runtime.Result, error) {
	h.t.Helper()
	o := runOpts{timeout: 30 * time.Second, maxOutput: 1 << 20, ctx: context.Background()}
	for _, f := range opts {
		f(&o)
	}
	req := runtime.Request{Code: []byte(code), Stdin: o.stdin, Files: o.files, Timeout: o.timeout, MaxOutputBytes: o.maxOutput,
		CPULimit: o.cpuLimit, Live: o.live, Egress: o.egress}
	if h.session {
		return h.runInSession(o.ctx, req)
	}
	if h.pooled {
		sb, b, done := h.pooledSandbox()
		res, err := sb.Run(o.ctx, req)
		done()
		if cerr := sb.Close(); cerr != nil && err == nil {
			err = cerr
		}
		h.assertClean(b)
		return res, err
	}
	b, err := bundle.New(runtime.BundleDir(h.rt), h.cfg, uuid.NewString())
	if err != nil {
		h.t.Fatalf("bundle.New: %v", err)
	}
	res, err := runtime.RunBundle(o.ctx, h.rt, b, req)
	h.assertClean(b)
	return res, err
}

// priorCall is a session's call before the one under test: it leaves
// state of every kind the session keeps.
const priorCall = `import os, threading, time
prior = os.getpid()
open("prior.txt", "w").write("x")
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
`

// openSession starts a session on a sandbox of h's configuration; end
// closes it and checks that nothing of it is left.
func (h *harness) openSession() (sess *runtime.Session, end func() error) {
	h.t.Helper()
	pool := runtime.NewPool(runtime.PoolConfig{Runtime: h.rt, Config: h.cfg})
	if h.sessions.Logger == nil {
		// What a session says of itself (a park that failed, and why) is
		// in the test's output, beside a test that then waits in vain.
		h.sessions.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("test", h.t.Name())
	}
	sess, err := pool.NewSession(context.Background(), h.sessions)
	if err != nil {
		pool.Close()
		h.t.Fatalf("NewSession: %v", err)
	}
	b := runtime.SessionBundle(sess)
	return sess, func() error {
		err := sess.Close()
		pool.Close()
		h.assertClean(b)
		return err
	}
}

// runInSession runs req as the second call of a new session, and ends it.
func (h *harness) runInSession(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	h.t.Helper()
	sess, end := h.openSession()
	first, err := sess.Run(context.Background(), runtime.Request{Code: []byte(priorCall), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
	if err != nil || first.ExitCode != 0 || first.Ended != "" {
		end()
		h.t.Fatalf("a session's first call: exit %d, ended %q, %v; stderr %s", first.ExitCode, first.Ended, err, first.Stderr)
	}
	if h.sessions.Park > 0 && !h.sessions.Background {
		awaitParked(h.t, sess) // the call under test restores it
	}
	res, err := sess.Run(ctx, req)
	if cerr := end(); cerr != nil && err == nil {
		err = cerr
	}
	return res, err
}

// mustRun runs code and fails the test if the sandbox could not run it.
func (h *harness) mustRun(code string, opts ...func(*runOpts)) runtime.Result {
	h.t.Helper()
	res, err := h.run(code, opts...)
	if err != nil {
		h.t.Fatalf("Run: %v", err)
	}
	return res
}

// probe runs code that prints one JSON object, requires exit 0 and
// decodes the object into v.
func (h *harness) probe(code string, v any) {
	h.t.Helper()
	res := h.mustRun(code)
	if res.ExitCode != 0 {
		h.t.Fatalf("probe exited %d\nstdout: %s\nstderr: %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	if err := json.Unmarshal(res.Stdout, v); err != nil {
		h.t.Fatalf("probe output is not JSON: %v\nstdout: %s\nstderr: %s", err, res.Stdout, res.Stderr)
	}
}

func withStdin(b []byte) func(*runOpts)              { return func(o *runOpts) { o.stdin = b } }
func withFiles(f ...runtime.File) func(*runOpts)     { return func(o *runOpts) { o.files = f } }
func withTimeout(d time.Duration) func(*runOpts)     { return func(o *runOpts) { o.timeout = d } }
func withMaxOutput(n int64) func(*runOpts)           { return func(o *runOpts) { o.maxOutput = n } }
func withContext(ctx context.Context) func(*runOpts) { return func(o *runOpts) { o.ctx = ctx } }
func withEgress(eg runtime.Egress) func(*runOpts)    { return func(o *runOpts) { o.egress = eg } }
func withCPULimit(d time.Duration) func(*runOpts)    { return func(o *runOpts) { o.cpuLimit = d } }
func withLive(l *runtime.Live) func(*runOpts)        { return func(o *runOpts) { o.live = l } }

// assertClean checks that the call left no bundle, container state,
// cgroup, mount or process.
func (h *harness) assertClean(b *bundle.Bundle) {
	h.t.Helper()
	if _, err := os.Stat(b.Dir); !os.IsNotExist(err) {
		h.t.Errorf("bundle dir %s left behind", b.Dir)
	}
	instDir := runtime.InstanceDir(h.rt)
	filepath.WalkDir(instDir, func(p string, d os.DirEntry, err error) error {
		if err == nil && strings.Contains(p, b.ID) {
			h.t.Errorf("state of call %s left behind: %s", b.ID, p)
		}
		return nil
	})
	// Both the host's mount namespace and this process's own.
	for _, mi := range []string{"/proc/1/mountinfo", "/proc/self/mountinfo"} {
		mounts, _ := os.ReadFile(mi)
		for _, line := range strings.Split(string(mounts), "\n") {
			if strings.Contains(line, b.ID) {
				h.t.Errorf("mount left behind in %s: %s", mi, line)
			}
		}
	}
	if h.kind == runtime.Process {
		// No cgroup to look in: no process may still work in the call's
		// dir.
		assertNoProcessIn(h.t, b.Dir)
		return
	}
	assertNoCgroups(h.t, b.ID, true)
	assertNoProcesses(h.t, b.ID)
}

// assertNoProcessIn checks that no process on the host has its working
// dir in dir, the process runtime's call dir.
func assertNoProcessIn(t *testing.T, dir string) {
	t.Helper()
	var left []string
	testenv.EventuallyWithin(t, time.Second, "no process of the call in "+dir, func() bool {
		left = left[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if cwd, err := os.Readlink(filepath.Join("/proc", e.Name(), "cwd")); err == nil && strings.HasPrefix(cwd, dir) {
				left = append(left, e.Name())
			}
		}
		return len(left) == 0
	})
}

// assertNoCgroups checks that no cgroup of any controller is named after
// id (a call or an instance).
func assertNoCgroups(t *testing.T, id string, exact bool) {
	t.Helper()
	for _, root := range cgroupRoots() {
		base := filepath.Join(root, "mcp-exec")
		filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if filepath.Base(p) == id {
				t.Errorf("cgroup left behind: %s", p)
			}
			return nil
		})
	}
}

func cgroupRoots() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var roots []string
	for _, e := range entries {
		roots = append(roots, filepath.Join("/sys/fs/cgroup", e.Name()))
	}
	return append(roots, "/sys/fs/cgroup")
}

// assertNoProcesses checks that no process on the host belongs to a cgroup
// or has a command line naming id, waiting briefly for the kernel to reap.
func assertNoProcesses(t *testing.T, id string) {
	t.Helper()
	var left []string
	testenv.EventuallyWithin(t, time.Second, "no process of call "+id+" to be left", func() bool {
		left = left[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			if e.Name()[0] < '0' || e.Name()[0] > '9' {
				continue
			}
			cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
			cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if bytes.Contains(cg, []byte(id)) || bytes.Contains(cmd, []byte(id)) {
				left = append(left, e.Name()+": "+string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
			}
		}
		return len(left) == 0
	})
}
