// Package server is the MCP face of mcp-exec: the exec tool, its input
// checks and output, and the stdio, streamable HTTP and legacy SSE
// transports. It runs calls on an Engine and knows nothing of how a sandbox
// is made.
//
// Invariants a maintainer must keep:
//   - invalid input is a tool error (isError) whose message names the field
//     and the limit (and its MCP_EXEC_* variable); whatever the code did —
//     a non-zero exit, a timeout, an OOM kill — is a result;
//   - the server keeps serving after any call, good or bad, and the state it
//     keeps for a client is bounded: calls waiting for a slot (MaxQueued),
//     message sizes, HTTP bodies being read, idle sessions;
//   - a call whose client is gone (cancellation, closed stdio, vanished HTTP
//     connection, deleted session, server shutdown) has its sandbox killed at
//     once;
//   - nothing of the code, stdin or output reaches the logs, the audit
//     log, a metric or a span: metadata only, and no session handle (its
//     digest instead); metric labels are a fixed vocabulary.
package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

const mib = 1 << 20

// Engine runs one call in a fresh sandbox. It is all the server needs of
// the sandbox.
type Engine interface {
	// Run runs req once. It returns an error wrapping runtime.ErrSandbox
	// when the sandbox could not run; whatever the code did is a Result.
	Run(ctx context.Context, req runtime.Request) (runtime.Result, error)
	// Info describes what a call gets, for the tool description.
	Info() EngineInfo
	// NewSession makes the sandbox of a persistent session.
	NewSession(ctx context.Context) (Session, error)
}

// EngineInfo is what the tool description and the output's runtime field
// say about the sandbox.
type EngineInfo struct {
	// Runtime names the runtime that runs the calls.
	Runtime string
	// PythonVersion is the sandbox's Python, e.g. "3.11.2".
	PythonVersion string
	// Modules are the importable top-level modules beyond the standard
	// library.
	Modules []string
	// Shell: /bin/sh and the common command-line tools exist.
	Shell bool
	// Note is a sentence the description adds, e.g. what isolation a
	// weaker runtime gives.
	Note string
}

// Options configure a Server. Units are in the names.
type Options struct {
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// CallCaps bound a call's code, stdin, output and files.
	policy.CallCaps
	// Limits are the sandbox's resource limits, for the description and
	// the audit log.
	Limits policy.Limits
	// MaxConcurrency calls run at once; MaxQueued more wait for a slot and
	// any further one is refused.
	MaxConcurrency int
	MaxQueued      int
	// Progress is the interval of progress notifications.
	Progress time.Duration
	// TextBytes bounds the text block a model reads of a call (0:
	// DefaultTextBytes); structuredContent keeps the whole output.
	TextBytes int64
	// ResourceMaxBytes bounds the output files the server keeps as
	// resources (0: none kept, every file comes inline); each is kept
	// ResourceTTL after its call (resources.go).
	ResourceMaxBytes int64
	ResourceTTL      time.Duration
	// PersistentMax persistent sessions are open at most (0: none);
	// each ends after PersistentIdle without a call, or PersistentLifetime
	// after it began.
	PersistentMax      int
	PersistentIdle     time.Duration
	PersistentLifetime time.Duration
	// PersistentPerClient of them one client may hold: an HTTP session,
	// a legacy SSE stream, the stdio peer (in stateless HTTP, where no
	// client is known, only PersistentMax bounds them). 0: half of
	// PersistentMax, at least one, so that no one client takes them all.
	PersistentPerClient int
	// PersistentBackground: a session's threads run on between its
	// calls; otherwise its sandbox is frozen between them (the tool's
	// description says which).
	PersistentBackground bool

	// Transport, AuthToken and the rest below configure the HTTP
	// transports.
	Transport Transport
	AuthToken string
	// SessionIdle closes a streamable HTTP session idle this long, and
	// MaxSessions bounds how many are open: a new one past it closes the
	// least recently used.
	SessionIdle time.Duration
	MaxSessions int
	// Stateless serves streamable HTTP without sessions.
	Stateless bool

	// Version is the server's version, as the MCP handshake reports it.
	Version string
	// Audit, when not nil, gets one record per call.
	Audit *AuditLog
	// Logger receives the server's logs (metadata only), SDKLogger the
	// go-sdk's; nil discards.
	Logger, SDKLogger *slog.Logger
	// Metrics, when not nil, gets the server's collectors (metrics.go) and
	// is what /metrics serves; Tracer, when not nil, gets a span per call
	// (calls.go); Ready, when not nil, says whether the engine can run
	// calls, for GET /readyz.
	Metrics *prometheus.Registry
	Tracer  trace.Tracer
	Ready   func() error
}

// perClient is how many persistent sessions one client may hold.
func (o Options) perClient() int {
	if o.PersistentPerClient > 0 {
		return o.PersistentPerClient
	}
	return max(1, o.PersistentMax/2)
}

