package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/runtime"
)

// execInput is the exec tool's input. TimeoutS is a pointer so that an
// explicit 0 is told apart from "not given", and refused.
type execInput struct {
	Code     string   `json:"code"`
	Stdin    string   `json:"stdin,omitempty"`
	TimeoutS *float64 `json:"timeout_s,omitempty"`
}

// execOutput is the call's structuredContent. The contract's fields are
// never renamed or removed; cpu_ms, peak_memory_bytes and runtime are extras.
type execOutput struct {
	Stdout          string `json:"stdout" jsonschema:"what the program wrote to stdout (invalid UTF-8 replaced by U+FFFD), at most the output cap"`
	Stderr          string `json:"stderr" jsonschema:"what the program wrote to stderr (invalid UTF-8 replaced by U+FFFD), at most the output cap"`
	ExitCode        int    `json:"exit_code" jsonschema:"exit status; 128+N when killed by signal N"`
	TimedOut        bool   `json:"timed_out" jsonschema:"the wall-clock limit was hit and the whole container was killed"`
	OOMKilled       bool   `json:"oom_killed" jsonschema:"the memory limit killed a process"`
	PidsLimited     bool   `json:"pids_limited" jsonschema:"creating a process or thread failed at the process limit"`
	StdoutTruncated bool   `json:"stdout_truncated" jsonschema:"stdout went past its cap and was cut; the program was not blocked or killed for it"`
	StderrTruncated bool   `json:"stderr_truncated" jsonschema:"stderr went past its cap and was cut; the program was not blocked or killed for it"`
	Truncated       bool   `json:"truncated" jsonschema:"stdout_truncated or stderr_truncated"`
	DurationMS      int64  `json:"duration_ms" jsonschema:"wall-clock time of the run in milliseconds"`
	CPUMS           int64  `json:"cpu_ms" jsonschema:"CPU time of all processes in milliseconds, 0 when unknown"`
	PeakMemoryBytes int64  `json:"peak_memory_bytes" jsonschema:"highest memory use of the container, 0 when unknown"`
	Runtime         string `json:"runtime" jsonschema:"the container runtime that ran the code"`
}

// origin is what carried a call: Done of ctx means its client is gone (nil:
// only the SDK's own cancellation applies), client names it in the audit log.
type origin struct {
	ctx    context.Context
	client string
}

// execServer runs exec calls: it validates input, bounds concurrency, keeps
// calls alive with progress and kills their containers when their client
// goes. One execServer backs every MCP session of the process.
type execServer struct {
	cfg   config
	sb    *sandbox
	root  context.Context // done: the server is shutting down
	log   *slog.Logger
	audit *auditLog
	sem   chan struct{}

	mu      sync.Mutex
	closing bool
	active  sync.WaitGroup
}

func newExecServer(root context.Context, cfg config, sb *sandbox, audit *auditLog, log *slog.Logger) *execServer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &execServer{cfg: cfg, sb: sb, root: root, log: log, audit: audit, sem: make(chan struct{}, cfg.MaxConcurrency)}
}

// mcpServer returns an MCP server with the exec tool. originOf tells each
// call's handler what carried it.
func (s *execServer) mcpServer(originOf func(*mcp.CallToolRequest) origin, sdkLog *slog.Logger) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: "mcp-exec", Title: "mcp-exec", Version: version}, &mcp.ServerOptions{
		Logger: sdkLog,
		// The tool list never changes, so there is nothing to notify.
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}, Logging: &mcp.LoggingCapabilities{}},
	})
	mcp.AddTool(srv, s.tool(), s.handler(originOf))
	return srv
}

