package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	dto "github.com/prometheus/client_model/go"
	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// Operations tests of the built binary: what an operator scrapes, probes,
// reads in the log and receives as traces, with real Python in real
// sandboxes.

// metric is the value of the series of family name whose labels include
// want (a histogram's count); -1 when there is none.
func metric(families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	f := families[name]
	if f == nil {
		return -1
	}
series:
	for _, m := range f.Metric {
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				found = found || l.GetName() == k && l.GetValue() == v
			}
			if !found {
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

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// After a mixed run over HTTP — a call of each verdict real Python can
// give — /metrics, behind the token, counts each under its verdict and
// says what the engine holds; no code or output is in it.
func TestBinaryMetricsAfterMixedRun(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken, "MCP_EXEC_MAX_CONCURRENCY=1", "MCP_EXEC_MAX_QUEUED=0",
		"MCP_EXEC_MEMORY_MB=64", "MCP_EXEC_PIDS=24", "MCP_EXEC_MAX_OUTPUT_BYTES=1000"}, "--transport", "http", "--addr", "127.0.0.1:0")
	base := p.url(t)
	cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, nil)}, nil)
	ctx := context.Background()
	const marker = "Zq7-output-marker"
	for _, args := range []map[string]any{
		{"code": "print('" + marker + "')"},
		{"code": "import sys; sys.exit(3)"},
		{"code": "import time; time.sleep(30)", "timeout_s": 1},
		{"code": "b = bytearray(512 << 20)"},
		{"code": "import threading, time\nts = []\ntry:\n    for i in range(100):\n        t = threading.Thread(target=time.sleep, args=(3,)); t.start(); ts.append(t)\nexcept RuntimeError as e:\n    print('limit', e)\n"},
		{"code": "print('x' * 5000)"},
		{"code": ""},
	} {
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: args}); err != nil {
			t.Fatalf("exec %v: %v", args, err)
		}
	}
	// One call holds the only slot: the next is refused; then its client
	// gives up on it.
	long, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(long, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(60)", "timeout_s": 90}})
		errc <- err
	}()
	testenv.Eventually(t, "the long call to hold the slot", func() bool {
		f, _ := testenv.Scrape(t, base+"/metrics", testToken)
		return metric(f, "mcp_exec_slots_in_use", nil) == 1
	})
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print(1)"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "MCP_EXEC_MAX_QUEUED") {
		t.Errorf("a call past the queue: %v %v", text(res), err)
	}
	cancel()
	<-errc
	var families map[string]*dto.MetricFamily
	var body string
	testenv.Eventually(t, "the cancelled call counted", func() bool {
		families, body = testenv.Scrape(t, base+"/metrics", testToken)
		return metric(families, "mcp_exec_calls_total", map[string]string{"verdict": "cancelled"}) == 1
	})
	for verdict, want := range map[string]float64{"ok": 2, "exit_nonzero": 1, "timeout": 1, "oom": 1, "pids": 1,
		"refused_input": 1, "refused_busy": 1, "cancelled": 1, "sandbox_error": 0} {
		if got := metric(families, "mcp_exec_calls_total", map[string]string{"runtime": "libcontainer", "verdict": verdict}); got != want {
			t.Errorf("mcp_exec_calls_total{verdict=%q} = %v, want %v", verdict, got, want)
		}
	}
	for name, want := range map[string]float64{"mcp_exec_call_duration_seconds": 6, "mcp_exec_call_cpu_seconds": 6} {
		if got := metric(families, name, nil); got != want {
			t.Errorf("%s count = %v, want %v (the calls whose code ran)", name, got, want)
		}
	}
	if got := metric(families, "mcp_exec_call_peak_memory_bytes", nil); got < 1 {
		t.Errorf("peak memory observed %v times, want the calls' peaks", got)
	}
	if got := metric(families, "mcp_exec_call_truncations_total", map[string]string{"stream": "stdout"}); got != 1 {
		t.Errorf("stdout truncations = %v, want 1", got)
	}
	warm := metric(families, "mcp_exec_sandboxes_total", map[string]string{"how": "warm"})
	cold := metric(families, "mcp_exec_sandboxes_total", map[string]string{"how": "cold"})
	if warm+cold < 7 {
		t.Errorf("sandboxes: %v warm + %v cold, want one per call that ran (≥ 7)", warm, cold)
	}
	for name, labels := range map[string]map[string]string{
		"mcp_exec_build_info":           {"runtime": "libcontainer"},
		"mcp_exec_rootfs_cache_bytes":   nil,
		"mcp_exec_rootfs_cache_entries": nil,
		"mcp_exec_templates":            {"state": "idle"},
		"mcp_exec_ready":                nil,
		"go_goroutines":                 nil,
		"process_resident_memory_bytes": nil,
	} {
		if got := metric(families, name, labels); got <= 0 && name != "mcp_exec_templates" || got < 0 {
			t.Errorf("%s%v = %v, want it there", name, labels, got)
		}
	}
	if strings.Contains(body, marker) || strings.Contains(body, "sleep") {
		t.Errorf("/metrics holds the code or its output")
	}
	if code, _ := httpGet(t, base+"/metrics"); code != http.StatusUnauthorized {
		t.Errorf("GET /metrics without the token = %d, want 401", code)
	}
	if code, b := httpGet(t, base+"/readyz"); code != 200 || b != "ready" {
		t.Errorf("GET /readyz = %d %q, want 200 ready", code, b)
	}
	if code, b := httpGet(t, base+"/version"); code != 200 || !strings.Contains(b, `"version"`) {
		t.Errorf("GET /version = %d %q", code, b)
	}
	if testing.Verbose() {
		for _, line := range strings.Split(body, "\n") {
			if strings.HasPrefix(line, "mcp_exec_calls_total") || strings.HasPrefix(line, "mcp_exec_call_duration_seconds_count") ||
				strings.HasPrefix(line, "mcp_exec_sandboxes") || strings.HasPrefix(line, "mcp_exec_rootfs_cache") {
				t.Log(line)
			}
		}
	}
	p.stop(t)
}

