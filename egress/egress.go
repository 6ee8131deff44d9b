// Package egress is the proxy through which a sandbox reaches the hosts an
// operator allows, and nothing else. A sandbox has no route out: a relay
// inside it hands each connection it accepts to the server, which hands it
// to Call.Serve here. On it the proxy serves HTTP proxy requests (CONNECT
// host:port, and absolute http:// URLs), checks each destination against
// the allow and deny lists, resolves the name itself and refuses the
// addresses of the server's host, its networks and its cloud, connects to
// the address it checked, and counts and bounds what each call sends.
// For hosts with secrets it terminates TLS with a CA of its own and adds
// the headers to each request, so that the credentials never enter the
// sandbox.
//
// Invariants a maintainer keeps:
//   - nothing the sandbox sends is loaded or executed: requests are parsed
//     by net/http, everything else is relayed as bytes;
//   - a name is resolved here, once per upstream connection, and that
//     connection goes to an address that was checked (no second lookup
//     that DNS rebinding could answer differently);
//   - a refusal reaches the code as a 403 whose status line and body name
//     the host and what refused it (refuse.go: the only file here that
//     names the server's variables, as the messages leave the process);
//   - the secrets and the CA's key stay in this process's memory: never
//     in a file, the environment, a log line or a response;
//   - no connection outlives its Call.
//
// It knows nothing of runtimes, MCP or configuration variables.
package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"sync"
	"time"
)

// Limits bound what one call may do through the proxy.
type Limits struct {
	// MaxConns is the connections a call may have open at once from its
	// sandbox, and again to upstream hosts.
	MaxConns int
	// MaxBytes is what a call may send and receive upstream, in all.
	MaxBytes int64
	// Idle closes a connection that moved no byte either way this long;
	// Lifetime closes any connection this long after it opened.
	Idle, Lifetime time.Duration
}

// DefaultLimits let pip fetch a few large wheels and an API client wait
// for a slow answer, while a call cannot hold hundreds of connections or
// stream without end.
func DefaultLimits() Limits {
	return Limits{MaxConns: 32, MaxBytes: 1 << 30, Idle: 2 * time.Minute, Lifetime: 30 * time.Minute}
}

// Config is a proxy's configuration: the operator's settings, the
// limits, and where each call's destinations are reported.
type Config struct {
	Settings
	Limits Limits
	// Audit and Metrics, when set, are called once for each destination
	// of a call as the call closes.
	Audit   func(call string, d Destination)
	Metrics func(d Destination)
	// Logger gets what goes wrong in the proxy itself; nil discards.
	Logger *slog.Logger

	// Test seams: the resolver, the dialer, the clock.
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	now    func() time.Time
}

// Proxy is the server's one egress proxy, shared by every call.
type Proxy struct {
	cfg     Config
	hosts   Hosts
	secrets map[string]http.Header
	roots   *x509.CertPool // upstream TLS: the system's roots and CAFile's
	extra   []byte         // CAFile's certificates, PEM, for the sandbox
	ca      *authority     // nil without secrets
	pip     *url.URL
	log     *slog.Logger
	lookup  func(ctx context.Context, host string) ([]netip.Addr, error)
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	now     func() time.Time

	mu     sync.Mutex
	calls  map[*Call]struct{}
	closed bool
}

// New makes the proxy: it reads the secrets and the CA file and, with
// secrets, makes the instance's CA. It listens nowhere: connections come
// through Call.Serve.
func New(cfg Config) (*Proxy, error) {
	if !cfg.Enabled() {
		return nil, errors.New("{Allow} is empty: there is no network, so no proxy")
	}
	if err := cfg.Settings.Validate(); err != nil {
		return nil, err
	}
	def := DefaultLimits()
	if cfg.Limits.MaxConns <= 0 || cfg.Limits.MaxBytes <= 0 || cfg.Limits.Idle <= 0 || cfg.Limits.Lifetime <= 0 {
		return nil, fmt.Errorf("egress limits must all be positive, got %+v (defaults %+v)", cfg.Limits, def)
	}
	p := &Proxy{cfg: cfg, hosts: cfg.Hosts, log: cfg.Logger, lookup: cfg.lookup, dial: cfg.dial, now: cfg.now, calls: map[*Call]struct{}{}}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.lookup == nil {
		p.lookup = lookupDNS
	}
	if p.dial == nil {
		p.dial = (&net.Dialer{Timeout: dialTimeout}).DialContext
	}
	if p.now == nil {
		p.now = time.Now
	}
	p.pip, _ = cfg.pipIndex() // checked by Validate
	if err := p.loadTrust(); err != nil {
		return nil, err
	}
	return p, nil
}

// dialTimeout bounds one TCP connect to an upstream address.
const dialTimeout = 15 * time.Second

// loadTrust reads the secrets and the upstream CAs, and makes the
// instance's CA when there are secrets.
func (p *Proxy) loadTrust() error {
	roots, err := x509.SystemCertPool()
	if err != nil {
		// No system roots (a minimal image): only CAFile's are trusted,
		// which fails closed for every other host.
		roots = x509.NewCertPool()
	}
	if p.cfg.CAFile != "" {
		certs, pemBytes, err := loadCAs(p.cfg.CAFile)
		if err != nil {
			return err
		}
		for _, c := range certs {
			roots.AddCert(c)
		}
		p.extra = pemBytes
	}
	p.roots = roots
	if p.cfg.SecretsFile == "" {
		return nil
	}
	if p.secrets, err = LoadSecrets(p.cfg.SecretsFile); err != nil {
		return err
	}
	hosts := make([]string, 0, len(p.secrets))
	for h := range p.secrets {
		hosts = append(hosts, h)
	}
	p.ca, err = newAuthority(hosts, p.now)
	return err
}

// NewCall starts a call's use of the proxy: id names it to the audit
// hook. The caller closes it when the call ends.
func (p *Proxy) NewCall(id string) *Call {
	c := newCall(p, id)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.closeLocked()
	} else {
		p.calls[c] = struct{}{}
	}
	return c
}

func (p *Proxy) forget(c *Call) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.calls, c)
}

// Close closes every call's connections; calls made after it serve
// nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	calls := make([]*Call, 0, len(p.calls))
	for c := range p.calls {
		calls = append(calls, c)
	}
	p.mu.Unlock()
	for _, c := range calls {
		c.Close()
	}
	return nil
}

// httpServer serves HTTP/1.1 on one connection with h. Each connection
// gets its own (a struct, cheap), so that its handler knows its call
// without a lookup and nothing is shared between calls.
func (p *Proxy) httpServer(h http.Handler) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: headerTimeout,
		IdleTimeout:       p.cfg.Limits.Idle,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          p.errorLog(),
		// HTTP/1.1 only: HTTP/2 multiplexing would hide a call's
		// streams from its connection bounds.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
}

// errorLog is where net/http's servers and reverse proxies report what
// they do not return (a handshake that failed, a client gone): debug
// lines, as the code causes them at will.
func (p *Proxy) errorLog() *log.Logger {
	return slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)
}

const (
	// headerTimeout bounds how long a request's head may take to arrive.
	headerTimeout = 30 * time.Second
	// maxHeaderBytes bounds a request's head.
	maxHeaderBytes = 64 << 10
)
