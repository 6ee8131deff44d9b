package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	// Device rules of the devices cgroup are only applied with this driver.
	_ "github.com/opencontainers/cgroups/devices"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// Config configures a runtime instance.
type Config struct {
	// StateDir holds one private directory per live server instance;
	// DefaultStateDir when empty.
	StateDir string
	// Logger receives metadata only; nil discards.
	Logger *slog.Logger
	// RunscPath and RunscPlatform configure the runsc runtime.
	RunscPath     string
	RunscPlatform string
	// UIDBase is the first host uid of the call slots (libcontainer's, and
	// the process runtime's under root); DefaultUIDBase when 0.
	UIDBase int
	// SlotDir is where call slots are claimed host-wide; DefaultSlotDir
	// when empty.
	SlotDir string
	// Executables are what the process runtime's code may execute besides
	// the interpreter: with MCP_EXEC_SHELL, the shell and the system's
	// tools (the containers have them in their rootfs).
	Executables []string
	// WorkDir is where the process runtime makes each call's dirs; the
	// system's temp dir when empty.
	WorkDir string
	// Fork makes libcontainer's sandboxes forks of templates (fork.go).
	Fork ForkConfig
	// ParkDir is where the runsc runtime saves parked persistent sessions
	// (SessionConfig.Park), on disk; DefaultParkDir when empty.
	ParkDir string
	// ProcessNamespaces says whether the process runtime puts each call in
	// namespaces of its own: where the host lets it (auto, the default),
	// always (it refuses to start without them), or never.
	ProcessNamespaces Namespaces
}

func (c *Config) setDefaults() {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.UIDBase == 0 {
		c.UIDBase = DefaultUIDBase
	}
	if c.SlotDir == "" {
		c.SlotDir = DefaultSlotDir
	}
}

// LibcontainerUsable returns an error naming everything the libcontainer
// runtime would lack on this host, or nil.
func LibcontainerUsable() error {
	missing := host.Probe().ForLibcontainer()
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: this host cannot provide the full sandbox with libcontainer: %s",
		ErrUnsupported, host.Explain(host.Libcontainer, missing))
}

// RunscUsable returns an error naming everything the runsc runtime would
// lack on this host with cfg, or nil.
func RunscUsable(cfg Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), host.ProbeTimeout)
	defer cancel()
	info := host.ProbeRunsc(ctx, host.Probe(), cfg.RunscPath, cfg.RunscPlatform)
	if info.Available() {
		return nil
	}
	return fmt.Errorf("%w: this host cannot provide the full sandbox with runsc: %s", ErrUnsupported, host.Explain(host.Runsc, info.Missing))
}

// LibcontainerRuntime runs bundles with runc's libcontainer in this process.
// The binary must call libcontainer's init hook when started as "init".
type LibcontainerRuntime struct {
	cfg   Config
	inst  *instance
	slots *slots
	// templates fork the sandboxes; nil when each is a fresh container.
	templates *templates
	filters   filterCache

	live liveSet
}

// NewLibcontainer checks that this host can give the full sandbox with
// libcontainer and creates the runtime's instance state. It refuses rather
// than run with less isolation.
func NewLibcontainer(cfg Config) (*LibcontainerRuntime, error) {
	cfg.setDefaults()
	if err := initproto.Linked(); err != nil {
		return nil, err
	}
	if err := LibcontainerUsable(); err != nil {
		return nil, err
	}
	inst, err := newInstance(cfg.StateDir, cfg.Logger)
	if err != nil {
		return nil, err
	}
	r := &LibcontainerRuntime{cfg: cfg, inst: inst, slots: newSlots(cfg.UIDBase, cfg.SlotDir)}
	if cfg.Fork.Enabled {
		r.templates = newTemplates(cfg.Fork, cfg.Logger, r.startTemplate)
	}
	return r, nil
}

func (r *LibcontainerRuntime) Kind() Kind { return Libcontainer }

