package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
	"github.com/inhuman/mcp-exec/server"
)

// engine wires rootfs, bundle and runtime together: it is the server's
// Engine and what the run subcommand calls.
type engine struct {
	set           settings
	rt            runtime.Runtime
	bundleCfg     bundle.Config
	pythonVersion string
	contents      rootfs.Contents
	// moreModules counts what the process runtime's host Python imports
	// beyond contents.Modules.
	moreModules int
	// note says, when the runtime is not a per-call container, what the
	// sandbox is instead and why it was chosen.
	note string
	// pool runs every call: on sandboxes prepared ahead (startPool), or
	// on one prepared for the call.
	pool *runtime.Pool
	log  *slog.Logger
	// watch sees any change to the served rootfs (and packages dir):
	// calls are refused from then on (checkRootfs).
	watch       *rootfs.Watcher
	mounts      map[string]string // watched dir → where the sandbox has it
	changedOnce sync.Once
	// prepared is the outcome of the newest sandbox preparation, for the
	// readiness (ready).
	prepared atomic.Pointer[prepareOutcome]
	// egress is the network allowlist's proxy, nil without one; network
	// what the tool's description says of it.
	egress  *egressWiring
	network string
}

// newEngine creates the runtime (refusing when the host cannot give the
// full sandbox) and opens the rootfs, proven in that runtime's sandboxes.
// What it takes of the configuration it takes once, here (settingsOf).
func newEngine(ctx context.Context, cfg config, log *slog.Logger) (_ *engine, retErr error) {
	defer func() { retErr = named(retErr) }()
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &engine{set: settingsOf(cfg, log), log: log}
	var err error
	if e.egress, err = newEgress(cfg, log); err != nil {
		return nil, err
	}
	if err := e.start(ctx); err != nil {
		e.egress.close()
		return nil, err
	}
	if e.egress != nil {
		e.network = egressNote(cfg.Egress, slices.Contains(e.contents.Modules, "pip"))
		log.Info("network allowlist on: sandboxes reach hosts through the egress proxy", "reachable", cfg.Egress.Reachable(),
			"relay", fmt.Sprintf("127.0.0.1:%d in each sandbox", policy.RelayPort))
	}
	return e, nil
}

// settings are what the engine takes of the configuration, in the forms
// the packages below it take: the runtime's, the rootfs', and what every
// sandbox's bundle shares but its rootfs.
type settings struct {
	kind     runtime.Kind // as configured: auto, or one
	runtime  runtime.Config
	source   rootfs.Source
	limits   policy.Limits
	caps     policy.CallCaps
	sessions runtime.SessionConfig
	// unused are the rootfs settings set, which the process runtime does
	// not use: it runs the host's interpreter.
	unused [][2]string
	// data is what the data dir holds, for the description; nil without.
	data *server.DataInfo
}

func settingsOf(cfg config, log *slog.Logger) settings {
	rt := runtime.Config{
		StateDir:      cfg.StateDir,
		Logger:        log,
		RunscPath:     cfg.RunscPath,
		RunscPlatform: cfg.RunscPlatform,
		Fork:          runtime.ForkConfig{Enabled: cfg.Fork, MaxCalls: cfg.ForkMaxCalls, MaxAge: cfg.ForkMaxAge},

		ProcessNamespaces: cfg.ProcessNamespaces,
	}
	if cfg.Shell {
		// The process runtime runs the host's own tools where a container
		// has busybox's.
		rt.Executables = []string{"/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"}
	}
	var unused [][2]string
	for _, v := range [][2]string{{"MCP_EXEC_ROOTFS", cfg.Rootfs}, {"MCP_EXEC_ROOTFS_IMAGE", cfg.RootfsImage}, {"MCP_EXEC_PACKAGES_DIR", cfg.PackagesDir}} {
		if v[1] != "" {
			unused = append(unused, v)
		}
	}
	var data *server.DataInfo
	if cfg.DataDir != "" {
		d := dataListing(cfg.DataDir)
		data = &d
	}
	return settings{kind: cfg.Runtime, runtime: rt, limits: cfg.Limits, caps: cfg.CallCaps, unused: unused, data: data,
		source: rootfs.Source{Dir: cfg.Rootfs, Image: cfg.RootfsImage, Python: cfg.Python,
			Options: cfg.rootfsOptions(), PackagesDir: cfg.PackagesDir, DataDir: cfg.DataDir, CacheDir: cfg.CacheDir},
		sessions: runtime.SessionConfig{Background: cfg.PersistentBackground, Park: cfg.PersistentPark, Logger: log}}
}

