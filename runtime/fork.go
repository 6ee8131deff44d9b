package runtime

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/moby/sys/capability"
	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/manager"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// Forked sandboxes. Starting a container costs a call several times what
// starting bare Python does (namespaces, mounts, cgroups, runc's init
// stage, the interpreter's own start), and a pool only moves that work
// off the call's time. A forked sandbox skips most of it: a template — a
// libcontainer sandbox made as every other, the same rootfs, packages
// and preloads — starts its interpreter as a zygote that never runs a
// caller's code. For each call, the template's init forks the call's init
// into new mount, pid, network, ipc, uts and cgroup namespaces and the
// call's own cgroups, where it makes what a fresh container has (its
// /proc, masked; fresh /tmp, /dev/shm and /code; the hostname; lo); the
// zygote forks the code's process into those namespaces, which drops to
// the code's uid with no capability, no_new_privs and the sandbox's
// seccomp filter before the init lets it read any code (the init checks
// it from outside, and moves it into the call's cgroups). From there a
// call runs and is torn down exactly as any sandbox's (sandbox.go,
// supervise.go). runtime/sandboxinit (init_template.c, zygote.py) says how.
//
// One difference a process can see: the code's parent is the zygote,
// outside the call's pid namespace, so its getppid() is 0 (as for a
// process docker exec starts), not the init's 1; the zygote hands the
// init its exit status. A second interpreter fork and an exec per call
// would make the init its parent, at about a third more CPU per call
// (measured: docs/performance.md).
//
// A template lives in a call slot (slots.go) for its whole life and forks
// one sandbox at a time: the kernel's per-user counts are then shared by
// no two sandboxes, as with fresh containers. What the forks of one
// template do share — the interpreter's memory as the template left it,
// its string hash secret, its address-space layout — is why a template
// serves a bounded number of calls for a bounded time (ForkConfig), and
// is set out in docs/sandbox.md.

// ForkConfig configures forked sandboxes (libcontainer only).
type ForkConfig struct {
	// Enabled forks each sandbox from a template; otherwise each is a
	// container of its own from the start.
	Enabled bool
	// MaxCalls and MaxAge bound a template's life: past either it is
	// replaced once its current call ends. DefaultForkMaxCalls and
	// DefaultForkMaxAge when 0.
	MaxCalls int
	MaxAge   time.Duration
}

const (
	DefaultForkMaxCalls = 500
	DefaultForkMaxAge   = 10 * time.Minute
	// templateIdle is how long an unused template is kept.
	templateIdle = 2 * time.Minute
	// forkFailuresToStop is how many forks in a row may fail before the
	// runtime makes fresh containers instead, for good.
	forkFailuresToStop = 3
)

func (c *ForkConfig) setDefaults() {
	if c.MaxCalls <= 0 {
		c.MaxCalls = DefaultForkMaxCalls
	}
	if c.MaxAge <= 0 {
		c.MaxAge = DefaultForkMaxAge
	}
}

// forkTimeout bounds a template's answer to a fork: the fork itself, and
// the call's init in its cgroups. A variable for tests.
var forkTimeout = 10 * time.Second

// reapTimeout bounds the wait for a template to say a call's processes
// are all reaped, from the call's first kill: a template that does not
// (its interpreter stopped, or a child of it it cannot reap) is killed
// and replaced, so that no call keeps a template, its call slot and its
// processes for ever. A variable for tests.
var reapTimeout = 5 * time.Second

// forkUID holds, by runtime instance, the uid a fork's code process is
// asked to take instead of its bundle's: tests play a template whose
// forks are not confined, which the call's init must refuse (by instance,
// as forkSeccompEdit).
var forkUID sync.Map // instance id → uint32

// forkUIDOf is the uid instance inst's fork of b asks for.
func forkUIDOf(inst string, b *bundle.Bundle) uint32 {
	if v, ok := forkUID.Load(inst); ok {
		return v.(uint32)
	}
	return b.Init.UID
}

// forkSeccompEdit holds, by runtime instance, an edit of the filters of
// that instance's templates and their forks: a test opens a hole in it to
// attack what stands behind it. By instance: one test's hole must never
// reach another's sandboxes, run beside it (a CLONE_PARENT the runsc
// seccomp test saw allowed, once, in a full run).
var forkSeccompEdit sync.Map // instance id → func(*specs.LinuxSeccomp)