// Transport is how the server speaks MCP.
type Transport string

const (
	Stdio Transport = "stdio"
	HTTP  Transport = "http"
	SSE   Transport = "sse"
)

// ParseTransport parses a transport name as given in configuration.
func ParseTransport(s string) (Transport, error) {
	switch t := Transport(s); t {
	case Stdio, HTTP, SSE:
		return t, nil
	}
	return "", fmt.Errorf("must be one of stdio, http, sse, got %q", s)
}

// Validate reports every option that is out of range, naming its field
// as {Field}: the edge, which knows how each is set, names it so
// (docs/architecture.md).
func (o Options) Validate() error {
	var errs []error
	if o.DefaultTimeout <= 0 || o.MaxTimeout <= 0 {
		errs = append(errs, errors.New("{DefaultTimeout} and {MaxTimeout} must be > 0"))
	}
	if o.DefaultTimeout > o.MaxTimeout {
		errs = append(errs, fmt.Errorf("{DefaultTimeout} (%s) must not exceed {MaxTimeout} (%s)",
			fmtSeconds(o.DefaultTimeout), fmtSeconds(o.MaxTimeout)))
	}
	if err := o.CallCaps.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.MaxConcurrency < 1 {
		errs = append(errs, fmt.Errorf("{MaxConcurrency} must be ≥ 1, got %d", o.MaxConcurrency))
	}
	if o.MaxQueued < 0 {
		errs = append(errs, fmt.Errorf("{MaxQueued} must be ≥ 0, got %d", o.MaxQueued))
	}
	if o.Progress <= 0 {
		errs = append(errs, fmt.Errorf("{Progress} must be > 0, got %v", o.Progress))
	}
	if o.TextBytes != 0 && o.TextBytes < minTextBytes {
		errs = append(errs, fmt.Errorf("{TextBytes} must be ≥ %d, got %d", minTextBytes, o.TextBytes))
	}
	if o.ResourceMaxBytes < 0 || o.ResourceMaxBytes > 0 && o.ResourceTTL <= 0 {
		errs = append(errs, fmt.Errorf("{ResourceMaxBytes} must be ≥ 0 (0: no output files kept), and {ResourceTTL} > 0 while they are kept; got %d and %v", o.ResourceMaxBytes, o.ResourceTTL))
	}
	if o.PersistentMax < 0 {
		errs = append(errs, fmt.Errorf("{PersistentMax} must be ≥ 0, got %d", o.PersistentMax))
	}
	if o.PersistentMax > 0 && (o.PersistentIdle <= 0 || o.PersistentLifetime <= 0) {
		errs = append(errs, errors.New("{PersistentIdle} and {PersistentLifetime} must be > 0 while persistent sessions are on"))
	}
	if o.PersistentPerClient < 0 || (o.PersistentMax > 0 && o.PersistentPerClient > o.PersistentMax) {
		errs = append(errs, fmt.Errorf("{PersistentPerClient} must be ≥ 1 and ≤ {PersistentMax} (%d), got %d", o.PersistentMax, o.PersistentPerClient))
	}
	if o.Transport != Stdio {
		switch {
		case o.AuthToken == "":
			errs = append(errs, fmt.Errorf("{AuthToken} is required with {Transport}=%s: the server refuses to serve HTTP without a bearer token", o.Transport))
		case len(o.AuthToken) < minTokenLen:
			errs = append(errs, fmt.Errorf("{AuthToken} must be at least %d characters, got %d", minTokenLen, len(o.AuthToken)))
		}
		if o.SessionIdle <= 0 {
			errs = append(errs, fmt.Errorf("{SessionIdle} must be > 0, got %v", o.SessionIdle))
		}
		if o.MaxSessions < 1 {
			errs = append(errs, fmt.Errorf("{MaxSessions} must be ≥ 1, got %d", o.MaxSessions))
		}
	}
	if err := o.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// MemoryTarget is the soft memory limit the server's process should set
// for the Go runtime (debug.SetMemoryLimit) when the operator set none
// (GOMEMLIMIT): with it the collector works harder as the heap nears it,
// so that the bounded input the server holds (MaxConcurrency running and
// MaxQueued waiting calls, one body budget of requests being read, up to
// MaxSessions sessions, the resource store's ResourceMaxBytes) keeps the
// process well under 300 MB.
const MemoryTarget = 192 << 20

// minTokenLen keeps a guessable token from passing for protection.
const minTokenLen = 16

// Server runs exec calls: it validates input, bounds concurrency and the
// queue, keeps calls alive with progress and kills their sandboxes when
// their client goes. One Server backs every MCP session of the process.
type Server struct {
	eng  Engine
	info EngineInfo
	opts Options
	log  *slog.Logger
	sem  chan struct{}
	// waiting counts the calls waiting for a slot.
	waiting atomic.Int64

	mu      sync.Mutex
	root    context.Context // done: the server is shutting down
	closing bool
	active  sync.WaitGroup

	persist *sessions
	store   *resourceStore // nil: no output files kept
	ops     serverOps
}

// New returns a Server running calls on eng.
func New(eng Engine, opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.SDKLogger == nil {
		opts.SDKLogger = slog.New(slog.DiscardHandler)
	}
	s := &Server{eng: eng, info: eng.Info(), opts: opts, log: opts.Logger,
		sem: make(chan struct{}, opts.MaxConcurrency), root: context.Background()}
	s.persist = newSessions(s)
	s.store = newResourceStore(opts.ResourceMaxBytes, opts.ResourceTTL)
	s.ops.tracer = opts.Tracer
	if opts.Metrics != nil {
		var err error
		if s.ops.metrics, err = newMetrics(opts.Metrics, s); err != nil {
			return nil, fmt.Errorf("registering the server's metrics: %w", err)
		}
	}
	return s, nil
}

// serving marks the start of serving under ctx: its end kills every call.
func (s *Server) serving(ctx context.Context) {
	s.mu.Lock()
	s.root = ctx
	s.mu.Unlock()
}

// execInput is the exec tool's input. TimeoutS is a pointer so that an
// explicit 0 is told apart from "not given", and refused.
type execInput struct {
	Code       string      `json:"code"`
	Stdin      string      `json:"stdin,omitempty"`
	TimeoutS   *float64    `json:"timeout_s,omitempty"`
	Files      []inputFile `json:"files,omitempty"`
	Session    string      `json:"session,omitempty"`
	EndSession bool        `json:"end_session,omitempty"`
}

// execOutput is the call's structuredContent. The contract's fields are
// never renamed or removed; the rest are extras.
type execOutput struct {
	Stdout          string        `json:"stdout" jsonschema:"what the program wrote to stdout (invalid UTF-8 replaced by U+FFFD), at most the output cap"`
	Stderr          string        `json:"stderr" jsonschema:"what the program wrote to stderr (invalid UTF-8 replaced by U+FFFD), at most the output cap"`
	ExitCode        int           `json:"exit_code" jsonschema:"exit status; 128+N when killed by signal N"`
	Signal          string        `json:"signal" jsonschema:"the signal that killed the program (e.g. SIGSEGV, SIGKILL), then exit_code is 128 + its number; empty when it exited"`
	TimedOut        bool          `json:"timed_out" jsonschema:"the wall-clock limit was hit: a fresh call's sandbox was killed; in a persistent session the code was interrupted (KeyboardInterrupt) and, if it stopped, the session lives on (session_ended empty), else its sandbox was killed (session_ended timeout)"`
	OOMKilled       bool          `json:"oom_killed" jsonschema:"the memory limit killed a process"`
	PidsLimited     bool          `json:"pids_limited" jsonschema:"creating a process or thread failed at the process limit"`
	StdoutTruncated bool          `json:"stdout_truncated" jsonschema:"stdout went past its cap and was cut; the program was not blocked or killed for it"`
	StderrTruncated bool          `json:"stderr_truncated" jsonschema:"stderr went past its cap and was cut; the program was not blocked or killed for it"`
	Truncated       bool          `json:"truncated" jsonschema:"stdout_truncated or stderr_truncated"`
	StdoutBytes     int64         `json:"stdout_bytes" jsonschema:"bytes the program wrote to stdout, including any past the cap"`
	StderrBytes     int64         `json:"stderr_bytes" jsonschema:"bytes the program wrote to stderr, including any past the cap"`
	DurationMS      int64         `json:"duration_ms" jsonschema:"wall-clock time of the run in milliseconds"`
	CPUMS           int64         `json:"cpu_ms" jsonschema:"CPU time of all processes in milliseconds, as the host's cgroup accounts it; 0 when unknown"`
	PeakMemoryBytes int64         `json:"peak_memory_bytes" jsonschema:"highest memory use of the container, 0 when unknown"`
	Runtime         string        `json:"runtime" jsonschema:"the runtime that ran the code: libcontainer, runsc or process"`
	Files           []outputFile  `json:"files" jsonschema:"the regular files the code left under /tmp/outputs, each also a content block: inline when small, else a resource_link to its uri"`
	FilesTruncated  bool          `json:"files_truncated" jsonschema:"a file under /tmp/outputs was left out for the file count or size limit"`
	FilesLeftOut    []leftOutFile `json:"files_left_out" jsonschema:"what was left out of /tmp/outputs (the first 64), each with its size and why"`
	Result          string        `json:"result" jsonschema:"the repr of the value of the code's last statement when that is an expression and the value is not None, else empty; at most the output cap"`
	ResultTruncated bool          `json:"result_truncated" jsonschema:"result went past the output cap and was cut"`
	Session         string        `json:"session" jsonschema:"the persistent session's handle when the call ran in one, else empty"`
	SessionEnded    string        `json:"session_ended" jsonschema:"empty while the session lives on, else why it is gone: closed, timeout, oom, exited, idle, lifetime or shutdown"`
}

// origin is what carried a call: Done of ctx means its client is gone (nil:
// only the SDK's own cancellation applies), client names it in the audit
// log, and owner is the client its persistent sessions count against
// (PersistentPerClient): "" where no client is known (stateless HTTP).
type origin struct {
	ctx    context.Context
	client string
	owner  string
}

// mcpServer returns an MCP server with the exec tool. originOf tells each
// call's handler what carried it.
func (s *Server) mcpServer(originOf func(*mcp.CallToolRequest) origin) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "mcp-exec", Title: "mcp-exec", Version: s.opts.Version, Icons: icons()}, &mcp.ServerOptions{
		Logger: s.opts.SDKLogger,
		// The tool list never changes, so there is nothing to notify; nor
		// is a client told of its resources coming and going.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Logging: &mcp.LoggingCapabilities{},
			Resources: &mcp.ResourceCapabilities{}},
	})
	tool := s.tool()
	srv.AddReceivingMiddleware(checkArguments(schemaProperties(tool.InputSchema)), s.listResources)
	mcp.AddTool(srv, tool, s.handler(originOf))
	srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: resourceTemplate, Name: "output file",
		Description: "a file an exec call left in /tmp/outputs, kept for a while for the client that made the call"}, s.readResource)
	return srv
}

