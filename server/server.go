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
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

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
	// MoreModules counts the importable modules that Modules leaves out:
	// the process runtime lists the batteries of the host's Python, and
	// counts the rest of its site-packages.
	MoreModules int
	// Shell: /bin/sh and the common command-line tools exist.
	Shell bool
	// Note is a sentence the description adds, e.g. what isolation a
	// weaker runtime gives.
	Note string
	// Network, with the network allowlist on, says what the code can
	// reach and how (pip included); empty: no network at all.
	Network string
	// Data, when not nil, is the operator's data every sandbox has,
	// read-only.
	Data *DataInfo
}

// DataInfo is what the operator's data dir holds, as the server started.
type DataInfo struct {
	// Path is where the sandbox has it.
	Path string
	// Files and Bytes count its regular files and their bytes; Partial:
	// the count stopped at its bound, and there are more.
	Files   int
	Bytes   int64
	Partial bool
}

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
	Code      string   `json:"code"`
	Stdin     string   `json:"stdin,omitempty"`
	TimeoutS  *float64 `json:"timeout_s,omitempty"`
	CPULimitS *float64 `json:"cpu_limit_s,omitempty"`
	// BinaryOutput asks for the streams' bytes as they are, in base64,
	// beside their text.
	BinaryOutput bool        `json:"binary_output,omitempty"`
	Files        []inputFile `json:"files,omitempty"`
	Session      string      `json:"session,omitempty"`
	EndSession   bool        `json:"end_session,omitempty"`
}

// execOutput is the call's structuredContent. The contract's fields are
// never renamed or removed; the rest are extras.
type execOutput struct {
	Stdout          string             `json:"stdout" jsonschema:"what the program wrote to stdout (each byte of invalid UTF-8 replaced by one U+FFFD), at most the output cap: past it, its first and last parts with a line between saying how many bytes were left out"`
	Stderr          string             `json:"stderr" jsonschema:"what the program wrote to stderr (each byte of invalid UTF-8 replaced by one U+FFFD), at most the output cap: past it, its first and last parts with a line between saying how many bytes were left out"`
	StdoutBase64    string             `json:"stdout_base64,omitempty" jsonschema:"with binary_output: stdout's bytes as they are (the same parts as stdout), base64-encoded"`
	StderrBase64    string             `json:"stderr_base64,omitempty" jsonschema:"with binary_output: stderr's bytes as they are (the same parts as stderr), base64-encoded"`
	ExitCode        int                `json:"exit_code" jsonschema:"exit status; 128+N when killed by signal N"`
	Signal          string             `json:"signal" jsonschema:"the signal that killed the program (e.g. SIGSEGV, SIGKILL), then exit_code is 128 + its number; empty when it exited"`
	TimedOut        bool               `json:"timed_out" jsonschema:"the wall-clock limit was hit: a fresh call's sandbox was killed; in a persistent session the code was interrupted (KeyboardInterrupt) and, if it stopped, the session lives on (session_ended empty), else its sandbox was killed (session_ended timeout)"`
	CPULimited      bool               `json:"cpu_limited" jsonschema:"the CPU time limit (cpu_limit_s) ended the run: a fresh call's sandbox was killed; a persistent session's code was interrupted (KeyboardInterrupt) and, if it stopped, the session lives on"`
	OOMKilled       bool               `json:"oom_killed" jsonschema:"the memory limit killed a process (in the process runtime: its limit refused an allocation and the MemoryError ended the code)"`
	PidsLimited     bool               `json:"pids_limited" jsonschema:"creating a process or thread failed at the process limit"`
	StdoutTruncated bool               `json:"stdout_truncated" jsonschema:"stdout went past its cap and was cut; the program was not blocked or killed for it"`
	StderrTruncated bool               `json:"stderr_truncated" jsonschema:"stderr went past its cap and was cut; the program was not blocked or killed for it"`
	Truncated       bool               `json:"truncated" jsonschema:"stdout_truncated or stderr_truncated"`
	StdoutBytes     int64              `json:"stdout_bytes" jsonschema:"bytes the program wrote to stdout, including any past the cap"`
	StderrBytes     int64              `json:"stderr_bytes" jsonschema:"bytes the program wrote to stderr, including any past the cap"`
	DurationMS      int64              `json:"duration_ms" jsonschema:"wall-clock time of the run in milliseconds"`
	CPUMS           int64              `json:"cpu_ms" jsonschema:"CPU time of all processes in milliseconds, as the host's kernel accounts it (the sandbox's cgroup; in the process runtime, the call's processes, to 10 ms); 0 when unknown"`
	PeakMemoryBytes int64              `json:"peak_memory_bytes" jsonschema:"highest memory use of the container (in the process runtime, the peak resident memory of its largest single process, approximate), 0 when unknown"`
	Runtime         string             `json:"runtime" jsonschema:"the runtime that ran the code: libcontainer, runsc or process"`
	Files           []outputFile       `json:"files" jsonschema:"the regular files the code left under /tmp/outputs, each also a content block: inline when small, else a resource_link to its uri"`
	FilesTruncated  bool               `json:"files_truncated" jsonschema:"a file under /tmp/outputs was left out for the file count or size limit"`
	FilesLeftOut    []leftOutFile      `json:"files_left_out" jsonschema:"what was left out of /tmp/outputs (the first 64), each with its size and why"`
	Result          string             `json:"result" jsonschema:"the repr of the value of the code's last statement when that is an expression and the value is not None, else empty; at most the output cap"`
	ResultTruncated bool               `json:"result_truncated" jsonschema:"result went past the output cap and was cut"`
	Session         string             `json:"session" jsonschema:"the persistent session's handle when the call ran in one, else empty"`
	SessionEnded    runtime.SessionEnd `json:"session_ended" jsonschema:"empty while the session lives on, else why it is gone: closed, timeout, cpu_limit, oom, exited, idle, lifetime or shutdown"`
	Egress          []egressDest       `json:"egress" jsonschema:"each host:port the code asked the network proxy for (with the network allowlist on; else empty), in the order first asked: bytes each way, and whether it was allowed"`
}