func (s *execServer) tool() *mcp.Tool {
	f := false
	return &mcp.Tool{
		Name:        "exec",
		Title:       "Run Python in a sandbox",
		Description: s.description(),
		// Written out rather than inferred: the SDK would make the optional
		// timeout_s ["null","number"], and the ranges are checked by the
		// handler so that its errors name the limit and its variable.
		InputSchema: map[string]any{
			"type":     "object",
			"required": []string{"code"},
			"properties": map[string]any{
				"code": map[string]any{
					"type":        "string",
					"description": "Python source, run as a script (__main__). Print what you want to see.",
				},
				"stdin": map[string]any{
					"type":        "string",
					"description": fmt.Sprintf("fed to the program's standard input, then EOF; at most %d bytes", s.cfg.MaxStdinBytes),
				},
				"timeout_s": map[string]any{
					"type": "number",
					"description": fmt.Sprintf("wall-clock limit in seconds, > 0 and ≤ %s; default %s",
						fmtSeconds(s.cfg.MaxTimeout), fmtSeconds(s.cfg.DefaultTimeout)),
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
func (s *execServer) description() string {
	c := s.cfg
	var b strings.Builder
	fmt.Fprintf(&b, "Run Python %s code in a fresh, locked-down sandbox container: every call gets a new container, torn down afterwards, so nothing persists between calls. ", s.sb.pythonVersion)
	b.WriteString("The code runs as a script (__main__) and its stdout, stderr and exit code are returned; print what you want to see. ")
	fmt.Fprintf(&b, "There is no network access. The filesystem is read-only except /tmp (the working directory, a %d MiB tmpfs). ", c.Limits.TmpfsBytes/mib)
	if c.Rootfs == "" {
		b.WriteString("Only the Python standard library is available. ")
	}
	fmt.Fprintf(&b, "Limits per call: %d MiB of memory, %d processes/threads, %s CPU; a wall-clock timeout of %s s by default, up to %s s with timeout_s; stdout and stderr are each cut at %d bytes; stdin up to %d bytes. ",
		c.Limits.MemoryBytes/mib, c.Limits.Pids, strconv.FormatFloat(c.Limits.CPUs, 'f', -1, 64),
		fmtSeconds(c.DefaultTimeout), fmtSeconds(c.MaxTimeout), c.MaxOutputBytes, c.MaxStdinBytes)
	b.WriteString("A non-zero exit, a timeout or hitting the memory limit is a normal result (exit_code, timed_out, oom_killed), not an error.")
	return b.String()
}

// inputError is invalid input: the caller's to fix, its message names the
// field and the limit.
type inputError struct{ err error }

func (e *inputError) Error() string { return e.err.Error() }

// handler is the exec tool. Invalid input and a sandbox that could not run
// are tool errors (isError); whatever the code did is a result.
func (s *execServer) handler(originOf func(*mcp.CallToolRequest) origin) mcp.ToolHandlerFor[execInput, execOutput] {
	return func(ctx context.Context, req *mcp.CallToolRequest, in execInput) (*mcp.CallToolResult, execOutput, error) {
		o := originOf(req)
		rec := s.newRecord(o.client, in)
		if !s.enter() {
			rec.Error = "server shutting down"
			s.audit.write(rec)
			return nil, execOutput{}, errors.New("the server is shutting down")
		}
		defer s.active.Done()

		// The SDK cancels ctx on notifications/cancelled and when a stdio
		// client goes; a shutdown or a vanished HTTP client must kill the
		// container too.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(s.root, cancel)()
		if o.ctx != nil {
			defer context.AfterFunc(o.ctx, cancel)()
		}

		res, timeout, err := s.exec(ctx, req, in)
		rec.setResult(res, timeout, err)
		s.audit.write(rec)
		s.log.Info("exec", "call", rec.CallID, "client", rec.Client, "code_bytes", rec.CodeBytes,
			"stdin_bytes", rec.StdinBytes, "exit_code", res.ExitCode, "timed_out", res.TimedOut,
			"oom_killed", res.OOMKilled, "duration", res.Duration, "err", err)

		var inErr *inputError
		switch {
		case errors.As(err, &inErr):
			return nil, execOutput{}, inErr
		case err != nil && ctx.Err() != nil:
			// Cancelled: nobody is waiting for an answer.
			return nil, execOutput{}, fmt.Errorf("call cancelled: %w", context.Cause(ctx))
		case errors.Is(err, runtime.ErrSandbox):
			// The details are host paths and runtime internals: the
			// operator's, not the client's.
			s.log.Error("sandbox could not run", "call", rec.CallID, "err", err)
			return nil, execOutput{}, fmt.Errorf("the sandbox could not run this call, a problem of the server rather than of the code; the server log has the details under call %s", rec.CallID)
		case err != nil:
			// The code ran and its verdict stands; the runtime failed only
			// afterwards, tearing down. That is the operator's to look into.
			s.log.Error("exec teardown", "call", rec.CallID, "err", err)
		}
		out := outputOf(res, s.sb.rt.Kind())
		return &mcp.CallToolResult{
			Content: []mcp.Content{&mcp.TextContent{Text: summary(out, timeout, s.cfg)}},
		}, out, nil
	}
}

// exec validates the input, waits for a free slot and runs the code.
func (s *execServer) exec(ctx context.Context, req *mcp.CallToolRequest, in execInput) (runtime.Result, time.Duration, error) {
	timeout, err := s.validate(in)
	if err != nil {
		return runtime.Result{}, 0, &inputError{err}
	}
	var running atomic.Bool
	defer s.progress(ctx, req, &running)()

	select {
	case s.sem <- struct{}{}:
	case <-ctx.Done():
		return runtime.Result{}, timeout, ctx.Err()
	}
	defer func() { <-s.sem }()
	running.Store(true)
	res, err := s.sb.run(ctx, []byte(in.Code), []byte(in.Stdin), timeout, s.cfg.MaxOutputBytes)
	return res, timeout, err
}

// validate checks the input against the configured limits; every message
// names the field and the limit.
func (s *execServer) validate(in execInput) (time.Duration, error) {
	if in.Code == "" {
		return 0, errors.New("code is required and must be non-empty")
	}
	if n := int64(len(in.Stdin)); n > s.cfg.MaxStdinBytes {
		return 0, fmt.Errorf("stdin is %d bytes, over the limit of %d (MCP_EXEC_MAX_STDIN_BYTES)", n, s.cfg.MaxStdinBytes)
	}
	if in.TimeoutS == nil {
		return s.cfg.DefaultTimeout, nil
	}
	f := *in.TimeoutS
	d := time.Duration(f * float64(time.Second))
	if !(f > 0) || d <= 0 || f > s.cfg.MaxTimeout.Seconds() {
		return 0, fmt.Errorf("timeout_s must be > 0 and ≤ %s (MCP_EXEC_MAX_TIMEOUT_S), got %s",
			fmtSeconds(s.cfg.MaxTimeout), strconv.FormatFloat(f, 'g', -1, 64))
	}
	return d, nil
}

// progress sends notifications/progress every cfg.Progress while the call
// waits or runs, when the client asked for them with a progress token, so
// that clients with a request timeout survive long runs. The returned stop
// waits for the sender, so no notification follows the result.
func (s *execServer) progress(ctx context.Context, req *mcp.CallToolRequest, running *atomic.Bool) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(s.cfg.Progress)
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
			msg := fmt.Sprintf("waiting for a free slot (%d running at most) for %s", s.cfg.MaxConcurrency, elapsed.Round(time.Second))
			if running.Load() {
				msg = fmt.Sprintf("running for %s", elapsed.Round(time.Second))
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

// enter registers a call, unless the server is shutting down.
func (s *execServer) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return false
	}
	s.active.Add(1)
	return true
}

// drain refuses new calls and waits for the running ones, whose contexts
// the shutdown has cancelled, to finish tearing down.
func (s *execServer) drain() {
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.active.Wait()
}

func (s *execServer) newRecord(client string, in execInput) auditRecord {
	sum := sha256.Sum256([]byte(in.Code))
	l := s.cfg.Limits
	return auditRecord{
		Time:       time.Now().UTC(),
		CallID:     uuid.NewString(),
		Client:     client,
		CodeSHA256: hex.EncodeToString(sum[:]),
		CodeBytes:  len(in.Code),
		StdinBytes: len(in.Stdin),
		Runtime:    string(s.cfg.Runtime),
		Limits: auditLimits{
			MemoryBytes:    l.MemoryBytes,
			Pids:           l.Pids,
			CPUs:           l.CPUs,
			TmpfsBytes:     l.TmpfsBytes,
			MaxOutputBytes: s.cfg.MaxOutputBytes,
		},
	}
}

func outputOf(res runtime.Result, kind runtime.Kind) execOutput {
	return execOutput{
		Stdout:          strings.ToValidUTF8(string(res.Stdout), "\uFFFD"),
		Stderr:          strings.ToValidUTF8(string(res.Stderr), "\uFFFD"),
		ExitCode:        res.ExitCode,
		TimedOut:        res.TimedOut,
		OOMKilled:       res.OOMKilled,
		PidsLimited:     res.PidsLimitHit,
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Truncated:       res.StdoutTruncated || res.StderrTruncated,
		DurationMS:      res.Duration.Milliseconds(),
		CPUMS:           res.CPUTime.Milliseconds(),
		PeakMemoryBytes: res.PeakMemoryBytes,
		Runtime:         string(kind),
	}
}

// summary is the text block: the verdict on one line, then the output.
func summary(out execOutput, timeout time.Duration, cfg config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "exit code %d", out.ExitCode)
	if out.TimedOut {
		fmt.Fprintf(&b, "; timed out after %s s, the container was killed", fmtSeconds(timeout))
	}
	if out.OOMKilled {
		fmt.Fprintf(&b, "; killed by the memory limit (%d MiB)", cfg.Limits.MemoryBytes/mib)
	}
	if out.PidsLimited {
		fmt.Fprintf(&b, "; hit the process limit (%d)", cfg.Limits.Pids)
	}
	if out.StdoutTruncated {
		fmt.Fprintf(&b, "; stdout truncated at %d bytes", cfg.MaxOutputBytes)
	}
	if out.StderrTruncated {
		fmt.Fprintf(&b, "; stderr truncated at %d bytes", cfg.MaxOutputBytes)
	}
	fmt.Fprintf(&b, " (%d ms)\n", out.DurationMS)
	for _, s := range []struct{ name, text string }{{"stdout", out.Stdout}, {"stderr", out.Stderr}} {
		if s.text == "" {
			continue
		}
		fmt.Fprintf(&b, "--- %s ---\n%s", s.name, s.text)
		if !strings.HasSuffix(s.text, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func fmtSeconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}