// A stdio server with MCP_EXEC_METRICS_ADDR serves /metrics, /readyz and
// /version there without the token; its log, MCP_EXEC_LOG_FORMAT=json, is
// one JSON object a line, says each start-up fact once, and gives a
// cancelled call as cancelled.
func TestBinaryOpsListenerAndJSONLog(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_METRICS_ADDR=127.0.0.1:0", "MCP_EXEC_LOG_FORMAT=json", "MCP_EXEC_MEMRY_MB=100"})
	addr := p.waitLog(t, regexp.MustCompile(`"msg":"serving metrics","addr":"([^"]+)"`))[1]
	base := "http://" + addr
	p.initialize(t)
	p.send(t, execRequest(2, "print(6 * 7)"))
	if m := p.recv(t); m["result"] == nil {
		t.Fatalf("exec: %v", m)
	}
	// Cancelled by the client while it runs.
	p.send(t, execRequest(3, "import time; time.sleep(60)"))
	testenv.Eventually(t, "the call to run", func() bool {
		f, _ := testenv.Scrape(t, base+"/metrics", "")
		return metric(f, "mcp_exec_slots_in_use", nil) == 1
	})
	p.send(t, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":3}}`)
	var families map[string]*dto.MetricFamily
	testenv.Eventually(t, "the cancelled call counted", func() bool {
		families, _ = testenv.Scrape(t, base+"/metrics", "")
		return metric(families, "mcp_exec_calls_total", map[string]string{"verdict": "cancelled"}) == 1
	})
	if got := metric(families, "mcp_exec_calls_total", map[string]string{"verdict": "ok"}); got != 1 {
		t.Errorf("ok calls = %v, want 1", got)
	}
	if code, b := httpGet(t, base+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d %q", code, b)
	}
	p.stop(t)

	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("a log line that is not JSON: %q", sc.Text())
			continue
		}
		lines = append(lines, m)
	}
	count := map[string]int{}
	var execs []map[string]any
	for _, m := range lines {
		msg, _ := m["msg"].(string)
		count[msg]++
		if msg == "exec" {
			execs = append(execs, m)
		}
	}
	for _, msg := range []string{"sandbox ready", "serving metrics", "stopped"} {
		if count[msg] != 1 {
			t.Errorf("log line %q appears %d times, want once", msg, count[msg])
		}
	}
	warned := false
	for _, m := range lines {
		w, _ := m["msg"].(string)
		warned = warned || strings.Contains(w, "MCP_EXEC_MEMRY_MB") && strings.Contains(w, "MCP_EXEC_MEMORY_MB")
	}
	if !warned {
		t.Errorf("no warning naming MCP_EXEC_MEMRY_MB and MCP_EXEC_MEMORY_MB")
	}
	if len(execs) != 2 || execs[0]["verdict"] != "ok" || execs[0]["exit_code"] != 0.0 || execs[1]["verdict"] != "cancelled" || execs[1]["exit_code"] != nil {
		t.Errorf("exec lines %v, want ok (exit 0) then cancelled (no exit code)", execs)
	}
}

