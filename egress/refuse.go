package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// This file holds what the proxy answers the code when it does not
// connect it: the messages leave the process, so, like the server's
// messages to a caller, they name the operator's variables directly.

// refusal is a destination the proxy will not connect the code to, and
// why: short for the call's record, long for the code.
type refusal struct {
	status int // 403, or 429 for a call's bounds
	target target
	short  string
	long   string
}

func (r *refusal) Error() string {
	return fmt.Sprintf("mcp-exec egress refused %s: %s", r.target, r.long)
}

// maxListed bounds how much of the allowlist a refusal shows.
const maxListed = 12

func notAllowed(t target, allow []Rule) *refusal {
	listed := make([]string, 0, min(len(allow), maxListed))
	for i, r := range allow {
		if i == maxListed {
			listed = append(listed, fmt.Sprintf("and %d more", len(allow)-maxListed))
			break
		}
		listed = append(listed, r.String())
	}
	return &refusal{status: http.StatusForbidden, target: t, short: "not in MCP_EXEC_EGRESS_ALLOW",
		long: fmt.Sprintf("%s is not in MCP_EXEC_EGRESS_ALLOW, the hosts this server lets code reach (%s; a host without a port is on 443 and 80)",
			t, strings.Join(listed, ", "))}
}

func deniedBy(t target, rule Rule) *refusal {
	return &refusal{status: http.StatusForbidden, target: t, short: "denied by MCP_EXEC_EGRESS_DENY",
		long: fmt.Sprintf("%s is denied by MCP_EXEC_EGRESS_DENY (%s)", t, rule)}
}

func addressRefused(t target, r resolved) *refusal {
	what := fmt.Sprintf("%s resolves to %s, %s", t.host, r.refused, r.class)
	if t.host == r.refused.String() {
		what = fmt.Sprintf("%s is %s", t.host, r.class)
	}
	return &refusal{status: http.StatusForbidden, target: t, short: "address " + r.refused.String() + " refused",
		long: what + ": the proxy never connects code to loopback, private, link-local, metadata or other special addresses, " +
			"unless the operator maps the name to the address with MCP_EXEC_EGRESS_HOSTS"}
}

func secretOverHTTP(t target) *refusal {
	return &refusal{status: http.StatusForbidden, target: t, short: "credentials are sent over https only",
		long: fmt.Sprintf("the proxy adds credentials to requests for %s (MCP_EXEC_EGRESS_SECRETS_FILE) and sends them over https only: use https://%s/", t.host, t.host)}
}

func tooManyConns(t target, n int) *refusal {
	return &refusal{status: http.StatusTooManyRequests, target: t, short: "connection limit",
		long: fmt.Sprintf("this call has %d egress connections open, its limit: close some first", n)}
}

func byteLimit(t target, n int64) *refusal {
	return &refusal{status: http.StatusTooManyRequests, target: t, short: "byte limit",
		long: fmt.Sprintf("this call sent and received %d bytes through the egress proxy, its limit", n)}
}

// otherServerName is a tunnel opened for t whose TLS ClientHello named
// another host (name): its connection is closed, as the tunnel is
// already open and can carry no answer.
func otherServerName(name, t target) *refusal {
	return &refusal{status: http.StatusForbidden, target: name, short: "named in the TLS ClientHello of a tunnel to " + t.host,
		long: fmt.Sprintf("a tunnel opened for %s named %s in its TLS ClientHello; the proxy closed it", t, name.host)}
}

func errCallClosed(t target) *refusal {
	return &refusal{status: http.StatusServiceUnavailable, target: t, short: "call ended", long: "the call has ended"}
}

// writeRefusal answers with the refusal in the status line as well as
// the body: for a CONNECT, Python's http.client (urllib, requests, pip)
// shows only the status line ("Tunnel connection failed: 403 …"), and
// for a plain request urllib's HTTPError shows it too. Then it closes the
// connection: the client asks again on a new one.
func writeRefusal(w http.ResponseWriter, r *refusal) {
	writeRaw(w, r.status, r.Error())
}

// writeUpstreamError answers a request the proxy could not carry to an
// allowed host: a refusal, or the host unreachable (502) or too slow
// (504). After Close there is no one to answer.
func writeUpstreamError(w http.ResponseWriter, t target, err error) {
	var ref *refusal
	var ne net.Error
	switch {
	case errors.As(err, &ref):
		writeRefusal(w, ref)
	case errors.Is(err, context.Canceled):
	case errors.As(err, &ne) && ne.Timeout():
		writeRaw(w, http.StatusGatewayTimeout, fmt.Sprintf("mcp-exec egress: %s did not answer in time: %v", t, err))
	default:
		writeRaw(w, http.StatusBadGateway, fmt.Sprintf("mcp-exec egress: cannot reach %s: %v", t, err))
	}
}

func badRequest(w http.ResponseWriter, msg string) {
	writeRaw(w, http.StatusBadRequest, "mcp-exec egress: "+msg)
}

// writeRaw writes a whole response whose reason phrase carries msg, on
// the hijacked connection; where it cannot hijack, an ordinary one.
func writeRaw(w http.ResponseWriter, status int, msg string) {
	reason := http.StatusText(status) + " (" + phrase(msg) + ")"
	body := msg + "\n"
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Connection", "close")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %s\r\nConnection: close\r\n\r\n%s",
		status, reason, strconv.Itoa(len(body)), body)
	brw.Flush()
}

// phrase makes msg fit a reason phrase: one line of printable ASCII.
func phrase(msg string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return '?'
		}
		return r
	}, msg)
}

// untrustedUpstream is a host with secrets whose certificate the proxy
// could not verify: it gets no request, so never the secrets.
func untrustedUpstream(t target, err error) error {
	return fmt.Errorf("verifying %s's TLS certificate against the system's CAs and MCP_EXEC_EGRESS_CA_FILE's: %w", t, err)
}
