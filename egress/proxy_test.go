package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/nettest"
)

// A tunnel to an allowed host carries bytes both ways, and the call
// counts them under the host's name.
func TestConnectRelaysBothWaysAndCounts(t *testing.T) {
	echo := startEcho(t)
	p := newTestProxy(t, Config{Settings: Settings{
		Allow: rules(t, "echo.test:"+port(echo.port())), Hosts: hosts(t, "echo.test=127.0.0.1")}}, nil, nil)
	call := p.NewCall("c1")
	relay := relayFor(t, call)

	resp, conn := connectVia(t, relay, "echo.test:"+port(echo.port()))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT: %s", refusedBody(resp))
	}
	sent := bytes.Repeat([]byte("0123456789"), 1000)
	go conn.Write(sent)
	got := make([]byte, len(sent))
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, sent) {
		t.Fatalf("echo through the tunnel: %v (equal %v)", err, bytes.Equal(got, sent))
	}
	conn.Close()
	call.Close()
	d, err := destination(call.Destinations(), "echo.test", true)
	if err != nil {
		t.Fatalf("%v in %+v", err, call.Destinations())
	}
	if d.Port != echo.port() || d.BytesOut != int64(len(sent)) || d.BytesIn != int64(len(sent)) {
		t.Errorf("destination = %+v, want port %d and %d bytes each way", d, echo.port(), len(sent))
	}
}

// An absolute-URI request is forwarded with the hop-by-hop headers
// dropped, and a client's requests to one host share one connection.
func TestAbsoluteURIForwarded(t *testing.T) {
	var conns atomic.Int32
	var seen atomic.Value
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Clone())
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.Path)
	}), ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	up := ln.Addr().(*net.TCPAddr).Port

	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "web.test:"+port(up)), Hosts: hosts(t, "web.test=127.0.0.1")}}, nil, nil)
	call := p.NewCall("c1")
	client := proxyClient(relayFor(t, call), nil)
	for i := range 3 {
		req, _ := http.NewRequest("GET", fmt.Sprintf("http://web.test:%d/path%d", up, i), nil)
		req.Header.Set("Proxy-Authorization", "Basic c2VjcmV0")
		req.Header.Set("Connection", "X-Hop")
		req.Header.Set("X-Hop", "dropped")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := fmt.Sprintf("hello web.test:%d /path%d", up, i); resp.StatusCode != 200 || string(body) != want {
			t.Fatalf("GET %d: %s %q, want 200 %q", i, resp.Status, body, want)
		}
	}
	h := seen.Load().(http.Header)
	for _, name := range []string{"Proxy-Authorization", "X-Hop", "X-Forwarded-For", "Forwarded"} {
		if v := h.Get(name); v != "" {
			t.Errorf("the host got %s: %q; the proxy must drop it", name, v)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("the host saw %d connections for 3 requests, want 1 (kept alive per host)", n)
	}
}

// A host not on the list gets a 403 naming it and the variable, in the
// status line (all Python shows for a CONNECT) and in the body, and is
// recorded as refused.
func TestHostNotListedRefused(t *testing.T) {
	dialer := &testDialer{}
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "pypi.org,files.pythonhosted.org")}}, nil, dialer)
	call := p.NewCall("c1")
	relay := relayFor(t, call)

	resp, _ := connectVia(t, relay, "evil.example:443")
	msg := refusedBody(resp)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(resp.Status, "evil.example:443") ||
		!strings.Contains(resp.Status, "MCP_EXEC_EGRESS_ALLOW") || !strings.Contains(msg, "pypi.org") {
		t.Errorf("CONNECT to an unlisted host answered:\n%s\nwant 403 naming evil.example:443 and MCP_EXEC_EGRESS_ALLOW, listing what is allowed", msg)
	}
	resp, err := proxyClient(relay, nil).Get("http://evil.example/x")
	if err != nil {
		t.Fatal(err)
	}
	if msg := refusedBody(resp); resp.StatusCode != http.StatusForbidden || !strings.Contains(msg, "evil.example:80 is not in MCP_EXEC_EGRESS_ALLOW") {
		t.Errorf("GET http://evil.example/x answered:\n%s\nwant 403 naming the host and the variable", msg)
	}
	if a := dialer.addresses(); len(a) != 0 {
		t.Errorf("the proxy connected to %v for refused hosts", a)
	}
	call.Close()
	d, err := destination(call.Destinations(), "evil.example", false)
	if err != nil || d.Refused == "" {
		t.Errorf("destinations %+v: want evil.example refused with a reason", call.Destinations())
	}
}

