package runtime

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
)

// The process runtime runs each call as a fresh process of the server's
// own machine: the sandbox's init, started directly, with the host's
// interpreter. There is no container: no namespaces, no cgroups, no
// seccomp filter, no read-only root of its own. What it keeps of the
// sandbox: a fresh process per call, in its own empty working directory,
// with the environment allowlist, the init's rlimits (memory, processes,
// file size, CPU time, open files), its whole process group and every
// orphan it made killed when the call ends, and nothing of it left after.
//
// It is for a server that itself runs in a locked-down container — the
// mcp-exec 0.5.4 deployment: docker run --read-only --cap-drop ALL --user
// 65532 --network none … — where no per-call container can be made and
// the outer container is the boundary. It is never chosen silently: by
// name (MCP_EXEC_RUNTIME=process) or by auto, which says so in the tool's
// description, the runtime field of every result, the log and doctor.

// ProcessRuntime runs each call as a fresh process.
type ProcessRuntime struct {
	cfg  Config
	dir  string // the instance's dir: one subdir per call
	live liveSet
}

// NewProcess creates the process runtime, keeping its per-call dirs under
// dir (the system's temp dir when empty), which it creates 0700.
func NewProcess(cfg Config) (*ProcessRuntime, error) {
	cfg.setDefaults()
	base := cfg.WorkDir
	if base == "" {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "mcp-exec-")
	if err != nil {
		return nil, fmt.Errorf("%w: creating the process runtime's dir under %s: %w", ErrUnsupported, base, err)
	}
	// Others need nothing here: each call's dir is the code's own.
	if err := os.Chmod(dir, 0o711); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &ProcessRuntime{cfg: cfg, dir: dir}, nil
}

func (r *ProcessRuntime) Kind() Kind        { return Process }
func (r *ProcessRuntime) BundleDir() string { return r.dir }

// InitDir: the init is this executable itself.
func (r *ProcessRuntime) InitDir() string { return "/proc/self" }

// Close kills what still runs and removes the runtime's dir.
func (r *ProcessRuntime) Close() error {
	err := r.live.closeAll()
	return errors.Join(err, os.RemoveAll(r.dir))
}

// Prepare starts the init for b's process in a fresh working dir, and
// returns once the interpreter waits for its code.
func (r *ProcessRuntime) Prepare(ctx context.Context, b *bundle.Bundle) (_ Sandbox, retErr error) {
	sb := &procSandbox{rt: r, b: b, done: make(chan struct{})}
	defer func() {
		if retErr != nil {
			sb.Close()
		}
	}()
	if err := r.live.add(sb); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The code's working dir (its /tmp) and the dir of its script (its
	// /code), each its own and empty.
	work, code := filepath.Join(b.Dir, "work"), filepath.Join(b.Dir, "code")
	for _, d := range []string{work, code} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
		}
	}
	if err := os.Chmod(b.Dir, 0o711); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	init := processInit(b, work, code)
	if os.Geteuid() == 0 {
		// Root drops to the sandbox's uid: the work dir must be its.
		if err := os.Chown(work, int(init.UID), int(init.GID)); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
		}
		if err := os.Chmod(code, 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
		}
	}

	var toInit, fromInit, diag, childIn, childOut, childErr *os.File
	var err error
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
	cmd := exec.Command("/proc/self/exe", initMarker)
	cmd.Args[0] = "mcp-exec-init"
	cmd.Env = processEnv(b.Spec.Process.Env, work)
	cmd.Dir = work
	cmd.Stdin, cmd.Stdout, cmd.Stderr = childIn, childOut, childErr
	// Its own process group, so that the whole of it is killed at once.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := make(chan error, 1)
	go func() {
		// The parent-death signal follows the forking thread.
		goruntime.LockOSThread()
		defer goruntime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			close(sb.done)
			return
		}
		sb.mu.Lock()
		sb.cmd = cmd
		sb.mu.Unlock()
		started <- nil
		cmd.Wait()
		close(sb.done)
	}()
	err = <-started
	for _, f := range []*os.File{childIn, childOut, childErr} {
		f.Close()
	}
	if err != nil {
		toInit.Close()
		fromInit.Close()
		diag.Close()
		return nil, fmt.Errorf("%w: starting the init: %w", ErrSandbox, err)
	}
	sb.sess = newSession(toInit, fromInit, diag)
	if err := sb.sess.configure(init); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	if err := sb.sess.waitReady(ctx, sb); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	return sb, nil
}

