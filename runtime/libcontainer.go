package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	// Device rules of the devices cgroup are only applied with this driver.
	_ "github.com/opencontainers/cgroups/devices"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
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

// ErrUnsupported marks a host that cannot provide the whole sandbox.
var ErrUnsupported = errors.New("isolation unavailable")

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

	live liveSet
}

// NewLibcontainer checks that this host can give the full sandbox with
// libcontainer and creates the runtime's instance state. It refuses rather
// than run with less isolation.
func NewLibcontainer(cfg Config) (*LibcontainerRuntime, error) {
	cfg.setDefaults()
	if err := LibcontainerUsable(); err != nil {
		return nil, err
	}
	inst, err := newInstance(cfg.StateDir, cfg.Logger)
	if err != nil {
		return nil, err
	}
	return &LibcontainerRuntime{cfg: cfg, inst: inst, slots: newSlots(cfg.UIDBase, cfg.SlotDir)}, nil
}

func (r *LibcontainerRuntime) Kind() Kind        { return Libcontainer }
func (r *LibcontainerRuntime) BundleDir() string { return r.inst.bundleDir() }
func (r *LibcontainerRuntime) InitDir() string   { return r.inst.initDir() }

// Close kills every container still running and removes the instance.
func (r *LibcontainerRuntime) Close() error {
	errs := []error{r.live.closeAll()}
	errs = append(errs, r.slots.close())
	errs = append(errs, r.inst.close())
	return errors.Join(errs...)
}