// Close kills every container still running and removes the instance.
func (r *LibcontainerRuntime) Close() error {
	if r.templates != nil {
		r.templates.close()
	}
	errs := []error{r.live.closeAll()}
	errs = append(errs, r.slots.close())
	errs = append(errs, r.inst.close())
	return errors.Join(errs...)
}

// Prepare creates the container in a call slot's user namespace and starts
// its init, which starts the interpreter; it returns once the interpreter
// waits for its code: namespaces, mounts, cgroups and the seccomp filter
// are all in place then. With forking on, the sandbox is a fork of a
// template instead (fork.go); should the template fail, a fresh container.
func (r *LibcontainerRuntime) Prepare(ctx context.Context, cfg bundle.Config) (Sandbox, error) {
	b, err := r.bundle(cfg, uuid.NewString())
	if err != nil {
		return nil, err
	}
	return r.prepareBundle(ctx, b)
}

// bundle makes the bundle of a sandbox of cfg.
func (r *LibcontainerRuntime) bundle(cfg bundle.Config, id string) (*bundle.Bundle, error) {
	return newBundle(r.inst.bundleDir(), r.inst.initDir(), cfg, id)
}

// prepareBundle prepares the sandbox of b, which it owns from then on,
// even when it fails.
func (r *LibcontainerRuntime) prepareBundle(ctx context.Context, b *bundle.Bundle) (Sandbox, error) {
	if r.templates == nil || !r.templates.on() {
		return prepare(ctx, &r.live, b, &lcContainer{rt: r, b: b})
	}
	// A template that failed (its interpreter died while it waited, say)
	// is replaced, and the call tries another once before it takes a
	// fresh container.
	var ferr error
	for attempt := 0; attempt < 2; attempt++ {
		tpl, err := r.templates.acquire(ctx, b)
		if err != nil {
			ferr = err
			break
		}
		sb, err := prepare(ctx, &r.live, b, &forkContainer{rt: r, b: b, tpl: tpl, z: tpl.box.(*zygote)})
		if err == nil || !errors.Is(err, errFork) {
			return sb, err
		}
		ferr = err
		// The failed sandbox removed b: the same again.
		if b, err = r.bundle(b.Config, b.ID); err != nil {
			return nil, err
		}
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() != nil {
		b.Remove()
		return nil, ctx.Err()
	}
	r.templates.failed(ferr)
	r.cfg.Logger.Warn("templates could not fork the sandbox; making a fresh container", "err", ferr)
	return prepare(ctx, &r.live, b, &lcContainer{rt: r, b: b})
}

// Forking says whether sandboxes are forked from templates, and how that
// went.
func (r *LibcontainerRuntime) Forking() ForkStatus {
	if r.templates == nil {
		return ForkStatus{}
	}
	return r.templates.status()
}

// seccompFilter is the BPF program of a spec's seccomp section.
func (r *LibcontainerRuntime) seccompFilter(s *specs.LinuxSeccomp) ([]byte, error) {
	return r.filters.compile(s)
}

// socketBytes is the spec's bound on socket buffers (see bundle), or 0.
func socketBytes(s *specs.Spec) int64 {
	if s.Linux == nil || s.Linux.Resources == nil || s.Linux.Resources.Memory == nil || s.Linux.Resources.Memory.KernelTCP == nil {
		return 0
	}
	return *s.Linux.Resources.Memory.KernelTCP
}

// lcContainer is one libcontainer container.
type lcContainer struct {
	rt     *LibcontainerRuntime
	b      *bundle.Bundle
	slot   *slot
	config *configs.Config
	// template: the container is a template's (fork.go), whose init
	// takes file descriptors over its stdin, a socket.
	template bool

	// Set by start, on the locked thread; read after it returned.
	mu   sync.Mutex
	c    *libcontainer.Container
	proc *libcontainer.Process
	// cgPaths are the container's cgroups, fixed once it has started.
	cgPaths map[string]string
}

// create takes a call slot and turns the spec into libcontainer's
// configuration, joined to the slot's user namespace.
func (lc *lcContainer) create(context.Context) error {
	sl, err := lc.rt.slots.acquire()
	if err != nil {
		return err
	}
	lc.slot = sl
	b := lc.b
	b.Spec.Linux.CgroupsPath = lc.rt.inst.cgroupPath(b.ID)
	if lc.template {
		b.Spec.Linux.CgroupsPath = lc.rt.inst.templateCgroupPath(b.ID)
	}
	b.Spec.Linux.Namespaces = append(b.Spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: sl.nsPath})
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{CgroupName: b.ID, Spec: b.Spec})
	if err != nil {
		return fmt.Errorf("%w: converting spec: %w", ErrSandbox, err)
	}
	// If this server dies, its containers die with it rather than run on
	// unwatched: this covers runc init's own stages, and the sandbox's init
	// sets its own first thing. The watchdog is the backstop of both.
	config.ParentDeathSignal = int(unix.SIGKILL)
	lc.config = config
	return nil
}