// start creates the runtime and readies its sandboxes: the process
// runtime's on the host's interpreter, a container's on the rootfs it
// opens.
func (e *engine) start(ctx context.Context) (retErr error) {
	rt, why, err := newRuntime(e.set.kind, e.set.runtime)
	if err != nil {
		return fmt.Errorf("the sandbox cannot start: %w", err)
	}
	defer func() {
		if retErr != nil {
			rt.Close()
		}
	}()
	e.rt = rt
	if e.egress != nil {
		if err := runtime.NetworkUsable(rt); err != nil {
			return fmt.Errorf("the sandbox cannot start: %w", err)
		}
	}
	if p, ok := rt.(*runtime.ProcessRuntime); ok {
		return e.startProcess(ctx, p, why)
	}
	if e.set.kind == runtime.Auto {
		e.log.Info("runtime chosen", "configured", e.set.kind, "runtime", rt.Kind(), "why", why)
	}
	start := time.Now()
	root, err := rootfs.Open(ctx, e.set.source, e.prove)
	if err != nil {
		return fmt.Errorf("the sandbox cannot start: %w", e.pipMissing(err))
	}
	e.log.Debug("rootfs ready", "dir", root.Dir, "python", root.Python, "digest", root.Digest, "elapsed", time.Since(start))
	e.contents, e.pythonVersion = root.Contents, root.PythonVersion
	e.bundleCfg = e.bundleConfig(root)
	if err := e.watchRootfs(root); err != nil {
		return fmt.Errorf("the sandbox cannot start: %w", err)
	}
	e.pool = e.newPool(0, false)
	return nil
}

// watchRootfs watches the rootfs every sandbox binds, and the packages
// dir, for changes made on the host while the server serves them.
func (e *engine) watchRootfs(root rootfs.Root) error {
	e.mounts = map[string]string{root.Dir: "/"}
	dirs := []string{root.Dir}
	if pd := e.set.source.PackagesDir; pd != "" && root.PackagesMount != "" {
		e.mounts[pd] = root.PackagesMount
		dirs = append(dirs, pd)
	}
	w, err := rootfs.Watch(dirs...)
	if err != nil {
		return err
	}
	e.watch = w
	return nil
}

// checkRootfs refuses a call once a file of the served rootfs changed:
// its code would run on files nobody proved. The caller is told which
// file, as the sandbox names it; the log says which on the host, and how
// to serve again.
func (e *engine) checkRootfs() error {
	ce := e.rootfsChanged()
	if ce == nil {
		return nil
	}
	inside := filepath.Join(e.mounts[ce.Dir], ce.Rel)
	return &server.RefusedError{Reason: fmt.Sprintf("the server refuses calls: a file of its Python rootfs changed while it serves it (%s %s); "+
		"the operator must restart the server, which proves the rootfs again", inside, ce.What)}
}

// rootfsChanged is the first change to the served rootfs, or nil; the
// first time it is seen, the log says which file and what to do.
func (e *engine) rootfsChanged() *rootfs.ChangedError {
	if e.watch == nil {
		return nil
	}
	var ce *rootfs.ChangedError
	if !errors.As(e.watch.Changed(), &ce) {
		return nil
	}
	e.changedOnce.Do(func() {
		e.log.Error("a file of the rootfs changed while the server serves it: every call is refused from now on",
			"change", ce.Error(),
			"fix", "if the change is wanted, restart the server: it proves the rootfs again at start; a cached rootfs ("+
				"under the cache dir) is never changed by mcp-exec: remove the changed generation and restart to rebuild it")
	})
	return ce
}

