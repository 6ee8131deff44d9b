package egress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
)

// target is a destination as a request names it: a normalized host and a
// port.
type target struct {
	host string
	port uint16
}

func (t target) String() string { return hostPort(t.host, t.port) }

// parseTarget parses host:port (a request's authority); without a port,
// def, unless def is 0, when the port is required (CONNECT).
func parseTarget(authority string, def uint16) (target, error) {
	host, portStr, err := net.SplitHostPort(authority)
	port := def
	switch {
	case err == nil:
		if port, err = parsePort(portStr); err != nil {
			return target{}, err
		}
	case def == 0:
		return target{}, fmt.Errorf("%q is not host:port", authority)
	default:
		host = authority
	}
	h, err := normalizeHost(host)
	if err != nil {
		return target{}, fmt.Errorf("%q: %w", authority, err)
	}
	return target{h, port}, nil
}

// requestTarget is where r asks to go, as well as it can be told.
func requestTarget(r *http.Request) target {
	t, err := parseTarget(r.Host, 0)
	if r.Method != http.MethodConnect {
		t, err = parseTarget(r.URL.Host, 80)
	}
	if err != nil {
		return target{host: phrase(r.Host)}
	}
	return t
}

// check applies the lists to t: deny first, then allow; a host with
// secrets is reached only through a tunnel the proxy terminates.
func (p *Proxy) check(t target, tunnel bool) *refusal {
	if rule, ok := denied(p.cfg.Deny, t.host, t.port); ok {
		return deniedBy(t, rule)
	}
	if !allows(p.cfg.Allow, t.host, t.port) {
		return notAllowed(t, p.cfg.Allow)
	}
	if !tunnel && p.secrets[t.host] != nil {
		return secretOverHTTP(t)
	}
	return nil
}

// frontHandler serves the requests on one connection from the sandbox:
// CONNECT for a tunnel, an absolute http:// URL to forward. over: the
// connection is past the call's bound, and gets a 429.
func (c *Call) frontHandler(sc *trackedConn, over bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.enter() {
			return
		}
		defer c.leave()
		switch {
		case over:
			ref := tooManyConns(requestTarget(r), c.p.cfg.Limits.MaxConns)
			c.record(ref.target, ref)
			writeRefusal(w, ref)
		case r.Method == http.MethodConnect:
			c.connect(w, r, sc)
		case r.URL.IsAbs():
			c.forward(w, r)
		default:
			badRequest(w, "this is an HTTP proxy: ask for an absolute URL (GET http://host/path) or a tunnel (CONNECT host:443); HTTP_PROXY and HTTPS_PROXY point clients here")
		}
	})
}

// connect opens a tunnel to an allowed host: opaque bytes both ways, or,
// for a host with secrets, TLS the proxy terminates (intercept).
func (c *Call) connect(w http.ResponseWriter, r *http.Request, sc *trackedConn) {
	t, err := parseTarget(r.Host, 0)
	if err != nil {
		badRequest(w, "CONNECT needs host:port: "+err.Error())
		return
	}
	if ref := c.p.check(t, true); ref != nil {
		c.record(t, ref)
		writeRefusal(w, ref)
		return
	}
	if headers := c.p.secrets[t.host]; headers != nil {
		c.intercept(w, r, t, headers, sc)
		return
	}
	up, err := c.dialUpstream(r.Context(), t)
	if err != nil {
		writeUpstreamError(w, t, err)
		return
	}
	client, err := tunnel(w)
	if err != nil {
		up.Close()
		return
	}
	relay(client, up, func(client net.Conn) (net.Conn, bool) { return c.checkServerName(client, t) })
}

// tunnel takes the connection over from net/http and says the tunnel is
// open; bytes the client sent ahead are kept for the tunnel.
func tunnel(w http.ResponseWriter) (net.Conn, error) {
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil, err
	}
	if _, err := conn.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		conn.Close()
		return nil, err
	}
	if n := brw.Reader.Buffered(); n > 0 {
		ahead, _ := brw.Reader.Peek(n)
		return &prefixConn{Conn: conn, prefix: bytes.Clone(ahead)}, nil
	}
	return conn, nil
}

// forward carries an absolute-URI request (plain HTTP) to an allowed
// host. The call's transport keeps connections alive per host, so a
// client's next request to the same host reuses one; a redirect is the
// client's to follow, and comes back here to be checked again.
func (c *Call) forward(w http.ResponseWriter, r *http.Request) {
	if r.URL.Scheme != "http" {
		badRequest(w, fmt.Sprintf("only http:// URLs are forwarded, got %s://: https goes through a tunnel (CONNECT host:443; set HTTPS_PROXY)", r.URL.Scheme))
		return
	}
	t, err := parseTarget(r.URL.Host, 80)
	if err != nil {
		badRequest(w, err.Error())
		return
	}
	if ref := c.p.check(t, false); ref != nil {
		c.record(t, ref)
		writeRefusal(w, ref)
		return
	}
	c.forwarder.ServeHTTP(w, r)
}

// newForwarder makes the call's reverse proxy for absolute-URI requests.
// It drops the hop-by-hop headers (Connection and what it names,
// Proxy-Authorization, Keep-Alive, …) both ways, and adds no
// X-Forwarded-For: the host learns nothing of the sandbox.
func (c *Call) newForwarder() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Transport: c.transport,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.Host = pr.Out.URL.Host
		},
		ErrorLog: c.p.errorLog(),
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t, _ := parseTarget(r.URL.Host, 80)
			writeUpstreamError(w, t, err)
		},
	}
}

// newTransport makes the call's transport for plain HTTP: every new
// connection is dialed through dialUpstream, never through the server's
// own proxy settings.
func (c *Call) newTransport() *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			t, err := parseTarget(addr, 0)
			if err != nil {
				return nil, err
			}
			return c.dialUpstream(ctx, t)
		},
		MaxIdleConnsPerHost: 2,
		MaxConnsPerHost:     c.p.cfg.Limits.MaxConns,
		IdleConnTimeout:     c.p.cfg.Limits.Idle,
		// The code's Accept-Encoding goes as it is, and so does the body.
		DisableCompression: true,
	}
}

// dialUpstream connects the call to t: it resolves the name (once), drops
// the addresses of refused classes, and connects to the first remaining
// one that answers, that very address. The connection counts into the
// call's bounds and t's destination.
func (c *Call) dialUpstream(ctx context.Context, t target) (net.Conn, error) {
	ctx, stop := c.bind(ctx)
	defer stop()
	c.mu.Lock()
	ref := c.upstreamBoundLocked(t)
	c.mu.Unlock()
	if ref != nil {
		c.record(t, ref)
		return nil, ref
	}
	res, err := c.p.resolve(ctx, t.host)
	if err != nil {
		return nil, err
	}
	if len(res.addrs) == 0 {
		ref := addressRefused(t, res)
		c.record(t, ref)
		return nil, ref
	}
	var errs []error
	for _, a := range res.addrs {
		conn, err := c.p.dial(ctx, "tcp", netip.AddrPortFrom(a, t.port).String())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		return c.trackUpstream(conn, t)
	}
	return nil, fmt.Errorf("connecting to %s: %w", t, errors.Join(errs...))
}
