package server

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sync/semaphore"
)

// maxMessageBytes bounds one incoming message (HTTP body or stdio line). It
// never rejects code or stdin the tool would accept: JSON escaping can turn
// one byte of them into six (\u0001). Files are allowed twice their size:
// base64 is 4/3, and text with quotes and newlines escaped about twice;
// text full of control characters should come as base64. The slack is for
// the envelope.
func maxMessageBytes(o Options) int64 {
	const slack = 1 * mib
	n, f := o.MaxCodeBytes+o.MaxStdinBytes, o.MaxFileBytes
	if n < 0 || f < 0 || n > (math.MaxInt64-slack)/12 || f > (math.MaxInt64-slack)/12 {
		return math.MaxInt64
	}
	return 6*n + 2*f + slack
}

// bodyBudget bounds the bytes of all HTTP request bodies the server holds
// at once: a body and what the SDK decodes from it live until the call's
// answer is sent, so without a bound a client posting many large calls at
// once would grow the server without limit. Requests beyond it wait.
func bodyBudget(o Options) int64 {
	return max(32*mib, maxMessageBytes(o))
}

// ServeHTTP serves MCP on ln over streamable HTTP at /mcp, or the legacy
// HTTP+SSE transport at /sse, until ctx is done. Then it kills the running
// calls, answers them, and returns.
func (s *Server) ServeHTTP(ctx context.Context, ln net.Listener) error {
	fo := FrontOptions{Transport: s.opts.Transport, AuthToken: s.opts.AuthToken, Version: s.opts.Version, Logger: s.log}
	if s.opts.Metrics != nil {
		fo.Metrics = s.opts.Metrics
	}
	f := NewFront(fo)
	f.Serve(ln)
	s.log.Info("serving", "transport", s.opts.Transport, "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+mcpPath(s.opts.Transport),
		"stateless", s.opts.Transport == HTTP && s.opts.Stateless)
	return s.ServeFront(ctx, f)
}

// ServeFront serves MCP behind f, which already serves its listener, until
// ctx is done or a listener fails. Then it kills the running calls, lets
// each answer its client, and closes f.
func (s *Server) ServeFront(ctx context.Context, f *Front) error {
	s.serving(ctx)
	defer s.drain()
	handler, err := s.httpHandler()
	if err != nil {
		f.Close(0)
		return err
	}
	f.attach(handler, s.Ready)
	var serveErr error
	select {
	case serveErr = <-f.errc:
	case <-ctx.Done():
	}
	// Kill and tear down the running calls; their handlers answer with an
	// error. Then close: idle connections at once, open streams (which
	// would never end by themselves) after a short grace for those answers.
	s.drain()
	f.Close(2 * time.Second)
	return serveErr
}

func mcpPath(t Transport) string {
	if t == SSE {
		return "/sse"
	}
	return "/mcp"
}

// httpHandler is the transport's MCP handler, with its bounds.
func (s *Server) httpHandler() (http.Handler, error) {
	limit := maxMessageBytes(s.opts)
	var handler http.Handler
	switch s.opts.Transport {
	case HTTP:
		live := &liveRequests{m: map[string]*liveRequest{}, stateless: s.opts.Stateless}
		srv := s.mcpServer(live.originOf)
		// The SDK's localhost DNS-rebinding protection stays on; its body
		// limit is an http.MaxBytesReader.
		handler = live.track(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
			&mcp.StreamableHTTPOptions{
				Logger:              s.opts.SDKLogger,
				MaxRequestBodyBytes: limit,
				SessionTimeout:      s.opts.SessionIdle,
				Stateless:           s.opts.Stateless,
			}))
		if !s.opts.Stateless {
			l := &sessionLimit{max: s.opts.MaxSessions, idle: s.opts.SessionIdle, next: handler, log: s.log,
				keep: s.persist.holds, last: map[string]time.Time{}, busy: map[string]int{}}
			open := l.open
			s.ops.httpSessions.Store(&open)
			handler = l
		}
	case SSE:
		// A legacy session lives exactly as long as its GET stream, so each
		// GET gets its own MCP server whose calls die with that stream.
		var streams atomic.Int64
		count := func() int { return int(streams.Load()) }
		s.ops.httpSessions.Store(&count)
		handler = mcp.NewSSEHandler(func(r *http.Request) *mcp.Server {
			streams.Add(1)
			context.AfterFunc(r.Context(), func() { streams.Add(-1) })
			o := origin{ctx: r.Context(), client: r.RemoteAddr}
			return s.mcpServer(func(*mcp.CallToolRequest) origin { return o })
		}, &mcp.SSEOptions{MaxRequestBodyBytes: limit})
	default:
		return nil, fmt.Errorf("{Transport}: %q is not an HTTP transport", s.opts.Transport)
	}
	return limitBodies(handler, limit, semaphore.NewWeighted(bodyBudget(s.opts))), nil
}

