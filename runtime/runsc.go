package runtime

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The runsc runtime runs each call as one `runsc run` child process:
//
//	runsc --root=<instance>/runsc --network=none --platform=<probed>
//	      --oci-seccomp --log-fd=3 run --bundle <bundle> <id>
//
// Why `run` rather than create + start + wait + delete: it is one runsc
// process instead of four (each costs a Go binary start-up, ~30-50 ms here),
// and runsc waits for the sandbox it started with wait4, while `runsc wait`
// on a sandbox that is not its child polls and took 1.2-2 s after a fast
// exit. `run` also starts the sandbox and gofer "attached": they die with
// the run process (PR_SET_PDEATHSIG), and the run process dies with the
// thread of this server that forked it, so a killed server leaves no
// sandbox running. `run` destroys the container's state itself on the way
// out.
//
// Prepare sets the cgroup path, adapts the seccomp section to what this
// runsc can express and has the init install the exact filter in the code
// (see gvisorSeccomp), rewrites config.json, and creates
// the call's cgroups with the spec's limits. runsc finds them already
// there, so it joins the sandbox, gofer and ptrace stubs to them without
// owning them, and they outlive `runsc run`: the verdict (oom_kill, peak
// memory, CPU time) is read from them after the sandbox is gone, then they
// are removed. Then it starts `runsc run`, whose process is the sandbox's
// init, with the init's standard streams on Unix sockets (see stdio), and
// waits until the interpreter inside waits for its code: gVisor's boot is
// over before a call's timeout starts to count.
//
// Run is supervise's: the conversation with the init is the same as under
// libcontainer. A timeout or cancellation that the init does not answer at
// once SIGKILLs the run process and every process in the call's cgroup.
//
// runsc reports its own failures as JSON records on --log-fd; such a
// record, when the sandbox never got ready, goes into Prepare's error.

// RunscRuntime runs bundles with gVisor's runsc, one child process per call.
type RunscRuntime struct {
	cfg  Config
	inst *instance
	info host.RunscInfo
	// root is runsc's --root: container state, inside the private instance
	// dir so a dead instance's sandboxes are found and swept with it.
	root string

	live liveSet

	filters filterCache // the exact filters the init installs
	// parkRoot is where parked sessions' images go (park.go), in a dir
	// of this instance's; parkLock, once that dir is made, is its lock
	// file, held while the instance lives (sweepParked).
	parkRoot string
	parkMu   sync.Mutex
	parkLock *os.File
	// templates fork the sandboxes (runsc_fork.go); nil when each is a
	// gVisor sandbox of its own.
	templates *templates
}

// NewRunsc checks that runsc can give the full sandbox on this host (the
// binary, a safe platform, --oci-seccomp, root with writable cgroups) and
// creates the runtime's instance state. It refuses rather than run with
// less isolation.
func NewRunsc(cfg Config) (*RunscRuntime, error) {
	cfg.setDefaults()
	if err := initproto.Linked(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), host.ProbeTimeout)
	defer cancel()
	info := host.ProbeRunsc(ctx, host.Probe(), cfg.RunscPath, cfg.RunscPlatform)
	if !info.Available() {
		return nil, fmt.Errorf("%w: this host cannot provide the full sandbox with runsc: %s",
			ErrUnsupported, host.Explain(host.Runsc, info.Missing))
	}
	inst, err := newInstance(cfg.StateDir, cfg.Logger)
	if err != nil {
		return nil, err
	}
	root := filepath.Join(inst.dir, "runsc")
	if err := os.Mkdir(root, 0o700); err != nil {
		inst.close()
		return nil, fmt.Errorf("creating runsc root dir: %w", err)
	}
	parkRoot := cmp.Or(cfg.ParkDir, DefaultParkDir)
	sweepParked(parkRoot)
	cfg.Logger.Debug("runsc runtime ready", "runsc", info.Path, "version", info.Version, "platform", info.Platform)
	r := &RunscRuntime{cfg: cfg, inst: inst, info: info, root: root, parkRoot: parkRoot}
	if cfg.Fork.Enabled {
		r.templates = newTemplates(cfg.Fork, cfg.Logger, r.startTemplate)
	}
	return r, nil
}

