package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// Tests of the built binary: the whole path a client sees, over stdio,
// streamable HTTP and the legacy SSE transport.

const testToken = "test-token-0123456789abcdef"

// serverEnv is this process's environment without any MCP_EXEC_ setting,
// so that the caller's shell does not change what a test means.
func serverEnv(stateDir string, extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MCP_EXEC_") {
			env = append(env, kv)
		}
	}
	// No prepared sandboxes by default: the tests count what calls leave.
	// TestBinaryPool tests the pool.
	return append(append(env, "MCP_EXEC_STATE_DIR="+stateDir, "MCP_EXEC_POOL_SIZE=0"), extra...)
}

// proc is a running mcp-exec serve.
type proc struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan []byte // stdout, line by line
	stderr   *testenv.SyncBuffer
	stateDir string
	instance string
	done     chan struct{}
}

// startServer starts the binary with a private state dir and waits until
// its sandbox is up.
func startServer(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	requireSandbox(t)
	p := &proc{
		stateDir: filepath.Join(t.TempDir(), "state"),
		stderr:   &testenv.SyncBuffer{},
		lines:    make(chan []byte, 16),
		done:     make(chan struct{}),
	}
	p.cmd = exec.Command(binaryPath(t), append([]string{"serve"}, args...)...)
	p.cmd.Env = serverEnv(p.stateDir, env...)
	p.cmd.Stderr = p.stderr
	stdin, err := p.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.stdin = stdin
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stdout = pw
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	go func() {
		defer close(p.lines)
		r := bufio.NewReaderSize(pr, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if len(line) > 0 {
				p.lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("server stderr:\n%s", p.stderr)
		}
	})
	p.waitLog(t, regexp.MustCompile(`msg="sandbox ready"|"msg":"sandbox ready"`))
	ids := instances(t, p.stateDir)
	if len(ids) != 1 {
		t.Fatalf("state dir holds instances %v, want one", ids)
	}
	p.instance = ids[0]
	return p
}

// waitLog waits for a line of the server's log to match re and returns the
// match's submatches.
func (p *proc) waitLog(t *testing.T, re *regexp.Regexp) []string {
	t.Helper()
	var m []string
	testenv.Eventually(t, fmt.Sprintf("the server's log to match %s", re), func() bool {
		if m = re.FindStringSubmatch(p.stderr.String()); m != nil {
			return true
		}
		select {
		case <-p.done:
			t.Fatalf("server exited, its log never matched %s:\n%s", re, p.stderr)
		default:
		}
		return false
	})
	return m
}

// url waits for an HTTP server to listen and returns its base URL.
func (p *proc) url(t *testing.T) string {
	t.Helper()
	return "http://" + p.waitLog(t, regexp.MustCompile(`msg=serving .*addr=(\S+)`))[1]
}

// exit waits for the server to exit and returns its status.
func (p *proc) exit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("server still running after %v", within)
		return -1
	}
}

// stop sends SIGTERM and checks the server exits 0 leaving nothing behind.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.exit(t, 20*time.Second); code != 0 {
		t.Errorf("after SIGTERM: exit status %d, want 0", code)
	}
	assertGone(t, p.stateDir, p.instance)
}

// send writes one line to the server's stdin.
func (p *proc) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		t.Fatalf("writing to the server: %v", err)
	}
}

// recv reads the next message the server writes to stdout.
func (p *proc) recv(t *testing.T) map[string]any {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			t.Fatal("server closed stdout")
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatalf("server wrote a line that is not JSON (stdout must carry only the protocol): %q", line)
		}
		return m
	case <-time.After(30 * time.Second):
		t.Fatal("no message from the server within 30 s")
		return nil
	}
}

func (p *proc) initialize(t *testing.T) {
	t.Helper()
	p.send(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if m := p.recv(t); m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	p.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
}

func execRequest(id any, code string) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": "exec", "arguments": map[string]any{"code": code}}})
	return string(b)
}

