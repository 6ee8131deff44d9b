package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/runtime"
)

// verdictEngine is the fake engine with the verdicts a sandbox gives:
//
//	oom       killed by the memory limit
//	pids      hit the process limit
//	chatter   wrote past the output cap on stdout
//	hang      runs until released, even when cancelled (a slow teardown)
//	phases    tells the call's phases, as the runtime does
//
// anything else runs on the fake engine.
type verdictEngine struct {
	*fakeEngine
	release chan struct{}
}

func newVerdictEngine() *verdictEngine {
	return &verdictEngine{fakeEngine: newFakeEngine(), release: make(chan struct{})}
}

func (v *verdictEngine) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	res := runtime.Result{Duration: 3 * time.Millisecond, CPUTime: 2 * time.Millisecond, PeakMemoryBytes: 8 << 20}
	switch string(req.Code) {
	case "oom":
		res.OOMKilled, res.ExitCode = true, 137
	case "pids":
		res.PidsLimitHit, res.ExitCode = true, 1
	case "chatter":
		res.Stdout, res.StdoutBytes, res.StdoutTruncated = []byte("x"), 1<<30, true
	case "hang":
		v.running.Add(1)
		defer v.running.Add(-1)
		<-v.release
		return res, ctx.Err()
	case "phases":
		now := time.Now()
		for i, p := range []runtime.Phase{runtime.PhasePrepare, runtime.PhaseRun, runtime.PhaseCollect, runtime.PhaseTeardown} {
			req.Phases(p, now.Add(time.Duration(i)*time.Millisecond), now.Add(time.Duration(i+1)*time.Millisecond))
		}
	default:
		return v.fakeEngine.Run(ctx, req)
	}
	return res, nil
}

