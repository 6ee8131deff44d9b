package server

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Options configure a Server. Units are in the names.
type Options struct {
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// MaxCPU is the largest CPU time limit a call may ask for (0:
	// MaxTimeout).
	MaxCPU time.Duration
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

// maxCPU is the largest cpu_limit_s.
func (o Options) maxCPU() time.Duration {
	if o.MaxCPU > 0 {
		return o.MaxCPU
	}
	return o.MaxTimeout
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
	if o.MaxCPU < 0 {
		errs = append(errs, fmt.Errorf("{MaxCPU} must be > 0, got %v", o.MaxCPU))
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
