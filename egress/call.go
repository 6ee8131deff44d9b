package egress

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"sync"
	"time"
)

// Destination is one host:port a call asked for, and what went each way.
// A host reached and later refused (a limit) is two destinations.
type Destination struct {
	Host string `json:"host"`
	Port int    `json:"port"`
	// BytesOut and BytesIn are what went to and came from the host,
	// counted on the proxy's connections to it (TLS included).
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	Allowed  bool  `json:"allowed"`
	// Refused says why, when not Allowed.
	Refused string `json:"refused,omitempty"`
}

// maxDestinations bounds what a call's record holds: code asking for a
// million names must not grow the server's memory. Past it, destinations
// are counted in Omitted only.
const maxDestinations = 256

// closeWait bounds how long Close waits for a call's handlers to return
// once their connections are closed: they have nothing left to block on,
// so reaching it means a bug, which is logged.
const closeWait = 10 * time.Second

type destKey struct {
	host    string
	port    uint16
	allowed bool
}

// Call is one call's use of the proxy: its connections, its counters and
// its bounds. Close ends every connection of it.
type Call struct {
	p         *Proxy
	id        string
	ctx       context.Context // done when the call closes: cancels dials and lookups
	cancel    context.CancelFunc
	transport *http.Transport // absolute-URI requests, kept alive per host
	forwarder *httputil.ReverseProxy
	closeOnce sync.Once

	mu        sync.Mutex
	closed    bool
	conns     map[*trackedConn]struct{}
	clients   int   // connections from the sandbox open now
	upstreams int   // connections to hosts open now
	used      int64 // bytes moved upstream, or reserved by a read or write in flight
	dests     []*Destination
	index     map[destKey]*Destination
	omitted   int
	wg        sync.WaitGroup // Serve and the handlers, which Close waits for
}

func newCall(p *Proxy, id string) *Call {
	c := &Call{p: p, id: id, conns: map[*trackedConn]struct{}{}, index: map[destKey]*Destination{}}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.transport = c.newTransport()
	c.forwarder = c.newForwarder()
	return c
}

// Serve serves one connection the sandbox opened to its relay, and
// returns when that connection is closed: by the code, by a bound, by ctx
// or by Close.
func (c *Call) Serve(ctx context.Context, conn net.Conn) {
	if !c.enter() {
		conn.Close()
		return
	}
	defer c.leave()
	sc, over := c.trackClient(conn)
	if sc == nil {
		return
	}
	stop := context.AfterFunc(ctx, func() { sc.Close() })
	defer stop()
	serveConn(c.p.httpServer(c.frontHandler(sc, over)), sc, sc.done)
}

// enter admits a goroutine that Close must wait for, unless the call is
// closed.
func (c *Call) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

func (c *Call) leave() { c.wg.Done() }

// Close closes every connection of the call, waits for its handlers, and
// reports each destination to the audit and metrics hooks. Later
// connections are refused. Calling it again waits for the first.
func (c *Call) Close() {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		conns := c.closeLocked()
		c.mu.Unlock()
		for _, conn := range conns {
			conn.Close()
		}
		c.cancel()
		c.transport.CloseIdleConnections()
		done := make(chan struct{})
		go func() { c.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(closeWait):
			c.p.log.Error("egress: a call's handlers did not return after its connections were closed", "call", c.id)
		}
		c.p.forget(c)
		c.report()
	})
}

// closeLocked marks the call closed and returns its connections.
func (c *Call) closeLocked() []*trackedConn {
	c.closed = true
	conns := make([]*trackedConn, 0, len(c.conns))
	for conn := range c.conns {
		conns = append(conns, conn)
	}
	return conns
}

func (c *Call) report() {
	for _, d := range c.Destinations() {
		if c.p.cfg.Audit != nil {
			c.p.cfg.Audit(c.id, d)
		}
		if c.p.cfg.Metrics != nil {
			c.p.cfg.Metrics(d)
		}
	}
}