// editedSeccomp is s, or a copy of it that instance inst's edit edited.
func editedSeccomp(inst string, s *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	v, ok := forkSeccompEdit.Load(inst)
	if !ok || s == nil {
		return s
	}
	edit := v.(func(*specs.LinuxSeccomp))
	c := *s
	c.Syscalls = slices.Clone(s.Syscalls)
	for i := range c.Syscalls {
		c.Syscalls[i].Args = slices.Clone(c.Syscalls[i].Args)
	}
	edit(&c)
	return &c
}

// TemplatePrefix begins the id of every template: its bundle, container
// state and cgroups are an instance's, not a call's.
const TemplatePrefix = "template-"

// errFork refines ErrSandbox: the template failed, not the call; a fresh
// container can take the call instead.
var errFork = errors.New("the template could not fork the sandbox")

// template is one template and what it has served.
type template struct {
	key templateKey
	box templateBox
	// born: when it was made, for ForkConfig.MaxAge.
	born time.Time
	// Guarded by templates.mu.
	calls    int
	lastUsed time.Time
}

// templateBox is what the registry's bookkeeping needs of a template's
// sandbox: whether it can still fork, and its end. A zygote is one; the
// registry's tests use tokens.
type templateBox interface {
	// alive: its interpreter waits for forks.
	alive() bool
	Close() error
}

// zygote is a libcontainer template: its sandbox, whose init forks the
// calls' sandboxes, and what every fork of it is given.
type zygote struct {
	sb   *sandbox
	fork *forkedSetup
}

func (z *zygote) alive() bool {
	select {
	case <-z.sb.done:
		return false
	default:
	}
	return z.sb.status() == ready
}

func (z *zygote) Close() error { return z.sb.Close() }

// forkedSetup is what every fork of a template is given: its init's
// configuration of the fresh namespaces, the code's seccomp filter, and
// the cgroup configuration its calls' cgroups are made from.
type forkedSetup struct {
	config *initproto.Fresh
	bpf    []byte
	cgroup *cgroups.Cgroup
	// roots are, on cgroup v1, where each of callControllers has its
	// hierarchy: a call's cgroup there is the root and the call's path.
	// Found once per template, not once a call (each lookup reads the
	// mount table, one per controller).
	roots map[string]string
}

// templates are a runtime's templates, by the configuration of the
// sandboxes they fork: which are busy, which wait, which are past their
// bounds or dead and replaced, and whether forking goes on at all.
type templates struct {
	cfg ForkConfig
	log *slog.Logger
	// start makes a template of the configuration of a call's bundle, as
	// a Pool's runtime prepares its sandboxes: a zygote
	// (LibcontainerRuntime.startTemplate), or a token in tests.
	start func(ctx context.Context, call *bundle.Bundle) (templateBox, error)

	mu       sync.Mutex
	idle     []*template
	busy     map[*template]bool
	failures int    // in a row
	forks    int64  // sandboxes forked and torn down whole
	lastErr  string // the last failure
	disabled string // why forking stopped; "" while it goes on
	closed   bool
	stop     chan struct{}
	done     sync.WaitGroup
}

func newTemplates(cfg ForkConfig, log *slog.Logger, start func(context.Context, *bundle.Bundle) (templateBox, error)) *templates {
	cfg.setDefaults()
	ts := &templates{cfg: cfg, log: log, start: start, busy: map[*template]bool{}, stop: make(chan struct{})}
	ts.done.Add(1)
	go ts.sweep()
	return ts
}

// templateKey is what makes a template: the sandboxes of one key can be
// forks of one template, whose rootfs, interpreter, packages, data dir
// (its mounts are theirs), environment, limits and caps they get. Not of
// it: a call's CPU weight (bundle.Config.Ahead), which its own cgroup
// has, and the mark of a template's own bundle (Template).
type templateKey struct {
	rootfs, python, initDir    string
	packagesDir, packagesMount string
	dataDir                    string
	env                        string // NUL-separated
	limits                     policy.Limits
	caps                       policy.CallCaps
	// relay is the network's relay port, 0 without the network (whose
	// site dir is a mount of the template's); the CA bundle is each
	// fork's own, written by its init.
	relay int
}