// Deny wins over allow, on the ports it names (every port without one).
func TestDenyWinsOverAllow(t *testing.T) {
	echo := startEcho(t)
	dialer := &testDialer{routes: map[string]string{"*": echo.ln.Addr().String()}}
	dns := &testDNS{}
	dns.set("api.corp.test", "93.184.216.34")
	dns.set("billing.corp.test", "93.184.216.34")
	dns.set("www.corp.test", "93.184.216.34")
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "*.corp.test,*.corp.test:8443"),
		Deny: rules(t, "billing.corp.test,www.corp.test:8443")}}, dns, dialer)
	relay := relayFor(t, p.NewCall("c1"))
	for _, tt := range []struct {
		authority string
		want      int
		says      string
	}{
		{"api.corp.test:443", 200, ""},
		{"billing.corp.test:443", 403, "denied by MCP_EXEC_EGRESS_DENY (billing.corp.test)"},
		{"billing.corp.test:8443", 403, "denied by MCP_EXEC_EGRESS_DENY"},
		{"www.corp.test:443", 200, ""},
		{"www.corp.test:8443", 403, "denied by MCP_EXEC_EGRESS_DENY (www.corp.test:8443)"},
	} {
		resp, _ := connectVia(t, relay, tt.authority)
		if msg := refusedBody(resp); resp.StatusCode != tt.want || !strings.Contains(msg, tt.says) {
			t.Errorf("CONNECT %s: %s, want %d %q", tt.authority, msg, tt.want, tt.says)
		}
	}
}

// Wildcards cover subdomains only, a rule without a port covers 443 and
// 80, and a rule with one covers only it.
func TestWildcardAndPortRules(t *testing.T) {
	echo := startEcho(t)
	dialer := &testDialer{routes: map[string]string{"*": echo.ln.Addr().String()}}
	dns := &testDNS{}
	for _, n := range []string{"a.svc.test", "a.b.svc.test", "svc.test", "evilsvc.test", "pypi.org", "mirror.test"} {
		dns.set(n, "93.184.216.34")
	}
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "*.svc.test, pypi.org, mirror.test:8443")}}, dns, dialer)
	relay := relayFor(t, p.NewCall("c1"))
	for authority, want := range map[string]int{
		"a.svc.test:443": 200, "a.b.svc.test:80": 200, "A.SVC.TEST.:443": 200,
		"svc.test:443": 403, "evilsvc.test:443": 403, "a.svc.test:8443": 403,
		"pypi.org:443": 200, "pypi.org:80": 200, "pypi.org:22": 403,
		"mirror.test:8443": 200, "mirror.test:443": 403,
	} {
		resp, _ := connectVia(t, relay, authority)
		if resp.StatusCode != want {
			t.Errorf("CONNECT %s: %s, want %d", authority, refusedBody(resp), want)
		}
	}
}

// A listed name that resolves to loopback is refused, naming the address
// class and the mapping variable; mapped by the operator, it is reached.
func TestListedNameResolvingToLoopbackRefused(t *testing.T) {
	echo := startEcho(t)
	dns := &testDNS{}
	dns.set("sneaky.test", "127.0.0.1")
	dns.set("mapped.test", "8.8.8.8") // the mapping wins over DNS
	allow := rules(t, "sneaky.test:"+port(echo.port())+",mapped.test:"+port(echo.port()))
	p := newTestProxy(t, Config{Settings: Settings{Allow: allow, Hosts: hosts(t, "mapped.test=127.0.0.1")}}, dns, nil)
	relay := relayFor(t, p.NewCall("c1"))

	resp, _ := connectVia(t, relay, "sneaky.test:"+port(echo.port()))
	if msg := refusedBody(resp); resp.StatusCode != 403 || !strings.Contains(msg, "sneaky.test resolves to 127.0.0.1, a loopback address") ||
		!strings.Contains(msg, "MCP_EXEC_EGRESS_HOSTS") {
		t.Errorf("CONNECT to a name resolving to loopback: %s\nwant 403 naming the address, its class and MCP_EXEC_EGRESS_HOSTS", msg)
	}
	resp, conn := connectVia(t, relay, "mapped.test:"+port(echo.port()))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT to a mapped name: %s, want 200", refusedBody(resp))
	}
	fmt.Fprint(conn, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != "ping" {
		t.Errorf("through the mapped name: %q %v", buf, err)
	}
	if n := dns.lookups("mapped.test"); n != 0 {
		t.Errorf("a mapped name was looked up %d times, want 0", n)
	}
}