// Destinations returns what the call asked for so far, in the order
// first asked; after Close, all of it.
func (c *Call) Destinations() []Destination {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Destination, len(c.dests))
	for i, d := range c.dests {
		out[i] = *d
	}
	return out
}

// Omitted is how many destinations past maxDestinations were not kept.
func (c *Call) Omitted() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.omitted
}

// record notes that the call asked for t, reached or refused (ref), and
// returns the destination its bytes count into (nil past the bound).
func (c *Call) record(t target, ref *refusal) *Destination {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recordLocked(t, ref)
}

func (c *Call) recordLocked(t target, ref *refusal) *Destination {
	k := destKey{t.host, t.port, ref == nil}
	if d, ok := c.index[k]; ok {
		return d
	}
	if len(c.dests) >= maxDestinations {
		c.omitted++
		return nil
	}
	d := &Destination{Host: t.host, Port: int(t.port), Allowed: ref == nil}
	if ref != nil {
		d.Refused = ref.short
	}
	c.dests = append(c.dests, d)
	c.index[k] = d
	return d
}

// reserve claims up to want bytes of the call's budget for one read or
// write; settle returns what it did not move and counts what it did.
// Reserving first keeps the total within MaxBytes even with reads and
// writes in flight on many connections at once.
func (c *Call) reserve(want int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := int(min(int64(want), c.p.cfg.Limits.MaxBytes-c.used))
	if n < 0 {
		n = 0
	}
	c.used += int64(n)
	return n
}

func (c *Call) settle(d *Destination, reserved, moved int, in bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.used -= int64(reserved - moved)
	if d == nil {
		return
	}
	if in {
		d.BytesIn += int64(moved)
	} else {
		d.BytesOut += int64(moved)
	}
}

// trackClient takes a connection from the sandbox under the call's
// watch; over says it is past MaxConns, to be answered 429 and closed.
func (c *Call) trackClient(conn net.Conn) (_ *trackedConn, over bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		conn.Close()
		return nil, false
	}
	c.clients++
	tc := c.trackLocked(conn, nil, false)
	return tc, c.clients > c.p.cfg.Limits.MaxConns
}

// trackUpstream takes a connection to a host under the call's watch and
// budget, or closes it and refuses when the call is closed or at a bound.
func (c *Call) trackUpstream(conn net.Conn, t target) (net.Conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ref := c.upstreamBoundLocked(t); ref != nil {
		conn.Close()
		c.recordLocked(t, ref)
		return nil, ref
	}
	c.upstreams++
	return c.trackLocked(conn, c.recordLocked(t, nil), true), nil
}

// upstreamBoundLocked refuses a new upstream connection when the call is
// closed, has MaxConns open, or has used its bytes.
func (c *Call) upstreamBoundLocked(t target) *refusal {
	switch {
	case c.closed:
		return errCallClosed(t)
	case c.upstreams >= c.p.cfg.Limits.MaxConns:
		return tooManyConns(t, c.p.cfg.Limits.MaxConns)
	case c.used >= c.p.cfg.Limits.MaxBytes:
		return byteLimit(t, c.p.cfg.Limits.MaxBytes)
	}
	return nil
}

func (c *Call) trackLocked(conn net.Conn, d *Destination, upstream bool) *trackedConn {
	tc := &trackedConn{Conn: conn, call: c, dest: d, upstream: upstream, done: make(chan struct{})}
	tc.touch()
	c.conns[tc] = struct{}{}
	tc.watch(c.p.cfg.Limits.Idle, c.p.cfg.Limits.Lifetime)
	return tc
}

// untrack forgets a closed connection.
func (c *Call) untrack(tc *trackedConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.conns, tc)
	if tc.upstream {
		c.upstreams--
	} else {
		c.clients--
	}
}

// bind returns ctx, also done when the call closes.
func (c *Call) bind(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(c.ctx, cancel)
	return ctx, func() { stop(); cancel() }
}