// In auto → process, the long reason is said once, not once per fact.
func TestBinaryAutoSaysWhyOnce(t *testing.T) {
	testenv.Real(t)
	requireSandbox(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		testenv.Missing(t, "setpriv is not installed (util-linux)")
	}
	bin, dir := publicBinary(t)
	cmd := exec.Command("setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", bin, "serve")
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home"), "MCP_EXEC_RUNTIME=auto",
		"MCP_EXEC_STATE_DIR=" + filepath.Join(dir, "state"), "MCP_EXEC_POOL_SIZE=0"}
	out, err := cmd.CombinedOutput() // stdin is /dev/null: it starts, then stops
	if err != nil {
		t.Fatalf("auto as uid 65532: %v\n%s", err, out)
	}
	const reason = "no per-call container can be made here"
	if n := strings.Count(string(out), reason); n != 1 {
		t.Errorf("the reason auto chose the process runtime is said %d times, want once:\n%s", n, out)
	}
}

// /readyz turns 503 once the served rootfs changed, and the metrics say
// so; it is never 200 again.
func TestBinaryReadyzAfterRootfsChange(t *testing.T) {
	requireSandbox(t)
	tmp := t.TempDir()
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(tmp, "rootfs")
	if stdout, stderr, status := cli(t, nil, "rootfs", "build", "--out", root); status != 0 {
		t.Fatalf("rootfs build: status %d\n%s\n%s", status, stdout, stderr)
	}
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken, "MCP_EXEC_ROOTFS=" + root}, "--transport", "http", "--addr", "127.0.0.1:0")
	base := p.url(t)
	// Ready once its sandbox is up, which the HTTP listener comes before.
	testenv.EventuallyWithin(t, 60*time.Second, "/readyz to say ready before the change", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == 200
	})
	if code, b := httpGet(t, base+"/readyz"); code != 200 {
		t.Fatalf("/readyz before the change = %d %q", code, b)
	}
	if err := os.WriteFile(filepath.Join(root, "usr", "planted.py"), []byte("print(1)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	code, b := httpGet(t, base+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(b, "rootfs changed") || strings.Contains(b, root) {
		t.Errorf("/readyz after the change = %d %q, want 503 saying the rootfs changed, without the host path", code, b)
	}
	f, _ := testenv.Scrape(t, base+"/metrics", testToken)
	if metric(f, "mcp_exec_rootfs_changed", nil) != 1 || metric(f, "mcp_exec_ready", nil) != 0 {
		t.Errorf("metrics after the change: rootfs_changed %v ready %v, want 1 and 0",
			metric(f, "mcp_exec_rootfs_changed", nil), metric(f, "mcp_exec_ready", nil))
	}
	p.stop(t)
}

// otlpReceiver is an OTLP/HTTP trace collector on loopback: it keeps the
// spans it is sent.
type otlpReceiver struct {
	mu       sync.Mutex
	spans    []*tracepb.Span
	resource map[string]string
}