// newRuntime creates the runtime of kind, and says why when auto chose it.
func newRuntime(kind runtime.Kind, cfg runtime.Config) (runtime.Runtime, string, error) {
	if kind == runtime.Auto {
		return runtime.NewAuto(cfg)
	}
	rt, err := runtime.New(kind, cfg)
	return rt, "", err
}

// prove runs what rootfs.Open asks in a sandbox of this engine: the start-up
// probe, or the byte-compiling of an image.
func (e *engine) prove(ctx context.Context, t rootfs.Trial) (string, error) {
	bc := e.bundleConfig(t.Root)
	if t.Compile {
		return "", e.compileImage(ctx, bc)
	}
	return e.validateRootfs(ctx, bc, t.Root.Contents.Modules, t.Preload)
}

// compileImage byte-compiles an image's Python tree before it is cached:
// images such as python:*-slim ship no .pyc, and on a read-only root every
// call would compile the whole standard library again. The compiler runs
// in a sandbox like any code, with the bytecode redirected to
// /tmp/outputs (PYTHONPYCACHEPREFIX) and returned as output files, which
// are then put where the interpreter looks for them: the image's files
// stay read-only to the sandbox and nothing of the image runs on the host.
func (e *engine) compileImage(ctx context.Context, bc bundle.Config) error {
	bc.Limits.MemoryBytes = max(bc.Limits.MemoryBytes, 1<<30)
	bc.Limits.TmpfsBytes = 768 << 20
	bc.Limits.CPUs = max(bc.Limits.CPUs, 2)
	bc.MaxFiles, bc.MaxFileBytes = 50000, 512<<20
	bc.Env = append(bc.Env, "PYTHONPYCACHEPREFIX="+policy.OutputsDir)
	code := "import compileall\ncompileall.compile_path(skip_curdir=True, quiet=2)\n"
	res, err := runtime.Run(ctx, e.rt, bc, runtime.Request{Code: []byte(code), Timeout: 10 * time.Minute, MaxOutputBytes: 64 << 10})
	if err != nil {
		return fmt.Errorf("byte-compiling the image in a sandbox: %w", err)
	}
	if res.TimedOut || res.ExitCode > 1 || res.FilesTruncated {
		return fmt.Errorf("byte-compiling the image in a sandbox: exit %d, timed out %v, output cut %v: %s",
			res.ExitCode, res.TimedOut, res.FilesTruncated, lastLines(res.Stderr, 3))
	}
	n, err := rootfs.PlaceBytecode(bc.Rootfs, func(yield func(string, []byte) bool) {
		for _, f := range res.Files {
			if !yield(f.Path, f.Data) {
				return
			}
		}
	})
	e.log.Debug("byte-compiled the image", "files", n)
	return err
}

// processNote is the tool description's paragraph about the process
// runtime: what each call gets, what this host lacks of it, and what the
// code must do differently.
func processNote(configured runtime.Kind, why string, iso runtime.ProcessIsolation, limits policy.Limits, stackBytes int64) string {
	n := "Isolation: " + iso.Summary() + "."
	if configured == runtime.Auto && why != "" {
		// The reason in full is the operator's (the log, doctor).
		n += " (MCP_EXEC_RUNTIME=auto chose this: no per-call container can be made here.)"
	}
	if names := missingNames(iso.Missing); names != "" {
		n += " This host lacks: " + names + "."
	}
	if iso.Namespaces {
		n += " There are no IP sockets, and multiprocessing's pools, queues and locks are not available (they need a /dev/shm, which the call has not): use threads."
	} else {
		n += " There are no IP or unix sockets (socketpair works), and multiprocessing's pools, queues, locks and managers are not available: use threads."
	}
	// The call's CPU is counted over its process tree: a child the kernel
	// reaps itself (SIGCHLD ignored) would take its time with it.
	n += " SIGCHLD's handler cannot be changed (signal.signal(signal.SIGCHLD, ...) raises PermissionError), so multiprocessing's forkserver start method does not work; fork and spawn do."
	return n + " " + processLimitsNote(iso, limits, stackBytes)
}

