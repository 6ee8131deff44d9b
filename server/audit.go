package server

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/inhuman/mcp-exec/runtime"
)

// auditRecord is one line of the audit log: metadata about a call, never
// its code, stdin or output.
type auditRecord struct {
	Time            time.Time   `json:"time"`
	CallID          string      `json:"call_id"`
	Client          string      `json:"client"`
	CodeSHA256      string      `json:"code_sha256"`
	CodeBytes       int         `json:"code_bytes"`
	StdinBytes      int         `json:"stdin_bytes"`
	Runtime         string      `json:"runtime"`
	Limits          auditLimits `json:"limits"`
	ExitCode        *int        `json:"exit_code"` // null when the code did not run
	TimedOut        bool        `json:"timed_out"`
	OOMKilled       bool        `json:"oom_killed"`
	PidsLimited     bool        `json:"pids_limited"`
	StdoutTruncated bool        `json:"stdout_truncated"`
	StderrTruncated bool        `json:"stderr_truncated"`
	StdoutBytes     int64       `json:"stdout_bytes"`
	StderrBytes     int64       `json:"stderr_bytes"`
	DurationMS      int64       `json:"duration_ms"`
	Error           string      `json:"error,omitempty"`
	// Verdict is the call's outcome in one word, as the metrics count it.
	Verdict string `json:"verdict,omitempty"`
	// Session is a digest of the persistent session's handle (never the
	// handle, which is what lets a caller in); SessionEnded why it ended.
	Session      string             `json:"session,omitempty"`
	SessionEnded runtime.SessionEnd `json:"session_ended,omitempty"`
	// SessionEndDetail says what ended it when SessionEnded alone would
	// mislead (the server killed it, not its code).
	SessionEndDetail string `json:"session_end_detail,omitempty"`
	// Event is "session_start" or "session_end" for a record of a
	// persistent session rather than of a call.
	Event string `json:"event,omitempty"`
	// Egress is each host the call's code asked the network allowlist's
	// proxy for, reached or refused, with the bytes each way.
	Egress []runtime.EgressDestination `json:"egress,omitempty"`
}

// auditSession records a persistent session's start or end.
func (s *Server) auditSession(h *held, event string, why runtime.SessionEnd, detail string) {
	s.opts.Audit.write(auditRecord{Time: time.Now().UTC(), CallID: uuid.NewString(), Client: h.client,
		Runtime: s.info.Runtime, Event: event, Session: h.id, SessionEnded: why, SessionEndDetail: detail})
}

type auditLimits struct {
	TimeoutS       float64 `json:"timeout_s,omitempty"`
	MemoryBytes    int64   `json:"memory_bytes"`
	Pids           int64   `json:"pids"`
	CPUs           float64 `json:"cpus"`
	TmpfsBytes     int64   `json:"tmpfs_bytes"`
	MaxOutputBytes int64   `json:"max_output_bytes"`
}

// setResult records the verdict of a call that got as far as validation.
func (r *auditRecord) setResult(res runtime.Result, timeout time.Duration, err error) {
	r.Limits.TimeoutS = timeout.Seconds()
	if err != nil {
		r.Error = err.Error()
	}
	r.Egress = res.Egress // what the network saw, whether the code ran to its end or not
	if res.Duration == 0 && err != nil {
		return // the code never ran
	}
	code := res.ExitCode
	r.ExitCode = &code
	r.TimedOut, r.OOMKilled, r.PidsLimited = res.TimedOut, res.OOMKilled, res.PidsLimitHit
	r.StdoutTruncated, r.StderrTruncated = res.StdoutTruncated, res.StderrTruncated
	r.StdoutBytes, r.StderrBytes = res.StdoutBytes, res.StderrBytes
	r.DurationMS = res.Duration.Milliseconds()
}

// AuditLog writes one JSON line per call. A nil *AuditLog is off.
type AuditLog struct {
	mu  sync.Mutex
	w   io.Writer
	c   io.Closer // nil for stderr
	log *slog.Logger
}

// OpenAudit opens the audit log named by {AuditLog}: "" is off, "-"
// is stderr, anything else a file appended to and readable by the owner only.
func OpenAudit(path string, stderr io.Writer, log *slog.Logger) (*AuditLog, error) {
	switch path {
	case "":
		return nil, nil
	case "-":
		return &AuditLog{w: stderr, log: log}, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("{AuditLog}: opening %s: %w", path, err)
	}
	return &AuditLog{w: f, c: f, log: log}, nil
}

func (a *AuditLog) write(r auditRecord) {
	if a == nil {
		return
	}
	line, err := json.Marshal(r)
	if err != nil {
		a.log.Error("encoding audit record", "err", err)
		return
	}
	line = append(line, '\n')
	a.mu.Lock()
	defer a.mu.Unlock()
	// One write per record, so that O_APPEND keeps lines whole even when
	// several servers share the file.
	if _, err := a.w.Write(line); err != nil {
		a.log.Error("writing audit log", "call", r.CallID, "err", err)
	}
}

func (a *AuditLog) Close() error {
	if a == nil || a.c == nil {
		return nil
	}
	return a.c.Close()
}