// egressDest is one destination of a call's network.
type egressDest struct {
	Host     string `json:"host" jsonschema:"the host as the code named it"`
	Port     int    `json:"port" jsonschema:"the port"`
	BytesOut int64  `json:"bytes_out" jsonschema:"bytes sent to the host (TLS included)"`
	BytesIn  int64  `json:"bytes_in" jsonschema:"bytes received from the host (TLS included)"`
	Allowed  bool   `json:"allowed" jsonschema:"the proxy let the code reach it"`
	Refused  string `json:"refused,omitempty" jsonschema:"why the proxy refused it, when not allowed"`
}

// origin is what carried a call: Done of ctx means its client is gone (nil:
// only the SDK's own cancellation applies), client names it in the audit
// log.
type origin struct {
	ctx    context.Context
	client string
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
		// A client's output files are its own: no intermediary may keep
		// one to serve another (the default scope is public).
		SetCacheable: func(_ context.Context, _ mcp.Request, c *mcp.Cacheable) { c.CacheScope = "private" },
	})
	tool := s.tool()
	srv.AddReceivingMiddleware(checkArguments(schemaProperties(tool.InputSchema)), s.listResources)
	mcp.AddTool(srv, tool, s.handler(originOf))
	srv.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: resourceTemplate, Name: "output file",
		Description: "a file an exec call left in /tmp/outputs, kept for a while for the client that made the call"}, s.readResource)
	return srv
}

// iconSVG is the server's and the tool's icon (a copy of deploy/icon.svg,
// which the MCP registry's server.json names).
//
//go:embed icon.svg
var iconSVG []byte

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
			rec.Session, rec.SessionEnded, rec.SessionEndDetail = sessionID(so.handle), so.ended, so.detail
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
		out := outputOf(res, s.info.Runtime, in.BinaryOutput)
		out.Session, out.SessionEnded = so.handle, so.ended
		files, shown := s.fileBlocks(res.Files, &out, s.scopeOf(req.Session))
		text := s.summary(callText{out: out, timeout: timeout, cpuLimit: s.cpuLimit(in), shown: shown, endDetail: so.detail, memoryRefused: res.MemoryRefused})
		return &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: text}}, files...)}, out, nil
	}
}

// sessionOut is what a call says of its persistent session: its handle,
// why it ended, and what ended it when that alone would mislead.
type sessionOut struct {
	handle string
	ended  runtime.SessionEnd
	detail string
}