func (s *Server) tool() *mcp.Tool {
	f := false
	return &mcp.Tool{
		Name:        "exec",
		Title:       "Run Python in a sandbox",
		Icons:       icons(),
		Description: s.description(),
		// Written out rather than inferred: the SDK would make the optional
		// timeout_s ["null","number"], and the ranges are checked by the
		// handler so that its errors name the limit and its variable.
		// code is not required by the schema: end_session needs none, and
		// the handler's refusal of a call without it says so.
		InputSchema: map[string]any{
			"type":                 "object",
			"additionalProperties": false,
			"properties": map[string]any{
				"code": map[string]any{
					"type":        "string",
					"description": fmt.Sprintf("Python source, run as a script (__main__); at most %d bytes. Print what you want to see. Required, unless end_session ends a session.", s.opts.MaxCodeBytes),
				},
				"stdin": map[string]any{
					"type":        "string",
					"description": fmt.Sprintf("fed to the program's standard input, then EOF; at most %d bytes", s.opts.MaxStdinBytes),
				},
				"timeout_s": map[string]any{
					"type": "number",
					"description": fmt.Sprintf("wall-clock limit in seconds, > 0 and ≤ %s; default %s",
						fmtSeconds(s.opts.MaxTimeout), fmtSeconds(s.opts.DefaultTimeout)),
				},
				"files": filesSchema(s.opts),
				"session": map[string]any{
					"type":        "string",
					"description": `persistent session: "new" starts one and runs the code in it; the session handle of an earlier result runs the code there, with the variables, imports, working directory and /tmp the last call left. Omit for a fresh sandbox.`,
				},
				"end_session": map[string]any{
					"type":        "boolean",
					"description": "end the persistent session after this call (code may then be empty)",
				},
			},
		},
		Annotations: &mcp.ToolAnnotations{
			ReadOnlyHint:    false,
			DestructiveHint: &f, // each call gets a fresh container; nothing outside it changes
			IdempotentHint:  false,
			OpenWorldHint:   &f, // no network
		},
	}
}