// The metadata service and the other special addresses are refused
// however they are asked for, and nothing is dialed.
func TestSpecialAddressesRefused(t *testing.T) {
	dialer := &testDialer{}
	dns := &testDNS{}
	dns.set("metadata.test", "169.254.169.254")
	dns.set("aws6.test", "fd00:ec2::254")
	dns.set("mixed.test", "10.1.2.3")
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "*,*:8080")}}, dns, dialer)
	relay := relayFor(t, p.NewCall("c1"))
	client := proxyClient(relay, nil)
	for _, authority := range []string{
		"169.254.169.254:80", "metadata.test:80", "[fd00:ec2::254]:80", "aws6.test:80", "mixed.test:443",
		"127.0.0.1:8080", "[::1]:80", "0.0.0.0:80", "[::]:80", "[::ffff:127.0.0.1]:80", "[64:ff9b::7f00:1]:80",
		"100.64.0.1:80", "192.168.1.1:80", "172.16.0.1:80", "[fe80::1]:80", "255.255.255.255:80", "224.0.0.1:80",
	} {
		resp, _ := connectVia(t, relay, authority)
		if msg := refusedBody(resp); resp.StatusCode != 403 || !strings.Contains(msg, "the proxy never connects code to") {
			t.Errorf("CONNECT %s: %s, want 403 naming the address class", authority, msg)
		}
	}
	resp, err := client.Get("http://169.254.169.254/latest/meta-data/")
	if err != nil {
		t.Fatal(err)
	}
	if msg := refusedBody(resp); resp.StatusCode != 403 || !strings.Contains(msg, "169.254.169.254 is a link-local address") {
		t.Errorf("GET the metadata service: %s, want 403 naming link-local", msg)
	}
	if a := dialer.addresses(); len(a) != 0 {
		t.Errorf("the proxy dialed %v", a)
	}
}

// DNS rebinding: the proxy resolves a name once per connection and
// connects to the very address it checked; a name that later resolves to
// loopback is refused, not connected.
func TestResolvedOnceConnectedAsChecked(t *testing.T) {
	echo := startEcho(t)
	dns := &testDNS{}
	dns.set("rebind.test", "93.184.216.34")
	dialer := &testDialer{routes: map[string]string{"93.184.216.34:443": echo.ln.Addr().String()}}
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "rebind.test")}}, dns, dialer)
	relay := relayFor(t, p.NewCall("c1"))

	resp, _ := connectVia(t, relay, "rebind.test:443")
	if resp.StatusCode != 200 {
		t.Fatalf("first CONNECT: %s", refusedBody(resp))
	}
	dns.set("rebind.test", "127.0.0.1") // the attacker's DNS answers anew
	resp, _ = connectVia(t, relay, "rebind.test:443")
	if resp.StatusCode != 403 {
		t.Errorf("CONNECT after rebinding: %s, want 403", refusedBody(resp))
	}
	if got := dialer.addresses(); len(got) != 1 || got[0] != "93.184.216.34:443" {
		t.Errorf("dialed %v, want exactly [93.184.216.34:443]: the address checked, never a name", got)
	}
	if n := dns.lookups("rebind.test"); n != 2 {
		t.Errorf("rebind.test was looked up %d times for 2 connections, want 2", n)
	}
}

