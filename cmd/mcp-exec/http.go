package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxMessageBytes bounds one incoming message (HTTP body or stdio line). It
// never rejects a stdin the tool would accept: JSON escaping can turn one
// byte into six (\u0000). The 4 MiB on top are for the code and the
// envelope.
func maxMessageBytes(cfg config) int64 {
	const slack = 4 * mib
	if cfg.MaxStdinBytes > (math.MaxInt64-slack)/6 {
		return math.MaxInt64
	}
	return 6*cfg.MaxStdinBytes + slack
}

// serveHTTP serves MCP on ln over streamable HTTP at /mcp, or the legacy
// HTTP+SSE transport at /sse, until ctx is done.
func serveHTTP(ctx context.Context, ln net.Listener, cfg config, s *execServer, log, sdkLog *slog.Logger) error {
	limit := maxMessageBytes(cfg)
	var path string
	var handler http.Handler
	switch cfg.Transport {
	case "http":
		path = "/mcp"
		live := &liveRequests{m: map[string]*liveRequest{}}
		srv := s.mcpServer(live.originOf, sdkLog)
		// The SDK's localhost DNS-rebinding protection stays on; its body
		// limit is an http.MaxBytesReader.
		handler = live.track(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
			&mcp.StreamableHTTPOptions{Logger: sdkLog, MaxRequestBodyBytes: limit}))
	case "sse":
		path = "/sse"
		// A legacy session lives exactly as long as its GET stream, so each
		// GET gets its own MCP server whose calls die with that stream.
		handler = mcp.NewSSEHandler(func(r *http.Request) *mcp.Server {
			o := origin{ctx: r.Context(), client: r.RemoteAddr}
			return s.mcpServer(func(*mcp.CallToolRequest) origin { return o }, sdkLog)
		}, &mcp.SSEOptions{MaxRequestBodyBytes: limit})
	default:
		return fmt.Errorf("MCP_EXEC_TRANSPORT: unknown transport %q", cfg.Transport)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})
	mux.Handle(path, requireToken(cfg.AuthToken, handler, log))
	hs := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		// Bodies are read at once; the deadline is lifted when a body is
		// done, so long SSE responses are not cut. No WriteTimeout for them.
		ReadTimeout:    time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		// Requests outlive the signal: a shutdown first kills the running
		// calls (through the exec server's root context), lets each answer
		// its client with an error, and only then closes connections.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("serving", "transport", cfg.Transport, "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+path)

	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Kill and tear down the running calls; their handlers answer with an
	// error. Then close: idle connections at once, open streams (which
	// would never end by themselves) after a short grace for those answers.
	s.drain()
	shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := hs.Shutdown(shutdownCtx); err != nil {
		hs.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
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