// description tells the model what it is dealing with, from the live
// configuration.
func (s *Server) description() string {
	o, info := s.opts, s.info
	var b strings.Builder
	if o.PersistentMax > 0 {
		fmt.Fprintf(&b, "Run Python %s code in a fresh, locked-down sandbox: every call gets a new one, torn down afterwards, so nothing persists between calls unless they share a persistent session (below). ", info.PythonVersion)
	} else {
		fmt.Fprintf(&b, "Run Python %s code in a fresh, locked-down sandbox: every call gets a new one, torn down afterwards, so nothing persists between calls. ", info.PythonVersion)
	}
	b.WriteString("The code runs as a script (__main__) and its stdout, stderr and exit code are returned; print what you want to see. ")
	// The process runtime's call has no /tmp of its own: its working
	// directory is, and the model must write there by relative paths.
	process := info.Runtime == string(runtime.Process)
	dir, outputs := policy.WorkDir, policy.OutputsDir
	if process {
		dir, outputs = "the working directory", "outputs/ in the working directory"
		fmt.Fprintf(&b, "There is no network access. The code may write only in its working directory, its own /tmp (also $TMPDIR and $HOME, %d MiB in all): use relative paths; the machine's /tmp and everything else are read-only. ", o.Limits.TmpfsBytes/mib)
	} else {
		fmt.Fprintf(&b, "There is no network access. The filesystem is read-only except /tmp (the working directory, a %d MiB tmpfs). ", o.Limits.TmpfsBytes/mib)
	}
	if len(info.Modules) == 0 {
		b.WriteString("Only the Python standard library is available. ")
	} else {
		fmt.Fprintf(&b, "Importable beyond the standard library: %s. ", strings.Join(info.Modules, ", "))
	}
	if info.Shell {
		b.WriteString("A POSIX shell (/bin/sh) and the common command-line tools exist, so os.system and subprocess with shell=True work. ")
	} else {
		b.WriteString("There is no shell: run programs with subprocess and an argument list. ")
	}
	fmt.Fprintf(&b, "To hand the code data, send files (written under %s before it starts); to get files back, have the code write them to %s: "+
		"each comes back as an image or a resource (at most %d files, %d bytes in all). ", dir, outputs, o.MaxFiles, o.MaxFileBytes)
	if slices.Contains(info.Modules, "matplotlib") {
		fmt.Fprintf(&b, "plt.show() saves each figure as a PNG in %s, so a plot comes back as an image. ", outputs)
	}
	fmt.Fprintf(&b, "Limits per call: %d MiB of memory, %d processes/threads, %s CPU; a wall-clock timeout of %s s by default, up to %s s with timeout_s; stdout and stderr are each cut at %d bytes; stdin up to %d bytes. ",
		o.Limits.MemoryBytes/mib, o.Limits.Pids, strconv.FormatFloat(o.Limits.CPUs, 'f', -1, 64),
		fmtSeconds(o.DefaultTimeout), fmtSeconds(o.MaxTimeout), o.MaxOutputBytes, o.MaxStdinBytes)
	b.WriteString("If the code ends with an expression, its repr comes back as result, as in a notebook. ")
	fmt.Fprintf(&b, "The text shows at most %d bytes of output (the head and tail of each part; structuredContent has all of it)", o.textBytes())
	if s.store != nil {
		b.WriteString("; files too large to inline come as resource links: read one with resources/read, or pass its uri in files to a later call")
	}
	b.WriteString(". ")
	b.WriteString("A non-zero exit, a timeout or hitting the memory limit is a normal result (exit_code, timed_out, oom_killed), not an error.")
	if o.PersistentMax > 0 {
		fmt.Fprintf(&b, " To keep state between calls (load data once, then explore it), start a persistent session with session \"new\" and pass the returned session handle in later calls: they run one at a time in the same interpreter, like notebook cells; end_session: true ends it. "+
			"A session has the same limits, its own sandbox, and ends after %s s without a call, %s s in all, on a timeout the code does not stop for (it gets KeyboardInterrupt first), on sys.exit() or at the memory limit; at most %d are open, %d per client.",
			fmtSeconds(o.PersistentIdle), fmtSeconds(o.PersistentLifetime), o.PersistentMax, o.perClient())
		if !o.PersistentBackground {
			b.WriteString(" Between calls a session is paused: threads and processes the code started run only while a call runs.")
		}
	}
	if info.Note != "" {
		b.WriteString(" " + info.Note)
	}
	return b.String()
}