// A redirect is the client's to follow: its next hop comes back through
// the proxy and is checked again, so an allowed host cannot send the code
// to the metadata service or an unlisted host.
func TestRedirectToRefusedHostRefused(t *testing.T) {
	var hops atomic.Int32
	up := startHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hops.Add(1)
		http.Redirect(w, r, r.URL.Query().Get("to"), http.StatusFound)
	}))
	dns := &testDNS{}
	dns.set("metadata.test", "169.254.169.254")
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "open.test:"+port(up)+",metadata.test"),
		Hosts: hosts(t, "open.test=127.0.0.1")}}, dns, nil)
	relay := relayFor(t, p.NewCall("c1"))
	client := proxyClient(relay, nil)
	for to, says := range map[string]string{
		"http://metadata.test/latest/meta-data/": "metadata.test resolves to 169.254.169.254, a link-local address",
		"http://unlisted.test/":                  "unlisted.test:80 is not in MCP_EXEC_EGRESS_ALLOW",
	} {
		resp, err := client.Get(fmt.Sprintf("http://open.test:%d/?to=%s", up, to))
		if err != nil {
			t.Fatal(err)
		}
		if msg := refusedBody(resp); resp.StatusCode != 403 || !strings.Contains(msg, says) {
			t.Errorf("redirect to %s: the second hop got %s, want 403 %q", to, msg, says)
		}
	}
	if n := hops.Load(); n != 2 {
		t.Errorf("the allowed host answered %d times, want 2", n)
	}
}

// What is not a proxy request gets a 400 saying what the proxy expects.
func TestMalformedRequests400(t *testing.T) {
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "pypi.org")}}, nil, nil)
	relay := relayFor(t, p.NewCall("c1"))
	for _, req := range []string{
		"GET /simple/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"CONNECT pypi.org HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"CONNECT bad_host!:443 HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET ftp://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"GET https://pypi.org/ HTTP/1.1\r\nHost: pypi.org\r\n\r\n",
		"HELLO\r\n\r\n",
	} {
		conn, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(time.Minute))
		fmt.Fprint(conn, req)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%q: %v %v, want 400", req, resp, err)
		}
		conn.Close()
	}
}

// Domain fronting: a tunnel opened for an allowed name whose TLS
// ClientHello names another host (on a shared CDN address, that picks
// the site) is closed before a byte of it reaches the host; one naming
// its own host goes through, and so does a protocol that is not TLS.
func TestTunnelServerNameChecked(t *testing.T) {
	ca := nettest.NewCA(t)
	up := startHTTPS(t, ca, http.NotFoundHandler(), "allowed.test", "evil.test")
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "allowed.test:"+port(up)), Hosts: hosts(t, "allowed.test=127.0.0.1")}}, nil, nil)
	call := p.NewCall("c1")
	relay := relayFor(t, call)
	for _, tt := range []struct {
		serverName string
		ok         bool
	}{{"evil.test", false}, {"allowed.test", true}, {"ALLOWED.test", true}} {
		_, conn := connectVia(t, relay, "allowed.test:"+port(up))
		tc := tls.Client(conn, &tls.Config{ServerName: tt.serverName, RootCAs: ca.Pool()})
		tc.SetDeadline(time.Now().Add(time.Minute))
		err := tc.Handshake()
		if (err == nil) != tt.ok {
			t.Errorf("a tunnel to allowed.test with server name %s: handshake err %v, want ok %v", tt.serverName, err, tt.ok)
		}
		tc.Close()
		if d, _ := destination(call.Destinations(), "allowed.test", true); !tt.ok && d.BytesOut != 0 {
			t.Errorf("%d bytes of a tunnel naming %s reached the host, want none", d.BytesOut, tt.serverName)
		}
	}
	call.Close()
	if d, err := destination(call.Destinations(), "evil.test", false); err != nil || !strings.Contains(d.Refused, "TLS ClientHello of a tunnel to allowed.test") {
		t.Errorf("destinations %+v: want evil.test refused, named in a ClientHello", call.Destinations())
	}
}

// The URL decides where an absolute-URI request goes and what Host the
// host sees: a Host header naming another site does not steer it.
func TestHostHeaderDoesNotSteer(t *testing.T) {
	up := startHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "host="+r.Host) }))
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "web.test:"+port(up)), Hosts: hosts(t, "web.test=127.0.0.1")}}, nil, nil)
	relay := relayFor(t, p.NewCall("c1"))
	conn, err := net.Dial("tcp", relay)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET http://web.test:%d/ HTTP/1.1\r\nHost: internal.test\r\nConnection: close\r\n\r\n", up)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if want := fmt.Sprintf("host=web.test:%d", up); string(body) != want {
		t.Errorf("the host saw %q, want %q", body, want)
	}
}