func (r *RunscRuntime) Kind() Kind          { return Runsc }
func (r *RunscRuntime) instanceID() string  { return r.inst.id }
func (r *RunscRuntime) instanceDir() string { return r.inst.dir }

// Info is what the runtime probed of runsc when it started.
func (r *RunscRuntime) Info() host.RunscInfo { return r.info }

// Close kills every sandbox still running and removes the instance.
func (r *RunscRuntime) Close() error {
	if r.templates != nil {
		r.templates.close()
	}
	errs := []error{r.live.closeAll()}
	killRunscProcesses(r.root)
	errs = append(errs, os.RemoveAll(filepath.Join(r.parkRoot, r.inst.id)), r.inst.close())
	r.parkMu.Lock()
	if r.parkLock != nil {
		r.parkLock.Close()
	}
	r.parkMu.Unlock()
	return errors.Join(errs...)
}

// globalArgs are runsc's flags for every call. The network is none: the
// sandbox gets its own network stack with only lo. There is deliberately
// no --ignore-cgroups, --rootless or --TESTONLY-* flag.
func (r *RunscRuntime) globalArgs() []string {
	return []string{
		"--root=" + r.root,
		"--network=none",
		"--platform=" + r.info.Platform,
		// Apply the bundle's seccomp filter inside the sandbox too, so the
		// code sees the same EPERMs as under libcontainer (without it gVisor
		// lets the code ptrace, unshare a user namespace, …, in its own
		// kernel).
		"--oci-seccomp",
		"--log-fd=3",
	}
}

// Prepare fixes the bundle for runsc, creates the call's cgroups with the
// spec's limits, starts the sandbox and waits for its interpreter.
func (r *RunscRuntime) Prepare(ctx context.Context, cfg bundle.Config) (Sandbox, error) {
	b, err := newBundle(r.inst.bundleDir(), r.inst.initDir(), cfg, uuid.NewString())
	if err != nil {
		return nil, err
	}
	return r.prepareBundle(ctx, b)
}

// prepareBundle prepares the sandbox of b, which it owns from then on:
// with forking on, a fork of a template (runsc_fork.go); should the
// templates fail, a gVisor sandbox of its own.
func (r *RunscRuntime) prepareBundle(ctx context.Context, b *bundle.Bundle) (Sandbox, error) {
	if r.templates != nil && r.templates.on() {
		sb, fb, err := r.prepareForked(ctx, b)
		if fb == nil {
			return sb, err // b was the sandbox's, made or failed
		}
		if ctx.Err() != nil {
			fb.Remove()
			return nil, ctx.Err()
		}
		r.templates.failed(err)
		r.cfg.Logger.Warn("templates could not fork the sandbox; making a gVisor sandbox of its own", "err", err)
		b = fb
	}
	return prepare(ctx, &r.live, b, &runscContainer{rt: r, b: b, ended: make(chan struct{})})
}

// runscContainer is one `runsc run` and the sandbox it runs.
type runscContainer struct {
	rt   *RunscRuntime
	b    *bundle.Bundle
	cg   *callCgroup
	logf *os.File
	// seccomp is the exact filter the init installs in the code.
	seccomp []byte

	mu  sync.Mutex
	cmd *exec.Cmd
	// parked: checkpointed, its processes gone; restores takes the
	// restore to its thread (park.go). ended is closed once wait returns.
	parked   bool
	restores chan restoreReq
	ended    chan struct{}
	image    string // the last park's, until restored
}

// create adapts the bundle to this runsc, rewrites config.json, and makes
// the call's cgroups with the spec's limits.
func (rc *runscContainer) create(context.Context) error {
	b := rc.b
	if b.Spec.Linux == nil || b.Spec.Process == nil {
		return fmt.Errorf("%w: spec of %s has no linux or process section", ErrSandbox, b.ID)
	}
	b.Spec.Linux.CgroupsPath = rc.rt.inst.cgroupPath(b.ID)
	if s := b.Spec.Linux.Seccomp; s != nil {
		bpf, err := rc.rt.filters.compile(s)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrSandbox, err)
		}
		rc.seccomp = bpf
		b.Spec.Linux.Seccomp = gvisorSeccomp(s)
	}
	b.Spec.Mounts = gvisorMounts(b.Spec.Mounts)
	if err := b.WriteSpec(); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	cg, err := newCallCgroup(b)
	if err != nil {
		return fmt.Errorf("%w: creating cgroups of %s: %w", ErrSandbox, b.ID, err)
	}
	rc.cg = cg
	if err := limitSockets(cg.paths, socketBytes(b.Spec)); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	logf, err := os.OpenFile(filepath.Join(b.Dir, "runsc-errors.json"), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%w: creating runsc log: %w", ErrSandbox, err)
	}
	rc.logf = logf
	return nil
}

