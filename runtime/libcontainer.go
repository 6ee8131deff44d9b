package runtime

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	goruntime "runtime"
	"sync"
	"syscall"
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
}

func (c *Config) setDefaults() {
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
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
	cfg  Config
	inst *instance

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
	return &LibcontainerRuntime{cfg: cfg, inst: inst}, nil
}

func (r *LibcontainerRuntime) Kind() Kind        { return Libcontainer }
func (r *LibcontainerRuntime) BundleDir() string { return r.inst.bundleDir() }

// Close kills every container still running and removes the instance.
func (r *LibcontainerRuntime) Close() error {
	errs := []error{r.live.closeAll()}
	errs = append(errs, r.inst.close())
	return errors.Join(errs...)
}

// Prepare creates the container and starts its init, which then waits for
// the signal to exec the interpreter: namespaces, mounts, cgroups and the
// seccomp filter are all in place before Run.
func (r *LibcontainerRuntime) Prepare(ctx context.Context, b *bundle.Bundle) (_ Sandbox, retErr error) {
	sb := &lcSandbox{rt: r, b: b, threadDone: make(chan struct{})}
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
	b.Spec.Linux.CgroupsPath = r.inst.cgroupPath(b.ID)
	config, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName: b.ID,
		Spec:       b.Spec,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: converting spec: %w", ErrSandbox, err)
	}
	// If this server dies, its containers die with it rather than run on
	// unwatched; the next instance sweeps what is left. This covers runc
	// init's own stages; the signal does not survive into the container's
	// final init, which sets its own (see bundle's init script).
	config.ParentDeathSignal = int(unix.SIGKILL)

	proc, err := processFromSpec(b.Spec.Process)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if err := sb.pipes(proc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}

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
		if err := c.Start(proc); err != nil {
			started <- fmt.Errorf("starting container %s: %w", b.ID, err)
			return
		}
		started <- nil
		<-sb.threadDone
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	sb.proc = proc
	sb.closeChildEnds()
	return sb, nil
}

// lcSandbox is one libcontainer container between Prepare and Close.
type lcSandbox struct {
	rt *LibcontainerRuntime
	b  *bundle.Bundle

	mu      sync.Mutex
	c       *libcontainer.Container
	proc    *libcontainer.Process
	ran     bool
	waiting bool // Run reaps the init

	// Parent ends stay with us; child ends go to the container's init.
	stdinR, stdinW, stdoutR, stdoutW, stderrR, stderrW *os.File

	threadDone chan struct{}
	closer     teardownOnce
}

func (sb *lcSandbox) pipes(p *libcontainer.Process) error {
	var err error
	if sb.stdinR, sb.stdinW, err = os.Pipe(); err != nil {
		return fmt.Errorf("creating stdin pipe: %w", err)
	}
	if sb.stdoutR, sb.stdoutW, err = os.Pipe(); err != nil {
		return fmt.Errorf("creating stdout pipe: %w", err)
	}
	if sb.stderrR, sb.stderrW, err = os.Pipe(); err != nil {
		return fmt.Errorf("creating stderr pipe: %w", err)
	}
	// Plain *os.File ends are handed to the child as they are, with no
	// copying goroutine inside libcontainer that Wait would wait for.
	p.Stdin, p.Stdout, p.Stderr = sb.stdinR, sb.stdoutW, sb.stderrW
	return nil
}

// closeChildEnds drops our copies of the ends the container holds, so that
// EOF arrives when the container's last process is gone.
func (sb *lcSandbox) closeChildEnds() {
	for _, f := range []**os.File{&sb.stdinR, &sb.stdoutW, &sb.stderrW} {
		if *f != nil {
			(*f).Close()
			*f = nil
		}
	}
}

