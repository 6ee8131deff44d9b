package egress

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// trackedConn is a connection of a call, from its sandbox or to a host:
// closed with the call, after Idle without a byte or Lifetime in all;
// one to a host also counts its bytes into its destination and the
// call's budget.
type trackedConn struct {
	net.Conn
	call     *Call
	dest     *Destination // nil: a connection from the sandbox
	upstream bool
	last     atomic.Int64 // unix nanoseconds of the last byte either way
	once     sync.Once
	done     chan struct{} // closed once the connection is
	mu       sync.Mutex
	idle     *time.Timer
	life     *time.Timer
}

// errByteLimit ends a connection whose call has used its bytes.
var errByteLimit = errors.New("the call's egress byte limit is reached")

func (c *trackedConn) Read(b []byte) (int, error) {
	if !c.upstream {
		n, err := c.Conn.Read(b)
		c.moved(n)
		return n, err
	}
	k := c.call.reserve(len(b))
	if k == 0 && len(b) > 0 {
		c.Close()
		return 0, errByteLimit
	}
	n, err := c.Conn.Read(b[:k])
	c.call.settle(c.dest, k, n, true)
	c.moved(n)
	return n, err
}

func (c *trackedConn) Write(b []byte) (int, error) {
	if !c.upstream {
		n, err := c.Conn.Write(b)
		c.moved(n)
		return n, err
	}
	k := c.call.reserve(len(b))
	n, err := c.Conn.Write(b[:k])
	c.call.settle(c.dest, k, n, false)
	c.moved(n)
	if err == nil && k < len(b) {
		c.Close()
		return n, errByteLimit
	}
	return n, err
}

func (c *trackedConn) moved(n int) {
	if n > 0 {
		c.touch()
	}
}

func (c *trackedConn) touch() { c.last.Store(time.Now().UnixNano()) }

// watch arms the idle and lifetime bounds. The idle timer wakes once per
// Idle and closes the connection if no byte moved since the last wake:
// cheaper than a deadline reset on every read and write, and it covers
// both directions of a tunnel at once.
func (c *trackedConn) watch(idle, lifetime time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.life = time.AfterFunc(lifetime, func() { c.Close() })
	var check func()
	check = func() {
		quiet := time.Since(time.Unix(0, c.last.Load()))
		if quiet >= idle {
			c.Close()
			return
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.idle != nil {
			c.idle.Reset(idle - quiet)
		}
	}
	c.idle = time.AfterFunc(idle, check)
}

func (c *trackedConn) Close() error {
	err := net.ErrClosed
	c.once.Do(func() {
		err = c.Conn.Close()
		c.mu.Lock()
		c.life.Stop()
		c.idle.Stop()
		c.idle = nil
		c.mu.Unlock()
		c.call.untrack(c)
		close(c.done)
	})
	return err
}

// CloseWrite half-closes, when the underlying connection can: a tunnel
// passes on the end of one direction and keeps the other.
func (c *trackedConn) CloseWrite() error { return closeWrite(c.Conn) }

func closeWrite(conn net.Conn) error {
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// serveConn serves one connection with srv and returns once done is
// closed: when the connection is, however that happens.
func serveConn(srv *http.Server, conn net.Conn, done <-chan struct{}) {
	_ = srv.Serve(&oneConnListener{conn: conn, done: done})
	<-done
}

// oneConnListener hands http.Server one connection, then blocks the next
// Accept until that connection is closed, so that Serve returns with it.
type oneConnListener struct {
	conn  net.Conn
	done  <-chan struct{}
	taken atomic.Bool
}

func (l *oneConnListener) Accept() (net.Conn, error) {
	if l.taken.CompareAndSwap(false, true) {
		return l.conn, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

// Close does not close the connection: http.Server closes its listener
// as Serve returns, and the connection lives on while hijacked.
func (l *oneConnListener) Close() error   { return nil }
func (l *oneConnListener) Addr() net.Addr { return l.conn.LocalAddr() }

// prefixConn replays bytes a client sent before its tunnel was answered
// (the start of a TLS handshake, pipelined after CONNECT), then reads on.
type prefixConn struct {
	net.Conn
	prefix []byte
}

func (c *prefixConn) Read(b []byte) (int, error) {
	if len(c.prefix) > 0 {
		n := copy(b, c.prefix)
		c.prefix = c.prefix[n:]
		return n, nil
	}
	return c.Conn.Read(b)
}

func (c *prefixConn) CloseWrite() error { return closeWrite(c.Conn) }

// relay copies both ways between the code's side of a tunnel and the
// host's until both directions end. The host's bytes flow at once (SSH,
// SMTP and database servers speak first); the code's only once check has
// read their start and returned what to copy from, or closed the tunnel.
// The end of one direction is passed on as a half-close, as a TCP tunnel
// would; an error either way closes both.
func relay(client, up net.Conn, check func(net.Conn) (net.Conn, bool)) {
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		if _, err := io.Copy(dst, src); err != nil || closeWrite(dst) != nil {
			dst.Close()
			src.Close()
		}
	}
	wg.Add(2)
	go pipe(client, up)
	go func() {
		src, ok := check(client)
		if !ok {
			client.Close()
			up.Close()
			wg.Done()
			return
		}
		pipe(up, src)
	}()
	wg.Wait()
	client.Close()
	up.Close()
}