func keyOf(cfg bundle.Config) templateKey {
	k := templateKey{rootfs: cfg.Rootfs, python: cfg.Python, initDir: cfg.InitDir,
		packagesDir: cfg.PackagesDir, packagesMount: cfg.PackagesMount, dataDir: cfg.DataDir, env: strings.Join(cfg.Env, "\x00"),
		limits: cfg.Limits, caps: cfg.CallCaps}
	if cfg.Network != nil {
		k.relay = cfg.Network.RelayPort
	}
	return k
}

// acquire returns a template for b's sandboxes that nothing else uses,
// starting one when none waits.
func (ts *templates) acquire(ctx context.Context, b *bundle.Bundle) (*template, error) {
	key := keyOf(b.Config)
	t, stale, err := ts.take(key)
	for _, s := range stale {
		ts.retire(s)
	}
	if t != nil || err != nil {
		return t, err
	}
	box, err := ts.start(ctx, b)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	t = &template{key: key, box: box, born: now, lastUsed: now}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed {
		go box.Close()
		return nil, fmt.Errorf("%w: runtime is closed", ErrSandbox)
	}
	ts.busy[t] = true
	return t, nil
}

// take takes the newest idle template of key that is still usable, and
// hands back those it found stale, to retire.
func (ts *templates) take(key templateKey) (t *template, stale []*template, err error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.closed || ts.disabled != "" {
		return nil, nil, fmt.Errorf("%w: %w: forking is off (%s)", ErrSandbox, errFork, ts.disabled)
	}
	for i := len(ts.idle) - 1; i >= 0; i-- {
		c := ts.idle[i]
		if c.key != key {
			continue
		}
		ts.idle = slices.Delete(ts.idle, i, i+1)
		if !ts.usable(c) {
			stale = append(stale, c)
			continue
		}
		ts.busy[c] = true
		return c, stale, nil
	}
	return nil, stale, nil
}

// on says whether sandboxes are still forked: not after
// forkFailuresToStop templates in a row failed.
func (ts *templates) on() bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.disabled == "" && !ts.closed
}

// usable: alive, and within its bounds. ts.mu is held.
func (ts *templates) usable(t *template) bool {
	return t.box.alive() && t.calls < ts.cfg.MaxCalls && time.Since(t.born) < ts.cfg.MaxAge
}

// startTemplate makes a template for the sandboxes of call's
// configuration: a sandbox of its own, ready once its zygote is.
func (r *LibcontainerRuntime) startTemplate(ctx context.Context, call *bundle.Bundle) (templateBox, error) {
	cfg := call.Config
	cfg.Ahead, cfg.Template = false, true
	tb, err := newBundle(r.inst.templateDir(), r.inst.initDir(), cfg, TemplatePrefix+uuid.NewString())
	if err != nil {
		return nil, fmt.Errorf("%w: the template's: %w", errFork, err)
	}
	setup, err := forkSetupOf(call, r.inst.cgroupPath("template"), func(s *specs.LinuxSeccomp) ([]byte, error) {
		return r.seccompFilter(editedSeccomp(r.inst.id, s))
	}, false)
	if err != nil {
		tb.Remove()
		return nil, fmt.Errorf("%w: %w: %w", ErrSandbox, errFork, err)
	}
	tb.Spec.Linux.Seccomp = editedSeccomp(r.inst.id, tb.Spec.Linux.Seccomp)
	sb, err := prepare(ctx, &r.live, tb, &lcContainer{rt: r, b: tb, template: true})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		r.templates.failed(err)
		return nil, fmt.Errorf("%w: starting a template: %w", errFork, err)
	}
	return &zygote{sb: sb.(*sandbox), fork: setup}, nil
}