func (o *otlpReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want POST /v1/traces, protobuf", http.StatusBadRequest)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var req coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	o.mu.Lock()
	for _, rs := range req.ResourceSpans {
		o.resource = map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			o.resource[kv.Key] = kv.Value.GetStringValue()
		}
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
	o.mu.Unlock()
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// With OTEL_EXPORTER_OTLP_ENDPOINT set, each call is a span with its
// verdict and a child per phase, exported over OTLP/HTTP.
func TestBinaryTraces(t *testing.T) {
	requireSandbox(t)
	var recv otlpReceiver
	collector := httptest.NewServer(&recv)
	defer collector.Close()
	stateDir := filepath.Join(t.TempDir(), "state")
	var stderr testenv.SyncBuffer
	cmd := exec.Command(binaryPath(t), "serve")
	cmd.Env = serverEnv(stateDir, "OTEL_EXPORTER_OTLP_ENDPOINT="+collector.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_SERVICE_NAME=mcp-exec-test")
	cmd.Stderr = &stderr
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const marker = "Zq7-traced-code"
	for _, code := range []string{"print('" + marker + "')", "import sys; sys.exit(4)"} {
		if res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": code}}); err != nil || res.IsError {
			t.Fatalf("exec: %v %v", err, res)
		}
	}
	cs.Close() // the server exits, flushing what it still holds
	recv.mu.Lock()
	defer recv.mu.Unlock()
	var roots []*tracepb.Span
	children := map[string][]string{}
	for _, s := range recv.spans {
		if s.Name == "exec" {
			roots = append(roots, s)
		} else {
			children[hex.EncodeToString(s.ParentSpanId)] = append(children[hex.EncodeToString(s.ParentSpanId)], s.Name)
		}
		for _, kv := range s.Attributes {
			if strings.Contains(kv.Value.String(), marker) {
				t.Errorf("span %s attribute %s holds the code", s.Name, kv.Key)
			}
		}
	}
	if len(roots) != 2 {
		t.Fatalf("got %d exec spans of %d, want 2; server log:\n%s", len(roots), len(recv.spans), &stderr)
	}
	for i, want := range []struct {
		verdict string
		exit    int64
	}{{"ok", 0}, {"exit_nonzero", 4}} {
		attrs := map[string]string{}
		var exit int64 = -1
		for _, kv := range roots[i].Attributes {
			attrs[kv.Key] = kv.Value.GetStringValue()
			if kv.Key == "mcp_exec.exit_code" {
				exit = kv.Value.GetIntValue()
			}
		}
		if attrs["mcp_exec.verdict"] != want.verdict || exit != want.exit || attrs["mcp_exec.runtime"] != "libcontainer" {
			t.Errorf("exec span %d: verdict %q exit %d runtime %q, want %s, %d, libcontainer", i, attrs["mcp_exec.verdict"], exit, attrs["mcp_exec.runtime"], want.verdict, want.exit)
		}
		got := strings.Join(children[hex.EncodeToString(roots[i].SpanId)], " ")
		for _, phase := range []string{"queue", "prepare", "run", "collect", "teardown"} {
			if !strings.Contains(got, phase) {
				t.Errorf("exec span %d has children %q, want %s among them", i, got, phase)
			}
		}
	}
	if recv.resource["service.name"] != "mcp-exec-test" {
		t.Errorf("resource %v, want OTEL_SERVICE_NAME honoured", recv.resource)
	}
}

// rootfsEntry is what rootfs ls --json says of one cached rootfs.
type rootfsEntry struct {
	Name    string `json:"name"`
	Holders int    `json:"holders"`
}

func lsCache(t *testing.T, cache string) map[string]int {
	t.Helper()
	out, errOut, status := cli(t, nil, "rootfs", "ls", "--json", "--cache-dir", cache)
	if status != 0 {
		t.Fatalf("rootfs ls: %d %s", status, errOut)
	}
	var list []rootfsEntry
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("rootfs ls --json: %v\n%s", err, out)
	}
	m := map[string]int{}
	for _, e := range list {
		m[e.Name] = e.Holders
	}
	return m
}

// The rootfs cache stays bounded without ever taking a rootfs from a live
// server: rootfs prune removes what no running server holds, and a server
// started with MCP_EXEC_CACHE_MAX_MB removes, beyond it, the least
// recently used that no server holds, never another live server's.
func TestBinaryRootfsCacheBound(t *testing.T) {
	requireSandbox(t)
	tmp := t.TempDir()
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	cache := filepath.Join(tmp, "cache")
	env := func(extra ...string) []string { return append([]string{"MCP_EXEC_CACHE_DIR=" + cache}, extra...) }
	// What each server built, by the key its settings make.
	newEntries := func(before map[string]int) []string {
		var names []string
		for n := range lsCache(t, cache) {
			if _, ok := before[n]; !ok {
				names = append(names, n)
			}
		}
		return names
	}
	a := startServer(t, env())
	aRootfs := newEntries(nil)
	if len(aRootfs) != 1 {
		t.Fatalf("server A built %v, want one rootfs", aRootfs)
	}
	before := lsCache(t, cache)
	b := startServer(t, env("MCP_EXEC_PRELOAD=json"))
	bRootfs := newEntries(before)
	if len(bRootfs) != 1 {
		t.Fatalf("server B built %v, want one rootfs", bRootfs)
	}
	b.stop(t)
	if got := lsCache(t, cache); got[aRootfs[0]] < 1 || got[bRootfs[0]] != 0 {
		t.Errorf("rootfs ls: %v; want A's held and B's not", got)
	}

	out, errOut, status := cli(t, nil, "rootfs", "prune", "--cache-dir", cache)
	if status != 0 || !strings.Contains(out, "removed "+bRootfs[0]) || strings.Contains(out, aRootfs[0]) {
		t.Errorf("rootfs prune with A live: %d\n%s%s; want B's removed, A's kept", status, out, errOut)
	}
	if _, err := os.Stat(filepath.Join(cache, aRootfs[0], "usr")); err != nil {
		t.Errorf("the live server's rootfs lost its files: %v", err)
	}
	a.initialize(t)
	a.send(t, execRequest(2, "import json; print(json.dumps([1]))"))
	if m := a.recv(t); !strings.Contains(fmt.Sprint(m), "[1]") {
		t.Errorf("a call on server A after the prune: %v", m)
	}

	// B's again, unused; then C, bound to 1 MiB: it removes B's and keeps
	// A's and its own, both held.
	b = startServer(t, env("MCP_EXEC_PRELOAD=json"))
	b.stop(t)
	c := startServer(t, env("MCP_EXEC_PRELOAD=decimal", "MCP_EXEC_CACHE_MAX_MB=1"))
	c.waitLog(t, regexp.MustCompile(`removed a rootfs no server uses.* rootfs=`+regexp.QuoteMeta(bRootfs[0])))
	got := lsCache(t, cache)
	if _, ok := got[bRootfs[0]]; ok || got[aRootfs[0]] < 1 || len(got) != 2 {
		t.Errorf("after C's bound the cache holds %v; want A's and C's, both held", got)
	}
	if strings.Contains(c.stderr.String(), "rootfs="+aRootfs[0]) {
		t.Errorf("server C removed server A's rootfs:\n%s", c.stderr)
	}
	c.stop(t)
	a.stop(t)
}