// initConfig is the bundle's, with the exact filter for the code.
func (rc *runscContainer) initConfig() (*initproto.Config, error) {
	c := containerInit(rc.b)
	c.Seccomp = rc.seccomp
	// A template's (runsc_fork.go): its interpreter a zygote, under the
	// template's filter, which gVisor applies (--oci-seccomp).
	c.Template = rc.b.Config.Template
	return c, nil
}

// stdio are the sandbox's standard streams: one unix socket pair each.
// Not pipes: runsc 2022-12 puts a host pipe in non-blocking mode and, when
// the pipe is full, reports a write of up to 64 KiB as done and drops it
// (a 64 MiB write arrived as ~4 MiB, with os.write returning success).
// With a socket its writes block as they should and nothing is lost.
// The code itself sees pipes under every runtime: the init's.
func (rc *runscContainer) stdio() (child, parent [3]*os.File, err error) { return socketStdio() }

// socketStdio are a gVisor sandbox's init's standard streams (see stdio).
func socketStdio() (child, parent [3]*os.File, err error) {
	for i, name := range []string{"stdin", "stdout", "stderr"} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			closeAll(child[:])
			closeAll(parent[:])
			return child, parent, fmt.Errorf("creating %s socket pair: %w", name, err)
		}
		parent[i] = os.NewFile(uintptr(fds[0]), name)
		child[i] = os.NewFile(uintptr(fds[1]), name)
		// One direction each, so that neither side can talk back.
		if i == 0 {
			unix.Shutdown(fds[0], unix.SHUT_RD)
			unix.Shutdown(fds[1], unix.SHUT_WR)
		} else {
			unix.Shutdown(fds[0], unix.SHUT_WR)
			unix.Shutdown(fds[1], unix.SHUT_RD)
		}
	}
	return child, parent, nil
}

// waitDelay bounds Wait after Cancel: should the run process outlive our
// SIGKILL, os/exec kills it again and returns. (The streams are plain
// files, so there is no copying goroutine to wait for.)
const waitDelay = 2 * time.Second

// start starts `runsc run`; the sandbox's init talks to us on its stdio.
func (rc *runscContainer) start(child [3]*os.File) error {
	args := append(rc.rt.globalArgs(), "run", "--bundle", rc.b.Dir, rc.b.ID)
	cmd := exec.Command(rc.rt.info.Path, args...)
	cmd.Env = []string{} // nothing of the server's environment, not even to runsc
	cmd.Dir = "/"
	// Plain files: the sandbox gets these very sockets.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	cmd.ExtraFiles = []*os.File{rc.logf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting runsc for %s: %w", rc.b.ID, err)
	}
	rc.mu.Lock()
	rc.cmd = cmd
	rc.mu.Unlock()
	return nil
}

func (rc *runscContainer) started() error { return nil }

// explain adds runsc's own account of a sandbox that never got ready.
func (rc *runscContainer) explain(err error) error {
	if msg := runscFailure(rc.logf); msg != "" {
		return fmt.Errorf("%w; runsc said: %s", err, msg)
	}
	return err
}

// sockets: gVisor's network stack keeps its buffers in the sentry's own
// memory, which the memory limit covers.
func (rc *runscContainer) sockets() (int64, int64, bool) { return 0, 0, false }

func (rc *runscContainer) cpu() time.Duration {
	if rc.cg == nil {
		return 0
	}
	return cgroupCPU(rc.cg.paths)
}

func (rc *runscContainer) foreground() error {
	if rc.cg == nil || !preparedAhead(rc.b.Spec) {
		return nil
	}
	return cgroupForeground(rc.cg.paths)
}

// waitsForExit: a gVisor sandbox is left to end on its own before the
// result is returned; killed while its init was still exiting, its
// teardown (runsc delete) was seen to hang inside a container.
func (rc *runscContainer) waitsForExit() bool { return true }