func TestBinaryStdio(t *testing.T) {
	requireSandbox(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	var stderr testenv.SyncBuffer
	cmd := exec.Command(binaryPath(t), "serve")
	cmd.Env = serverEnv(stateDir, "MCP_EXEC_AUDIT_LOG=-")
	cmd.Stderr = &stderr
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("tools/list: %v, %v", tools, err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print(6 * 7)"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v, %v", res, err)
	}
	if out := decodeOutput(t, res); out.Stdout != "42\n" {
		t.Errorf("exec(print(6 * 7)): stdout = %q, want 42", out.Stdout)
	}
	ids := instances(t, stateDir)
	// Closing stdin ends the server, which exits 0 and leaves nothing.
	if err := cs.Close(); err != nil {
		t.Errorf("closing the client: %v (server log:\n%s)", err, &stderr)
	}
	if code := cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("server exit status %d after stdin closed, want 0", code)
	}
	for _, id := range ids {
		assertGone(t, stateDir, id)
	}
	// Logs go to stderr: stdout carried only the protocol, or the client
	// would have failed to decode it.
	if !strings.Contains(stderr.String(), "sandbox ready") {
		t.Errorf("server log on stderr lacks the start: %s", &stderr)
	}
	// MCP_EXEC_AUDIT_LOG=- puts the audit log there too.
	if !regexp.MustCompile(`(?m)^\{"time":.*"client":"stdio".*"exit_code":0,`).MatchString(stderr.String()) {
		t.Errorf("no audit record of the call on stderr: %s", &stderr)
	}
}

// A client's malformed line gets a JSON-RPC error and the server goes on.
func TestBinaryStdioBadLines(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_MAX_STDIN_BYTES=100"})
	p.initialize(t)
	// Over 6 × (code + stdin limits) + 2 × files + 1 MiB: no valid call is
	// that long.
	huge := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"exec","arguments":{"code":"` +
		strings.Repeat("x", 34<<20) + `"}}}`
	for _, tc := range []struct {
		name, line string
		id         any // nil: null
		code       float64
		msg        string
	}{
		{"not JSON", `{not json`, nil, -32700, "not valid JSON"},
		{"bad version", `{"jsonrpc":"1.0","id":3,"method":"ping"}`, float64(3), -32600, "invalid JSON-RPC message"},
		{"method not a string", `{"jsonrpc":"2.0","id":"four","method":4}`, "four", -32600, "invalid JSON-RPC message"},
		{"not an object", `42`, nil, -32600, "invalid JSON-RPC message"},
		{"batch", `[{"jsonrpc":"2.0","id":6,"method":"ping"}]`, nil, -32600, "batches are not supported"},
		{"over the line limit", huge, float64(7), -32600, "MCP_EXEC_MAX_CODE_BYTES, MCP_EXEC_MAX_STDIN_BYTES and MCP_EXEC_MAX_FILE_BYTES"},
		{"unknown method", `{"jsonrpc":"2.0","id":8,"method":"nope"}`, float64(8), -32601, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p.send(t, tc.line)
			m := p.recv(t)
			e, _ := m["error"].(map[string]any)
			if m["id"] != tc.id || e == nil || e["code"] != tc.code || !strings.Contains(fmt.Sprint(e["message"]), tc.msg) {
				t.Errorf("reply to %.60s: %v; want id %v, code %v, a message with %q", tc.line, m, tc.id, tc.code, tc.msg)
			}
			// The next call works.
			p.send(t, execRequest(100, "print(100)"))
			m = p.recv(t)
			res, _ := m["result"].(map[string]any)
			sc, _ := res["structuredContent"].(map[string]any)
			if m["id"] != float64(100) || sc["stdout"] != "100\n" {
				t.Errorf("exec after a bad line: %v", m)
			}
		})
	}
	p.stop(t)
}

