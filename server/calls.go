package server

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/inhuman/mcp-exec/runtime"
)

// What a call leaves for the operator, besides its audit record: one log
// line with every verdict field, its metrics, and its trace (a span for the
// call and one for each phase: queue, prepare, run, collect, teardown).

// serverOps is the server's operational state: how it records calls and
// what it counts.
type serverOps struct {
	metrics *metrics
	tracer  trace.Tracer
	// httpSessions counts the open HTTP sessions, once an HTTP transport
	// serves.
	httpSessions atomic.Pointer[func() int]
}

func (o *serverOps) httpSessionCount() int {
	if f := o.httpSessions.Load(); f != nil {
		return (*f)()
	}
	return 0
}

// callTrack is one exec call as its stages report it.
type callTrack struct {
	began  time.Time
	span   trace.Span
	tracer trace.Tracer
	// queueWait is how long it waited for a concurrency slot; queued
	// says it got as far as asking for one.
	queueWait time.Duration
	queued    bool
}

type callKey struct{}

// callOf is the call ctx carries, or nil.
func callOf(ctx context.Context) *callTrack {
	c, _ := ctx.Value(callKey{}).(*callTrack)
	return c
}

// beginCall starts recording a call: its span, a child of the trace its
// HTTP request carried when it carried one (W3C traceparent).
func (s *Server) beginCall(ctx context.Context, req *mcp.CallToolRequest, rec auditRecord) (context.Context, *callTrack) {
	c := &callTrack{began: time.Now(), tracer: s.ops.tracer}
	if c.tracer == nil {
		c.tracer = noop.NewTracerProvider().Tracer("")
	}
	if req != nil && req.Extra != nil && req.Extra.Header != nil {
		ctx = propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(http.Header(req.Extra.Header)))
	}
	ctx, c.span = c.tracer.Start(ctx, "exec", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("mcp_exec.call_id", rec.CallID),
		attribute.String("mcp_exec.runtime", rec.Runtime),
		attribute.Int("mcp_exec.code_bytes", rec.CodeBytes),
		attribute.Int("mcp_exec.stdin_bytes", rec.StdinBytes),
	))
	return context.WithValue(ctx, callKey{}, c), c
}

// waited records the wait for a slot that began at start, and its span.
func (c *callTrack) waited(ctx context.Context, start time.Time) {
	if c == nil {
		return
	}
	end := time.Now()
	c.queueWait, c.queued = end.Sub(start), true
	_, sp := c.tracer.Start(ctx, "queue", trace.WithTimestamp(start))
	sp.End(trace.WithTimestamp(end))
}

// phases is what the runtime tells of the call's phases: a span each,
// under the call's.
func (c *callTrack) phases(ctx context.Context) runtime.PhaseFunc {
	if c == nil || !c.span.IsRecording() {
		return nil
	}
	return func(p runtime.Phase, start, end time.Time) {
		_, sp := c.tracer.Start(ctx, string(p), trace.WithTimestamp(start))
		sp.End(trace.WithTimestamp(end))
	}
}

// verdictOf is a call's outcome in one word; err is what the call
// returned, ctx its context.
func verdictOf(ctx context.Context, res runtime.Result, err error) string {
	var inErr *inputError
	var refused *RefusedError
	switch {
	case errors.As(err, &inErr):
		return verdictInput
	case errors.Is(err, errBusy):
		return verdictBusy
	case errors.As(err, &refused), errors.Is(err, errShuttingDown):
		return verdictRefused
	case err != nil && ctx.Err() != nil:
		return verdictCancelled
	case errors.Is(err, runtime.ErrSandbox):
		return verdictSandbox
	case res.TimedOut:
		return verdictTimeout
	case res.OOMKilled:
		return verdictOOM
	case res.PidsLimitHit:
		return verdictPids
	case res.ExitCode != 0:
		return verdictExit
	}
	return verdictOK
}

// codeRan says whether a call with this verdict ran the code to a
// result whose figures mean something.
func codeRan(verdict string, res runtime.Result) bool {
	switch verdict {
	case verdictInput, verdictBusy, verdictRefused, verdictCancelled, verdictSandbox:
		return false
	}
	return res.Duration > 0
}

