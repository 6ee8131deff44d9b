// Package runtime runs an OCI bundle in a fresh sandbox, collects its
// bounded output and verdict, and tears everything down.
//
// Three runtimes implement it: libcontainer (runc's library, in-process),
// runsc (gVisor, as a child process) and process (the sandbox's init as a
// confined process of the server's machine, for a server that cannot make
// containers). All share one sandbox core (sandbox.go) and one init and
// its protocol (runtime/sandboxinit, runtime/initproto); each contributes
// a container (create, start, kill, statistics, teardown). The containers
// enforce exactly what the bundle's spec says; per-call knobs (stdin,
// timeout, output caps) arrive in a Request. The package knows nothing of MCP; of
// policy it reads only what the spec cannot carry: the process runtime's
// confinement (policy/process.go) and the CPU weight of a call.
//
// Invariants a maintainer must keep:
//   - Run returns an error only when the sandbox could not run. A non-zero
//     exit, a timeout or an OOM kill is a Result.
//   - Teardown always happens — success, error, timeout, panic, cancelled
//     context — and never depends on the caller's context: every process of
//     the container is killed, then the container, its cgroups, its state and
//     its bundle directory are removed.
//   - Output writers never block the child and never fail: they keep the
//     first bytes up to the cap and count the rest.
//   - Each server instance keeps its state in its own directory, locked for
//     as long as it lives; a new instance removes what dead ones left.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
)

// Kind names a runtime implementation: host's enum, which the host checks
// are keyed by.
type Kind = host.Runtime

const (
	Libcontainer = host.Libcontainer
	Runsc        = host.Runsc
	Process      = host.Process
	Auto         = host.Auto
)

// ParseKind parses a runtime name as given in configuration.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case Libcontainer, Runsc, Process, Auto:
		return k, nil
	}
	return "", fmt.Errorf("unknown runtime %q (want %s, %s, %s or %s)", s, Libcontainer, Runsc, Process, Auto)
}

// Request carries what one call asks for at run time.
type Request struct {
	// Code is the Python source, run as the script /code/main.py.
	Code []byte
	// Stdin is fed to the program's standard input, followed by EOF.
	Stdin []byte
	// Files are written under /tmp before the code starts.
	Files []File
	// Timeout is the wall-clock limit of the code, counted from when it
	// starts; when it passes every process of the container is killed. It
	// must be > 0.
	Timeout time.Duration
	// CPULimit, when not 0, is the CPU time the code may use, all its
	// processes together, counted from when it starts: the supervision
	// reads it (the call's cgroup; in the process runtime, its process
	// tree) and stops the code there, as at a timeout (a session's is
	// interrupted first). 0: the timeout alone bounds it.
	CPULimit time.Duration
	// MaxOutputBytes caps each of stdout and stderr, and the last
	// expression's repr. It must be > 0, and the sandbox's own cap
	// (bundle.Config) bounds it too.
	MaxOutputBytes int64
	// Persistent keeps the interpreter for another call (a Session's): the
	// code runs as a notebook cell, and a timeout interrupts it first.
	Persistent bool
	// Live, when not nil, is shown the output as it comes, for whoever
	// watches the call; stdout is then line-buffered.
	Live *Live
	// Phases, when not nil, is told each phase of the call once it is
	// over (phases.go).
	Phases PhaseFunc
	// Egress, when not nil, takes the connections the code opens to its
	// sandbox's egress relay (a sandbox of a bundle.Config with a
	// Network), for this call only; the runtime closes it as the call
	// ends. Nil: they are closed as they come.
	Egress Egress
}

// closeEgress closes the call's Egress, if any: the call is over, and
// nothing of its network may outlive it. The entry points of a call (Run,
// Sandbox.Run, Pool.Run, Session.Run) do it once every attempt is over.
func (r Request) closeEgress() {
	if r.Egress != nil {
		r.Egress.Close()
	}
}

// File is a file of a call: one written under /tmp before the code starts,
// or one the code left under /tmp/outputs. Path is relative to that dir.
type File struct {
	Path string
	Data []byte
}