// sessionLimit keeps at most max streamable HTTP sessions open. A new one
// past it closes the session used least recently, as a DELETE from its
// client would: a client opening sessions in a loop can no longer grow the
// server, while one that uses its session keeps it.
type sessionLimit struct {
	max  int
	idle time.Duration
	next http.Handler
	log  *slog.Logger
	// keep says whether a session holds what closing it would end (its
	// persistent sessions): it is never closed to make room.
	keep func(id string) bool

	mu   sync.Mutex
	last map[string]time.Time // session → last request
	busy map[string]int       // session → its requests under way (calls)
}

func (l *sessionLimit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Mcp-Session-Id")
	if id == "" {
		// It may open a session: the SDK names it in the response.
		rec := &sessionRecorder{ResponseWriter: w, l: l, r: r}
		l.next.ServeHTTP(rec, r)
		return
	}
	l.touch(id)
	defer l.touch(id) // a long call keeps its session recent
	if r.Method == http.MethodPost {
		// A session with a call under way is never closed to make room.
		l.mu.Lock()
		l.busy[id]++
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			if l.busy[id]--; l.busy[id] <= 0 {
				delete(l.busy, id)
			}
			l.mu.Unlock()
		}()
	}
	l.next.ServeHTTP(w, r)
	if r.Method == http.MethodDelete {
		l.mu.Lock()
		delete(l.last, id)
		l.mu.Unlock()
	}
}

// open is how many sessions are open: used within the idle timeout.
func (l *sessionLimit) open() int {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, t := range l.last {
		if now.Sub(t) <= l.idle {
			n++
		}
	}
	return n
}

func (l *sessionLimit) touch(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, known := l.last[id]; known {
		l.last[id] = time.Now()
	}
}

// opened records a new session and closes the least recently used ones
// past the limit, of those it may close: none with a call under way or
// persistent sessions of its own, which another client could otherwise
// take from it by opening sessions (red team F11). When none may be
// closed, the new session is, and opened says so.
func (l *sessionLimit) opened(id string, via *http.Request) bool {
	now := time.Now()
	l.mu.Lock()
	for s, t := range l.last {
		if now.Sub(t) > l.idle {
			delete(l.last, s) // the SDK closed it already
		}
	}
	l.last[id] = now
	var victims []string
	for len(l.last) > l.max {
		oldest, at := "", now
		for s, t := range l.last {
			if s != id && l.busy[s] == 0 && (l.keep == nil || !l.keep(s)) && (t.Before(at) || oldest == "") {
				oldest, at = s, t
			}
		}
		if oldest == "" {
			oldest = id
		}
		delete(l.last, oldest)
		victims = append(victims, oldest)
	}
	l.mu.Unlock()
	for _, v := range victims {
		l.log.Info("closing the least recently used session", "session", v, "max_sessions", l.max, "the new one", v == id)
		l.close(v, via)
	}
	return len(victims) == 0 || victims[len(victims)-1] != id
}

// close closes session v as its client's DELETE would.
func (l *sessionLimit) close(v string, via *http.Request) {
	req, err := http.NewRequestWithContext(context.WithoutCancel(via.Context()), http.MethodDelete, via.URL.String(), nil)
	if err != nil {
		return
	}
	req.Header.Set("Mcp-Session-Id", v)
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Host, req.RemoteAddr = via.Host, via.RemoteAddr
	// Not on the new session's response: a DELETE waits for the old
	// session's calls to end.
	go l.next.ServeHTTP(discardResponse{}, req)
}

// sessionRecorder sees the session id the SDK gives a new session, and
// turns the answer into a refusal when no room can be made for it.
type sessionRecorder struct {
	http.ResponseWriter
	l       *sessionLimit
	r       *http.Request
	written bool
	refused bool
}

