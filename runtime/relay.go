package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The server's side of a sandbox's egress relay (runtime/sandboxinit's
// init_relay.c): with the network allowlist on, each connection the code
// opens to the relay in its network namespace arrives as frames on the
// init's stdout, and goes on to the call's Egress as a net.Conn; what the
// Egress writes goes back as frames on the init's stdin.
//
// Why the init's standard streams rather than a descriptor per
// connection: they are the one channel every runtime already gives the
// init — a fresh container's, a fork's, the process runtime's, and
// gVisor's, where a socket of the sandbox's own network stack cannot be
// handed to the host, runsc of 2022 takes no extra descriptor, and
// descriptors do not cross its boundary in a message. The cost is a copy
// through the init, bounded by a window per connection each way.
//
// Each connection is a socket pair here: the Egress gets one end (a real
// *net.UnixConn: deadlines, half-close), and two goroutines pump the other
// to and from the frames, so that the reader of the init's stdout never
// waits for a slow Egress: it only queues, within the window the init
// keeps to.

// Egress is where a call's sandbox connections go, when the network
// allowlist is on: the server's egress proxy, for one call. The runtime
// hands it each connection the code opens to the relay, and closes it
// when the call ends (so that no connection of the call outlives it).
type Egress interface {
	Serve(ctx context.Context, conn net.Conn)
	Close()
}

// EgressDestination is one host a call's code asked the egress proxy
// for, and what went each way.
type EgressDestination struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
	Allowed  bool   `json:"allowed"`
	// Refused says why, when not Allowed.
	Refused string `json:"refused,omitempty"`
}

// NetworkUsable says whether rt can give its calls the network allowlist:
// nil, or why not (ErrUnsupported). The container runtimes always can.
func NetworkUsable(rt Runtime) error {
	if n, ok := rt.(interface{ NetworkUsable() error }); ok {
		return n.NetworkUsable()
	}
	return nil
}

// relay is one sandbox's relay, on the server's side: its connections,
// and the call they are handed to.
type relay struct {
	out *relayOut

	mu     sync.Mutex
	ctx    context.Context // the call's; nil between calls
	egress Egress          // nil between calls: connections are refused
	conns  map[uint32]*relayConn
}

func newRelay(to *os.File, wmu *sync.Mutex) *relay {
	return &relay{out: newRelayOut(to, wmu), conns: map[uint32]*relayConn{}}
}

// begin hands the connections the code opens from now on to eg, for the
// call of ctx.
func (r *relay) begin(ctx context.Context, eg Egress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctx, r.egress = ctx, eg
}

// end closes every connection of the call, which the init closes in the
// sandbox, and refuses new ones until the next call.
func (r *relay) end() {
	r.mu.Lock()
	conns := make([]*relayConn, 0, len(r.conns))
	for _, c := range r.conns {
		conns = append(conns, c)
	}
	r.ctx, r.egress = nil, nil
	r.mu.Unlock()
	for _, c := range conns {
		c.abort(true)
	}
}

// frame takes an I_NET frame from the init's stdout. It never blocks: it
// runs on the reader of the init's stdout, whose stall would stall the
// call's output and, with it, the init.
func (r *relay) frame(p []byte) {
	if len(p) < 5 {
		return
	}
	op, id, p := p[0], binary.BigEndian.Uint32(p[1:]), p[5:]
	if op == initproto.NetOpen {
		r.open(id)
		return
	}
	r.mu.Lock()
	c := r.conns[id]
	r.mu.Unlock()
	if c == nil {
		return // closed here already: a frame that crossed the close
	}
	switch op {
	case initproto.NetData:
		if !c.queue(p) {
			c.abort(true) // past the window: the init is broken
		}
	case initproto.NetAck:
		if len(p) == 4 {
			c.ack(int(binary.BigEndian.Uint32(p)))
		}
	case initproto.NetEOF:
		c.queueEOF()
	case initproto.NetClose:
		c.abort(false)
	}
}

// open takes a connection the code opened: to the call's Egress, or,
// between calls, closed at once.
func (r *relay) open(id uint32) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.egress == nil || r.conns[id] != nil {
		r.out.send(initproto.NetClose, id, nil)
		return
	}
	c, theirs, err := newRelayConn(r, id)
	if err != nil {
		r.out.send(initproto.NetClose, id, nil)
		return
	}
	r.conns[id] = c
	go r.egress.Serve(r.ctx, theirs)
	go c.pumpIn()
	go c.pumpOut()
}

func (r *relay) forget(id uint32) {
	r.mu.Lock()
	delete(r.conns, id)
	r.mu.Unlock()
}

// shutdown ends every connection: the init's stdout ended.
func (r *relay) shutdown() {
	r.end()
	r.out.stop()
}

// relayConn is one relayed connection: ours is our end of the socket pair
// whose other end the Egress has.
type relayConn struct {
	r    *relay
	id   uint32
	ours *net.UnixConn

	mu sync.Mutex
	// wakeIn and wakeOut tell pumpIn and pumpOut of a change (a frame
	// queued, an ack, the end); closed once the connection is.
	wakeIn, wakeOut chan struct{}
	in              [][]byte // from the init, not yet written to ours
	inBytes         int
	inEOF           bool
	credit          int // what we may still send the init
	inDone, outDone bool
	closed          bool
}