// ceilMS rounds up to whole milliseconds: a run of 0.4 ms took time, and
// says so, rather than reading as none at all.
func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// iconSVG is the server's and the tool's icon (a copy of deploy/icon.svg,
// which the MCP registry's server.json names).
//
//go:embed icon.svg
var iconSVG []byte

func icons() []mcp.Icon {
	return []mcp.Icon{{Source: "data:image/svg+xml;base64," + base64.StdEncoding.EncodeToString(iconSVG),
		MIMEType: "image/svg+xml", Sizes: []string{"any"}}}
}

// inputError is invalid input: the caller's to fix, its message names the
// field and the limit.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }

// errBusy refuses a call when MaxQueued others already wait for a slot.
var errBusy = errors.New("server busy")

// RefusedError is an Engine's refusal of a call for a reason of the
// server's that the caller is told as it is (its text names no host
// path): the rootfs changed under the server, say.
type RefusedError struct{ Reason string }

func (e *RefusedError) Error() string { return e.Reason }

// handler is the exec tool. Invalid input and a sandbox that could not run
// are tool errors (isError); whatever the code did is a result.
func (s *Server) handler(originOf func(*mcp.CallToolRequest) origin) mcp.ToolHandlerFor[execInput, execOutput] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in execInput) (*mcp.CallToolResult, execOutput, error) {
		o := originOf(req)
		rec := s.newRecord(o.client, in)
		ctx, c := s.beginCall(ctx, req, rec)
		root, ok := s.enter()
		if !ok {
			rec.Error = "server shutting down"
			rec.Verdict = s.endCall(ctx, c, rec, runtime.Result{}, errShuttingDown)
			s.opts.Audit.write(rec)
			return nil, execOutput{}, errShuttingDown
		}
		defer s.active.Done()

		// The SDK cancels ctx on notifications/cancelled and when a stdio
		// client goes; a shutdown or a vanished HTTP client must kill the
		// container too.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(root, cancel)()
		if o.ctx != nil {
			defer context.AfterFunc(o.ctx, cancel)()
		}

		res, timeout, so, err := s.exec(ctx, req, in, o)
		rec.setResult(res, timeout, err)
		if so.handle != "" {
			rec.Session, rec.SessionEnded = sessionID(so.handle), so.ended
		}
		rec.Verdict = s.endCall(ctx, c, rec, res, err)
		s.opts.Audit.write(rec)

		var inErr *inputError
		var refused *RefusedError
		switch {
		case errors.As(err, &inErr):
			return nil, execOutput{}, inErr
		case errors.As(err, &refused):
			return nil, execOutput{}, refused
		case errors.Is(err, errBusy):
			return nil, execOutput{}, err
		case err != nil && ctx.Err() != nil:
			// Cancelled: nobody is waiting for an answer.
			return nil, execOutput{}, fmt.Errorf("call cancelled: %w", context.Cause(ctx))
		case errors.Is(err, runtime.ErrSandbox):
			// The details are host paths and runtime internals: the
			// operator's, not the client's (endCall logged them).
			return nil, execOutput{}, fmt.Errorf("the sandbox could not run this call, a problem of the server rather than of the code; the server log has the details under call %s", rec.CallID)
		}
		// Any other error came after the code ran, tearing down: its
		// verdict stands, and endCall logged the error for the operator.
		out := outputOf(res, s.info.Runtime)
		out.Session, out.SessionEnded = so.handle, so.ended
		files, shown := s.fileBlocks(res.Files, &out, s.scopeOf(req.Session))
		text := s.summary(callText{out: out, timeout: timeout, shown: shown})
		return &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: text}}, files...)}, out, nil
	}
}