// forkSetupOf derives what the forks of b's template are given from b's
// spec: the fresh mounts, masks and hostname a container of it would
// have, the seccomp filter (compiled by compile), the init's capabilities
// once set up, the cgroups (at cgroupPath; none inside gVisor, whose
// forks' cgroups are their template's sandbox's).
func forkSetupOf(b *bundle.Bundle, cgroupPath string, compile func(*specs.LinuxSeccomp) ([]byte, error), gvisor bool) (*forkedSetup, error) {
	spec := *b.Spec
	linux := *spec.Linux
	spec.Linux = &linux
	linux.CgroupsPath = cgroupPath
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: b.ID, Spec: &spec})
	if err != nil {
		return nil, fmt.Errorf("converting spec: %w", err)
	}
	fc := &initproto.Fresh{Masked: slices.Clone(linux.MaskedPaths), Readonly: slices.Clone(linux.ReadonlyPaths), Hostname: spec.Hostname, GVisor: gvisor}
	fc.Mounts = freshMounts(config.Mounts)
	if !slices.ContainsFunc(fc.Mounts, func(m initproto.Mount) bool { return m.Type == "proc" }) ||
		!slices.ContainsFunc(fc.Mounts, func(m initproto.Mount) bool { return m.Target == b.Init.WorkDir }) {
		return nil, fmt.Errorf("the spec has no /proc or no tmpfs at the work dir %s, which a forked sandbox needs", b.Init.WorkDir)
	}
	if !cgroups.IsCgroup2UnifiedMode() && !gvisor {
		fc.LoopbackMTU = loopbackMTU // as shrinkLoopback does for a container
	}
	if c := spec.Process.Capabilities; c != nil {
		for _, name := range c.Effective {
			cp, err := capabilityByName(name)
			if err != nil {
				return nil, err
			}
			fc.KeepCaps |= 1 << uint(cp)
		}
	}
	if linux.Seccomp == nil {
		return nil, errors.New("the spec has no seccomp filter")
	}
	bpf, err := compile(linux.Seccomp)
	if err != nil {
		return nil, err
	}
	setup := &forkedSetup{config: fc, bpf: bpf, cgroup: config.Cgroups}
	if !cgroups.IsCgroup2UnifiedMode() && !gvisor {
		if setup.roots, err = controllerRoots(config.Cgroups, linux.CgroupsPath); err != nil {
			return nil, err
		}
	}
	return setup, nil
}

// controllerRoots are where each of callControllers has the cgroup at
// path, less path: what the cgroup library finds for a path, found once.
func controllerRoots(cg *cgroups.Cgroup, path string) (map[string]string, error) {
	c := *cg
	c.Path, c.Name, c.Parent = path, "", ""
	m, err := manager.New(&c)
	if err != nil {
		return nil, fmt.Errorf("finding the cgroup hierarchies: %w", err)
	}
	roots := map[string]string{}
	for _, name := range callControllers {
		if p, ok := m.GetPaths()[name]; ok {
			root, cut := strings.CutSuffix(p, path)
			if !cut {
				return nil, fmt.Errorf("the %s cgroup of %s is at %s", name, path, p)
			}
			roots[name] = root
		}
	}
	if _, ok := roots["memory"]; !ok {
		return nil, errors.New("no memory cgroup controller")
	}
	return roots, nil
}

// freshMounts are the mounts a fork makes anew: proc, and each tmpfs that
// holds no other mount (not /dev, whose device nodes are the template's
// binds, read-only to the code).
func freshMounts(mounts []*configs.Mount) []initproto.Mount {
	holds := func(dir string) bool {
		return slices.ContainsFunc(mounts, func(o *configs.Mount) bool { return strings.HasPrefix(o.Destination, dir+"/") })
	}
	var fresh []initproto.Mount
	for _, m := range mounts {
		if m.Device == "proc" || (m.Device == "tmpfs" && !holds(m.Destination)) {
			fresh = append(fresh, initproto.Mount{Target: m.Destination, Type: m.Device, Source: m.Source, Data: m.Data, Flags: uint64(m.Flags)})
		}
	}
	return fresh
}

// capabilityByName is the number of a capability the spec names.
func capabilityByName(name string) (capability.Cap, error) {
	for _, c := range capability.ListKnown() {
		if "CAP_"+strings.ToUpper(c.String()) == name {
			return c, nil
		}
	}
	return 0, fmt.Errorf("unknown capability %q", name)
}

// release takes a template back after a call's sandbox is gone: ready
// for the next, or replaced when it failed or is past its bounds.
func (ts *templates) release(t *template, ok bool) {
	ts.mu.Lock()
	delete(ts.busy, t)
	t.calls++
	t.lastUsed = time.Now()
	if ok {
		ts.forks++
		ts.failures = 0
	}
	keep := ok && !ts.closed && ts.usable(t)
	if keep {
		ts.idle = append(ts.idle, t)
	}
	ts.mu.Unlock()
	if !keep {
		ts.retire(t)
	}
}