// processLimitsNote says how the process runtime's limits, rlimits rather
// than a cgroup's, differ from what the limits line says: what the
// process limit counts, that thread stacks count in the memory limit,
// and what the memory limit does at its bound.
func processLimitsNote(iso runtime.ProcessIsolation, limits policy.Limits, stackBytes int64) string {
	var n string
	if !iso.Namespaces && !iso.UIDPerCall {
		n = fmt.Sprintf("The process limit counts the server's own uid, which every call shares: a call may start %d processes/threads beyond what that uid ran when the call began, fewer where that would take the uid near its own limit. ", limits.Pids)
	}
	if iso.ContainerPids > 0 {
		n += fmt.Sprintf("The container's own process limit (%d) bounds the server and all calls together: a call gets no more than it leaves free. ", iso.ContainerPids)
	}
	if stackBytes > 0 {
		n += fmt.Sprintf("Each thread's stack (%d MiB) counts in the memory limit: about %d threads fit. ", stackBytes/mib, limits.MemoryBytes/stackBytes-2)
	}
	return n + "At the memory limit an allocation fails (MemoryError) rather than the process being killed: a MemoryError that ends the code is reported as oom_killed."
}

func missingNames(ms []host.Missing) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.What
	}
	return strings.Join(names, ", ")
}

// startProcess readies the process runtime: the host's interpreter, its
// packages, and the matplotlib backend beside them, in the runtime's dir.
func (e *engine) startProcess(ctx context.Context, p *runtime.ProcessRuntime, why string) error {
	// Said once, with why auto chose it: the reason is long.
	iso := p.Isolation()
	e.note = expandFields(processNote(e.set.kind, why, iso, e.set.limits, threadStack()))
	if e.egress != nil {
		// The network's sentence says what its IPv4 sockets reach.
		e.note = strings.Replace(e.note, "There are no IP sockets, and", "Besides the network proxy there are no IP sockets, and", 1)
	}
	e.log.Warn("each call is a fresh process with no container of its own: the container mcp-exec runs in is the boundary for what it does not confine",
		"configured", e.set.kind, "runtime", p.Kind(), "why", why, "namespaces", iso.Namespaces, "isolation", iso.Summary(), "missing", missingNames(iso.Missing))
	for _, v := range e.set.unused {
		e.log.Info("not used by the process runtime, which runs the host's interpreter", "setting", v[0], "value", v[1])
	}
	py, err := rootfs.FindPython(ctx, e.set.source.Python)
	if err != nil {
		return fmt.Errorf("the sandbox cannot start: finding python ({Python}): %w", err)
	}
	if e.contents, err = rootfs.Describe(py, e.set.source.Options); err != nil {
		return fmt.Errorf("the sandbox cannot start: %w", e.pipMissing(err))
	}
	e.bundleCfg = e.bundleConfig(rootfs.Root{Dir: "/", Python: py.Path, Contents: e.contents})
	// The host's interpreter imports whatever its site-packages hold,
	// whatever MCP_EXEC_PACKAGES names: the description says what.
	packages := e.contents.Modules
	if err := e.hostModules(ctx); err != nil {
		return fmt.Errorf("the sandbox cannot start: listing what the host's Python imports: %w", err)
	}
	if slices.Contains(e.contents.Modules, "matplotlib") {
		// The rootfs's backend, as a container's has it (rootfs.Build):
		// plt.show() saves each figure where it comes back.
		lib := filepath.Join(p.Dir(), "lib")
		if err := os.Mkdir(lib, 0o755); err != nil {
			return fmt.Errorf("the sandbox cannot start: %w", err)
		}
		if err := rootfs.WriteMatplotlibBackend(lib); err != nil {
			return fmt.Errorf("the sandbox cannot start: %w", err)
		}
		e.bundleCfg.Env = append(e.bundleCfg.Env, "PYTHONPATH="+lib)
		if !slices.ContainsFunc(e.bundleCfg.Env, func(kv string) bool { return strings.HasPrefix(kv, "MPLBACKEND=") }) {
			e.bundleCfg.Env = append(e.bundleCfg.Env, "MPLBACKEND="+rootfs.MatplotlibBackend)
		}
	}
	e.pythonVersion, err = e.validateRootfs(ctx, e.bundleCfg, packages, nil)
	if err != nil {
		return fmt.Errorf("the sandbox cannot start: %w", err)
	}
	e.pool = e.newPool(0, false)
	return nil
}