// Shutdown and the end of stdin kill a running call's container at once.
func TestBinaryStdioShutdown(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(p *proc)
	}{
		{"SIGTERM", func(p *proc) { p.cmd.Process.Signal(syscall.SIGTERM) }},
		{"SIGINT", func(p *proc) { p.cmd.Process.Signal(syscall.SIGINT) }},
		{"stdin EOF", func(p *proc) { p.stdin.Close() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startServer(t, nil)
			p.initialize(t)
			p.send(t, execRequest(2, "import time; time.sleep(60)"))
			waitContainers(t, p.stateDir, 1, 10*time.Second)
			start := time.Now()
			tc.end(p)
			if code := p.exit(t, 15*time.Second); code != 0 {
				t.Errorf("exit status %d, want 0", code)
			}
			if took := time.Since(start); took > 10*time.Second {
				t.Errorf("exiting took %v with a 60 s call running, want it killed at once", took)
			}
			assertGone(t, p.stateDir, p.instance)
		})
	}
}

// headerTransport adds headers to every request, as a configured client does.
type headerTransport struct {
	header http.Header
	base   http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.header {
		r.Header[k] = v
	}
	return h.base.RoundTrip(r)
}

// dropper dials connections it can cut all at once, like a client whose
// machine vanishes: no MCP message, no DELETE, just gone.
type dropper struct {
	mu      sync.Mutex
	conns   []net.Conn
	dropped bool
}

func (d *dropper) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dropped {
		return nil, errors.New("client is gone")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err == nil {
		d.conns = append(d.conns, c)
	}
	return c, err
}

func (d *dropper) drop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dropped = true
	for _, c := range d.conns {
		c.Close()
	}
}

func httpClient(header, value string, d *dropper) *http.Client {
	tr := &http.Transport{}
	if d != nil {
		tr.DialContext = d.DialContext
	}
	h := http.Header{}
	if header != "" {
		h.Set(header, value)
	}
	return &http.Client{Transport: headerTransport{h, tr}}
}

func connectHTTP(t *testing.T, transport mcp.Transport, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(context.Background(), transport, nil)
	if err != nil {
		t.Fatalf("connecting: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

func rawPost(t *testing.T, url, host string, header http.Header, body string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header.Clone()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

func TestBinaryHTTP(t *testing.T) {
	audit := filepath.Join(t.TempDir(), "audit.log")
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken, "MCP_EXEC_MAX_STDIN_BYTES=100", "MCP_EXEC_PROGRESS_S=0.2", "MCP_EXEC_AUDIT_LOG=" + audit},
		"--transport", "http", "--addr", "127.0.0.1:0")
	base := p.url(t)

	t.Run("healthz", func(t *testing.T) {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "ok" {
			t.Errorf("GET /healthz without a token = %d %q, want 200 ok", resp.StatusCode, body)
		}
	})
	t.Run("auth", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			header http.Header
			host   string
			body   string
			want   int
		}{
			{"no token", http.Header{}, "", initializeBody, 401},
			{"wrong bearer", http.Header{"Authorization": {"Bearer wrong-token-0123456789"}}, "", initializeBody, 401},
			{"token without Bearer", http.Header{"Authorization": {testToken}}, "", initializeBody, 401},
			{"wrong X-MCP-AUTH", http.Header{"X-Mcp-Auth": {"wrong-token-0123456789"}}, "", initializeBody, 401},
			{"bearer", http.Header{"Authorization": {"Bearer " + testToken}}, "", initializeBody, 200},
			{"bearer, lower case", http.Header{"Authorization": {"bearer " + testToken}}, "", initializeBody, 200},
			{"X-MCP-AUTH", http.Header{"X-Mcp-Auth": {testToken}}, "", initializeBody, 200},
			// The SDK's DNS-rebinding protection stays on.
			{"foreign Host", http.Header{"Authorization": {"Bearer " + testToken}}, "evil.example:80", initializeBody, 403},
			{"malformed JSON", http.Header{"Authorization": {"Bearer " + testToken}}, "", `{not json`, 400},
			{"body over the limit", http.Header{"Authorization": {"Bearer " + testToken}}, "",
				`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"x":"` + strings.Repeat("x", 34<<20) + `"}}`, 413},
		} {
			if got := rawPost(t, base+"/mcp", tc.host, tc.header, tc.body); got != tc.want {
				t.Errorf("POST /mcp with %s = %d, want %d", tc.name, got, tc.want)
			}
		}
		_, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(),
			&mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: httpClient("", "", nil), MaxRetries: -1}, nil)
		if err == nil {
			t.Error("a go-sdk client without a token connected")
		}
	})
	for _, auth := range []struct{ header, value string }{{"Authorization", "Bearer " + testToken}, {"X-MCP-AUTH", testToken}} {
		t.Run("client with "+auth.header, func(t *testing.T) {
			var mu sync.Mutex
			progress := 0
			cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: httpClient(auth.header, auth.value, nil)},
				&mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
					mu.Lock()
					progress++
					mu.Unlock()
				}})
			if tools, err := cs.ListTools(context.Background(), nil); err != nil || len(tools.Tools) != 1 {
				t.Fatalf("tools/list: %v, %v", tools, err)
			}
			params := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(1); print('hi')"}}
			params.SetProgressToken(1)
			res, err := cs.CallTool(context.Background(), params)
			if err != nil || res.IsError {
				t.Fatalf("exec: %v, %v", res, err)
			}
			if out := decodeOutput(t, res); out.Stdout != "hi\n" {
				t.Errorf("exec: stdout = %q, want hi", out.Stdout)
			}
			mu.Lock()
			defer mu.Unlock()
			if progress < 2 {
				t.Errorf("got %d progress notifications over HTTP in 1 s at 200 ms, want ≥ 2", progress)
			}
		})
	}
	t.Run("address in use", func(t *testing.T) {
		stateDir := filepath.Join(t.TempDir(), "state")
		cmd := exec.Command(binaryPath(t), "serve", "--transport", "http", "--addr", strings.TrimPrefix(base, "http://"))
		cmd.Env = serverEnv(stateDir, "MCP_EXEC_AUTH_TOKEN="+testToken)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "MCP_EXEC_ADDR") {
			t.Errorf("second server on a busy address: %v, %s; want a non-zero exit naming MCP_EXEC_ADDR", err, out)
		}
		if _, err := os.Stat(stateDir); err == nil {
			t.Error("a server that cannot listen started its sandbox")
		}
	})
	waitNoContainers(t, p.stateDir, 5*time.Second)
	p.stop(t)
	// One audit record per call, naming the HTTP client by its address.
	data, err := os.ReadFile(audit)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(regexp.MustCompile(`(?m)^\{.*"client":"127\.0\.0\.1:\d+".*\}$`).FindAll(data, -1)); n != 2 {
		t.Errorf("audit log has %d records of HTTP calls, want 2:\n%s", n, data)
	}
}