// sessionOut is what a call says of its persistent session.
type sessionOut struct{ handle, ended string }

// exec validates the input, waits for a free slot and runs the code: in a
// fresh sandbox, or in the persistent session the input names.
func (s *Server) exec(ctx context.Context, req *mcp.CallToolRequest, in execInput, o origin) (runtime.Result, time.Duration, sessionOut, error) {
	if err := badArguments(ctx); err != nil {
		return runtime.Result{}, 0, sessionOut{}, err
	}
	if in.Session != "" || in.EndSession {
		return s.execInSession(ctx, req, in, o)
	}
	timeout, files, err := s.validateCall(in, s.scopeOf(req.Session))
	if err != nil {
		return runtime.Result{}, 0, sessionOut{}, err
	}
	var stage atomic.Int32 // waitingSlot
	live := s.live(req)
	defer s.progress(ctx, req, &stage, live)()

	if err := s.acquire(ctx); err != nil {
		return runtime.Result{}, timeout, sessionOut{}, err
	}
	defer func() { <-s.sem }()
	stage.Store(running)
	res, err := s.eng.Run(ctx, s.request(ctx, in, files, timeout, live))
	return res, timeout, sessionOut{}, err
}

// validateCall checks the code, stdin, timeout and files of a call; scope
// is the client whose output files files[].uri may name.
func (s *Server) validateCall(in execInput, scope *mcp.ServerSession) (time.Duration, []runtime.File, error) {
	timeout, err := s.validate(in)
	if err != nil {
		return 0, nil, &inputError{err}
	}
	files, err := s.validateFiles(in.Files, scope)
	if err != nil {
		return 0, nil, &inputError{err}
	}
	return timeout, files, nil
}

func (s *Server) request(ctx context.Context, in execInput, files []runtime.File, timeout time.Duration, live *runtime.Live) runtime.Request {
	return runtime.Request{
		Phases:         callOf(ctx).phases(ctx),
		Code:           []byte(in.Code),
		Stdin:          []byte(in.Stdin),
		Files:          files,
		Timeout:        timeout,
		MaxOutputBytes: s.opts.MaxOutputBytes,
		Live:           live,
	}
}

// live is where a call's output is shown as it comes, when its client
// asked for progress.
func (s *Server) live(req *mcp.CallToolRequest) *runtime.Live {
	if req.Params.GetProgressToken() == nil || req.Session == nil {
		return nil
	}
	return &runtime.Live{}
}