func (lc *lcContainer) stdio() (child, parent [3]*os.File, err error) {
	child, parent, err = pipes()
	if err != nil || !lc.template {
		return child, parent, err
	}
	// The init's stdin a socket instead: forks come with descriptors.
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		closeAll(child[:])
		closeAll(parent[:])
		return child, parent, fmt.Errorf("creating the template's socket: %w", err)
	}
	child[0].Close()
	parent[0].Close()
	unix.Shutdown(fds[0], unix.SHUT_RD)
	unix.Shutdown(fds[1], unix.SHUT_WR)
	parent[0], child[0] = os.NewFile(uintptr(fds[0]), "template"), os.NewFile(uintptr(fds[1]), "template")
	return child, parent, nil
}

func (lc *lcContainer) initConfig() (*initproto.Config, error) {
	cfg := containerInit(lc.b)
	cfg.Template = lc.template
	return cfg, nil
}

func (lc *lcContainer) start(child [3]*os.File) error {
	proc, err := processFromSpec(lc.b.Spec.Process)
	if err != nil {
		return err
	}
	proc.Stdin, proc.Stdout, proc.Stderr = child[0], child[1], child[2]
	stateDir := lc.rt.inst.containerDir()
	if lc.template {
		stateDir = lc.rt.inst.templateStateDir()
	}
	c, err := libcontainer.Create(stateDir, lc.b.ID, lc.config)
	if err != nil {
		return fmt.Errorf("creating container %s: %w", lc.b.ID, err)
	}
	lc.mu.Lock()
	lc.c = c
	lc.mu.Unlock()
	if err := c.Run(proc); err != nil {
		return fmt.Errorf("starting container %s: %w", lc.b.ID, err)
	}
	lc.mu.Lock()
	lc.proc = proc
	lc.mu.Unlock()
	return nil
}

func (lc *lcContainer) wait() { lc.proc.Wait() }

// started bounds the container's socket buffers and shrinks its loopback
// (cgroup v1), now that its cgroups and network namespace exist.
func (lc *lcContainer) started() error {
	st, err := lc.c.State()
	if err != nil {
		return fmt.Errorf("%w: reading the state of container %s: %w", ErrSandbox, lc.b.ID, err)
	}
	lc.mu.Lock()
	// A copy: libcontainer's cgroup manager deletes from its own map as
	// Destroy removes each cgroup, while a session's watcher may still
	// read its verdict (a fatal concurrent map access killed the server).
	lc.cgPaths = maps.Clone(st.CgroupPaths)
	lc.mu.Unlock()
	if err := limitSockets(st.CgroupPaths, socketBytes(lc.b.Spec)); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	pid, err := lc.proc.Pid()
	if err != nil {
		return fmt.Errorf("%w: container %s has no init: %w", ErrSandbox, lc.b.ID, err)
	}
	if err := shrinkLoopback(st.CgroupPaths, pid); err != nil {
		return fmt.Errorf("%w: container %s: %w", ErrSandbox, lc.b.ID, err)
	}
	return nil
}