func (s *sessionRecorder) WriteHeader(code int) {
	if s.written {
		return
	}
	s.written = true
	if id := s.Header().Get("Mcp-Session-Id"); id != "" && code < 300 && !s.l.opened(id, s.r) {
		s.refused = true
		h := s.ResponseWriter.Header()
		h.Del("Mcp-Session-Id")
		h.Set("Content-Type", "text/plain; charset=utf-8")
		h.Set("Retry-After", "10")
		s.ResponseWriter.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(s.ResponseWriter, "mcp-exec: %d MCP sessions are open, each with a call under way or persistent sessions of its own (MCP_EXEC_MAX_SESSIONS=%d); try again later\n", s.l.max, s.l.max)
		return
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *sessionRecorder) Write(p []byte) (int, error) {
	if !s.written {
		s.WriteHeader(http.StatusOK)
	}
	if s.refused {
		return len(p), nil
	}
	return s.ResponseWriter.Write(p)
}

// Flush keeps streaming responses streaming.
func (s *sessionRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// discardResponse is the response writer of the server's own DELETEs.
type discardResponse struct{}

func (discardResponse) Header() http.Header         { return http.Header{} }
func (discardResponse) Write(p []byte) (int, error) { return len(p), nil }
func (discardResponse) WriteHeader(int)             {}

// limitBodies refuses a body declared over limit at once, and holds a
// request whose body would take the server's bodies over budget until
// others are done. A body of unknown length weighs the limit.
func limitBodies(next http.Handler, limit int64, budget *semaphore.Weighted) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		weight := r.ContentLength
		switch {
		case weight > limit:
			http.Error(w, fmt.Sprintf("request body is %d bytes, over the limit of %d bytes (set by MCP_EXEC_MAX_CODE_BYTES, MCP_EXEC_MAX_STDIN_BYTES and MCP_EXEC_MAX_FILE_BYTES)", weight, limit), http.StatusRequestEntityTooLarge)
			return
		case weight < 0:
			weight = limit
		}
		weight = max(weight, 1)
		if err := budget.Acquire(r.Context(), weight); err != nil {
			return // the client is gone
		}
		defer budget.Release(weight)
		next.ServeHTTP(w, r)
	})
}

// requireToken lets a request through only with the token, as
// "Authorization: Bearer TOKEN" or, for clients of mcp-exec 0.5.4, as
// "X-MCP-AUTH: TOKEN".
func requireToken(token string, next http.Handler, log *slog.Logger) http.Handler {
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !hasToken(r.Header, want) {
			log.Warn("unauthorized request", "remote", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="mcp-exec"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		// Nothing past the gate needs the token.
		r.Header.Del("Authorization")
		r.Header.Del("X-MCP-AUTH")
		next.ServeHTTP(w, r)
	})
}

func hasToken(h http.Header, want []byte) bool {
	ok := false
	if scheme, tok, found := strings.Cut(h.Get("Authorization"), " "); found && strings.EqualFold(scheme, "Bearer") {
		ok = subtle.ConstantTimeCompare([]byte(strings.TrimSpace(tok)), want) == 1
	}
	if v := h.Get("X-MCP-AUTH"); v != "" {
		ok = ok || subtle.ConstantTimeCompare([]byte(v), want) == 1
	}
	return ok
}

// callHeader carries, from the HTTP front to the tool handler, the key of
// the POST that brought a call. With stateful streamable HTTP the SDK
// (v1.8.0) cancels a call on notifications/cancelled only: not when its
// client vanishes, and a DELETE of its session even waits for it to
// finish. The handler gets the request's headers but not its context, so
// it looks its POST up by this header and dies with it.
const callHeader = "X-Mcp-Exec-Post"

// liveRequests holds the streamable HTTP POSTs in flight.
type liveRequests struct {
	mu sync.Mutex
	m  map[string]*liveRequest
	// stateless: no request's session id names a client.
	stateless bool
}

type liveRequest struct {
	ctx     context.Context
	cancel  context.CancelFunc
	session string
	remote  string
}

// track gives every POST a context that ends when its client goes, its
// response is complete, or its session is deleted.
func (l *liveRequests) track(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del(callHeader) // only we set it
		session := r.Header.Get("Mcp-Session-Id")
		switch r.Method {
		case http.MethodDelete:
			l.cancelSession(session)
		case http.MethodPost:
			key := rand.Text()
			ctx, cancel := context.WithCancel(r.Context())
			l.mu.Lock()
			l.m[key] = &liveRequest{ctx: ctx, cancel: cancel, session: session, remote: r.RemoteAddr}
			l.mu.Unlock()
			defer func() {
				l.mu.Lock()
				delete(l.m, key)
				l.mu.Unlock()
				cancel()
			}()
			r = r.WithContext(ctx)
			r.Header.Set(callHeader, key)
		}
		next.ServeHTTP(w, r)
	})
}

func (l *liveRequests) cancelSession(session string) {
	if session == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lr := range l.m {
		if lr.session == session {
			lr.cancel()
		}
	}
}

// originOf finds the POST that carried a call.
func (l *liveRequests) originOf(req *mcp.CallToolRequest) origin {
	var key string
	if req.Extra != nil && req.Extra.Header != nil {
		key = req.Extra.Header.Get(callHeader)
	}
	l.mu.Lock()
	lr := l.m[key]
	l.mu.Unlock()
	if lr == nil {
		// Its POST is over already: the client left before the call began.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return origin{ctx: ctx, client: "http"}
	}
	return origin{ctx: lr.ctx, client: lr.remote}
}