// exec validates the input, waits for a free slot and runs the code: in a
// fresh sandbox, or in the persistent session the input names.
func (s *Server) exec(ctx context.Context, req *mcp.CallToolRequest, in execInput, o origin) (runtime.Result, time.Duration, sessionOut, error) {
	if err := badArguments(ctx); err != nil {
		return runtime.Result{}, 0, sessionOut{}, err
	}
	if in.Session != "" || in.EndSession {
		return s.persist.call(ctx, req, in, o)
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
		CPULimit:       s.cpuLimit(in),
		MaxOutputBytes: s.opts.MaxOutputBytes,
		Live:           live,
	}
}

// cpuLimit is the call's CPU time limit, 0 for none: the input's, which
// validate checked.
func (s *Server) cpuLimit(in execInput) time.Duration {
	if in.CPULimitS == nil {
		return 0
	}
	return time.Duration(*in.CPULimitS * float64(time.Second))
}

// live is where a call's output is shown as it comes, when its client
// asked for progress.
func (s *Server) live(req *mcp.CallToolRequest) *runtime.Live {
	if req.Params.GetProgressToken() == nil || req.Session == nil {
		return nil
	}
	return &runtime.Live{}
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
	if f := in.CPULimitS; f != nil {
		if d := time.Duration(*f * float64(time.Second)); !(*f > 0) || d <= 0 || *f > s.opts.maxCPU().Seconds() {
			return 0, fmt.Errorf("cpu_limit_s must be > 0 and ≤ %s (MCP_EXEC_MAX_CPU_S), got %s",
				fmtSeconds(s.opts.maxCPU()), strconv.FormatFloat(*f, 'g', -1, 64))
		}
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

func outputOf(res runtime.Result, runtimeName string, binary bool) execOutput {
	files := make([]outputFile, len(res.Files))
	for i, f := range res.Files {
		files[i] = outputFile{Path: f.Path, Size: int64(len(f.Data)), MIMEType: mimeType(f.Path, f.Data)}
	}
	left := make([]leftOutFile, len(res.FilesLeftOut))
	for i, l := range res.FilesLeftOut {
		left[i] = leftOutFile{Path: validText([]byte(l.Path)), Size: l.Size, Why: string(l.Why)}
	}
	var stdout64, stderr64 string
	if binary {
		stdout64, stderr64 = base64.StdEncoding.EncodeToString(res.Stdout), base64.StdEncoding.EncodeToString(res.Stderr)
	}
	egress := make([]egressDest, len(res.Egress))
	for i, d := range res.Egress {
		egress[i] = egressDest{Host: d.Host, Port: d.Port, BytesOut: d.BytesOut, BytesIn: d.BytesIn, Allowed: d.Allowed, Refused: d.Refused}
	}
	return execOutput{
		Egress:          egress,
		StdoutBase64:    stdout64,
		StderrBase64:    stderr64,
		CPULimited:      res.CPULimited,
		Files:           files,
		FilesTruncated:  res.FilesTruncated,
		FilesLeftOut:    left,
		Signal:          signalName(res.Signal),
		StdoutBytes:     max(res.StdoutBytes, int64(len(res.Stdout))),
		StderrBytes:     max(res.StderrBytes, int64(len(res.Stderr))),
		Stdout:          validText(res.Stdout),
		Stderr:          validText(res.Stderr),
		ExitCode:        res.ExitCode,
		TimedOut:        res.TimedOut,
		OOMKilled:       res.OOMKilled,
		PidsLimited:     res.PidsLimitHit,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Truncated:       res.StdoutTruncated || res.StderrTruncated,
		DurationMS:      ceilMS(res.Duration),
		Result:          validText(res.Value),
		ResultTruncated: res.ValueTruncated,
		CPUMS:           res.CPUTime.Milliseconds(),
		PeakMemoryBytes: res.PeakMemoryBytes,
		Runtime:         runtimeName,
	}
}

// validText is b as valid UTF-8, each byte that is not part of a valid
// character replaced by one U+FFFD (as a decoder that reads byte by
// byte would): a run of bad bytes keeps its length, and a count of them
// holds. (strings.ToValidUTF8 makes one U+FFFD of a whole run.)
func validText(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.Grow(len(b) + len(b)/2)
	for len(b) > 0 {
		r, n := utf8.DecodeRune(b)
		if r == utf8.RuneError && n == 1 {
			sb.WriteString("\uFFFD")
		} else {
			sb.Write(b[:n])
		}
		b = b[n:]
	}
	return sb.String()
}

func fmtSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}