// pipMissing says why a package is asked for that the operator did not
// name: the allowlist puts pip in the rootfs (rootfsOptions).
func (e *engine) pipMissing(err error) error {
	var missing *rootfs.MissingPackagesError
	if e.egress != nil && errors.As(err, &missing) && slices.Contains(missing.Packages(), "python3-pip") {
		return fmt.Errorf("MCP_EXEC_EGRESS_ALLOW is set, which puts pip in the rootfs (from the host's Debian package): %w", err)
	}
	return err
}

// batteries are the modules of a host's Python the process runtime's
// description names when they import in its sandbox, in this order; the
// rest of its site-packages it counts. (A desktop's Python holds dozens
// of modules of the system's own: apt, dbus, gi.)
var batteries = []string{"numpy", "pandas", "matplotlib", "scipy", "sympy", "sklearn", "statsmodels", "seaborn",
	"networkx", "PIL", "cv2", "skimage", "yaml", "jinja2", "requests", "bs4", "lxml", "openpyxl", "pyarrow",
	"polars", "dateutil", "pytz", "tqdm", "plotly", "h5py", "xarray", "numba", "torch", "tensorflow"}

// hostModules lists, in a sandbox of the process runtime, what its
// interpreter imports beyond the standard library: the top-level modules
// of its site-packages, of which the batteries are each imported (in a
// process of their own) to be named. The description names those that
// import, and those MCP_EXEC_PACKAGES named, and counts the rest.
func (e *engine) hostModules(ctx context.Context) error {
	probe := fmt.Sprintf(`import json, pkgutil, subprocess, sys, sysconfig
paths = sysconfig.get_paths()
std = {paths["stdlib"], paths["platstdlib"]}
found = set()
for p in sys.path[1:]:
    if p in std or p.endswith((".zip", "lib-dynload")):
        continue
    for m in pkgutil.iter_modules([p]):
        if m.name.isidentifier() and not m.name.startswith(("_", "mcp_exec")):
            found.add(m.name)
ok = [m for m in %s if m in found and subprocess.run([sys.executable, "-c", "import " + m], capture_output=True).returncode == 0]
print(json.dumps({"found": sorted(found), "import": ok}))
`, pythonList(batteries))
	res, err := runtime.Run(ctx, e.rt, e.bundleCfg, runtime.Request{Code: []byte(probe), Timeout: 120 * time.Second, MaxOutputBytes: 1 << 20})
	if err != nil {
		return err
	}
	var got struct{ Found, Import []string }
	if res.ExitCode != 0 || json.Unmarshal(res.Stdout, &got) != nil {
		return fmt.Errorf("the probe ended with exit %d: %s", res.ExitCode, lastLines(res.Stderr, 3))
	}
	named := slices.Concat(got.Import, e.contents.Modules)
	slices.Sort(named)
	e.contents.Modules = slices.Compact(named)
	e.moreModules = 0
	for _, m := range got.Found {
		if !slices.Contains(e.contents.Modules, m) {
			e.moreModules++
		}
	}
	return nil
}

// pythonList renders names as a Python list literal.
func pythonList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// bundleConfig is what every sandbox of this engine on root shares.
func (e *engine) bundleConfig(root rootfs.Root) bundle.Config {
	bc := bundle.Config{
		Rootfs:   root.Dir,
		Python:   root.Python,
		Limits:   e.set.limits,
		CallCaps: e.set.caps,
		Env:      append(threadEnv(e.set.limits.CPUs), root.Contents.Env...),
	}
	e.egress.network(&bc)
	if pd := e.set.source.PackagesDir; pd != "" && root.PackagesMount != "" {
		bc.PackagesDir, bc.PackagesMount = pd, root.PackagesMount
	}
	bc.DataDir = e.set.source.DataDir
	return bc
}