// A call whose HTTP client vanishes, or deletes its session, is killed at
// once, not left to its timeout.
func TestBinaryHTTPClientGone(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken}, "--transport", "http", "--addr", "127.0.0.1:0")
	base := p.url(t)
	sleep := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(60)"}}

	t.Run("vanished", func(t *testing.T) {
		d := &dropper{}
		cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, d), MaxRetries: -1}, nil)
		go cs.CallTool(context.Background(), sleep)
		waitContainers(t, p.stateDir, 1, 10*time.Second)
		d.drop()
		waitNoContainers(t, p.stateDir, 5*time.Second)
	})
	t.Run("DELETE", func(t *testing.T) {
		cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, nil)}, nil)
		go cs.CallTool(context.Background(), sleep)
		waitContainers(t, p.stateDir, 1, 10*time.Second)
		req, _ := http.NewRequest(http.MethodDelete, base+"/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Mcp-Session-Id", cs.ID())
		start := time.Now()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if took := time.Since(start); resp.StatusCode != http.StatusNoContent || took > 5*time.Second {
			t.Errorf("DELETE of a session with a running call = %d after %v, want 204 at once", resp.StatusCode, took)
		}
		waitNoContainers(t, p.stateDir, 5*time.Second)
	})
	p.stop(t)
}

// A SIGTERM with an HTTP call running kills it, ends the streams and exits 0.
func TestBinaryHTTPShutdown(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken}, "--transport", "http", "--addr", "127.0.0.1:0")
	cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: p.url(t) + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, nil), MaxRetries: -1}, nil)
	errc := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(60)"}})
		errc <- err
	}()
	waitContainers(t, p.stateDir, 1, 10*time.Second)
	start := time.Now()
	p.stop(t)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("shutdown took %v with a 60 s call running", took)
	}
	select {
	case <-errc:
	case <-time.After(10 * time.Second):
		t.Error("the client's call did not end with the server")
	}
}

