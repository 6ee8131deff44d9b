package egress

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"sync"
)

// intercept serves a tunnel to a host with secrets: the proxy first
// connects to the host and verifies its certificate, then answers the
// CONNECT, terminates the code's TLS with a certificate its own CA signs
// for the host, and forwards each request inside on TLS it originates,
// with the operator's headers in place of any the code set. The code
// never holds the headers, the CA's key, or a connection to the host.
func (c *Call) intercept(w http.ResponseWriter, r *http.Request, t target, headers http.Header, sc *trackedConn) {
	up, err := c.dialTLS(r.Context(), t)
	if err != nil {
		writeUpstreamError(w, t, err)
		return
	}
	client, err := tunnel(w)
	if err != nil {
		up.Close()
		return
	}
	tc := tls.Server(client, c.p.leafConfig(t.host))
	ctx, cancel := context.WithTimeout(c.ctx, headerTimeout)
	err = tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		c.p.log.Debug("egress: the code's TLS handshake with the proxy failed", "call", c.id, "host", t.host, "err", err)
		tc.Close()
		up.Close()
		return
	}
	tr := c.tunnelTransport(t, up)
	defer tr.CloseIdleConnections()
	rp := &httputil.ReverseProxy{
		Transport: tr,
		Rewrite:   injectHeaders(t, headers),
		ErrorLog:  c.p.errorLog(),
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			writeUpstreamError(w, t, err)
		},
	}
	serveConn(c.p.httpServer(c.innerHandler(rp)), tc, sc.done)
}

// innerHandler serves the requests inside an intercepted tunnel: all go
// to the tunnel's host, whatever their Host header says.
func (c *Call) innerHandler(rp *httputil.ReverseProxy) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.enter() {
			return
		}
		defer c.leave()
		if r.Method == http.MethodConnect {
			badRequest(w, "CONNECT inside a tunnel")
			return
		}
		rp.ServeHTTP(w, r)
	})
}

// injectHeaders points a request at t over https and sets the secret
// headers, replacing any of the same names the code sent.
func injectHeaders(t target, headers http.Header) func(*httputil.ProxyRequest) {
	return func(pr *httputil.ProxyRequest) {
		pr.Out.URL.Scheme = "https"
		pr.Out.URL.Host = t.String()
		pr.Out.Host = t.host
		if t.port != 443 {
			pr.Out.Host = t.String()
		}
		for name, values := range headers {
			pr.Out.Header[name] = slices.Clone(values)
		}
	}
}

// tunnelTransport carries one tunnel's requests on first, the connection
// verified before the tunnel opened, then on new ones dialed and verified
// the same way if the host closes it.
func (c *Call) tunnelTransport(t target, first net.Conn) *http.Transport {
	var once sync.Once
	return &http.Transport{
		Proxy: nil,
		DialTLSContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var conn net.Conn
			once.Do(func() { conn, first = first, nil })
			if conn != nil {
				return conn, nil
			}
			return c.dialTLS(ctx, t)
		},
		MaxConnsPerHost:     1,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     c.p.cfg.Limits.Idle,
		DisableCompression:  true,
		// HTTP/1.1 upstream, as toward the code.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
}

// dialTLS connects to t through dialUpstream and originates TLS,
// verifying the host's certificate against the system's roots and the
// operator's CA file. A host that fails it is never sent a request.
func (c *Call) dialTLS(ctx context.Context, t target) (net.Conn, error) {
	raw, err := c.dialUpstream(ctx, t)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, &tls.Config{
		ServerName: t.host,
		RootCAs:    c.p.roots,
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
	})
	ctx, cancel := context.WithTimeout(ctx, headerTimeout)
	defer cancel()
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, untrustedUpstream(t, err)
	}
	return tc, nil
}

// leafConfig is the TLS the proxy offers the code for host: a certificate
// for that host from the instance's CA, HTTP/1.1 only.
func (p *Proxy) leafConfig(host string) *tls.Config {
	return &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.ca.leaf(host) },
		NextProtos:     []string{"http/1.1"},
		MinVersion:     tls.VersionTLS12,
	}
}