// failed counts a template that could not start or fork; past
// forkFailuresToStop in a row, forking stops for this runtime.
func (ts *templates) failed(err error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.failures++
	ts.lastErr = err.Error()
	if ts.failures >= forkFailuresToStop && ts.disabled == "" {
		ts.disabled = err.Error()
		ts.log.Error("forked sandboxes failed; every sandbox is a fresh container from now on", "err", err)
	}
}

// retire closes a template in the background.
func (ts *templates) retire(t *template) {
	ts.done.Add(1)
	go func() {
		defer ts.done.Done()
		if err := t.box.Close(); err != nil {
			ts.log.Warn("closing a template", "err", err)
		}
	}()
}

// sweep closes templates unused for templateIdle.
func (ts *templates) sweep() {
	defer ts.done.Done()
	tick := time.NewTicker(templateIdle / 4)
	defer tick.Stop()
	for {
		select {
		case <-ts.stop:
			return
		case <-tick.C:
		}
		ts.sweepOnce(time.Now())
	}
}

// sweepOnce retires the idle templates unused since before now less
// templateIdle, and those no longer usable.
func (ts *templates) sweepOnce(now time.Time) {
	ts.mu.Lock()
	var old []*template
	ts.idle = slices.DeleteFunc(ts.idle, func(t *template) bool {
		if now.Sub(t.lastUsed) > templateIdle || !ts.usable(t) {
			old = append(old, t)
			return true
		}
		return false
	})
	ts.mu.Unlock()
	for _, t := range old {
		ts.retire(t)
	}
}

// close closes every idle template; the busy ones are the runtime's
// live sandboxes' and close with them.
func (ts *templates) close() {
	ts.mu.Lock()
	if ts.closed {
		ts.mu.Unlock()
		return
	}
	ts.closed = true
	idle := ts.idle
	ts.idle = nil
	ts.mu.Unlock()
	close(ts.stop)
	for _, t := range idle {
		ts.retire(t)
	}
	ts.done.Wait()
}

// ForkStatus says what forking has done in a runtime.
type ForkStatus struct {
	// Enabled: sandboxes are forked from templates (ForkConfig.Enabled),
	// until Disabled says why no longer.
	Enabled  bool   `json:"enabled"`
	Disabled string `json:"disabled,omitempty"`
	// Forks is how many forked sandboxes served a call; LastError is the
	// last fork that failed (its call then got a fresh container).
	Forks     int64  `json:"forks"`
	LastError string `json:"last_error,omitempty"`
	// Templates waiting, and serving a call.
	Idle, Busy int `json:"-"`
}

func (ts *templates) status() ForkStatus {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ForkStatus{Enabled: true, Disabled: ts.disabled, Forks: ts.forks, LastError: ts.lastErr, Idle: len(ts.idle), Busy: len(ts.busy)}
}

// forkContainer is one forked sandbox: a call's cgroups, and the call's
// init and code, forked from a template's zygote.
type forkContainer struct {
	rt  *LibcontainerRuntime
	b   *bundle.Bundle
	tpl *template
	z   *zygote // tpl's

	cg       cgroups.Manager
	paths    map[string]string
	procs    []*os.File
	stateDir string // its entry in the instance's containers dir

	// forked: the template took the fork; its init's end is awaited.
	forked bool
	reaped chan struct{}
	broken bool // the template failed this fork
	// bounded: the wait for reaped is bounded (killed once); gaveUp: the
	// template did not report in time and was killed.
	bounded sync.Once
	gaveUp  atomic.Bool
}

// callControllers are the cgroup v1 controllers a forked sandbox has
// cgroups of its own in: those of its limits and accounting, and the
// freezer its killers use. In the others (devices, with the same rules,
// blkio, cpuset, the named ones) it stays in its template's, where no
// limit or count is the call's.
var callControllers = []string{"memory", "pids", "cpu", "cpuacct", "freezer"}

// forkState is a forked sandbox's entry in the instance's containers dir,
// where every live sandbox has one: which template it is a fork of, and
// its cgroups.
type forkState struct {
	Template string            `json:"template"`
	Cgroups  map[string]string `json:"cgroups"`
}