func TestBinarySSE(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken}, "--transport", "sse", "--addr", "127.0.0.1:0")
	base := p.url(t)
	if !strings.HasSuffix(p.waitLog(t, regexp.MustCompile(`url=(\S+)`))[1], "/sse") {
		t.Errorf("SSE server does not serve at /sse: %s", p.stderr)
	}
	for _, tc := range []struct {
		name, header, value string
		want                int
	}{
		{"no token", "", "", 401},
		{"wrong token", "Authorization", "Bearer wrong-token-0123456789", 401},
		{"bearer", "Authorization", "Bearer " + testToken, 200},
		{"X-MCP-AUTH", "X-MCP-AUTH", testToken, 200},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/sse", nil)
		resp, err := httpClient(tc.header, tc.value, nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != tc.want {
			t.Errorf("GET /sse with %s = %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
		resp.Body.Close()
		cancel()
	}
	for _, auth := range []struct{ header, value string }{{"Authorization", "Bearer " + testToken}, {"X-MCP-AUTH", testToken}} {
		cs := connectHTTP(t, &mcp.SSEClientTransport{Endpoint: base + "/sse", HTTPClient: httpClient(auth.header, auth.value, nil)}, nil)
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print('sse')"}})
		if err != nil || res.IsError {
			t.Fatalf("exec over SSE with %s: %v, %v", auth.header, res, err)
		}
		if out := decodeOutput(t, res); out.Stdout != "sse\n" {
			t.Errorf("exec over SSE: stdout = %q, want sse", out.Stdout)
		}
	}
	t.Run("vanished", func(t *testing.T) {
		d := &dropper{}
		cs := connectHTTP(t, &mcp.SSEClientTransport{Endpoint: base + "/sse", HTTPClient: httpClient("Authorization", "Bearer "+testToken, d)}, nil)
		go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(60)"}})
		waitContainers(t, p.stateDir, 1, 10*time.Second)
		d.drop()
		waitNoContainers(t, p.stateDir, 5*time.Second)
	})
	p.stop(t)
}

// An invalid configuration stops the server at start, naming the variable.
// No sandbox is needed: the configuration is checked first.
func TestBinaryConfigErrors(t *testing.T) {
	testenv.Real(t) // it builds the binary
	bin := binaryPath(t)
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"MCP_EXEC_TRANSPORT=http"}, nil, "MCP_EXEC_AUTH_TOKEN"},
		{nil, []string{"--transport", "http"}, "MCP_EXEC_AUTH_TOKEN"},
		{[]string{"MCP_EXEC_TRANSPORT=sse"}, nil, "MCP_EXEC_AUTH_TOKEN"},
		{[]string{"MCP_EXEC_TRANSPORT=http", "MCP_EXEC_AUTH_TOKEN=short"}, nil, "MCP_EXEC_AUTH_TOKEN"},
		{[]string{"MCP_EXEC_TRANSPORT=tcp"}, nil, "MCP_EXEC_TRANSPORT"},
		{[]string{"MCP_EXEC_MEMORY_MB=lots"}, nil, "MCP_EXEC_MEMORY_MB"},
		{[]string{"MCP_EXEC_MAX_TIMEOUT_S=-1"}, nil, "MCP_EXEC_MAX_TIMEOUT_S"},
		{[]string{"MCP_EXEC_DEFAULT_TIMEOUT_S=400"}, nil, "MCP_EXEC_DEFAULT_TIMEOUT_S"},
		{[]string{"MCP_EXEC_MAX_OUTPUT_BYTES=0"}, nil, "MCP_EXEC_MAX_OUTPUT_BYTES"},
		{[]string{"MCP_EXEC_MAX_CONCURRENCY=0"}, nil, "MCP_EXEC_MAX_CONCURRENCY"},
		{[]string{"MCP_EXEC_PROGRESS_S=never"}, nil, "MCP_EXEC_PROGRESS_S"},
		{[]string{"MCP_EXEC_RUNTIME=docker"}, nil, "MCP_EXEC_RUNTIME"},
		{[]string{"MCP_EXEC_CPUS=0"}, nil, "MCP_EXEC_CPUS"},
		{[]string{"MCP_EXEC_AUDIT_LOG=/nonexistent/dir/audit.log"}, nil, "MCP_EXEC_AUDIT_LOG"},
		{[]string{"MCP_EXEC_MAX_CODE_BYTES=0"}, nil, "MCP_EXEC_MAX_CODE_BYTES"},
		{[]string{"MCP_EXEC_MAX_QUEUED=-1"}, nil, "MCP_EXEC_MAX_QUEUED"},
		{[]string{"MCP_EXEC_SESSION_IDLE_S=0"}, nil, "MCP_EXEC_SESSION_IDLE_S"},
		{[]string{"MCP_EXEC_HTTP_STATELESS=maybe"}, nil, "MCP_EXEC_HTTP_STATELESS"},
		{[]string{"MCP_EXEC_PERSISTENT_PER_CLIENT=0"}, nil, "MCP_EXEC_PERSISTENT_PER_CLIENT"},
		{[]string{"MCP_EXEC_PERSISTENT_PER_CLIENT=9"}, nil, "MCP_EXEC_PERSISTENT_PER_CLIENT"},
		{[]string{"MCP_EXEC_PERSISTENT_MAX=2", "MCP_EXEC_PERSISTENT_PER_CLIENT=3"}, nil, "MCP_EXEC_PERSISTENT_PER_CLIENT"},
		{[]string{"MCP_EXEC_PERSISTENT_BACKGROUND=sometimes"}, nil, "MCP_EXEC_PERSISTENT_BACKGROUND"},
	} {
		stateDir := filepath.Join(t.TempDir(), "state")
		cmd := exec.Command(bin, append([]string{"serve"}, tc.args...)...)
		cmd.Env = serverEnv(stateDir, tc.env...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("serve %v with %v: %v, %q; want a non-zero exit naming %s", tc.args, tc.env, err, stderr.String(), tc.want)
		}
		if _, err := os.Stat(stateDir); err == nil {
			t.Errorf("serve with %v created its state dir before refusing", tc.env)
		}
	}
}

