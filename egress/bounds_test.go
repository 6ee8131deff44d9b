package egress

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// A call moves at most MaxBytes upstream, exactly, however fast the host
// sends; past it the tunnel is cut and a new one is refused with a 429
// naming the limit.
func TestByteLimitCutsAndRefuses(t *testing.T) {
	const limit = 64 << 10
	src := startSource(t, 1<<20)
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "big.test:"+port(src)), Hosts: hosts(t, "big.test=127.0.0.1")},
		Limits: Limits{MaxConns: 4, MaxBytes: limit, Idle: time.Minute, Lifetime: time.Hour}}, nil, nil)
	call := p.NewCall("c1")
	relay := relayFor(t, call)

	resp, conn := connectVia(t, relay, "big.test:"+port(src))
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %s", refusedBody(resp))
	}
	conn.SetDeadline(time.Now().Add(time.Minute))
	n, _ := io.Copy(io.Discard, conn)
	if n != limit {
		t.Errorf("the code got %d bytes of a 1 MiB download, want exactly the limit, %d", n, limit)
	}
	resp, _ = connectVia(t, relay, "big.test:"+port(src))
	if msg := refusedBody(resp); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(msg, fmt.Sprint(limit)) {
		t.Errorf("CONNECT past the byte limit: %s, want 429 naming %d", msg, limit)
	}
	call.Close()
	d, err := destination(call.Destinations(), "big.test", true)
	if err != nil || d.BytesIn+d.BytesOut != limit {
		t.Errorf("destinations %+v: want big.test with %d bytes in all", call.Destinations(), limit)
	}
}

// A call holds at most MaxConns connections from its sandbox at once: one
// more is answered 429; once one closes, a new one is served.
func TestConnectionLimit(t *testing.T) {
	echo := startEcho(t)
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "echo.test:"+port(echo.port())), Hosts: hosts(t, "echo.test=127.0.0.1")},
		Limits: Limits{MaxConns: 2, MaxBytes: 1 << 20, Idle: time.Minute, Lifetime: time.Hour}}, nil, nil)
	call := p.NewCall("c1")
	relay := relayFor(t, call)
	authority := "echo.test:" + port(echo.port())

	var open []net.Conn
	for range 2 {
		resp, conn := connectVia(t, relay, authority)
		if resp.StatusCode != 200 {
			t.Fatalf("CONNECT within the limit: %s", refusedBody(resp))
		}
		open = append(open, conn)
	}
	resp, _ := connectVia(t, relay, authority)
	if msg := refusedBody(resp); resp.StatusCode != http.StatusTooManyRequests || !strings.Contains(msg, "2 egress connections open, its limit") {
		t.Errorf("a third connection: %s, want 429 naming the limit", msg)
	}
	for _, conn := range open {
		conn.Close()
	}
	testenv.EventuallyWithin(t, time.Minute, "closed tunnels to free their places", func() bool {
		resp, conn := connectVia(t, relay, authority)
		if conn != nil {
			conn.Close()
		}
		return resp.StatusCode == 200
	})

	// Connections to the proxy count too, even before they ask for
	// anything: code cannot hold hundreds of them open.
	for range 2 {
		idle, err := net.Dial("tcp", relay)
		if err != nil {
			t.Fatal(err)
		}
		defer idle.Close()
	}
	testenv.EventuallyWithin(t, time.Minute, "two idle connections to be served", func() bool {
		call.mu.Lock()
		defer call.mu.Unlock()
		return call.clients == 2
	})
	resp, _ = connectVia(t, relay, authority)
	if msg := refusedBody(resp); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("a connection past two idle ones: %s, want 429", msg)
	}
}

// Close ends every live connection of the call at once, the code's and
// the host's, and Serve returns; a connection handed to a closed call is
// closed unserved.
func TestCloseTearsDownLiveConnections(t *testing.T) {
	echo := startEcho(t)
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "echo.test:"+port(echo.port())), Hosts: hosts(t, "echo.test=127.0.0.1")}}, nil, nil)
	call := p.NewCall("c1")
	client, server := net.Pipe()
	served := make(chan struct{})
	go func() { call.Serve(t.Context(), server); close(served) }()
	fmt.Fprintf(client, "CONNECT echo.test:%d HTTP/1.1\r\nHost: x\r\n\r\n", echo.port())
	buf := make([]byte, len("HTTP/1.1 200 Connection established\r\n\r\n"))
	if _, err := io.ReadFull(client, buf); err != nil || !strings.HasPrefix(string(buf), "HTTP/1.1 200") {
		t.Fatalf("CONNECT: %q %v", buf, err)
	}
	go client.Write([]byte("live"))
	if _, err := io.ReadFull(client, buf[:4]); err != nil || string(buf[:4]) != "live" {
		t.Fatalf("the tunnel does not carry bytes: %q %v", buf[:4], err)
	}

	call.Close()
	client.SetDeadline(time.Now().Add(10 * time.Second))
	if n, err := client.Read(buf); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Errorf("after Close the code's connection read %d bytes, err %v: want it closed", n, err)
	}
	select {
	case <-echo.closed:
	case <-time.After(10 * time.Second):
		t.Error("the host's connection outlived the call")
	}
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Error("Serve did not return after Close")
	}
	late, lateServer := net.Pipe()
	go call.Serve(t.Context(), lateServer)
	late.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := late.Read(buf); err != io.EOF && (err == nil || strings.Contains(err.Error(), "timeout")) {
		t.Errorf("a connection after Close: read err %v, want it closed unserved", err)
	}
}