// doctor blames what is wrong: a missing package is the rootfs's, not the
// runtime's; and it lists the packages the rootfs holds.
func TestDoctorBlamesTheRootfsAndListsPackages(t *testing.T) {
	requireSandbox(t)
	out, _, status := cli(t, []string{"MCP_EXEC_PACKAGES=nosuchpkg_zz"}, "doctor")
	if status != 1 || !strings.Contains(out, "gives the full sandbox on this host, but the server would refuse to start: its rootfs cannot be had") ||
		strings.Contains(out, "cannot give the full sandbox here") || !strings.Contains(out, "Debian has no package python3-nosuchpkg-zz") {
		t.Errorf("doctor with a missing package: status %d\n%s", status, out)
	}
	out, _, status = cli(t, []string{"MCP_EXEC_PACKAGES=numpy"}, "doctor", "--json")
	var r report
	if err := json.Unmarshal([]byte(out), &r); err != nil || status != 0 {
		t.Fatalf("doctor --json: %d %v\n%s", status, err, out)
	}
	if !strings.Contains(strings.Join(r.Rootfs.Packages, " "), "python3-numpy") || !strings.Contains(strings.Join(r.Rootfs.Modules, " "), "numpy") ||
		!r.Rootfs.Proved || r.Blame != "" {
		t.Errorf("doctor with numpy: rootfs %+v blame %q; want python3-numpy, numpy importable, proved", r.Rootfs, r.Blame)
	}
}

// Unknown variables, limits that cannot hold together and a package
// Debian does not have stop the real server naming the variables.
func TestBinaryConfigChecks(t *testing.T) {
	testenv.Real(t)
	bin := binaryPath(t)
	for _, tc := range []struct {
		env  []string
		code int
		want []string
	}{
		{[]string{"MCP_EXEC_MEMRY_MB=512", "MCP_EXEC_STRICT_CONFIG=true"}, 2, []string{"MCP_EXEC_MEMRY_MB", "MCP_EXEC_MEMORY_MB"}},
		{[]string{"MCP_EXEC_CPUS=99"}, 2, []string{"MCP_EXEC_CPUS"}},
		{[]string{"MCP_EXEC_TMPFS_MB=2000"}, 2, []string{"MCP_EXEC_TMPFS_MB", "MCP_EXEC_MEMORY_MB"}},
		{[]string{"MCP_EXEC_PACKAGES=numpy,,pandas"}, 2, []string{"MCP_EXEC_PACKAGES", "empty"}},
		{[]string{"MCP_EXEC_PACKAGES=nosuchpkg_zz"}, 1, []string{"MCP_EXEC_PACKAGES", "Debian has no package python3-nosuchpkg-zz", "MCP_EXEC_PACKAGES_DIR"}},
	} {
		stateDir := filepath.Join(t.TempDir(), "state")
		cmd := exec.Command(bin, "serve")
		cmd.Env = serverEnv(stateDir, tc.env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != tc.code {
			t.Errorf("serve with %v: %v, want exit status %d\n%s", tc.env, err, tc.code, &stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("serve with %v: stderr lacks %q:\n%s", tc.env, w, &stderr)
			}
		}
	}
}