// create makes the call's cgroups, with the limits of its spec, and opens
// their cgroup.procs files, which the fork moves itself into.
func (fc *forkContainer) create(context.Context) error {
	path := fc.rt.inst.cgroupPath(fc.b.ID)
	fc.b.Spec.Linux.CgroupsPath = path
	cg := *fc.z.fork.cgroup
	res := *cg.Resources
	cg.Resources, cg.Path, cg.Name, cg.Parent = &res, path, "", ""
	if r := fc.b.Spec.Linux.Resources; r != nil && r.CPU != nil && r.CPU.Shares != nil {
		res.CpuShares = *r.CPU.Shares
	}
	var m cgroups.Manager
	var err error
	if roots := fc.z.fork.roots; roots != nil {
		paths := map[string]string{}
		for c, root := range roots {
			paths[c] = root + path
		}
		res.SkipDevices = true
		m, err = manager.NewWithPaths(&cg, paths)
	} else {
		m, err = manager.New(&cg)
	}
	if err != nil {
		return fmt.Errorf("%w: the call's cgroups: %w", ErrSandbox, err)
	}
	fc.cg = m
	if err := m.Apply(-1); err != nil {
		return fmt.Errorf("%w: creating the call's cgroups: %w", ErrSandbox, err)
	}
	fc.paths = m.GetPaths()
	if err := m.Set(&res); err != nil {
		return fmt.Errorf("%w: setting the call's limits: %w", ErrSandbox, err)
	}
	if err := limitSockets(fc.paths, socketBytes(fc.b.Spec)); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	for _, p := range fc.paths {
		f, err := os.OpenFile(filepath.Join(p, "cgroup.procs"), os.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("%w: opening the call's cgroups: %w", ErrSandbox, err)
		}
		fc.procs = append(fc.procs, f)
	}
	state, _ := json.Marshal(forkState{Template: fc.z.sb.id, Cgroups: fc.paths})
	dir := filepath.Join(fc.rt.inst.containerDir(), fc.b.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("%w: the sandbox's state: %w", ErrSandbox, err)
	}
	fc.stateDir = dir
	if err := os.WriteFile(filepath.Join(dir, "state.json"), state, 0o600); err != nil {
		return fmt.Errorf("%w: the sandbox's state: %w", ErrSandbox, err)
	}
	return nil
}

func (fc *forkContainer) stdio() (child, parent [3]*os.File, err error) { return pipes() }

// start has the template fork the sandbox: the call's init gets child as
// its stdio, and returns once it is in the call's cgroups.
func (fc *forkContainer) start(child [3]*os.File) error {
	fds := []int{int(child[0].Fd()), int(child[1].Fd()), int(child[2].Fd())}
	for _, f := range fc.procs {
		fds = append(fds, int(f.Fd()))
	}
	req := binary.BigEndian.AppendUint32(nil, uint32(len(fds)))
	uid := forkUIDOf(fc.rt.inst.id, fc.b)
	req = binary.BigEndian.AppendUint32(req, uid)
	req = binary.BigEndian.AppendUint32(req, fc.b.Init.GID)
	req = append(req, fc.z.fork.bpf...)
	fc.reaped = make(chan struct{})
	err := fc.z.sb.conn.forkRequest(req, fds)
	closeAll(fc.procs)
	fc.procs = nil
	if err == nil {
		err = awaitForked(fc.z)
	}
	if err != nil {
		fc.broken = true
		close(fc.reaped)
		return fmt.Errorf("%w: %w: %w", ErrSandbox, errFork, err)
	}
	fc.forked = true
	go func() {
		defer close(fc.reaped)
		if !awaitReaped(fc.z) {
			fc.broken = true
		}
	}()
	return nil
}

// awaitForked waits for z's template to say the fork is made; one that
// does not within forkTimeout is killed.
func awaitForked(z *zygote) error {
	timer := time.NewTimer(forkTimeout)
	defer timer.Stop()
	conn := z.sb.conn
	for {
		select {
		case ev := <-conn.events:
			switch ev.kind {
			case initproto.IForked:
				return nil
			case initproto.IError:
				return errors.New(ev.msg)
			case 0:
				return fmt.Errorf("the template ended: %s", conn.failure())
			}
		case <-timer.C:
			z.sb.c.kill()
			return fmt.Errorf("the template did not fork within %v", forkTimeout)
		}
	}
}

// awaitReaped waits for z's template to reap the call's init (true), or
// to fail or end (false).
func awaitReaped(z *zygote) bool {
	conn := z.sb.conn
	for {
		select {
		case ev := <-conn.events:
			switch ev.kind {
			case initproto.IReaped:
				return true
			case initproto.IError, 0:
				return false
			}
		case <-z.sb.done:
			return false
		}
	}
}