// A server whose sandbox cannot start refuses to serve, saying why, and
// leaves nothing.
func TestBinarySandboxUnavailable(t *testing.T) {
	requireSandbox(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(binaryPath(t), "serve")
	cmd.Env = serverEnv(stateDir, "MCP_EXEC_ROOTFS=/nonexistent/rootfs")
	out, err := cmd.CombinedOutput()
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(string(out), "MCP_EXEC_ROOTFS") {
		t.Errorf("serve with a missing rootfs: %v, %s; want exit status 1 naming MCP_EXEC_ROOTFS", err, out)
	}
	assertGone(t, stateDir, "")
}

// With the pool on, calls find their sandbox prepared ahead, each is used
// once (no file of one call is seen by the next), and the server's exit
// leaves nothing, the prepared sandboxes included.
func TestBinaryPool(t *testing.T) {
	requireSandbox(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	var stderr testenv.SyncBuffer
	cmd := exec.Command(binaryPath(t), "serve", "-v")
	cmd.Env = serverEnv(stateDir, "MCP_EXEC_POOL_SIZE=2")
	cmd.Stderr = &stderr
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		// Let the pool refill: 2 prepared at first, one more per call.
		testenv.Eventually(t, fmt.Sprintf("the pool to prepare sandbox %d", 2+i), func() bool {
			return strings.Count(stderr.String(), "sandbox prepared ahead") >= 2+i
		})
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": fmt.Sprintf(`import os
print(sorted(os.listdir("/tmp")), sorted(os.listdir("/tmp/outputs")))
open("/tmp/mark-%d", "w").close()`, i)}})
		if err != nil || res.IsError {
			t.Fatalf("exec %d: %v, %v", i, res, err)
		}
		if out := decodeOutput(t, res); out.Stdout != "['outputs'] []\n" {
			t.Errorf("call %d saw /tmp %q, want only an empty outputs dir", i, out.Stdout)
		}
	}
	// The server's log reaches us through a pipe and a copying goroutine,
	// so the last call's line may trail its result: wait for it.
	testenv.Eventually(t, "the four calls' log lines", func() bool { return strings.Count(stderr.String(), "msg=exec ") >= 4 })
	if n := strings.Count(stderr.String(), "pooled=true"); n != 4 {
		t.Errorf("%d of 4 calls ran on a prepared sandbox, want 4:\n%s", n, stderr.String())
	}
	ids := instances(t, stateDir)
	if err := cs.Close(); err != nil {
		t.Errorf("closing the client: %v", err)
	}
	for _, id := range ids {
		assertGone(t, stateDir, id)
	}
}

// Stateless streamable HTTP scales out: two replicas behind a round-robin
// proxy serve one client's calls, at the newest protocol version, with
// progress on the call's own stream; a client that drops its connection
// mid-call through the proxy gets its container killed.
func TestBinaryHTTPStatelessReplicas(t *testing.T) {
	env := []string{"MCP_EXEC_AUTH_TOKEN=" + testToken, "MCP_EXEC_HTTP_STATELESS=true", "MCP_EXEC_PROGRESS_S=0.2"}
	replicas := []*proc{
		startServer(t, env, "--transport", "http", "--addr", "127.0.0.1:0"),
		startServer(t, env, "--transport", "http", "--addr", "127.0.0.1:0"),
	}
	var backends []*httputil.ReverseProxy
	for _, p := range replicas {
		u, err := url.Parse(p.url(t))
		if err != nil {
			t.Fatal(err)
		}
		rp := httputil.NewSingleHostReverseProxy(u)
		rp.FlushInterval = -1 // streams pass as they come
		backends = append(backends, rp)
	}
	var next atomic.Int64
	lb := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		backends[next.Add(1)%int64(len(backends))].ServeHTTP(w, r)
	}))
	defer lb.Close()

	var mu sync.Mutex
	var progress int
	cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: lb.URL + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, nil)},
		&mcp.ClientOptions{ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress++
			mu.Unlock()
		}})
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Errorf("protocol version %q through the replicas, want the newest, 2026-07-28", v)
	}
	if cs.ID() != "" {
		t.Errorf("session id %q, want none (stateless)", cs.ID())
	}
	for i := range 6 {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": fmt.Sprintf("print(%d)", i)}})
		if err != nil || res.IsError {
			t.Fatalf("call %d: %v %v", i, res, err)
		}
		if out := decodeOutput(t, res); out.Stdout != fmt.Sprintf("%d\n", i) {
			t.Errorf("call %d: stdout %q", i, out.Stdout)
		}
	}
	// Logs trail results through a pipe; a replica has had its turns once
	// both have logged six calls between them.
	testenv.Eventually(t, "the six calls' log lines", func() bool {
		return strings.Count(replicas[0].stderr.String()+replicas[1].stderr.String(), "msg=exec ") >= 6
	})
	for i, p := range replicas {
		if n := strings.Count(p.stderr.String(), "msg=exec "); n == 0 {
			t.Errorf("replica %d served none of the calls", i)
		}
	}
	params := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(1.2)"}}
	params.SetProgressToken("p")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if progress < 2 {
		t.Errorf("%d progress notifications during a 1.2 s call at 0.2 s intervals, want several", progress)
	}
	mu.Unlock()

	// A client whose connection drops mid-call: whichever replica has the
	// call kills its container.
	d := &dropper{}
	gone := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: lb.URL + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, d), MaxRetries: -1}, nil)
	go gone.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(60)"}})
	testenv.Eventually(t, "the call to start on a replica", func() bool { return containers(replicas) > 0 })
	d.drop()
	for _, p := range replicas {
		waitNoContainers(t, p.stateDir, 5*time.Second)
	}
	for _, p := range replicas {
		p.stop(t)
	}
}

// containers counts the containers running on replicas.
func containers(replicas []*proc) int {
	n := 0
	for _, p := range replicas {
		entries, _ := os.ReadDir(filepath.Join(p.stateDir, p.instance, "containers"))
		n += len(entries)
	}
	return n
}