// execInSession runs a call in a persistent session: a new one, or the
// one its handle names, after that session's earlier calls.
func (s *Server) execInSession(ctx context.Context, req *mcp.CallToolRequest, in execInput, o origin) (runtime.Result, time.Duration, sessionOut, error) {
	var none sessionOut
	fail := func(err error) (runtime.Result, time.Duration, sessionOut, error) {
		return runtime.Result{}, 0, none, &inputError{err}
	}
	switch {
	case in.Session == "":
		return fail(errors.New(`end_session needs session: the handle of the persistent session to end`))
	case s.opts.PersistentMax == 0:
		return fail(errors.New("session: persistent sessions are off on this server (MCP_EXEC_PERSISTENT_MAX=0); call without session for a fresh sandbox"))
	}
	endOnly := in.EndSession && in.Code == ""
	if endOnly && in.Session == "new" {
		return fail(errors.New(`end_session with session "new" and no code: there is no session to end`))
	}
	var (
		timeout time.Duration
		files   []runtime.File
		err     error
	)
	if !endOnly {
		if timeout, files, err = s.validateCall(in, s.scopeOf(req.Session)); err != nil {
			return runtime.Result{}, 0, none, err
		}
	}
	var stage atomic.Int32
	stage.Store(waitingTurn)
	live := s.live(req)
	defer s.progress(ctx, req, &stage, live)()
	var h *held
	if in.Session == "new" {
		if err := s.persist.reserve(o.owner); err != nil {
			return fail(err)
		}
	} else {
		if h, err = s.persist.lookup(in.Session); err != nil {
			return fail(err)
		}
		if err := s.persist.turn(ctx, h); err != nil {
			if errors.Is(err, errBusy) || ctx.Err() != nil {
				return runtime.Result{}, timeout, none, err
			}
			return fail(err)
		}
		if endOnly {
			s.persist.release(h, endClosed)
			return runtime.Result{}, 0, sessionOut{h.handle, endClosed}, nil
		}
	}
	stage.Store(waitingSlot)

	if err := s.acquire(ctx); err != nil {
		if h == nil {
			s.persist.unreserve(o.owner)
		} else {
			s.persist.release(h, "")
		}
		return runtime.Result{}, timeout, none, err
	}
	defer func() { <-s.sem }()
	stage.Store(running)
	if h == nil {
		sess, err := s.eng.NewSession(ctx)
		if err != nil {
			s.persist.unreserve(o.owner)
			return runtime.Result{}, timeout, none, err
		}
		if h, err = s.persist.open(sess, o.client, o.owner); err != nil {
			return runtime.Result{}, timeout, none, err
		}
	}
	res, err := h.sess.Run(ctx, s.request(ctx, in, files, timeout, live))
	ended := string(res.Ended)
	var gone *runtime.EndedError
	switch {
	case errors.As(err, &gone):
		ended = string(gone.Reason)
		err = &inputError{fmt.Errorf("session: that persistent session has ended (%s); start another with session \"new\"", describeEnd(ended, s.opts))}
	case errors.Is(err, runtime.ErrSandbox) && ended == "":
		// The sandbox could not run the call: the session goes with it.
		ended = string(runtime.EndExited)
	case ended == "" && in.EndSession:
		ended = endClosed
	}
	s.persist.release(h, ended)
	return res, timeout, sessionOut{h.handle, ended}, err
}