func (lc *lcContainer) paths() map[string]string {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.cgPaths
}

// kill SIGKILLs the container's init, which takes every process of its pid
// namespace with it, and every process of its cgroup for good measure.
func (lc *lcContainer) kill() {
	lc.mu.Lock()
	c := lc.c
	lc.mu.Unlock()
	if c == nil {
		return
	}
	if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		lc.rt.cfg.Logger.Debug("killing container", "id", lc.b.ID, "err", err)
	}
	for _, p := range lc.paths() {
		killCgroupProcs(p)
	}
}

// verdict fills the verdict's OOM flag and usage from the container's
// cgroups, before they are removed.
func (lc *lcContainer) verdict(res *Result)           { cgroupVerdict(lc.paths(), res) }
func (lc *lcContainer) sockets() (int64, int64, bool) { return cgroupSockets(lc.paths()) }
func (lc *lcContainer) cpu() time.Duration            { return cgroupCPU(lc.paths()) }
func (lc *lcContainer) waitsForExit() bool            { return false }
func (lc *lcContainer) explain(err error) error       { return err }

func (lc *lcContainer) foreground() error {
	if !preparedAhead(lc.b.Spec) {
		return nil
	}
	return cgroupForeground(lc.paths())
}

func (lc *lcContainer) deadline(at time.Time) {
	if at.IsZero() {
		lc.rt.inst.wd.disarm(lc.b.Spec.Linux.CgroupsPath)
	} else {
		lc.rt.inst.wd.arm(lc.b.Spec.Linux.CgroupsPath, at)
	}
}

// destroy removes the container's cgroups and state and gives its slot
// back.
func (lc *lcContainer) destroy() error {
	var err error
	lc.mu.Lock()
	c := lc.c
	lc.mu.Unlock()
	if c != nil {
		if derr := destroy(c); derr != nil {
			err = fmt.Errorf("destroying container %s: %w", lc.b.ID, derr)
		}
	}
	if lc.slot != nil {
		lc.rt.slots.release(lc.slot)
	}
	return err
}

// destroy removes the container's cgroups and state, retrying while the
// kernel finishes off its processes.
func destroy(c *libcontainer.Container) error {
	var err error
	for i := 0; i < 100; i++ {
		if err = c.Destroy(); err == nil {
			return nil
		}
		c.Signal(unix.SIGKILL)
		time.Sleep(10 * time.Millisecond)
	}
	return err
}

// processFromSpec maps the spec's process to libcontainer's, field by
// field: libcontainer's UID and GID are plain ints whose zero value is root,
// so nothing may be left to a default.
func processFromSpec(p *specs.Process) (*libcontainer.Process, error) {
	if p == nil {
		return nil, errors.New("spec has no process")
	}
	nnp := p.NoNewPrivileges
	lp := &libcontainer.Process{
		Args:             append([]string(nil), p.Args...),
		Env:              append([]string(nil), p.Env...),
		UID:              int(p.User.UID),
		GID:              int(p.User.GID),
		AdditionalGroups: []int{},
		Cwd:              p.Cwd,
		NoNewPrivileges:  &nnp,
		Init:             true,
	}
	for _, g := range p.User.AdditionalGids {
		lp.AdditionalGroups = append(lp.AdditionalGroups, int(g))
	}
	if c := p.Capabilities; c != nil {
		lp.Capabilities = &configs.Capabilities{
			Bounding:    append([]string{}, c.Bounding...),
			Effective:   append([]string{}, c.Effective...),
			Inheritable: append([]string{}, c.Inheritable...),
			Permitted:   append([]string{}, c.Permitted...),
			Ambient:     append([]string{}, c.Ambient...),
		}
	}
	for _, rl := range p.Rlimits {
		t, ok := initproto.Rlimit(rl.Type)
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", rl.Type)
		}
		lp.Rlimits = append(lp.Rlimits, configs.Rlimit{Type: t, Hard: rl.Hard, Soft: rl.Soft})
	}
	return lp, nil
}
