package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Front is the HTTP face of a server from the moment its port is bound,
// before the sandbox is up: GET /healthz, /readyz, /version and /metrics
// answer at once, and MCP requests wait until a Server serves behind it
// (ServeFront), as they waited in the listen backlog before. A Kubernetes
// probe thus sees a live server that is not ready yet while the rootfs is
// built and proved, rather than a port that does not answer.
//
// It serves a main listener (the HTTP transports: MCP at /mcp or /sse,
// and /metrics, behind the token) and, when asked, an operations listener
// of its own (health, readiness, version and metrics, without the token:
// for a private address, and for stdio servers, which have no other).
type Front struct {
	opts FrontOptions
	log  *slog.Logger

	mu       sync.Mutex
	mcp      http.Handler // the transport's, once a Server serves
	ready    func() error // the attached server's readiness
	attached chan struct{}
	stopped  chan struct{}
	servers  []*http.Server
	serving  sync.WaitGroup
	errc     chan error // the first listener that failed
}

// FrontOptions configure a Front.
type FrontOptions struct {
	// Transport is the main listener's: HTTP serves MCP at /mcp, SSE at
	// /sse; Stdio has no main listener.
	Transport Transport
	// AuthToken guards MCP and, on the main listener, /metrics.
	AuthToken string
	// Version is what /version reports.
	Version string
	// Metrics, when not nil, is served at /metrics: on the operations
	// listener when there is one (MetricsApart), else on the main one.
	Metrics      prometheus.Gatherer
	MetricsApart bool
	Logger       *slog.Logger
}

// NewFront returns a Front that serves nothing yet.
func NewFront(o FrontOptions) *Front {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Front{opts: o, log: o.Logger, attached: make(chan struct{}), stopped: make(chan struct{}), errc: make(chan error, 2)}
}

// Serve starts serving the main listener: the transport's MCP path behind
// the token, the health endpoints, and /metrics behind the token unless
// it is served apart. It returns at once.
func (f *Front) Serve(ln net.Listener) {
	var metrics http.Handler
	if !f.opts.MetricsApart {
		metrics = f.metricsHandler(true)
	}
	mux := f.opsMux(metrics)
	path := "/mcp"
	if f.opts.Transport == SSE {
		path = "/sse"
	}
	mux.Handle(path, requireToken(f.opts.AuthToken, http.HandlerFunc(f.serveMCP), f.log))
	f.start(ln, mux)
}

// ServeOps starts serving the operations listener: health, readiness,
// version and metrics, without the token. It returns at once.
func (f *Front) ServeOps(ln net.Listener) {
	f.start(ln, f.opsMux(f.metricsHandler(false)))
}

// metricsHandler serves the metrics, behind the token when guarded; nil
// when there are none.
func (f *Front) metricsHandler(guarded bool) http.Handler {
	if f.opts.Metrics == nil {
		return nil
	}
	var h http.Handler = promhttp.HandlerFor(f.opts.Metrics, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(f.log.Handler(), slog.LevelWarn), ErrorHandling: promhttp.ContinueOnError})
	if guarded {
		h = requireToken(f.opts.AuthToken, h, f.log)
	}
	return h
}

// opsMux routes the operations endpoints, and metrics at /metrics when
// not nil.
func (f *Front) opsMux(metrics http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
	})
	mux.HandleFunc("GET /readyz", f.serveReady)
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]string{"version": f.opts.Version, "go": goruntime.Version()})
	})
	if metrics != nil {
		mux.Handle("GET /metrics", metrics)
	}
	return mux
}

func (f *Front) start(ln net.Listener, h http.Handler) {
	hs := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		// Bodies are read at once; the deadline is lifted when a body is
		// done, so long SSE responses are not cut. No WriteTimeout for them.
		ReadTimeout:    time.Minute,
		IdleTimeout:    2 * time.Minute,
		MaxHeaderBytes: 64 << 10,
		ErrorLog:       slog.NewLogLogger(f.log.Handler(), slog.LevelWarn),
	}
	f.mu.Lock()
	f.servers = append(f.servers, hs)
	f.mu.Unlock()
	f.serving.Add(1)
	go func() {
		defer f.serving.Done()
		if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			f.errc <- err
		}
	}()
}

// serveReady answers 200 once a server serves and says it is ready, else
// 503 with why (never a host path or a secret: no token guards it).
func (f *Front) serveReady(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := f.readiness(); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "not ready: "+err.Error())
		return
	}
	io.WriteString(w, "ready")
}

func (f *Front) readiness() error {
	select {
	case <-f.stopped:
		return errShuttingDown
	default:
	}
	f.mu.Lock()
	ready := f.ready
	f.mu.Unlock()
	if ready == nil {
		return errors.New("starting: the sandbox is not up yet")
	}
	return ready()
}

// SetReady makes ready the Front's readiness: a stdio server's, whose
// operations listener has no MCP to attach.
func (f *Front) SetReady(ready func() error) {
	f.mu.Lock()
	f.ready = ready
	f.mu.Unlock()
}

// attach puts the transport's handler behind the MCP path.
func (f *Front) attach(h http.Handler, ready func() error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mcp, f.ready = h, ready
	close(f.attached)
}

// serveMCP waits for a server to be attached, then hands it the request.
func (f *Front) serveMCP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-f.attached:
	case <-f.stopped:
		http.Error(w, "the server is stopping", http.StatusServiceUnavailable)
		return
	case <-r.Context().Done():
		return
	}
	// Attached, then stopped: the server's own handler answers, refusing
	// new calls while it drains.
	f.mu.Lock()
	h := f.mcp
	f.mu.Unlock()
	h.ServeHTTP(w, r)
}

// Close stops serving: idle connections at once, open ones (streams that
// would never end by themselves) after grace. It returns once every
// listener is closed.
func (f *Front) Close(grace time.Duration) {
	f.mu.Lock()
	select {
	case <-f.stopped:
	default:
		close(f.stopped)
	}
	servers := f.servers
	f.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var wg sync.WaitGroup
	for _, hs := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hs.Shutdown(ctx); err != nil {
				hs.Close()
			}
		}()
	}
	wg.Wait()
	f.serving.Wait()
}