func (fc *forkContainer) wait() { <-fc.reaped }

// started checks that the call's init is in the call's cgroups: the
// fork moved itself there, and the limits hold only if it did.
func (fc *forkContainer) started() error {
	for name, p := range fc.paths {
		if !cgroupHasProcs(p) {
			fc.broken = true
			return fmt.Errorf("%w: %w: the forked sandbox is not in its %s cgroup", ErrSandbox, errFork, name)
		}
	}
	return nil
}

func (fc *forkContainer) initConfig() (*initproto.Config, error) {
	cfg := containerInit(fc.b)
	cfg.Forked, cfg.Seccomp = fc.z.fork.config, fc.z.fork.bpf
	return cfg, nil
}

// kill SIGKILLs every process of the call's cgroups (all of them are in
// each): its init, pid 1 of the call's pid namespace, takes the rest with
// it. From the first kill on, the template has reapTimeout to say so.
func (fc *forkContainer) kill() {
	for _, c := range []string{"freezer", "memory", ""} {
		if p, ok := fc.paths[c]; ok {
			killCgroupProcs(p)
			break
		}
	}
	if fc.forked {
		fc.bounded.Do(func() { go fc.boundReap() })
	}
}

// boundReap bounds the wait for the template to report the call reaped.
func (fc *forkContainer) boundReap() {
	boundReap(fc.reaped, &fc.gaveUp, fc.rt.cfg.Logger, fc.z.sb, fc.b.ID)
}

// boundReap kills template sandbox tpl when it has not reported call's
// processes reaped within reapTimeout of the first kill: its end ends
// the wait (awaitReaped), and it is replaced, never given another call.
// Under either runtime a call that wedges its template costs it the
// template, not a slot for good.
func boundReap(reaped <-chan struct{}, gaveUp *atomic.Bool, log *slog.Logger, tpl *sandbox, call string) {
	timer := time.NewTimer(reapTimeout)
	defer timer.Stop()
	select {
	case <-reaped:
		return
	case <-timer.C:
	}
	gaveUp.Store(true)
	log.Warn("a template did not report a call's processes reaped; replacing it",
		"template", tpl.id, "sandbox", call, "after", reapTimeout)
	tpl.c.kill()
}

func (fc *forkContainer) verdict(res *Result)           { cgroupVerdict(fc.paths, res) }
func (fc *forkContainer) sockets() (int64, int64, bool) { return cgroupSockets(fc.paths) }
func (fc *forkContainer) cpu() time.Duration            { return cgroupCPU(fc.paths) }
func (fc *forkContainer) waitsForExit() bool            { return false }

// explain says why a forked sandbox never got ready: a failure of the
// template (what its interpreter said, if anything), whose next call gets
// another.
func (fc *forkContainer) explain(err error) error {
	fc.broken = true
	if msg := fc.z.sb.conn.failure(); msg != "no message" {
		return fmt.Errorf("%w: %w (the template: %s)", errFork, err, msg)
	}
	return fmt.Errorf("%w: %w", errFork, err)
}

func (fc *forkContainer) foreground() error {
	if !preparedAhead(fc.b.Spec) {
		return nil
	}
	return cgroupForeground(fc.paths)
}

func (fc *forkContainer) deadline(at time.Time) {
	if at.IsZero() {
		fc.rt.inst.wd.disarm(fc.b.Spec.Linux.CgroupsPath)
	} else {
		fc.rt.inst.wd.arm(fc.b.Spec.Linux.CgroupsPath, at)
	}
}

// destroy gives the template back, once nothing of the call is left in
// its namespaces, and removes the call's cgroups.
func (fc *forkContainer) destroy() error {
	closeAll(fc.procs)
	if fc.tpl != nil {
		if fc.reaped != nil {
			<-fc.reaped
		}
		fc.rt.templates.release(fc.tpl, !fc.broken && !fc.gaveUp.Load())
	}
	var errs []error
	for _, p := range fc.paths {
		if err := removeCgroup(p); err != nil {
			errs = append(errs, err)
		}
	}
	if fc.stateDir != "" {
		errs = append(errs, os.RemoveAll(fc.stateDir))
	}
	return errors.Join(errs...)
}