// Validate checks a Request once, before a sandbox is spent on it.
func (r Request) Validate() error {
	if len(r.Code) == 0 {
		return errors.New("code is empty")
	}
	if r.Timeout <= 0 {
		return fmt.Errorf("timeout must be > 0, got %v", r.Timeout)
	}
	if r.CPULimit < 0 {
		return fmt.Errorf("CPU limit must be ≥ 0, got %v", r.CPULimit)
	}
	if r.MaxOutputBytes <= 0 {
		return fmt.Errorf("output cap must be > 0, got %d", r.MaxOutputBytes)
	}
	for _, f := range r.Files {
		if err := CheckRelPath(f.Path); err != nil {
			return fmt.Errorf("file %q: %w", f.Path, err)
		}
	}
	return nil
}

// CheckRelPath checks a file path given relative to a sandbox dir: not
// empty, not absolute, no "." or ".." element, no empty element, no NUL.
func CheckRelPath(p string) error {
	switch {
	case p == "":
		return errors.New("path is empty")
	case strings.HasPrefix(p, "/"):
		return errors.New("path must be relative")
	case strings.IndexByte(p, 0) >= 0:
		return errors.New("path contains a NUL byte")
	case len(p) > 4096:
		return errors.New("path is longer than 4096 bytes")
	}
	for _, e := range strings.Split(p, "/") {
		switch e {
		case "":
			return errors.New("path has an empty element")
		case ".", "..":
			return fmt.Errorf("path has a %q element", e)
		}
	}
	return nil
}

// Result is the verdict of one run.
type Result struct {
	// Stdout and Stderr are what the program wrote, each within the
	// request's cap: past it, its first and last parts (half each)
	// around a line saying how many bytes were left out between them
	// (StdoutTruncated, StderrTruncated).
	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
	// StdoutBytes and StderrBytes count everything the program wrote,
	// including what was left out.
	StdoutBytes, StderrBytes int64
	// ExitCode is the exit status, or 128+N when a signal N ended it.
	ExitCode int
	// Signal is N when the signal N ended the code (ExitCode is then
	// 128+N), else 0: an exit status of 128+N is not a signal.
	Signal int
	// TimedOut: the wall-clock limit was hit and the container killed.
	TimedOut bool
	// CPULimited: the request's CPU limit ended the run (and not its
	// timeout, nor the code on its own).
	CPULimited bool
	// OOMKilled: the memory limit killed a process of the container; in
	// the process runtime, whose memory limit is an rlimit that refuses an
	// allocation instead, an uncaught MemoryError ended the code
	// (MemoryRefused is set too).
	OOMKilled bool
	// MemoryRefused: the process runtime's memory limit (RLIMIT_DATA)
	// refused an allocation and the MemoryError ended the code.
	MemoryRefused bool
	// SocketsKilled: the container was killed because its socket buffers
	// went past their bound (cgroup v1; OOMKilled is set too).
	SocketsKilled bool
	// PidsLimitHit: creating a process or thread failed at the pids limit
	// (under gVisor, which needs host tasks too, the sandbox may end then);
	// in the process runtime, the count of its RLIMIT_NPROC reached it (a
	// sample, every quarter second and as the code ends).
	PidsLimitHit bool
	// Duration is the wall-clock time from the start of the code to the
	// end of its last process.
	Duration time.Duration
	// CPUTime is the CPU time all processes of the container used while
	// the code ran, as the host's cgroup accounts it (under gVisor, its
	// kernel's time too; in the process runtime, the kernel's count of the
	// call's processes, to a clock tick); 0 when unknown.
	CPUTime time.Duration
	// CPUThrottled is how long the CPU quota held the container back.
	CPUThrottled time.Duration
	// PeakMemoryBytes is the highest memory use, when the runtime knows it:
	// in the process runtime, the peak resident set of its largest single
	// process (a peak of one process, not of their sum).
	PeakMemoryBytes int64
	// SocketPeakBytes is the most socket buffer memory the kernel charged
	// to the call where it counts it apart from the memory limit (cgroup
	// v1; 0 elsewhere, where the memory limit covers it).
	SocketPeakBytes int64
	// Files are the regular files the code left under /tmp/outputs, within
	// the sandbox's limits; FilesTruncated says one was left out for them.
	Files          []File
	FilesTruncated bool
	// FilesLeftOut names what was left out, the first maxLeftOut entries
	// (FilesTruncated is true whenever one was, named or not).
	FilesLeftOut []LeftOut
	// Pooled: the sandbox was prepared ahead of the call (see Pool).
	Pooled bool
	// Value is the repr of the code's last statement when that is an
	// expression whose value is not None, at most the output cap.
	Value          []byte
	ValueTruncated bool
	// Ended says why a session's sandbox takes no more calls: "" while it
	// does (and for a call that is not a session's).
	Ended SessionEnd
	// EndDetail says in words what ended it when Ended alone would
	// mislead (the runtime, not the code, ended it); else "".
	EndDetail string
	// Egress is what the call's code asked the egress proxy for, as the
	// caller that gave the call its Egress reads it back (the runtime
	// only relays).
	Egress []EgressDestination
}