// Prepare creates the container in a call slot's user namespace and starts
// its init, which starts the interpreter; it returns once the interpreter
// waits for its code: namespaces, mounts, cgroups and the seccomp filter
// are all in place then.
func (r *LibcontainerRuntime) Prepare(ctx context.Context, b *bundle.Bundle) (_ Sandbox, retErr error) {
	sb := &lcSandbox{rt: r, b: b, threadDone: make(chan struct{}), done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			sb.Close()
		}
	}()
	if err := r.live.add(sb); err != nil {
		return nil, err // the deferred Close removes the bundle
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sl, err := r.slots.acquire()
	if err != nil {
		return nil, err
	}
	sb.slot = sl

	b.Spec.Linux.CgroupsPath = r.inst.cgroupPath(b.ID)
	b.Spec.Linux.Namespaces = append(b.Spec.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: sl.nsPath})
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName: b.ID,
		Spec:       b.Spec,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: converting spec: %w", ErrSandbox, err)
	}
	// If this server dies, its containers die with it rather than run on
	// unwatched: this covers runc init's own stages, and the sandbox's init
	// sets its own first thing. The watchdog is the backstop of both.
	config.ParentDeathSignal = int(unix.SIGKILL)

	proc, err := processFromSpec(b.Spec.Process)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	var toInit, fromInit, diag, childIn, childOut, childErr *os.File
	if childIn, toInit, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if fromInit, childOut, err = os.Pipe(); err != nil {
		childIn.Close()
		toInit.Close()
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if diag, childErr, err = os.Pipe(); err != nil {
		for _, f := range []*os.File{childIn, toInit, fromInit, childOut} {
			f.Close()
		}
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	// Plain *os.File ends are handed to the child as they are, with no
	// copying goroutine inside libcontainer that Wait would wait for.
	proc.Stdin, proc.Stdout, proc.Stderr = childIn, childOut, childErr
	sb.sess = newSession(toInit, fromInit, diag)

	// The parent-death signal fires when the thread that forked the init
	// exits, and Go may retire threads; fork from a thread locked for the
	// life of the container so that it fires only when the server dies.
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		c, err := libcontainer.Create(r.inst.containerDir(), b.ID, config)
		if err != nil {
			started <- fmt.Errorf("creating container %s: %w", b.ID, err)
			return
		}
		sb.mu.Lock()
		sb.c = c
		sb.mu.Unlock()
		if err := c.Run(proc); err != nil {
			started <- fmt.Errorf("starting container %s: %w", b.ID, err)
			return
		}
		sb.mu.Lock()
		sb.proc = proc
		sb.mu.Unlock()
		started <- nil
		<-sb.threadDone
	}()
	err = <-started
	for _, f := range []*os.File{childIn, childOut, childErr} {
		f.Close() // the container holds them now
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	go func() {
		proc.Wait()
		close(sb.done)
	}()
	if err := sb.sess.configure(containerInit(b)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	st, err := sb.c.State()
	if err != nil {
		return nil, fmt.Errorf("%w: reading the state of container %s: %w", ErrSandbox, b.ID, err)
	}
	sb.cgPaths = st.CgroupPaths
	if err := limitSockets(sb.cgPaths, socketBytes(b.Spec)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	pid, err := proc.Pid()
	if err != nil {
		return nil, fmt.Errorf("%w: container %s has no init: %w", ErrSandbox, b.ID, err)
	}
	if err := shrinkLoopback(sb.cgPaths, pid); err != nil {
		return nil, fmt.Errorf("%w: container %s: %w", ErrSandbox, b.ID, err)
	}
	if err := sb.sess.waitReady(ctx, sb); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: container %s: %w", ErrSandbox, b.ID, err)
	}
	return sb, nil
}

// socketBytes is the spec's bound on socket buffers (see bundle), or 0.
func socketBytes(s *specs.Spec) int64 {
	if s.Linux == nil || s.Linux.Resources == nil || s.Linux.Resources.Memory == nil || s.Linux.Resources.Memory.KernelTCP == nil {
		return 0
	}
	return *s.Linux.Resources.Memory.KernelTCP
}

// lcSandbox is one libcontainer container between Prepare and Close.
type lcSandbox struct {
	rt   *LibcontainerRuntime
	b    *bundle.Bundle
	slot *slot
	sess *session

	// cgPaths are the container's cgroups, fixed once it has started.
	cgPaths map[string]string

	mu   sync.Mutex
	c    *libcontainer.Container
	proc *libcontainer.Process
	ran  bool
	done chan struct{} // closed when the init has been reaped

	threadDone chan struct{}
	closer     teardownOnce
}

func (sb *lcSandbox) Run(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	sb.mu.Lock()
	if sb.ran || sb.c == nil {
		sb.mu.Unlock()
		return Result{}, errors.New("sandbox already used or not prepared")
	}
	sb.ran = true
	sb.mu.Unlock()
	return supervise(ctx, sb, sb.sess, req, func(deadline time.Time) {
		sb.rt.inst.wd.arm(sb.b.Spec.Linux.CgroupsPath, deadline)
	})
}

func (sb *lcSandbox) exited() <-chan struct{} { return sb.done }

// kill SIGKILLs the container's init, which takes every process of its pid
// namespace with it, and every process of its cgroup for good measure.
func (sb *lcSandbox) kill() {
	sb.mu.Lock()
	c := sb.c
	sb.mu.Unlock()
	if c == nil {
		return
	}
	if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		sb.rt.cfg.Logger.Debug("killing container", "id", sb.b.ID, "err", err)
	}
	for _, p := range sb.cgPaths {
		killCgroupProcs(p)
	}
}

// verdict fills the verdict's OOM flag and usage from the container's
// cgroups, before they are removed.
func (sb *lcSandbox) verdict(res *Result) { cgroupVerdict(sb.cgPaths, res) }

func (sb *lcSandbox) sockets() (int64, int64, bool) { return cgroupSockets(sb.cgPaths) }

func (sb *lcSandbox) cpu() time.Duration { return cgroupCPU(sb.cgPaths) }

func (sb *lcSandbox) foreground() error {
	if !preparedAhead(sb.b.Spec) {
		return nil
	}
	return cgroupForeground(sb.cgPaths)
}

// Close kills and destroys the container and removes its bundle. It runs
// whatever state Run left, under its own deadline.
func (sb *lcSandbox) Close() error {
	return sb.closer.do("container "+sb.b.ID, sb.teardown)
}

func (sb *lcSandbox) teardown() error {
	var errs []error
	sb.kill()
	if sb.sess != nil {
		sb.sess.closeInput()
	}
	sb.mu.Lock()
	c, proc := sb.c, sb.proc
	sb.mu.Unlock()
	if c != nil {
		if proc != nil {
			<-sb.done
		}
		if err := destroy(c); err != nil {
			errs = append(errs, fmt.Errorf("destroying container %s: %w", sb.b.ID, err))
		}
	}
	close(sb.threadDone)
	if err := sb.b.Remove(); err != nil {
		errs = append(errs, err)
	}
	if sb.slot != nil {
		sb.rt.slots.release(sb.slot)
	}
	if sb.ran {
		sb.rt.inst.wd.disarm(sb.b.Spec.Linux.CgroupsPath)
	}
	sb.rt.live.remove(sb)
	return errors.Join(errs...)
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
		t, ok := rlimits[rl.Type]
		if !ok {
			return nil, fmt.Errorf("unknown rlimit %q", rl.Type)
		}
		lp.Rlimits = append(lp.Rlimits, configs.Rlimit{Type: t, Hard: rl.Hard, Soft: rl.Soft})
	}
	return lp, nil
}
