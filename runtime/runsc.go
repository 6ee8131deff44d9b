package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
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
// runsc can express (see gvisorSeccomp), rewrites config.json, and creates
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
}

// NewRunsc checks that runsc can give the full sandbox on this host (the
// binary, a safe platform, --oci-seccomp, root with writable cgroups) and
// creates the runtime's instance state. It refuses rather than run with
// less isolation.
func NewRunsc(cfg Config) (*RunscRuntime, error) {
	cfg.setDefaults()
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
	cfg.Logger.Debug("runsc runtime ready", "runsc", info.Path, "version", info.Version, "platform", info.Platform)
	return &RunscRuntime{cfg: cfg, inst: inst, info: info, root: root}, nil
}

func (r *RunscRuntime) Kind() Kind          { return Runsc }
func (r *RunscRuntime) BundleDir() string   { return r.inst.bundleDir() }
func (r *RunscRuntime) InitDir() string     { return r.inst.initDir() }
func (r *RunscRuntime) instanceID() string  { return r.inst.id }
func (r *RunscRuntime) instanceDir() string { return r.inst.dir }

// Info is what the runtime probed of runsc when it started.
func (r *RunscRuntime) Info() host.RunscInfo { return r.info }

// Close kills every sandbox still running and removes the instance.
func (r *RunscRuntime) Close() error {
	errs := []error{r.live.closeAll()}
	killRunscProcesses(r.root)
	errs = append(errs, r.inst.close())
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
func (r *RunscRuntime) Prepare(ctx context.Context, b *bundle.Bundle) (_ Sandbox, retErr error) {
	sb := &runscSandbox{rt: r, b: b, done: make(chan struct{})}
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
	if b.Spec.Linux == nil || b.Spec.Process == nil {
		return nil, fmt.Errorf("%w: spec of %s has no linux or process section", ErrSandbox, b.ID)
	}
	b.Spec.Linux.CgroupsPath = r.inst.cgroupPath(b.ID)
	if s := b.Spec.Linux.Seccomp; s != nil {
		b.Spec.Linux.Seccomp = gvisorSeccomp(s, r.info.Unimplemented)
	}
	b.Spec.Mounts = gvisorMounts(b.Spec.Mounts)
	if err := b.WriteSpec(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	cg, err := newCallCgroup(b)
	if err != nil {
		return nil, fmt.Errorf("%w: creating cgroups of %s: %w", ErrSandbox, b.ID, err)
	}
	sb.cg = cg
	if err := limitSockets(cg.paths, socketBytes(b.Spec)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	logf, err := os.OpenFile(filepath.Join(b.Dir, "runsc-errors.json"), os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: creating runsc log: %w", ErrSandbox, err)
	}
	sb.logf = logf
	if err := sb.io.open(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if err := sb.start(); err != nil {
		return nil, fmt.Errorf("%w: starting runsc for %s: %w", ErrSandbox, b.ID, err)
	}
	if err := sb.sess.configure(containerInit(b)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if err := sb.sess.waitReady(ctx, sb); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if msg := runscFailure(sb.logf); msg != "" {
			err = fmt.Errorf("%w; runsc said: %s", err, msg)
		}
		return nil, fmt.Errorf("%w: sandbox %s: %w", ErrSandbox, b.ID, err)
	}
	return sb, nil
}

// stdio are the sandbox's standard streams: one unix socket pair each.
// Not pipes: runsc 2022-12 puts a host pipe in non-blocking mode and, when
// the pipe is full, reports a write of up to 64 KiB as done and drops it
// (a 64 MiB write arrived as ~4 MiB, with os.write returning success).
// With a socket its writes block as they should and nothing is lost.
// The code itself sees pipes under both runtimes: the init's.
type stdio struct {
	parent, child [3]*os.File // stdin, stdout, stderr
}

func (s *stdio) open() error {
	for i, name := range []string{"stdin", "stdout", "stderr"} {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("creating %s socket pair: %w", name, err)
		}
		s.parent[i] = os.NewFile(uintptr(fds[0]), name)
		s.child[i] = os.NewFile(uintptr(fds[1]), name)
		// One direction each, so that neither side can talk back.
		if i == 0 {
			unix.Shutdown(fds[0], unix.SHUT_RD)
			unix.Shutdown(fds[1], unix.SHUT_WR)
		} else {
			unix.Shutdown(fds[0], unix.SHUT_WR)
			unix.Shutdown(fds[1], unix.SHUT_RD)
		}
	}
	return nil
}

func (s *stdio) closeChild() {
	for i, f := range s.child {
		if f != nil {
			f.Close()
			s.child[i] = nil
		}
	}
}

func (s *stdio) close() {
	s.closeChild()
	for i, f := range s.parent {
		if f != nil {
			f.Close()
			s.parent[i] = nil
		}
	}
}

// runscSandbox is one call between Prepare and Close.
type runscSandbox struct {
	rt   *RunscRuntime
	b    *bundle.Bundle
	cg   *callCgroup
	logf *os.File
	io   stdio
	sess *session

	mu      sync.Mutex
	cmd     *exec.Cmd
	ran     bool
	closing bool
	done    chan struct{} // closed when the run process has been waited for

	closer teardownOnce
}

// waitDelay bounds Wait after Cancel: should the run process outlive our
// SIGKILL, os/exec kills it again and returns. (The streams are plain
// files, so there is no copying goroutine to wait for.)
const waitDelay = 2 * time.Second

// start starts `runsc run`; the sandbox's init talks to us on its stdio.
func (sb *runscSandbox) start() error {
	args := append(sb.rt.globalArgs(), "run", "--bundle", sb.b.Dir, sb.b.ID)
	cmd := exec.Command(sb.rt.info.Path, args...)
	cmd.Env = []string{} // nothing of the server's environment, not even to runsc
	cmd.Dir = "/"
	// Plain files: the sandbox gets these very sockets.
	cmd.Stdin, cmd.Stdout, cmd.Stderr = sb.io.child[0], sb.io.child[1], sb.io.child[2]
	cmd.ExtraFiles = []*os.File{sb.logf}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = waitDelay

	// The parent-death signal fires when the thread that forked the child
	// exits, and Go may retire threads: fork from a thread that stays
	// locked until the child is reaped, so that it fires only when the
	// server dies.
	started := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(sb.done)
			return
		}
		sb.mu.Lock()
		sb.cmd = cmd
		closing := sb.closing
		sb.mu.Unlock()
		if closing {
			sb.kill()
		}
		started <- nil
		cmd.Wait()
		close(sb.done)
	}()
	if err := <-started; err != nil {
		return err
	}
	// Our copies of the child ends go, so that EOF comes when the sandbox's
	// last holder is gone.
	sb.io.closeChild()
	parent := sb.io.parent
	sb.io.parent = [3]*os.File{} // the session's now
	sb.sess = newSession(parent[0], parent[1], parent[2])
	return nil
}

func (sb *runscSandbox) Run(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	sb.mu.Lock()
	if sb.ran || sb.closing || sb.sess == nil {
		sb.mu.Unlock()
		return Result{}, errors.New("sandbox already used, closed or not prepared")
	}
	sb.ran = true
	sb.mu.Unlock()
	return supervise(ctx, sb, sb.sess, req, func(deadline time.Time) {
		sb.rt.inst.wd.arm(sb.b.Spec.Linux.CgroupsPath, deadline)
	})
}

func (sb *runscSandbox) exited() <-chan struct{} { return sb.done }

// sockets: gVisor's network stack keeps its buffers in the sentry's own
// memory, which the memory limit covers.
func (sb *runscSandbox) sockets() (int64, int64, bool) { return 0, 0, false }

func (sb *runscSandbox) cpu() time.Duration {
	if sb.cg == nil {
		return 0
	}
	return cgroupCPU(sb.cg.paths)
}

func (sb *runscSandbox) foreground() error {
	if sb.cg == nil || !preparedAhead(sb.b.Spec) {
		return nil
	}
	return cgroupForeground(sb.cg.paths)
}

// waitsForExit: a gVisor sandbox is left to end on its own before the
// result is returned; killed while its init was still exiting, its
// teardown (runsc delete) was seen to hang inside a container.
func (sb *runscSandbox) waitsForExit() bool { return true }

func (sb *runscSandbox) verdict(res *Result) {
	if sb.cg != nil {
		sb.cg.stats(res)
	}
}

// kill SIGKILLs the run process and every process in the call's cgroups:
// the sandbox, the gofer, the ptrace stubs.
func (sb *runscSandbox) kill() {
	sb.mu.Lock()
	cmd := sb.cmd
	sb.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		cmd.Process.Signal(os.Kill)
	}
	if sb.cg != nil {
		sb.cg.kill()
	}
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

// Close kills what runs, removes runsc's state of the container, the
// call's cgroups and the bundle, under its own deadline.
func (sb *runscSandbox) Close() error {
	return sb.closer.do("sandbox "+sb.b.ID, sb.teardown)
}

func (sb *runscSandbox) teardown() error {
	var errs []error
	sb.mu.Lock()
	sb.closing = true
	started := sb.cmd != nil || sb.sess != nil
	sb.mu.Unlock()
	sb.kill()
	if sb.sess != nil {
		sb.sess.closeInput()
	}
	if started {
		// start's goroutine reaps the run process; keep killing until it
		// has, in case Close raced with the start.
		tick := time.NewTicker(50 * time.Millisecond)
	wait:
		for {
			select {
			case <-sb.done:
				break wait
			case <-tick.C:
				sb.kill()
			}
		}
		tick.Stop()
	}
	if sb.stateLeft() {
		// runsc run was killed before it could destroy the container.
		ctx, cancel := context.WithTimeout(context.Background(), teardownTimeout/2)
		out, err := sb.rt.runsc(ctx, "delete", "--force", sb.b.ID)
		cancel()
		if err != nil && sb.stateLeft() {
			errs = append(errs, fmt.Errorf("deleting runsc container %s: %w: %s", sb.b.ID, err, bytes.TrimSpace(out)))
		}
		if sb.stateLeft() {
			removeRunscState(sb.rt.root, sb.b.ID)
		}
	}
	if sb.cg != nil {
		if err := sb.cg.remove(); err != nil {
			errs = append(errs, err)
		}
	}
	if sb.logf != nil {
		sb.logf.Close()
	}
	sb.mu.Lock()
	sb.io.close()
	sb.mu.Unlock()
	if err := sb.b.Remove(); err != nil {
		errs = append(errs, err)
	}
	if ran := sb.ran; ran {
		sb.rt.inst.wd.disarm(sb.b.Spec.Linux.CgroupsPath)
	}
	sb.rt.live.remove(sb)
	return errors.Join(errs...)
}

// stateLeft reports whether runsc's root dir still holds state of this
// container ("<id>_sandbox:<id>.state" and its lock).
func (sb *runscSandbox) stateLeft() bool {
	matches, _ := filepath.Glob(filepath.Join(sb.rt.root, globEscape(sb.b.ID)+"_*"))
	return len(matches) > 0
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