// threadEnv tells the numeric libraries how many threads the CPU quota is
// worth: OpenBLAS and OpenMP start one per CPU they see otherwise, each
// counting against the pids limit and fighting over the quota.
func threadEnv(cpus float64) []string {
	n := strconv.Itoa(max(1, int(math.Ceil(cpus))))
	return []string{"OPENBLAS_NUM_THREADS=" + n, "OMP_NUM_THREADS=" + n, "MKL_NUM_THREADS=" + n, "NUMEXPR_MAX_THREADS=" + n}
}

const (
	preloadPrefix = "MCP_EXEC_PRELOAD"
	dataPrefix    = "MCP_EXEC_DATA_DIR"
)

// validateRootfs runs the interpreter inside a real sandbox and returns its
// version: a rootfs that cannot run Python there, or import what it is said
// to hold, is refused.
func (e *engine) validateRootfs(ctx context.Context, bcfg bundle.Config, modules, preload []string) (string, error) {
	// The preloads are imported by the interpreter's start, before the
	// probe's first line; site only warns when one fails.
	probe := "import sys\n"
	for _, m := range preload {
		// Say why: the import's own error, not site's "Remainder of
		// file ignored".
		probe += fmt.Sprintf(`if %[1]q not in sys.modules:
    try:
        __import__(%[1]q)
    except BaseException as e:
        sys.exit(f"%[2]s: %[1]s cannot be imported in the sandbox: {type(e).__name__}: {e}; is its package in MCP_EXEC_PACKAGES (or the packages dir)?")
    sys.exit("%[2]s: %[1]s imports, but the interpreter did not import it as it started")
`, m, preloadPrefix)
	}
	if bcfg.DataDir != "" {
		// The data dir as the sandbox's uid sees it: listed, or why not.
		probe += fmt.Sprintf(`import os
try:
    os.listdir(%[1]q)
except OSError as e:
    sys.exit(f"%[2]s: {e.strerror}: %[1]s cannot be listed in the sandbox; it must be readable and searchable by every user (chmod a+rX), the sandbox being a user of its own")
`, policy.DataDir, dataPrefix)
	}
	probe += "import json, sqlite3, ssl, decimal, ctypes, multiprocessing\n"
	for _, m := range modules {
		probe += "import " + m + "\n"
	}
	probe += "print('%d.%d.%d' % sys.version_info[:3])\n"
	res, err := runtime.Run(ctx, e.rt, bcfg, runtime.Request{Code: []byte(probe), Timeout: 120 * time.Second, MaxOutputBytes: 64 << 10})
	if err != nil {
		return "", err
	}
	if line := lastLines(res.Stderr, 1); res.ExitCode == 1 && (strings.HasPrefix(line, preloadPrefix+": ") || strings.HasPrefix(line, dataPrefix+": ")) {
		return "", errors.New(line)
	}
	if res.ExitCode != 0 || res.TimedOut {
		return "", fmt.Errorf("python did not start in the sandbox (exit %d, timed out %v): %s",
			res.ExitCode, res.TimedOut, strings.TrimSpace(lastLines(res.Stderr, 3)))
	}
	return strings.TrimSpace(string(res.Stdout)), nil
}

// startPool starts keeping sandboxes prepared ahead, per the
// configuration: a fixed number, or adaptive up to the concurrency. With
// none (0, and until it is called), calls still run through a pool, which
// prepares each one's sandbox on its time.
func (e *engine) startPool(cfg config) {
	if cfg.PoolSize == 0 {
		return
	}
	size, adaptive := cfg.PoolSize, false
	if cfg.PoolSize < 0 {
		size, adaptive = cfg.MaxConcurrency, true
	}
	e.pool.Close() // the empty one newEngine made: it holds nothing
	e.pool = e.newPool(size, adaptive)
}

// newPool makes a pool of this engine's sandboxes. Forked ones are cheap
// enough to keep one more ready than the calls of the last minute needed.
func (e *engine) newPool(size int, adaptive bool) *runtime.Pool {
	spare := 0
	if lc, ok := e.rt.(runtime.Forker); ok && adaptive && lc.Forking().Enabled {
		spare = 1
	}
	return runtime.NewPool(runtime.PoolConfig{Runtime: recording{e.rt, e}, Config: e.bundleCfg,
		Size: size, Adaptive: adaptive, Spare: spare, Logger: e.log})
}