// processInit is the bundle's init configuration in the process
// runtime's terms: the work dir and the script in the call's own dirs (the
// script named relative to the work dir, so that no other process sees
// where the call's dir is on its command line), the init told it is no
// pid 1 of a namespace, and the limits a cgroup would have enforced as
// rlimits: memory (data), processes, file size. (Processes are counted per
// user by the kernel: with the server's own uid, it bounds them together,
// and the outer container's pids limit bounds all.)
func processInit(b *bundle.Bundle, work, code string) *initConfig {
	in := b.Init
	in.WorkDir = work
	in.Script = filepath.Join(code, "main.py")
	in.Argv = append(append([]string(nil), in.Argv[:len(in.Argv)-1]...), filepath.Join("..", filepath.Base(code), "main.py"))
	in.Rlimits = slices.Clone(in.Rlimits)
	lim := func(typ string, v int64) {
		in.Rlimits = append(in.Rlimits, specs.POSIXRlimit{Type: typ, Soft: uint64(v), Hard: uint64(v)})
	}
	if r := b.Spec.Linux.Resources; r != nil {
		if r.Memory != nil && r.Memory.Limit != nil {
			lim("RLIMIT_DATA", *r.Memory.Limit)
		}
		if r.Pids != nil && r.Pids.Limit != nil {
			lim("RLIMIT_NPROC", *r.Pids.Limit*8+64)
		}
	}
	for _, m := range b.Spec.Mounts {
		if m.Destination == "/tmp" {
			for _, o := range m.Options {
				if v, ok := strings.CutPrefix(o, "size="); ok {
					if n, err := strconv.ParseInt(v, 10, 64); err == nil {
						lim("RLIMIT_FSIZE", n)
					}
				}
			}
		}
	}
	return &initConfig{Init: in, Process: &processConfig{}}
}

// processEnv is the sandbox's environment with its home and temp dir the
// call's own work dir.
func processEnv(env []string, work string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "HOME", "TMPDIR":
			kv = k + "=" + work
		}
		out = append(out, kv)
	}
	return out
}

// procSandbox is one call's process between Prepare and Close.
type procSandbox struct {
	rt   *ProcessRuntime
	b    *bundle.Bundle
	sess *session

	mu   sync.Mutex
	cmd  *exec.Cmd
	ran  bool
	done chan struct{}

	closer teardownOnce
}

func (sb *procSandbox) Run(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	sb.mu.Lock()
	if sb.ran || sb.sess == nil {
		sb.mu.Unlock()
		return Result{}, errors.New("sandbox already used or not prepared")
	}
	sb.ran = true
	sb.mu.Unlock()
	return supervise(ctx, sb, sb.sess, req, nil)
}

func (sb *procSandbox) exited() <-chan struct{} { return sb.done }

// kill SIGKILLs the init's process group; the init, a subreaper, has its
// orphans killed when it dies (see sandboxinit.c's process mode).
func (sb *procSandbox) kill() {
	sb.mu.Lock()
	cmd := sb.cmd
	sb.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// verdict: without a cgroup there is no OOM counter or accounting; the
// init's rlimits turn memory exhaustion into MemoryError.
func (sb *procSandbox) verdict(*Result)               {}
func (sb *procSandbox) cpu() time.Duration            { return 0 }
func (sb *procSandbox) sockets() (int64, int64, bool) { return 0, 0, false }

// foreground: no cgroup, no weight; a prepared process waits idle.
func (sb *procSandbox) foreground() error { return nil }
func (sb *procSandbox) Close() error      { return sb.closer.do("process "+sb.b.ID, sb.teardown) }

func (sb *procSandbox) teardown() error {
	sb.kill()
	if sb.sess != nil {
		sb.sess.closeInput()
	}
	sb.mu.Lock()
	started := sb.cmd != nil
	sb.mu.Unlock()
	if started {
		<-sb.done
	}
	err := sb.b.Remove()
	sb.rt.live.remove(sb)
	return err
}