func newRelayConn(r *relay, id uint32) (c *relayConn, theirs net.Conn, err error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	ends := [2]net.Conn{}
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), fmt.Sprintf("relay-%d", id))
		ends[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			if i == 1 {
				ends[0].Close()
			} else {
				unix.Close(fds[1])
			}
			return nil, nil, err
		}
	}
	c = &relayConn{r: r, id: id, ours: ends[0].(*net.UnixConn), credit: initproto.NetWindow,
		wakeIn: make(chan struct{}, 1), wakeOut: make(chan struct{}, 1)}
	return c, ends[1], nil
}

// poke tells a pump of a change; c.mu is held, and c is not closed.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// queue keeps a chunk from the init for pumpIn; false: past the window.
func (c *relayConn) queue(p []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return true
	}
	if c.inEOF || c.inBytes+len(p) > initproto.NetWindow {
		return false
	}
	c.in = append(c.in, p)
	c.inBytes += len(p)
	poke(c.wakeIn)
	return true
}

func (c *relayConn) queueEOF() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.inEOF = true
		poke(c.wakeIn)
	}
}

func (c *relayConn) ack(n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.credit = min(c.credit+n, initproto.NetWindow)
		poke(c.wakeOut)
	}
}

// pumpIn writes what the code sent to the Egress, and acknowledges it to
// the init as it goes; the code's end of writes becomes a half-close.
func (c *relayConn) pumpIn() {
	for {
		c.mu.Lock()
		for len(c.in) == 0 && !c.inEOF && !c.closed {
			c.mu.Unlock()
			<-c.wakeIn
			c.mu.Lock()
		}
		if c.closed {
			c.mu.Unlock()
			return
		}
		if len(c.in) == 0 { // the code ended its writes
			c.mu.Unlock()
			if c.ours.CloseWrite() != nil {
				c.abort(true)
				return
			}
			c.finish(&c.inDone)
			return
		}
		p := c.in[0]
		c.in = c.in[1:]
		c.inBytes -= len(p)
		c.mu.Unlock()
		if _, err := c.ours.Write(p); err != nil {
			c.abort(true) // the Egress closed its end
			return
		}
		c.r.out.send(initproto.NetAck, c.id, binary.BigEndian.AppendUint32(nil, uint32(len(p))))
	}
}

// pumpOut sends what the Egress writes to the init, within the window;
// the Egress's end of writes becomes a half-close of the code's socket.
func (c *relayConn) pumpOut() {
	buf := make([]byte, initproto.NetChunk)
	for {
		c.mu.Lock()
		for c.credit == 0 && !c.closed {
			c.mu.Unlock()
			<-c.wakeOut
			c.mu.Lock()
		}
		closed, room := c.closed, min(c.credit, len(buf))
		c.mu.Unlock()
		if closed {
			return
		}
		n, err := c.ours.Read(buf[:room])
		if n > 0 {
			c.mu.Lock()
			c.credit -= n
			c.mu.Unlock()
			c.r.out.send(initproto.NetData, c.id, buf[:n])
		}
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			c.r.out.send(initproto.NetEOF, c.id, nil)
			c.finish(&c.outDone)
			return
		}
	}
}

// finish marks one way done; with both, the connection is over.
func (c *relayConn) finish(way *bool) {
	c.mu.Lock()
	*way = true
	both := c.inDone && c.outDone
	c.mu.Unlock()
	if both {
		c.abort(true)
	}
}

// abort closes the connection; tell: the init must hear of it.
func (c *relayConn) abort(tell bool) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.in, c.inBytes = nil, 0
	close(c.wakeIn)
	close(c.wakeOut)
	c.mu.Unlock()
	c.r.forget(c.id)
	if tell {
		c.r.out.send(initproto.NetClose, c.id, nil)
	}
	c.ours.Close()
}

// relayOut writes the relay's frames to the init's stdin, in order, from
// a goroutine of its own: queuing never blocks, so the reader of the
// init's stdout can answer (a close, an ack) without waiting for the
// init to read.
type relayOut struct {
	to  *os.File
	wmu *sync.Mutex // the initConn's: each frame is written whole

	mu      sync.Mutex
	queue   [][]byte
	wake    chan struct{}
	running bool
	stopped bool
}

func newRelayOut(to *os.File, wmu *sync.Mutex) *relayOut {
	return &relayOut{to: to, wmu: wmu, wake: make(chan struct{}, 1)}
}

func (o *relayOut) send(op byte, id uint32, data []byte) {
	p := make([]byte, 0, 5+len(data))
	p = append(p, op)
	p = binary.BigEndian.AppendUint32(p, id)
	p = append(p, data...)
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.stopped {
		return
	}
	o.queue = append(o.queue, frame(initproto.HNet, p))
	if !o.running {
		o.running = true
		go o.write()
	}
}

// write writes what is queued and returns once nothing is; a write that
// fails (the init is gone) drops the rest.
func (o *relayOut) write() {
	for {
		o.mu.Lock()
		q := o.queue
		o.queue = nil
		if len(q) == 0 {
			o.running = false
			o.mu.Unlock()
			return
		}
		o.mu.Unlock()
		o.wmu.Lock()
		var err error
		for _, f := range q {
			if err == nil {
				_, err = o.to.Write(f)
			}
		}
		o.wmu.Unlock()
		if err != nil {
			o.stop()
		}
	}
}

func (o *relayOut) stop() {
	o.mu.Lock()
	o.stopped, o.queue = true, nil
	o.mu.Unlock()
}