// acquire takes a slot, waiting for one when MaxQueued others do not wait
// already.
func (s *Server) acquire(ctx context.Context) error {
	defer callOf(ctx).waited(ctx, time.Now())
	select {
	case s.sem <- struct{}{}:
		return nil
	default:
	}
	if n := s.waiting.Add(1); n > int64(s.opts.MaxQueued) {
		s.waiting.Add(-1)
		return fmt.Errorf("%w: %d calls are running and %d are waiting for a slot, the most allowed (MCP_EXEC_MAX_CONCURRENCY=%d, MCP_EXEC_MAX_QUEUED=%d); try again later",
			errBusy, s.opts.MaxConcurrency, s.opts.MaxQueued, s.opts.MaxConcurrency, s.opts.MaxQueued)
	}
	defer s.waiting.Add(-1)
	select {
	case s.sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// validate checks the input against the configured limits; every message
// names the field and the limit.
func (s *Server) validate(in execInput) (time.Duration, error) {
	if in.Code == "" {
		return 0, errors.New("code is required and must be non-empty (only end_session with a session handle needs none)")
	}
	if n := int64(len(in.Code)); n > s.opts.MaxCodeBytes {
		return 0, fmt.Errorf("code is %d bytes, over the limit of %d (MCP_EXEC_MAX_CODE_BYTES)", n, s.opts.MaxCodeBytes)
	}
	if i := strings.IndexByte(in.Code, 0); i >= 0 {
		// The interpreter stops reading a script at a NUL byte and runs
		// what came before: refuse rather than run half of the code.
		return 0, fmt.Errorf("code contains a NUL byte at offset %d; Python would silently stop reading there", i)
	}
	if n := int64(len(in.Stdin)); n > s.opts.MaxStdinBytes {
		return 0, fmt.Errorf("stdin is %d bytes, over the limit of %d (MCP_EXEC_MAX_STDIN_BYTES)", n, s.opts.MaxStdinBytes)
	}
	if in.TimeoutS == nil {
		return s.opts.DefaultTimeout, nil
	}
	f := *in.TimeoutS
	d := time.Duration(f * float64(time.Second))
	if !(f > 0) || d <= 0 || f > s.opts.MaxTimeout.Seconds() {
		return 0, fmt.Errorf("timeout_s must be > 0 and ≤ %s (MCP_EXEC_MAX_TIMEOUT_S), got %s",
			fmtSeconds(s.opts.MaxTimeout), strconv.FormatFloat(f, 'g', -1, 64))
	}
	return d, nil
}

// progress sends notifications/progress every Progress while the call
// waits or runs, when the client asked for them with a progress token, so
// that clients with a request timeout survive long runs. The returned stop
// waits for the sender, so no notification follows the result.
// A call's stage, as its progress messages say it.
const (
	waitingSlot int32 = iota // for a concurrency slot
	waitingTurn              // for its persistent session's earlier calls
	running
)

func (s *Server) progress(ctx context.Context, req *mcp.CallToolRequest, stage *atomic.Int32, live *runtime.Live) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(s.opts.Progress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			elapsed := time.Since(start)
			var msg string
			switch stage.Load() {
			case waitingSlot:
				msg = fmt.Sprintf("waiting for a free slot (%d running at most) for %s", s.opts.MaxConcurrency, elapsed.Round(time.Second))
			case waitingTurn:
				msg = fmt.Sprintf("waiting for the persistent session's earlier calls for %s", elapsed.Round(time.Second))
			default:
				msg = fmt.Sprintf("running for %s", elapsed.Round(time.Second))
				if newest := newestOutput(live); newest != "" {
					msg += "; " + newest
				}
			}
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token,
				Progress:      elapsed.Seconds(), // elapsed time only grows, as progress must
				Message:       msg,
			})
			if err != nil {
				s.log.Debug("sending progress", "err", err)
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// newestOutput is the last lines of a running call's newest output, for
// a progress message: "stdout: …", or "" before any.
func newestOutput(live *runtime.Live) string {
	if live == nil {
		return ""
	}
	stream, tail, seq := live.Last()
	if seq == 0 {
		return ""
	}
	// Whole lines where the tail was cut; whole characters in any case.
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i < len(tail)-1 && len(tail) >= 300 {
		tail = tail[i+1:]
	}
	text := strings.TrimRight(strings.ToValidUTF8(string(tail), ""), "\n")
	return stream + ": " + text
}

// enter registers a call and returns the context whose end kills it,
// unless the server is shutting down.
func (s *Server) enter() (context.Context, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, false
	}
	s.active.Add(1)
	return s.root, true
}

// drain refuses new calls and waits for the running ones, whose contexts
// the shutdown has cancelled, to finish tearing down.
func (s *Server) drain() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.active.Wait()
	s.persist.closeAll()
}

func (s *Server) newRecord(client string, in execInput) auditRecord {
	sum := sha256.Sum256([]byte(in.Code))
	l := s.opts.Limits
	return auditRecord{
		Time:       time.Now().UTC(),
		CallID:     uuid.NewString(),
		Client:     client,
		CodeSHA256: hex.EncodeToString(sum[:]),
		CodeBytes:  len(in.Code),
		StdinBytes: len(in.Stdin),
		Runtime:    s.info.Runtime,
		Limits: auditLimits{
			MemoryBytes:    l.MemoryBytes,
			Pids:           l.Pids,
			CPUs:           l.CPUs,
			TmpfsBytes:     l.TmpfsBytes,
			MaxOutputBytes: s.opts.MaxOutputBytes,
		},
	}
}

func outputOf(res runtime.Result, runtimeName string) execOutput {
	files := make([]outputFile, len(res.Files))
	for i, f := range res.Files {
		files[i] = outputFile{Path: f.Path, Size: int64(len(f.Data)), MIMEType: mimeType(f.Path, f.Data)}
	}
	left := make([]leftOutFile, len(res.FilesLeftOut))
	for i, l := range res.FilesLeftOut {
		left[i] = leftOutFile{Path: l.Path, Size: l.Size, Why: string(l.Why)}
	}
	return execOutput{
		Files:           files,
		FilesTruncated:  res.FilesTruncated,
		FilesLeftOut:    left,
		Signal:          signalName(res.Signal),
		StdoutBytes:     max(res.StdoutBytes, int64(len(res.Stdout))),
		StderrBytes:     max(res.StderrBytes, int64(len(res.Stderr))),
		Stdout:          strings.ToValidUTF8(string(res.Stdout), "\uFFFD"),
		Stderr:          strings.ToValidUTF8(string(res.Stderr), "\uFFFD"),
		ExitCode:        res.ExitCode,
		TimedOut:        res.TimedOut,
		OOMKilled:       res.OOMKilled,
		PidsLimited:     res.PidsLimitHit,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Truncated:       res.StdoutTruncated || res.StderrTruncated,
		DurationMS:      ceilMS(res.Duration),
		Result:          strings.ToValidUTF8(string(res.Value), "\uFFFD"),
		ResultTruncated: res.ValueTruncated,
		CPUMS:           res.CPUTime.Milliseconds(),
		PeakMemoryBytes: res.PeakMemoryBytes,
		Runtime:         runtimeName,
	}
}

func fmtSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}