// value is the value of the series of family name whose labels include
// want; -1 when there is none.
func value(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := families[name]
	if f == nil {
		return -1
	}
series:
	for _, m := range f.Metric {
		have := map[string]string{}
		for _, l := range m.Label {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue series
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

// opsFront serves s's registry apart on a loopback port and returns its
// base URL.
func opsFront(t *testing.T, reg *prometheus.Registry, ready func() error) string {
	t.Helper()
	f := NewFront(FrontOptions{Transport: Stdio, Version: "test", Metrics: reg, MetricsApart: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.ServeOps(ln)
	if ready != nil {
		f.SetReady(ready)
	}
	t.Cleanup(func() { f.Close(time.Second) })
	return "http://" + ln.Addr().String()
}

// After calls of every verdict, /metrics counts each under its verdict,
// times what ran, and names no code, output or session handle.
func TestMetricsCountEveryVerdict(t *testing.T) {
	opts := sessionOptions()
	opts.MaxConcurrency, opts.MaxQueued = 1, 0
	opts.MaxOutputBytes = 1000
	opts.Metrics = prometheus.NewRegistry()
	eng := newVerdictEngine()
	s, cs := connect(t, eng, opts, nil)
	base := opsFront(t, opts.Metrics, s.Ready)

	const secret = "print:the-code-and-its-output-0xC0DE"
	for _, code := range []string{secret, "exit:3", "sleep:1s", "oom", "pids", "chatter", "fail", ""} {
		args := map[string]any{"code": code}
		if code == "sleep:1s" {
			args["timeout_s"] = 0.05
		}
		cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: args})
	}
	// A persistent session: its handle must appear nowhere.
	out, _ := call(t, cs, map[string]any{"code": "set:k=v", "session": "new"})
	if out.Session == "" {
		t.Fatal("no session handle")
	}
	// Busy: the only slot taken, no queue.
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:60s"}})
		errc <- err
	}()
	waitFor(t, "a call holding the slot", func() bool { return eng.running.Load() == 1 })
	families, _ := testenv.Scrape(t, base+"/metrics", "")
	if got := value(families, "mcp_exec_slots_in_use", nil); got != 1 {
		t.Errorf("mcp_exec_slots_in_use while a call runs = %v, want 1", got)
	}
	if msg := callErr(t, cs, map[string]any{"code": "print:1"}); !strings.Contains(msg, "MCP_EXEC_MAX_QUEUED") {
		t.Errorf("a call past the queue: %q, want refused naming MCP_EXEC_MAX_QUEUED", msg)
	}
	// Cancelled: the client gives up on the running call.
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	waitFor(t, "the cancelled call to end", func() bool { return eng.running.Load() == 0 })

	families, text := testenv.Scrape(t, base+"/metrics", "")
	for verdict, want := range map[string]float64{verdictOK: 2, verdictExit: 1, verdictTimeout: 1, verdictOOM: 1, verdictPids: 1,
		verdictSandbox: 1, verdictInput: 1, verdictBusy: 1, verdictCancelled: 1, verdictRefused: 0} {
		// ok: the secret's call and the session's.
		if verdict == verdictOK {
			want = 3 // and chatter, which exited 0
		}
		if got := value(families, "mcp_exec_calls_total", map[string]string{"runtime": "fake", "verdict": verdict}); got != want {
			t.Errorf("mcp_exec_calls_total{verdict=%q} = %v, want %v", verdict, got, want)
		}
	}
	// The code ran in 8 calls: ok ×3, exit, timeout, oom, pids — 7 — and
	// the session's cell; not the sandbox error, the refusals or the
	// cancelled one.
	for _, name := range []string{"mcp_exec_call_duration_seconds", "mcp_exec_call_cpu_seconds"} {
		if got := value(families, name, nil); got != 7 {
			t.Errorf("%s: %v observations, want 7 (the calls whose code ran)", name, got)
		}
	}
	if got := value(families, "mcp_exec_call_truncations_total", map[string]string{"stream": "stdout"}); got != 1 {
		t.Errorf("stdout truncations = %v, want 1", got)
	}
	if got := value(families, "mcp_exec_call_output_bytes_total", map[string]string{"stream": "stdout"}); got < 1<<30 {
		t.Errorf("stdout bytes = %v, want the chatter's 1 GiB counted", got)
	}
	for name, want := range map[string]float64{"mcp_exec_slots": 1, "mcp_exec_slots_in_use": 0, "mcp_exec_queue_depth": 0,
		"mcp_exec_persistent_sessions_open": 1, "mcp_exec_ready": 1} {
		if got := value(families, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	// Queue waits: every call that asked for a slot.
	if got := value(families, "mcp_exec_call_queue_wait_seconds", nil); got < 9 {
		t.Errorf("queue waits observed: %v, want one per call that asked for a slot (≥ 9)", got)
	}
	for _, leak := range []string{"0xC0DE", "the-code", out.Session, strings.TrimPrefix(out.Session, "ps_")} {
		if strings.Contains(text, leak) {
			t.Errorf("/metrics holds %q:\n%s", leak, text)
		}
	}
}

// On the HTTP transport /metrics is behind the token; /healthz, /readyz
// and /version are not.
func TestMetricsBehindTheToken(t *testing.T) {
	opts := testOptions()
	opts.Transport, opts.AuthToken = HTTP, "0123456789abcdef-token"
	opts.Metrics = prometheus.NewRegistry()
	s, err := New(newFakeEngine(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeHTTP(ctx, ln) }()
	defer func() { stop(); <-served }()
	base := "http://" + ln.Addr().String()
	waitFor(t, "the server ready", func() bool { return get(t, base+"/readyz", "").code == 200 })
	for _, c := range []struct {
		path, token string
		code        int
		body        string
	}{
		{"/metrics", "", 401, "unauthorized"},
		{"/metrics", "wrong-token-0123456789", 401, "unauthorized"},
		{"/metrics", opts.AuthToken, 200, "mcp_exec_calls_total"},
		{"/healthz", "", 200, "ok"},
		{"/readyz", "", 200, "ready"},
		{"/version", "", 200, `"version":"test"`},
	} {
		if r := get(t, base+c.path, c.token); r.code != c.code || !strings.Contains(r.body, c.body) {
			t.Errorf("GET %s (token %q) = %d %.200q, want %d with %q", c.path, c.token, r.code, r.body, c.code, c.body)
		}
	}
	testenv.Scrape(t, base+"/metrics", opts.AuthToken)
}

type response struct {
	code int
	body string
}

func get(t *testing.T, url, token string) response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{code: -1, body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, string(b)}
}

// /readyz is 503 before a server is attached, 200 once it serves and its
// engine is ready, 503 while the engine says not, and 503 from the moment
// the server begins to shut down, while its calls are still torn down.
func TestReadiness(t *testing.T) {
	opts := testOptions()
	opts.Transport, opts.AuthToken = HTTP, "0123456789abcdef-token"
	var mu sync.Mutex
	var engineErr error
	opts.Ready = func() error {
		mu.Lock()
		defer mu.Unlock()
		return engineErr
	}
	eng := newVerdictEngine()
	f := NewFront(FrontOptions{Transport: HTTP, AuthToken: opts.AuthToken, Version: "test"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.Serve(ln)
	base := "http://" + ln.Addr().String()
	if r := get(t, base+"/readyz", ""); r.code != 503 || !strings.Contains(r.body, "starting") {
		t.Errorf("/readyz before the server is attached = %d %q, want 503 starting", r.code, r.body)
	}
	if r := get(t, base+"/healthz", ""); r.code != 200 {
		t.Errorf("/healthz while starting = %d, want 200", r.code)
	}

	s, err := New(eng, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeFront(ctx, f) }()
	waitFor(t, "ready", func() bool { return get(t, base+"/readyz", "").code == 200 })
	mu.Lock()
	engineErr = errors.New("the rootfs changed")
	mu.Unlock()
	if r := get(t, base+"/readyz", ""); r.code != 503 || !strings.Contains(r.body, "the rootfs changed") {
		t.Errorf("/readyz with the engine not ready = %d %q, want 503 saying why", r.code, r.body)
	}
	mu.Lock()
	engineErr = nil
	mu.Unlock()

	// A call whose teardown is slow holds the shutdown: meanwhile the
	// server is not ready.
	cs := httpClient(t, base, opts.AuthToken)
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "hang"}})
	waitFor(t, "the call running", func() bool { return eng.running.Load() == 1 })
	stop()
	waitFor(t, "not ready while shutting down", func() bool {
		r := get(t, base+"/readyz", "")
		return r.code == 503 && strings.Contains(r.body, "shutting down")
	})
	close(eng.release)
	if err := <-served; err != nil {
		t.Errorf("ServeFront: %v", err)
	}
}

func httpClient(t *testing.T, base, token string) *mcp.ClientSession {
	t.Helper()
	hc := &http.Client{Transport: tokenTransport{token}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

type tokenTransport struct{ token string }

func (tt tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+tt.token)
	return http.DefaultTransport.RoundTrip(r)
}

// MCP requests that come while the server starts wait for it, as they
// waited in the listen backlog before, then get their answer.
func TestFrontHoldsMCPUntilAttached(t *testing.T) {
	opts := testOptions()
	opts.Transport, opts.AuthToken = HTTP, "0123456789abcdef-token"
	f := NewFront(FrontOptions{Transport: HTTP, AuthToken: opts.AuthToken})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.Serve(ln)
	base := "http://" + ln.Addr().String()
	if r := get(t, base+"/mcp", ""); r.code != 401 {
		t.Errorf("/mcp without the token while starting = %d, want 401", r.code)
	}
	connected := make(chan *mcp.ClientSession, 1)
	go func() {
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: &http.Client{Transport: tokenTransport{opts.AuthToken}}}, nil)
		if err != nil {
			t.Errorf("connecting while the server starts: %v", err)
		}
		connected <- cs
	}()
	select {
	case <-connected:
		t.Fatal("the client connected before a server was attached")
	case <-time.After(200 * time.Millisecond):
	}
	s, err := New(newFakeEngine(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeFront(ctx, f) }()
	defer func() { stop(); <-served }()
	cs := <-connected
	if cs == nil {
		return
	}
	defer cs.Close()
	if out, _ := call(t, cs, map[string]any{"code": "print:up"}); out.Stdout != "up" {
		t.Errorf("a call on a connection made while starting: %q", out.Stdout)
	}
}

// Each call is one JSON log line with every verdict field; a cancelled
// call says cancelled; a sandbox error carries the call id its isError
// text names; a session is named by its digest, never its handle.
func TestCallLogLine(t *testing.T) {
	var buf testenv.SyncBuffer
	opts := sessionOptions()
	opts.Logger = slog.New(slog.NewJSONHandler(&buf, nil))
	eng := newVerdictEngine()
	_, cs := connect(t, eng, opts, nil)

	call(t, cs, map[string]any{"code": "exit:3"})
	sandboxErr := callErr(t, cs, map[string]any{"code": "fail"})
	call(t, cs, map[string]any{"code": "chatter"})
	out, _ := call(t, cs, map[string]any{"code": "set:k=v", "session": "new"})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:60s"}})
		errc <- err
	}()
	waitFor(t, "the call running", func() bool { return eng.fakeEngine.running.Load() == 1 })
	cancel()
	<-errc
	var lines []map[string]any
	waitFor(t, "five exec lines", func() bool {
		lines = nil
		sc := bufio.NewScanner(strings.NewReader(buf.String()))
		for sc.Scan() {
			var m map[string]any
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Fatalf("log line is not JSON: %v: %s", err, sc.Text())
			}
			if m["msg"] == "exec" {
				lines = append(lines, m)
			}
		}
		return len(lines) == 5
	})
	fields := []string{"call", "client", "runtime", "verdict", "exit_code", "timed_out", "oom_killed", "pids_limited",
		"stdout_bytes", "stdout_truncated", "stderr_bytes", "stderr_truncated", "result_truncated", "files", "files_truncated",
		"duration", "cpu", "peak_memory_bytes", "pooled", "queue_wait", "took", "code_bytes", "stdin_bytes"}
	for _, f := range fields {
		if _, ok := lines[0][f]; !ok {
			t.Errorf("the exec line of a call that ran lacks %q: %v", f, lines[0])
		}
	}
	if lines[0]["verdict"] != verdictExit || lines[0]["exit_code"] != 3.0 || lines[0]["level"] != "INFO" {
		t.Errorf("exit 3: %v", lines[0])
	}
	id := regexp.MustCompile(`under call (\S+)`).FindStringSubmatch(sandboxErr)
	if lines[1]["verdict"] != verdictSandbox || id == nil || lines[1]["call"] != id[1] || lines[1]["err"] == nil || lines[1]["level"] != "ERROR" {
		t.Errorf("sandbox error %q: its line %v, want verdict %s, its call id and the error", sandboxErr, lines[1], verdictSandbox)
	}
	if lines[2]["stdout_truncated"] != true || lines[2]["stdout_bytes"] != float64(1<<30) {
		t.Errorf("a call past the output cap: %v, want stdout_truncated and every byte counted", lines[2])
	}
	if lines[3]["session"] == nil || lines[3]["session"] == out.Session {
		t.Errorf("a session's call: %v, want the session's digest", lines[3])
	}
	if lines[4]["verdict"] != verdictCancelled || lines[4]["exit_code"] != nil || lines[4]["err"] != nil {
		t.Errorf("a cancelled call: %v, want verdict cancelled without an exit code or an error", lines[4])
	}
	if strings.Contains(buf.String(), out.Session) {
		t.Errorf("the log holds the session handle %s", out.Session)
	}
}

// A call is a span with the verdict, and a child span per phase.
func TestCallSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	opts := testOptions()
	opts.Tracer = tp.Tracer("test")
	_, cs := connect(t, newVerdictEngine(), opts, nil)
	call(t, cs, map[string]any{"code": "phases"})
	spans := rec.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byName[s.Name()] = s
	}
	root := byName["exec"]
	if root == nil {
		t.Fatalf("no exec span among %d", len(spans))
	}
	attrs := map[string]string{}
	for _, a := range root.Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["mcp_exec.verdict"] != verdictOK || attrs["mcp_exec.exit_code"] != "0" || attrs["mcp_exec.call_id"] == "" {
		t.Errorf("exec span attributes %v, want the verdict, the exit code and the call id", attrs)
	}
	for _, name := range []string{"queue", "prepare", "run", "collect", "teardown"} {
		s := byName[name]
		if s == nil || s.Parent().SpanID() != root.SpanContext().SpanID() {
			t.Errorf("span %s: %v, want a child of exec", name, s)
		}
	}
}