// LeftOut is an entry of /tmp/outputs that did not come back.
type LeftOut struct {
	// Path is relative to /tmp/outputs, its bytes as the code named it; a
	// directory's ends in "/" ("./" for outputs itself).
	Path string
	// Size is the file's size in bytes (0 for a directory).
	Size int64
	Why  LeftOutReason
}

// LeftOutReason is why an output was left out.
type LeftOutReason string

const (
	// LeftCount: the call's file count limit (CallCaps.MaxFiles).
	LeftCount LeftOutReason = "count"
	// LeftBytes: the call's byte limit of files (CallCaps.MaxFileBytes).
	LeftBytes LeftOutReason = "bytes"
	// LeftUnreadable: the code took its permissions away, or it changed
	// while it was read.
	LeftUnreadable LeftOutReason = "unreadable"
	// LeftLimits: past the bounds of the walk of /tmp/outputs (depth 32,
	// 100000 entries, 4096 in a directory, the path's length).
	LeftLimits LeftOutReason = "limits"
)

// SessionEnd is why a persistent session ended: every value the
// server's session_ended can take, one vocabulary. A Session ends on its
// own only for EndTimeout, EndOOM, EndCPU or EndExited; the others are the
// server's reasons to close one.
type SessionEnd string

const (
	// EndTimeout: the code was still running a moment after its timeout's
	// interrupt, and the sandbox was killed.
	EndTimeout SessionEnd = "timeout"
	// EndOOM: the memory limit killed a process, or the process limit was
	// hit.
	EndOOM SessionEnd = "oom"
	// EndExited: the interpreter ended (sys.exit, os._exit, a crash), or
	// the sandbox could not go on.
	EndExited SessionEnd = "exited"
	// EndCPU: the code was still running a moment after the interrupt of
	// its CPU limit, or its RLIMIT_CPU ended the interpreter (the process
	// runtime), and the sandbox was killed.
	EndCPU SessionEnd = "cpu_limit"
	// EndClosed: a call ended it with end_session, or its client went.
	EndClosed SessionEnd = "closed"
	// EndIdle: no call came for the idle time.
	EndIdle SessionEnd = "idle"
	// EndLifetime: it was open for its whole lifetime.
	EndLifetime SessionEnd = "lifetime"
	// EndShutdown: the server stopped.
	EndShutdown SessionEnd = "shutdown"
)

// The two failures a caller tells apart. Neither is the code's own: what
// the code did, however it ended, is a Result.
var (
	// ErrUnsupported: this host cannot give the whole sandbox, so the
	// runtime refuses to run at all (doctor says what is missing).
	ErrUnsupported = errors.New("isolation unavailable")
	// ErrSandbox: this call's sandbox could not be set up or run; the
	// next call gets a fresh one.
	ErrSandbox = errors.New("sandbox could not run")
)

// errNotStarted refines ErrSandbox, never alone: the sandbox ended before
// the code started, so the call may have another (Pool.Run).
var errNotStarted = errors.New("the code could not be started")