func (sb *lcSandbox) Run(ctx context.Context, req Request) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	sb.mu.Lock()
	if sb.ran || sb.c == nil {
		sb.mu.Unlock()
		return Result{}, errors.New("sandbox already used or not prepared")
	}
	sb.ran = true
	c, proc := sb.c, sb.proc
	// From here on the parent ends belong to this run, not to teardown.
	stdoutR, stderrR, stdinW := sb.stdoutR, sb.stderrR, sb.stdinW
	sb.stdoutR, sb.stderrR, sb.stdinW = nil, nil, nil
	sb.mu.Unlock()

	stdout, stderr := newCappedBuffer(req.MaxOutputBytes), newCappedBuffer(req.MaxOutputBytes)
	outDone, errDone := make(chan struct{}), make(chan struct{})
	go drain(stdoutR, stdout, outDone)
	go drain(stderrR, stderr, errDone)
	go func() {
		// A program that never reads its stdin makes this write fail with
		// EPIPE once the container is gone; that is fine.
		if len(req.Stdin) > 0 {
			stdinW.Write(req.Stdin)
		}
		stdinW.Close()
	}()

	start := time.Now()
	if err := c.Exec(); err != nil {
		return Result{}, fmt.Errorf("%w: starting code in container %s: %w", ErrSandbox, sb.b.ID, err)
	}

	type waited struct {
		ps  *os.ProcessState
		err error
	}
	waitCh := make(chan waited, 1)
	sb.mu.Lock()
	sb.waiting = true // teardown must not reap the init too
	sb.mu.Unlock()
	go func() {
		ps, err := proc.Wait()
		waitCh <- waited{ps, err}
	}()

	timer := time.NewTimer(req.Timeout)
	defer timer.Stop()
	var res Result
	var w waited
	var ctxErr error
	select {
	case w = <-waitCh:
	case <-timer.C:
		res.TimedOut = true
		sb.kill()
		w = <-waitCh
	case <-ctx.Done():
		ctxErr = ctx.Err()
		sb.kill()
		w = <-waitCh
	}
	res.Duration = time.Since(start)

	// The init was pid 1 of its namespace: once it is gone the kernel has
	// killed every other process in it, so the pipes reach EOF promptly.
	// Bound the wait anyway, in case a process is stuck in the kernel.
	waitDrained(outDone, errDone)

	if w.ps != nil {
		if ws, ok := w.ps.Sys().(syscall.WaitStatus); ok {
			res.ExitCode = exitCode(ws.Exited(), ws.ExitStatus(), ws.Signaled(), int(ws.Signal()))
		} else {
			res.ExitCode = w.ps.ExitCode()
		}
	} else if w.err != nil && !res.TimedOut && ctxErr == nil {
		return Result{}, fmt.Errorf("%w: waiting for container %s: %w", ErrSandbox, sb.b.ID, w.err)
	}
	res.Stdout, res.StdoutTruncated, res.StdoutBytes = stdout.result()
	res.Stderr, res.StderrTruncated, res.StderrBytes = stderr.result()
	sb.readCgroupStats(&res)
	if ctxErr != nil {
		return res, ctxErr
	}
	return res, nil
}

// waitDrained waits for both output pipes to reach EOF, for a bounded time.
func waitDrained(chans ...chan struct{}) {
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for _, ch := range chans {
		select {
		case <-ch:
		case <-deadline.C:
			return
		}
	}
}

// kill sends SIGKILL to the container's init. With its own pid namespace
// that takes every process of the container with it, double-forked and
// setsid'd ones included.
func (sb *lcSandbox) kill() {
	sb.mu.Lock()
	c := sb.c
	sb.mu.Unlock()
	if c == nil {
		return
	}
	if err := c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
		sb.rt.cfg.Logger.Warn("killing container", "id", sb.b.ID, "err", err)
	}
}

// readCgroupStats fills the verdict's OOM flag and usage from the
// container's cgroups, before they are removed.
func (sb *lcSandbox) readCgroupStats(res *Result) {
	if st, err := sb.c.State(); err == nil {
		cgroupVerdict(st.CgroupPaths, res)
	}
}

// Close kills and destroys the container and removes its bundle. It runs
// whatever state Run left, under its own deadline.
func (sb *lcSandbox) Close() error {
	return sb.closer.do("container "+sb.b.ID, sb.teardown)
}

func (sb *lcSandbox) teardown() error {
	var errs []error
	sb.kill()
	sb.mu.Lock()
	c, proc, waiting := sb.c, sb.proc, sb.waiting
	files := []*os.File{sb.stdinR, sb.stdinW, sb.stdoutR, sb.stdoutW, sb.stderrR, sb.stderrW}
	sb.stdinR, sb.stdinW, sb.stdoutR, sb.stdoutW, sb.stderrR, sb.stderrW = nil, nil, nil, nil, nil, nil
	sb.mu.Unlock()
	if c != nil {
		if proc != nil && !waiting {
			// Never started, or its start failed: reap the init ourselves,
			// or it stays a zombie of this server.
			proc.Wait()
		}
		if err := destroy(c); err != nil {
			errs = append(errs, fmt.Errorf("destroying container %s: %w", sb.b.ID, err))
		}
	}
	close(sb.threadDone)
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
	if err := sb.b.Remove(); err != nil {
		errs = append(errs, err)
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

var rlimits = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}