// A call over HTTP whose request carries a W3C traceparent is a span of
// that trace.
func TestCallSpanContinuesTheClientsTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	opts := testOptions()
	opts.Transport, opts.AuthToken = HTTP, "0123456789abcdef-token"
	opts.Tracer = tp.Tracer("test")
	s, err := New(newFakeEngine(), opts)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.ServeHTTP(ctx, ln) }()
	defer func() { stop(); <-served }()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	hc := &http.Client{Transport: headerTransport{"Bearer " + opts.AuthToken, "00-" + traceID + "-00f067aa0ba902b7-01"}}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
		&mcp.StreamableClientTransport{Endpoint: "http://" + ln.Addr().String() + "/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call(t, cs, map[string]any{"code": "print:1"})
	for _, sp := range rec.Ended() {
		if sp.Name() == "exec" {
			if got := sp.SpanContext().TraceID().String(); got != traceID || sp.Parent().SpanID().String() != "00f067aa0ba902b7" {
				t.Errorf("exec span: trace %s parent %s, want the client's trace %s under its span", got, sp.Parent().SpanID(), traceID)
			}
			return
		}
	}
	t.Error("no exec span")
}

type headerTransport struct{ auth, traceparent string }

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", h.auth)
	r.Header.Set("Traceparent", h.traceparent)
	return http.DefaultTransport.RoundTrip(r)
}

// With metrics served apart, the HTTP port has no /metrics at all, with
// or without the token; the operations listener serves them without it.
func TestMetricsApartLeaveTheHTTPPort(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "probe_total", Help: "a probe"}))
	const token = "0123456789abcdef-token"
	f := NewFront(FrontOptions{Transport: HTTP, AuthToken: token, Metrics: reg, MetricsApart: true})
	main, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.ServeOps(ops)
	f.Serve(main)
	defer f.Close(time.Second)
	for _, tok := range []string{"", token} {
		if r := get(t, "http://"+main.Addr().String()+"/metrics", tok); r.code != http.StatusNotFound {
			t.Errorf("GET /metrics on the HTTP port (token %q) with metrics apart = %d %.100q, want 404", tok, r.code, r.body)
		}
	}
	if r := get(t, "http://"+ops.Addr().String()+"/metrics", ""); r.code != 200 || !strings.Contains(r.body, "probe_total") {
		t.Errorf("GET /metrics on the operations listener = %d %.100q", r.code, r.body)
	}
}