// Runtime prepares sandboxes from a bundle configuration: it makes each
// sandbox's bundle itself (newBundle), in its instance's state, where a
// crashed instance's bundles are swept with the rest.
type Runtime interface {
	Kind() Kind
	// Prepare makes a sandbox of cfg up to the point where only the code
	// remains to be started: its bundle, its container, its init and the
	// interpreter waiting for its code. The runtime sets cfg.InitDir, its
	// own.
	Prepare(ctx context.Context, cfg bundle.Config) (Sandbox, error)
	// Close kills what still runs and removes the instance's state.
	Close() error
}

// Sandbox is one prepared sandbox: a container, a fork of a template, or
// a confined process. Its Run runs one call's code, once: a sandbox is
// never given a second call, except a persistent session's (Session),
// which runs each of its caller's calls in the one interpreter, in turn.
type Sandbox interface {
	// Run starts the code, feeds it the request's stdin and waits for the
	// verdict. A cancelled ctx kills the container at once and returns the
	// context's error.
	Run(ctx context.Context, req Request) (Result, error)
	// Close tears the container down; it is safe to call more than once.
	Close() error
}

// Run prepares a sandbox of cfg, runs it once and tears it down before
// it returns (a Pool tears down in the background instead).
func Run(ctx context.Context, rt Runtime, cfg bundle.Config, req Request) (Result, error) {
	defer req.closeEgress()
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	sb, err := rt.Prepare(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	res, err := runValid(ctx, sb, req)
	if cerr := sb.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return res, err
}

// newBundle writes the bundle of one sandbox of cfg, its init in initDir,
// under dir: the one place where a runtime makes a bundle.
func newBundle(dir, initDir string, cfg bundle.Config, id string) (*bundle.Bundle, error) {
	cfg.InitDir = initDir
	b, err := bundle.New(dir, cfg, id)
	if err != nil {
		return nil, fmt.Errorf("%w: creating bundle: %w", ErrSandbox, err)
	}
	return b, nil
}

// runValid runs a request its caller validated: a sandbox of this package
// does not check it again.
func runValid(ctx context.Context, sb Sandbox, req Request) (Result, error) {
	if s, ok := sb.(*sandbox); ok {
		return s.run(ctx, req)
	}
	return sb.Run(ctx, req)
}

// teardownTimeout bounds every teardown, which runs even after the caller's
// context is done.
const teardownTimeout = 10 * time.Second

// exitCode maps a wait status to the contract's exit code.
func exitCode(exited bool, status int, signaled bool, sig int) int {
	if signaled {
		return 128 + sig
	}
	if exited {
		return status
	}
	return -1
}

// New creates the runtime of the given kind. It fails, naming what is
// missing, when this host cannot give that runtime's full sandbox.
func New(kind Kind, cfg Config) (Runtime, error) {
	switch kind {
	case Libcontainer:
		return NewLibcontainer(cfg)
	case Runsc:
		return NewRunsc(cfg)
	case Process:
		return NewProcess(cfg)
	case Auto:
		rt, _, err := NewAuto(cfg)
		return rt, err
	}
	return nil, fmt.Errorf("unknown runtime %q", kind)
}

// NewAuto creates the strictest runtime this host allows: libcontainer,
// else runsc, else the process runtime. why says what the stricter ones
// lacked when it is not libcontainer.
func NewAuto(cfg Config) (rt Runtime, why string, err error) {
	lcErr := LibcontainerUsable()
	if lcErr == nil {
		rt, err = NewLibcontainer(cfg)
		return rt, "", err
	}
	if rsErr := RunscUsable(cfg); rsErr == nil {
		rt, err = NewRunsc(cfg)
		return rt, fmt.Sprintf("libcontainer is unavailable here (%v)", lcErr), err
	}
	rt, err = NewProcess(cfg)
	return rt, fmt.Sprintf("no per-call container can be made here (%v)", lcErr), err
}

// Forker is a runtime whose sandboxes can be forks of templates
// (libcontainer's, runsc's): how that goes.
type Forker interface {
	Forking() ForkStatus
}