func (rc *runscContainer) verdict(res *Result) {
	if rc.cg != nil {
		rc.cg.stats(res)
	}
}

func (rc *runscContainer) deadline(at time.Time) {
	if at.IsZero() {
		rc.rt.inst.wd.disarm(rc.b.Spec.Linux.CgroupsPath)
	} else {
		rc.rt.inst.wd.arm(rc.b.Spec.Linux.CgroupsPath, at)
	}
}

// kill SIGKILLs the run process and every process in the call's cgroups:
// the sandbox, the gofer, the ptrace stubs.
func (rc *runscContainer) kill() {
	rc.mu.Lock()
	cmd := rc.cmd
	rc.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(os.Kill)
	}
	if rc.cg != nil {
		rc.cg.kill()
	}
	rc.unparkKill()
}

// destroy removes runsc's state of the container (when `runsc run` was
// killed before it could), the call's cgroups and runsc's log.
func (rc *runscContainer) destroy() error {
	var errs []error
	if rc.stateLeft() {
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout/2)
		out, err := rc.rt.runsc(ctx, "delete", "--force", rc.b.ID)
		cancel()
		if err != nil && rc.stateLeft() {
			errs = append(errs, fmt.Errorf("deleting runsc container %s: %w: %s", rc.b.ID, err, bytes.TrimSpace(out)))
		}
		if rc.stateLeft() {
			removeRunscState(rc.rt.root, rc.b.ID)
		}
	}
	if rc.cg != nil {
		if err := rc.cg.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if rc.logf != nil {
		rc.logf.Close()
	}
	if err := rc.removeImage(); err != nil {
		errs = append(errs, fmt.Errorf("removing the parked image: %w", err))
	}
	return errors.Join(errs...)
}

// stateLeft reports whether runsc's root dir still holds state of this
// container ("<id>_sandbox:<id>.state" and its lock).
func (rc *runscContainer) stateLeft() bool {
	matches, _ := filepath.Glob(filepath.Join(rc.rt.root, globEscape(rc.b.ID)+"_*"))
	return len(matches) > 0
}

// runscFailure returns the messages runsc logged as errors on --log-fd, or
// "" when it logged none.
func runscFailure(f *os.File) string {
	data, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, 0, 64<<10), 64<<10))
	if err != nil || len(bytes.TrimSpace(data)) == 0 {
		return ""
	}
	var msgs []string
	dec := json.NewDecoder(bytes.NewReader(data))
	for {
		var rec struct {
			Msg   string `json:"msg"`
			Level string `json:"level"`
		}
		if err := dec.Decode(&rec); err != nil {
			break
		}
		if rec.Msg != "" {
			msgs = append(msgs, rec.Msg)
		}
	}
	if len(msgs) == 0 {
		return strings.TrimSpace(string(data))
	}
	return strings.Join(msgs, "; ")
}

// removeRunscState removes a container's state files when runsc could not.
func removeRunscState(root, id string) {
	matches, _ := filepath.Glob(filepath.Join(root, globEscape(id)+"_*"))
	for _, m := range matches {
		os.Remove(m)
	}
}

func globEscape(s string) string {
	r := strings.NewReplacer(`*`, `\*`, `?`, `\?`, `[`, `\[`, `\`, `\\`)
	return r.Replace(s)
}

// runsc runs a short runsc command with the instance's flags.
func (r *RunscRuntime) runsc(ctx context.Context, args ...string) ([]byte, error) {
	full := append([]string{"--root=" + r.root}, args...)
	cmd := exec.CommandContext(ctx, r.info.Path, full...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.WaitDelay = time.Second
	return cmd.CombinedOutput()
}

// killRunscProcesses SIGKILLs every process started for a runsc root dir:
// `runsc run` and the sandboxes and gofers it started all carry
// "--root=<root>" on their command line. The root dir holds a random
// instance id, so no other process can match.
func killRunscProcesses(root string) int {
	want := []byte("--root=" + root + "\x00")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, want) {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		if pid > 0 && pid != os.Getpid() {
			if err := unix.Kill(pid, unix.SIGKILL); err == nil {
				n++
			}
		}
	}
	return n
}
