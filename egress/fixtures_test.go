package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/nettest"
)

// writeFile writes data in a temp dir of the test's, with exactly mode.
func writeFile(t testing.TB, name string, data []byte, mode os.FileMode) string {
	t.Helper()
	return nettest.WriteFile(t, name, data, mode)
}

// secretsFile writes a secrets file the proxy accepts (0600).
func secretsFile(t testing.TB, secrets map[string]map[string]string) string {
	t.Helper()
	data, err := json.Marshal(secrets)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, "secrets.json", data, 0o600)
}

// testDNS is the resolver the tests give the proxy: a name it does not
// know fails, so that no test asks the real DNS.
type testDNS struct {
	mu    sync.Mutex
	names map[string][]netip.Addr
	asked []string
}

func (d *testDNS) set(name string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.names == nil {
		d.names = map[string][]netip.Addr{}
	}
	d.names[name] = nil
	for _, a := range addrs {
		d.names[name] = append(d.names[name], netip.MustParseAddr(a))
	}
}

func (d *testDNS) lookup(_ context.Context, host string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.asked = append(d.asked, host)
	if a, ok := d.names[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host (test resolver)", Name: host, IsNotFound: true}
}

func (d *testDNS) lookups(host string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, h := range d.asked {
		if h == host {
			n++
		}
	}
	return n
}

// testDialer records each address the proxy connects to; with a route,
// it connects an address to another (a test server standing for an
// internet host).
type testDialer struct {
	mu     sync.Mutex
	dialed []string
	routes map[string]string
}

func (d *testDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	d.dialed = append(d.dialed, addr)
	to := addr
	if r, ok := d.routes[addr]; ok {
		to = r
	} else if r, ok := d.routes["*"]; ok {
		to = r
	}
	d.mu.Unlock()
	return (&net.Dialer{}).DialContext(ctx, network, to)
}

func (d *testDialer) addresses() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.dialed...)
}

// newTestProxy makes a proxy with the tests' resolver (and dialer, when
// given), the default limits unless set, and closes it after the test.
func newTestProxy(t testing.TB, cfg Config, dns *testDNS, dialer *testDialer) *Proxy {
	t.Helper()
	if dns == nil {
		dns = &testDNS{}
	}
	cfg.lookup = dns.lookup
	if dialer != nil {
		cfg.dial = dialer.dial
	}
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits()
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// relayFor stands in for a sandbox's relay: a loopback listener whose
// every connection goes to call.Serve. It returns its address.
func relayFor(t testing.TB, call *Call) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go call.Serve(ctx, conn)
		}
	}()
	t.Cleanup(func() { ln.Close(); cancel(); call.Close() })
	return ln.Addr().String()
}

// proxyClient is an HTTP client that goes through the relay at addr and
// trusts roots for TLS.
func proxyClient(addr string, roots *x509.CertPool) *http.Client {
	u := &url.URL{Scheme: "http", Host: addr}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(u), TLSClientConfig: &tls.Config{RootCAs: roots}},
		Timeout: time.Minute}
}

// tunnelConn is a client's end of a CONNECT: reads go through the
// reader that read the proxy's answer.
type tunnelConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *tunnelConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// connectVia asks the relay at addr for a tunnel to authority, and
// returns the proxy's answer and, when it is 200, the tunnel.
func connectVia(t testing.TB, addr, authority string) (*http.Response, net.Conn) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", authority, authority)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		conn.Close()
		t.Fatalf("CONNECT %s: reading the answer: %v", authority, err)
	}
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(body)))
		conn.Close()
		return resp, nil
	}
	resp.Body = http.NoBody // what follows is the tunnel
	tc := &tunnelConn{Conn: conn, r: br}
	t.Cleanup(func() { tc.Close() })
	return resp, tc
}

// refusedBody reads a refusal's status line and body as one string.
func refusedBody(resp *http.Response) string {
	body, _ := io.ReadAll(resp.Body)
	return resp.Status + "\n" + string(body)
}

// echoServer is an upstream host over plain TCP that sends back what it
// gets; closed reports each connection's end.
type echoServer struct {
	ln     net.Listener
	closed chan struct{}
}

func startEcho(t testing.TB) *echoServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &echoServer{ln: ln, closed: make(chan struct{}, 64)}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.Copy(conn, conn)
				conn.Close()
				e.closed <- struct{}{}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return e
}

func (e *echoServer) port() int { return e.ln.Addr().(*net.TCPAddr).Port }

// startSource is an upstream host over plain TCP that writes n bytes to
// each connection and closes it.
func startSource(t testing.TB, n int) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				io.CopyN(conn, zeros{}, int64(n))
				conn.Close()
			}()
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) { clear(b); return len(b), nil }

// startHTTPS starts an upstream HTTPS host on loopback with a
// certificate ca issues for names; it returns its port.
func startHTTPS(t testing.TB, ca *nettest.CA, h http.Handler, names ...string) int {
	t.Helper()
	s := httptest.NewUnstartedServer(h)
	s.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, names...)}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s.Listener.Addr().(*net.TCPAddr).Port
}

// startHTTP starts an upstream plain HTTP host on loopback.
func startHTTP(t testing.TB, h http.Handler) int {
	t.Helper()
	s := httptest.NewServer(h)
	t.Cleanup(s.Close)
	return s.Listener.Addr().(*net.TCPAddr).Port
}

func rules(t testing.TB, s string) []Rule {
	t.Helper()
	r, err := ParseRules(s)
	if err != nil {
		t.Fatalf("ParseRules(%q): %v", s, err)
	}
	return r
}

func hosts(t testing.TB, s string) Hosts {
	t.Helper()
	h, err := ParseHosts(s)
	if err != nil {
		t.Fatalf("ParseHosts(%q): %v", s, err)
	}
	return h
}

func port(n int) string { return strconv.Itoa(n) }

// destination finds host's record among ds.
func destination(ds []Destination, host string, allowed bool) (Destination, error) {
	for _, d := range ds {
		if d.Host == host && d.Allowed == allowed {
			return d, nil
		}
	}
	return Destination{}, errors.New("no destination " + host)
}