// A tunnel with no byte either way for Idle is closed; one that keeps
// talking lives on, until Lifetime.
func TestIdleAndLifetimeBounds(t *testing.T) {
	echo := startEcho(t)
	const idle, lifetime = 500 * time.Millisecond, 3 * time.Second
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "echo.test:"+port(echo.port())), Hosts: hosts(t, "echo.test=127.0.0.1")},
		Limits: Limits{MaxConns: 4, MaxBytes: 1 << 20, Idle: idle, Lifetime: lifetime}}, nil, nil)
	relay := relayFor(t, p.NewCall("c1"))
	authority := "echo.test:" + port(echo.port())

	_, quiet := connectVia(t, relay, authority)
	start := time.Now()
	quiet.SetDeadline(time.Now().Add(time.Minute))
	if _, err := quiet.Read(make([]byte, 1)); err == nil {
		t.Fatal("a quiet tunnel read a byte")
	}
	if d := time.Since(start); d < idle || d > lifetime {
		t.Errorf("a quiet tunnel closed after %v, want after the idle bound %v, before the lifetime %v", d, idle, lifetime)
	}

	_, busy := connectVia(t, relay, authority)
	start = time.Now()
	buf := make([]byte, 4)
	var err error
	for err == nil && time.Since(start) < lifetime+10*time.Second {
		time.Sleep(idle / 10)
		if _, err = busy.Write([]byte("ping")); err == nil {
			_, err = io.ReadFull(busy, buf)
		}
	}
	if d := time.Since(start); d < lifetime-time.Second || d > lifetime+10*time.Second {
		t.Errorf("a busy tunnel ended after %v (%v), want at its lifetime, %v", d, err, lifetime)
	}
}

// Code asking for endless distinct names cannot grow the call's record
// past its bound: the rest are counted.
func TestDestinationsBounded(t *testing.T) {
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "pypi.org")}}, nil, nil)
	call := p.NewCall("c1")
	relay := relayFor(t, call)
	client := proxyClient(relay, nil)
	for i := range maxDestinations + 20 {
		resp, err := client.Get(fmt.Sprintf("http://h%d.test/", i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	call.Close()
	if n, o := len(call.Destinations()), call.Omitted(); n != maxDestinations || o != 20 {
		t.Errorf("%d destinations kept, %d omitted; want %d and 20", n, o, maxDestinations)
	}
}

// The hooks get each destination once, as the call closes.
func TestAuditAndMetricsHooks(t *testing.T) {
	echo := startEcho(t)
	var audited []string
	var measured []Destination
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "echo.test:"+port(echo.port())), Hosts: hosts(t, "echo.test=127.0.0.1")},
		Audit: func(call string, d Destination) {
			audited = append(audited, fmt.Sprintf("%s %s %v", call, d.Host, d.Allowed))
		},
		Metrics: func(d Destination) { measured = append(measured, d) }}, nil, nil)
	call := p.NewCall("call-7")
	relay := relayFor(t, call)
	for range 2 {
		_, conn := connectVia(t, relay, "echo.test:"+port(echo.port()))
		conn.Write([]byte("x"))
		io.ReadFull(conn, make([]byte, 1))
		conn.Close()
	}
	connectVia(t, relay, "other.test:443")
	if len(audited) != 0 {
		t.Errorf("audited before the call closed: %v", audited)
	}
	call.Close()
	call.Close()
	if want := "call-7 echo.test true,call-7 other.test false"; strings.Join(audited, ",") != want {
		t.Errorf("audited %q, want %q", strings.Join(audited, ","), want)
	}
	if len(measured) != 2 || measured[0].BytesOut != 2 || measured[0].BytesIn != 2 {
		t.Errorf("metrics got %+v, want echo.test with 2 bytes each way, then other.test", measured)
	}
}

// Two calls share no connection: each reaches the host on its own, counts
// only its own bytes, and one closing leaves the other's tunnel alive.
func TestCallsShareNothing(t *testing.T) {
	var conns atomic.Int32
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				conns.Add(1)
			}
		}}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	up := ln.Addr().(*net.TCPAddr).Port
	echo := startEcho(t)
	p := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, fmt.Sprintf("web.test:%d,echo.test:%d", up, echo.port())),
		Hosts: hosts(t, "web.test=127.0.0.1,echo.test=127.0.0.1")}}, nil, nil)
	a, b := p.NewCall("a"), p.NewCall("b")
	relayA, relayB := relayFor(t, a), relayFor(t, b)
	for _, relay := range []string{relayA, relayB, relayA} {
		resp, err := proxyClient(relay, nil).Get(fmt.Sprintf("http://web.test:%d/", up))
		if err != nil {
			t.Fatal(err)
		}
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	if n := conns.Load(); n < 2 {
		t.Errorf("the host saw %d connections for two calls, want one each at least", n)
	}
	_, tunnelB := connectVia(t, relayB, "echo.test:"+port(echo.port()))
	a.Close()
	tunnelB.SetDeadline(time.Now().Add(time.Minute))
	go tunnelB.Write([]byte("still"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(tunnelB, buf); err != nil || string(buf) != "still" {
		t.Errorf("call b's tunnel after call a closed: %q %v", buf, err)
	}
	da, _ := destination(a.Destinations(), "web.test", true)
	db, _ := destination(b.Destinations(), "web.test", true)
	if da.BytesIn == 0 || db.BytesIn == 0 || da.BytesIn <= db.BytesIn {
		t.Errorf("bytes in: call a %d (two requests), call b %d (one): want each its own", da.BytesIn, db.BytesIn)
	}
}
