package egress

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"
)

// On a host shared by many names (a CDN, a cloud's load balancer), the
// TLS server name, not the address, picks the site: a tunnel opened for
// an allowed name whose ClientHello names another would reach a host the
// allowlist does not list. So the proxy reads the ClientHello of each
// opaque tunnel to a name before relaying it, with crypto/tls's own
// parser, and refuses one naming another host. What the code sends
// inside the encrypted stream (an HTTP Host header) it cannot see; that
// is what the allowlist trusts an allowed host to handle.

// errHelloRead stops the handshake once the ClientHello is parsed.
var errHelloRead = errors.New("ClientHello read")

// helloTimeout bounds how long a tunnel waits for the code's first bytes.
const helloTimeout = 30 * time.Second

// serverName reads the start of a tunnel: the TLS ClientHello's server
// name when it starts with one (isTLS), and a connection that replays
// what was read. A tunnel that does not start with a TLS handshake
// record (SSH, a database protocol on an allowed port) is passed as it is.
func serverName(conn net.Conn) (name string, isTLS bool, replay net.Conn, err error) {
	conn.SetReadDeadline(time.Now().Add(helloTimeout))
	defer conn.SetReadDeadline(time.Time{})
	first := make([]byte, 1)
	if _, err := io.ReadFull(conn, first); err != nil {
		return "", false, nil, err
	}
	if first[0] != 0x16 { // not a TLS handshake record
		return "", false, &prefixConn{Conn: conn, prefix: first}, nil
	}
	var read bytes.Buffer
	peek := &helloConn{Conn: conn, r: io.MultiReader(bytes.NewReader(first), io.TeeReader(conn, &read))}
	cfg := &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, errHelloRead
	}}
	err = tls.Server(peek, cfg).Handshake()
	replay = &prefixConn{Conn: conn, prefix: append(first, read.Bytes()...)}
	if !errors.Is(err, errHelloRead) {
		return "", true, replay, fmt.Errorf("reading the TLS ClientHello: %w", err)
	}
	return name, true, replay, nil
}

// helloConn lets crypto/tls read a ClientHello and write nothing back:
// the alert it sends when the handshake is stopped is not the code's.
type helloConn struct {
	net.Conn
	r io.Reader
}

func (c *helloConn) Read(b []byte) (int, error)  { return c.r.Read(b) }
func (c *helloConn) Write(b []byte) (int, error) { return len(b), nil }
func (c *helloConn) Close() error                { return nil }

// checkServerName returns the tunnel's client side to relay, or false
// when its ClientHello names another host than t (recorded as refused)
// or cannot be read. A tunnel to an address is not checked: the operator
// allowed the address, whatever names it serves.
func (c *Call) checkServerName(client net.Conn, t target) (net.Conn, bool) {
	if isDottedQuad(t.host) || strings.Contains(t.host, ":") {
		return client, true
	}
	name, isTLS, replay, err := serverName(client)
	if err != nil {
		c.p.log.Debug("egress: a tunnel's first bytes could not be read", "call", c.id, "host", t.host, "err", err)
		return nil, false
	}
	if !isTLS || name == "" {
		return replay, true
	}
	if n, err := normalizeName(name); err != nil || n != t.host {
		ref := otherServerName(target{host: phrase(name), port: t.port}, t)
		c.record(ref.target, ref)
		c.p.log.Debug("egress: a tunnel's TLS server name is not its host", "call", c.id, "host", t.host, "server_name", name)
		return nil, false
	}
	return replay, true
}