// recording is the engine's runtime as its pool sees it: the outcome of
// each preparation is kept, for the readiness (ready).
type recording struct {
	runtime.Runtime
	e *engine
}

// Unwrap is the runtime, for what the pool asks of it beyond Runtime
// (runtime.SessionPreparer).
func (r recording) Unwrap() runtime.Runtime { return r.Runtime }

func (r recording) Prepare(ctx context.Context, cfg bundle.Config) (runtime.Sandbox, error) {
	sb, err := r.Runtime.Prepare(ctx, cfg)
	if ctx.Err() == nil {
		r.e.prepared.Store(&prepareOutcome{at: time.Now(), err: err})
	}
	return sb, err
}

// Run runs one call in a fresh sandbox, through the pool: one prepared
// ahead when there is one, else one prepared now. Either is used for
// this call only and torn down after it, off the call's time.
func (e *engine) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if err := e.checkRootfs(); err != nil {
		return runtime.Result{}, err
	}
	record := e.egress.call(&req)
	res, err := e.pool.Run(ctx, req)
	record(&res)
	return res, named(err)
}

// NewSession makes a persistent session's sandbox, through the pool.
func (e *engine) NewSession(ctx context.Context) (server.Session, error) {
	if err := e.checkRootfs(); err != nil {
		return nil, err
	}
	sess, err := e.pool.NewSession(ctx, e.set.sessions)
	if err != nil {
		return nil, named(err)
	}
	return engineSession{sess, e}, nil
}

// engineSession names the settings in a session's errors, as Run does,
// and refuses its calls once the rootfs changed.
type engineSession struct {
	*runtime.Session
	e *engine
}

func (s engineSession) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if err := s.e.checkRootfs(); err != nil {
		return runtime.Result{}, err
	}
	record := s.e.egress.call(&req)
	res, err := s.Session.Run(ctx, req)
	record(&res)
	return res, named(err)
}

// Info describes the sandbox for the tool description.
func (e *engine) Info() server.EngineInfo {
	return server.EngineInfo{Runtime: string(e.rt.Kind()), PythonVersion: e.pythonVersion,
		Modules: e.contents.Modules, MoreModules: e.moreModules, Shell: e.contents.Shell, Note: e.note, Network: e.network, Data: e.set.data}
}

func (e *engine) close() error {
	// The rootfs this server used was used until now: the cache's bound
	// removes the least recently used first.
	defer rootfs.TouchHeld()
	if e.pool != nil {
		e.pool.Close()
	}
	if e.watch != nil {
		e.watch.Close()
	}
	defer e.egress.close()
	return e.rt.Close()
}

func lastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// prepareOutcome is how a sandbox preparation ended.
type prepareOutcome struct {
	at  time.Time
	err error
}

// unreadyAfterFailure is how long a failed sandbox preparation makes the
// server not ready: long enough for a load balancer to send calls
// elsewhere, short enough that a server whose calls prepare their own
// sandboxes gets calls again, to find out whether one can start now.
const unreadyAfterFailure = 30 * time.Second

// ready says whether calls can run now, for GET /readyz (no host path:
// it answers anyone): the rootfs is as proved, and the newest sandbox
// preparation, if any, did not fail just now.
func (e *engine) ready() error {
	if e.rootfsChanged() != nil {
		return errors.New("a file of the rootfs changed while the server serves it; it refuses calls until it is restarted (its log names the file)")
	}
	if p := e.prepared.Load(); p != nil && p.err != nil && time.Since(p.at) < unreadyAfterFailure {
		return errors.New("the newest sandbox could not start (its log says why)")
	}
	return nil
}

// threadStack is the stack a new thread of the code gets by default:
// glibc's, the RLIMIT_STACK the code inherits from the server, or 2 MiB
// when that is unlimited.
func threadStack() int64 {
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_STACK, &rl) != nil || rl.Cur == unix.RLIM_INFINITY {
		return 2 << 20
	}
	return int64(rl.Cur)
}