// endCall records a finished call: its one log line, its metrics, the end
// of its span.
func (s *Server) endCall(ctx context.Context, c *callTrack, rec auditRecord, res runtime.Result, err error) string {
	verdict := verdictOf(ctx, res, err)
	ran := codeRan(verdict, res)
	attrs := []slog.Attr{
		slog.String("call", rec.CallID), slog.String("client", rec.Client), slog.String("runtime", rec.Runtime),
		slog.String("verdict", verdict), slog.Int("code_bytes", rec.CodeBytes), slog.Int("stdin_bytes", rec.StdinBytes),
	}
	if ran {
		attrs = append(attrs,
			slog.Int("exit_code", res.ExitCode), slog.Bool("timed_out", res.TimedOut), slog.Bool("oom_killed", res.OOMKilled),
			slog.Bool("pids_limited", res.PidsLimitHit),
			slog.Int64("stdout_bytes", res.StdoutBytes), slog.Bool("stdout_truncated", res.StdoutTruncated),
			slog.Int64("stderr_bytes", res.StderrBytes), slog.Bool("stderr_truncated", res.StderrTruncated),
			slog.Bool("result_truncated", res.ValueTruncated),
			slog.Int("files", len(res.Files)), slog.Bool("files_truncated", res.FilesTruncated),
			slog.Duration("duration", res.Duration), slog.Duration("cpu", res.CPUTime),
			slog.Int64("peak_memory_bytes", res.PeakMemoryBytes), slog.Bool("pooled", res.Pooled))
	}
	if c.queued {
		attrs = append(attrs, slog.Duration("queue_wait", c.queueWait))
	}
	if rec.Session != "" {
		// A digest of the handle, as the audit log has it: never the handle.
		attrs = append(attrs, slog.String("session", rec.Session))
		if rec.SessionEnded != "" {
			attrs = append(attrs, slog.Any("session_ended", rec.SessionEnded))
		}
	}
	attrs = append(attrs, slog.Duration("took", time.Since(c.began)))
	level := slog.LevelInfo
	switch {
	case verdict == verdictSandbox:
		// The details are host paths and runtime internals: the
		// operator's; the client's error names this call's id.
		level = slog.LevelError
		attrs = append(attrs, slog.String("err", err.Error()))
	case err != nil && ran:
		// The code ran and its verdict stands; the runtime failed only
		// afterwards, tearing down.
		level = slog.LevelWarn
		attrs = append(attrs, slog.String("teardown_err", err.Error()))
	case err != nil && verdict != verdictCancelled:
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	s.log.LogAttrs(context.Background(), level, "exec", attrs...)
	s.ops.metrics.observe(verdict, res, ran, c.queueWait, c.queued, rec.Runtime)
	s.endSpan(c, verdict, ran, rec, res, err)
	return verdict
}

func (s *Server) endSpan(c *callTrack, verdict string, ran bool, rec auditRecord, res runtime.Result, err error) {
	if !c.span.IsRecording() {
		return
	}
	c.span.SetAttributes(attribute.String("mcp_exec.verdict", verdict))
	if ran {
		c.span.SetAttributes(
			attribute.Int("mcp_exec.exit_code", res.ExitCode),
			attribute.Bool("mcp_exec.timed_out", res.TimedOut),
			attribute.Bool("mcp_exec.oom_killed", res.OOMKilled),
			attribute.Bool("mcp_exec.pids_limited", res.PidsLimitHit),
			attribute.Bool("mcp_exec.stdout_truncated", res.StdoutTruncated),
			attribute.Bool("mcp_exec.stderr_truncated", res.StderrTruncated),
			attribute.Int64("mcp_exec.duration_ms", res.Duration.Milliseconds()),
			attribute.Int64("mcp_exec.cpu_ms", res.CPUTime.Milliseconds()),
			attribute.Int64("mcp_exec.peak_memory_bytes", res.PeakMemoryBytes),
			attribute.Bool("mcp_exec.pooled", res.Pooled),
		)
	}
	if c.queued {
		c.span.SetAttributes(attribute.Int64("mcp_exec.queue_wait_ms", c.queueWait.Milliseconds()))
	}
	if rec.Session != "" {
		c.span.SetAttributes(attribute.String("mcp_exec.session", rec.Session))
	}
	if verdict == verdictSandbox {
		// The span goes to the operator's collector: the error's text, as
		// in the log.
		c.span.SetStatus(codes.Error, err.Error())
	}
	c.span.End()
}
