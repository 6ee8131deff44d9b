package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// fakeEngine runs "code" written in a tiny language of its own, so that
// the server's logic is tested without root or containers:
//
//	print:TEXT    stdout TEXT
//	sleep:DUR     run for DUR, or until cancelled
//	fail          the sandbox could not run
//	exit:N        exit status N
type fakeEngine struct {
	info    EngineInfo
	running atomic.Int64
	peak    atomic.Int64
	calls   atomic.Int64
	// cancelled counts runs that ended because their context did.
	cancelled atomic.Int64
	sessions  atomic.Int64
	mu        sync.Mutex
	order     []string // the sessions' calls, as they ran
	srv       *Server
}

func newFakeEngine() *fakeEngine {
	return &fakeEngine{info: EngineInfo{Runtime: "fake", PythonVersion: "3.11.2"}}
}

func (f *fakeEngine) Info() EngineInfo { return f.info }

func (f *fakeEngine) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	f.calls.Add(1)
	n := f.running.Add(1)
	defer f.running.Add(-1)
	for p := f.peak.Load(); n > p && !f.peak.CompareAndSwap(p, n); p = f.peak.Load() {
	}
	start := time.Now()
	cmd, arg, _ := strings.Cut(string(req.Code), ":")
	res := runtime.Result{}
	switch cmd {
	case "print":
		res.Stdout = []byte(arg)
	case "sleep":
		arg, _, _ = strings.Cut(arg, "#") // the rest is padding
		d, err := time.ParseDuration(arg)
		if err != nil {
			return res, err
		}
		timer := time.NewTimer(min(d, req.Timeout))
		defer timer.Stop()
		select {
		case <-timer.C:
			if d > req.Timeout {
				res.TimedOut, res.ExitCode = true, 137
			}
		case <-ctx.Done():
			f.cancelled.Add(1)
			return res, ctx.Err()
		}
	case "fail":
		return res, fmt.Errorf("%w: the fake could not", runtime.ErrSandbox)
	case "exit":
		fmt.Sscan(arg, &res.ExitCode)
	case "stdin":
		res.Stdout = req.Stdin
	case "cpu":
		// cpu: the CPU limit ends the run, when there is one.
		if req.CPULimit > 0 {
			res.CPULimited, res.ExitCode, res.Signal, res.CPUTime = true, 137, 9, req.CPULimit
		}
	case "bytes":
		// bytes: stdout that is not UTF-8, a run of bad bytes among good.
		res.Stdout, res.Stderr = []byte("a\xff\xfe\xfdb \xe2\x82 \xe2\x82\xac"), []byte("\x80")
	case "signal":
		fmt.Sscan(arg, &res.Signal)
		res.ExitCode = 128 + res.Signal
	case "big":
		// big:N writes N bytes of numbered lines to stdout, ending with
		// "the end", and a traceback to stderr.
		var n int
		fmt.Sscan(arg, &n)
		res.Stdout = numberedLines(n)
		res.StdoutBytes = int64(len(res.Stdout))
		res.Stderr = append(numberedLines(n), "Traceback (most recent call last):\nValueError: boom\n"...)
		res.StderrBytes = int64(len(res.Stderr))
		res.Value = numberedLines(n)
	case "files":
		// files:NAME=SIZE,... returns those files: a PNG header then
		// filler for .png, bytes 0..255 for .bin, else text.
		for _, spec := range strings.Split(arg, ",") {
			name, size, _ := strings.Cut(spec, "=")
			var n int
			fmt.Sscan(size, &n)
			res.Files = append(res.Files, runtime.File{Path: name, Data: fakeFile(name, n)})
		}
	case "leftout":
		res.FilesTruncated = true
		res.FilesLeftOut = []runtime.LeftOut{{Path: "huge.png", Size: 16 << 20, Why: runtime.LeftBytes}, {Path: "fig-21.png", Size: 100, Why: runtime.LeftCount}}
	case "echofiles":
		// The input files come back as outputs, and a PNG with them.
		res.Files = append(res.Files, req.Files...)
		res.Files = append(res.Files, runtime.File{Path: "plot.png", Data: []byte("\x89PNG\r\n\x1a\n0000")})
		res.FilesTruncated = arg == "truncated"
	}
	res.Duration = max(time.Since(start), time.Millisecond)
	return res, nil
}

// numberedLines is n bytes of numbered lines, the last "the end".
func numberedLines(n int) []byte {
	var b []byte
	for i := 1; len(b) < n-8; i++ {
		b = fmt.Appendf(b, "line %06d %s\n", i, strings.Repeat("y", 40))
	}
	return append(b[:max(0, min(len(b), n-8))], "the end\n"...)
}

// fakeFile is n bytes that a file named name would hold.
func fakeFile(name string, n int) []byte {
	switch path.Ext(name) {
	case ".png":
		return append([]byte("\x89PNG\r\n\x1a\n"), bytes.Repeat([]byte{'p'}, max(0, n-8))...)[:max(n, 8)]
	case ".bin":
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i)
		}
		return b
	}
	return bytes.Repeat([]byte("csv,row\n"), n/8+1)[:n]
}

func testOptions() Options {
	return Options{
		DefaultTimeout: 30 * time.Second,
		MaxTimeout:     300 * time.Second,
		CallCaps:       policy.DefaultCallCaps(),
		Limits:         policy.DefaultLimits(),
		MaxConcurrency: 4,
		MaxQueued:      16,
		Progress:       5 * time.Second,
		Transport:      Stdio,
		SessionIdle:    10 * time.Minute,
		MaxSessions:    1000,
		Version:        "test",
		// As the binary's defaults.
		ResourceMaxBytes: 64 << 20,
		ResourceTTL:      10 * time.Minute,
	}
}

// connect starts a server on eng with opts and connects a real go-sdk
// client to it over in-memory transports.
func connect(t *testing.T, eng Engine, opts Options, copts *mcp.ClientOptions) (*Server, *mcp.ClientSession) {
	t.Helper()
	s, err := New(eng, opts)
	if err != nil {
		t.Fatal(err)
	}
	if f, ok := eng.(*fakeEngine); ok {
		f.srv = s
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.serving(ctx)
	srv := s.mcpServer(func(*mcp.CallToolRequest) origin { return origin{client: "test"} })
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, copts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
		cancel()
		s.drain()
	})
	return s, cs
}

// call runs exec with args and decodes its structured result.
func call(t *testing.T, cs *mcp.ClientSession, args map[string]any) (execOutput, *mcp.CallToolResult) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: args})
	if err != nil {
		t.Fatalf("CallTool(%v): %v", args, err)
	}
	if res.IsError {
		t.Fatalf("CallTool(%v): isError: %s", args, text(res))
	}
	var out execOutput
	remarshal(t, res.StructuredContent, &out)
	return out, res
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func remarshal(t testing.TB, from, to any) {
	t.Helper()
	b, err := json.Marshal(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, to); err != nil {
		t.Fatal(err)
	}
}

func TestToolsList(t *testing.T) {
	eng := newFakeEngine()
	eng.info.Modules = []string{"numpy", "pandas"}
	eng.info.Shell = true
	_, cs := connect(t, eng, testOptions(), nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 1 || res.Tools[0].Name != "exec" {
		t.Fatalf("tools/list: got %d tools, want exactly exec", len(res.Tools))
	}
	tool := res.Tools[0]
	var in, out struct {
		Type                 any                       `json:"type"`
		Required             []string                  `json:"required"`
		AdditionalProperties any                       `json:"additionalProperties"`
		Properties           map[string]map[string]any `json:"properties"`
	}
	remarshal(t, tool.InputSchema, &in)
	remarshal(t, tool.OutputSchema, &out)

	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"inputSchema.type", in.Type, "object"},
		// code may be left out with end_session; the handler says so.
		{"inputSchema.required", strings.Join(in.Required, ","), ""},
		{"inputSchema.additionalProperties", in.AdditionalProperties, false},
		{"inputSchema.properties.code.type", in.Properties["code"]["type"], "string"},
		{"inputSchema.properties.stdin.type", in.Properties["stdin"]["type"], "string"},
		// A plain "number", not the ["null","number"] the SDK infers.
		{"inputSchema.properties.timeout_s.type", in.Properties["timeout_s"]["type"], "number"},
		{"outputSchema.type", out.Type, "object"},
		{"annotations.openWorldHint", *tool.Annotations.OpenWorldHint, false},
		{"annotations.readOnlyHint", tool.Annotations.ReadOnlyHint, false},
		{"annotations.idempotentHint", tool.Annotations.IdempotentHint, false},
	} {
		if c.got != c.want {
			t.Errorf("tools/list: %s = %v, want %v", c.name, c.got, c.want)
		}
	}
	// The contract's fields, required, with their types.
	fields := map[string]string{
		"stdout": "string", "stderr": "string", "exit_code": "integer", "timed_out": "boolean",
		"oom_killed": "boolean", "stdout_truncated": "boolean", "stderr_truncated": "boolean",
		"truncated": "boolean", "duration_ms": "integer",
	}
	for f, typ := range fields {
		if got := out.Properties[f]["type"]; got != typ {
			t.Errorf("tools/list: outputSchema.properties.%s.type = %v, want %s", f, got, typ)
		}
		if !slices.Contains(out.Required, f) {
			t.Errorf("tools/list: outputSchema.required lacks %s", f)
		}
	}
	if len(tool.Icons) != 1 || !strings.HasPrefix(tool.Icons[0].Source, "data:image/svg+xml;base64,") {
		t.Errorf("tools/list: icons = %v, want the SVG icon", tool.Icons)
	}
	// The description comes from the live configuration.
	for _, want := range []string{"Python 3.11.2", "no network", "fresh", "256 MiB", "300 s", "1048576 bytes",
		"numpy, pandas", "/bin/sh"} {
		if !strings.Contains(tool.Description, want) {
			t.Errorf("tools/list: description lacks %q: %s", want, tool.Description)
		}
	}
}

func TestExecResult(t *testing.T) {
	_, cs := connect(t, newFakeEngine(), testOptions(), nil)
	out, res := call(t, cs, map[string]any{"code": "exit:3"})
	if out.ExitCode != 3 || out.Runtime != "fake" {
		t.Errorf("exec(exit:3) = %+v, want exit code 3 from runtime fake", out)
	}
	if !strings.Contains(text(res), "exit code 3") {
		t.Errorf("exec(exit:3): text %q lacks the exit code", text(res))
	}
	out, _ = call(t, cs, map[string]any{"code": "stdin", "stdin": "héllo"})
	if out.Stdout != "héllo" {
		t.Errorf("exec(stdin) = %q, want the stdin back", out.Stdout)
	}
}

func TestExecBadInput(t *testing.T) {
	opts := testOptions()
	opts.MaxStdinBytes = 10
	opts.MaxCodeBytes = 30
	eng := newFakeEngine()
	_, cs := connect(t, eng, opts, nil)
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"missing code", map[string]any{}, "code"},
		{"empty code", map[string]any{"code": ""}, "code is required and must be non-empty"},
		{"code of the wrong type", map[string]any{"code": 42}, "code"},
		{"code over its limit", map[string]any{"code": strings.Repeat("x", 31)}, "code is 31 bytes, over the limit of 30 (MCP_EXEC_MAX_CODE_BYTES)"},
		{"code with a NUL byte", map[string]any{"code": "print('a')\x00print('b')"}, "code contains a NUL byte at offset 10"},
		{"timeout zero", map[string]any{"code": "1", "timeout_s": 0}, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got 0"},
		{"timeout negative", map[string]any{"code": "1", "timeout_s": -1}, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got -1"},
		{"timeout over the maximum", map[string]any{"code": "1", "timeout_s": 500}, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got 500"},
		{"timeout of the wrong type", map[string]any{"code": "1", "timeout_s": "10"}, "timeout_s"},
		{"stdin over its limit", map[string]any{"code": "1", "stdin": "12345678901"}, "stdin is 11 bytes, over the limit of 10 (MCP_EXEC_MAX_STDIN_BYTES)"},
		{"stdin of the wrong type", map[string]any{"code": "1", "stdin": []int{1}}, "stdin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := eng.calls.Load()
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: tc.args})
			if err != nil {
				t.Fatalf("exec(%v): protocol error %v, want isError", tc.args, err)
			}
			if !res.IsError || !strings.Contains(text(res), tc.want) {
				t.Errorf("exec(%v) = isError %v, %q; want isError naming %q", tc.args, res.IsError, text(res), tc.want)
			}
			if n := eng.calls.Load() - before; n != 0 {
				t.Errorf("exec(%v): the engine ran %d times, want 0", tc.args, n)
			}
			// The server keeps serving.
			if out, _ := call(t, cs, map[string]any{"code": "print:2"}); out.Stdout != "2" {
				t.Errorf("exec after a bad call: stdout = %q, want 2", out.Stdout)
			}
		})
	}
	t.Run("unknown tool", func(t *testing.T) {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "eval", Arguments: map[string]any{"code": "1"}})
		if err == nil || !strings.Contains(err.Error(), "eval") {
			t.Errorf("calling tool eval: err = %v, want an error naming it", err)
		}
	})
}

func TestExecConcurrencyAndQueue(t *testing.T) {
	opts := testOptions()
	opts.MaxConcurrency = 2
	opts.MaxQueued = 3
	eng := newFakeEngine()
	srv, cs := connect(t, eng, opts, nil)

	// 2 run, 3 wait; the sixth is refused at once, naming the variable.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan *mcp.CallToolResult, 5)
	for range 5 {
		go func() {
			res, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:1s"}})
			results <- res
		}()
	}
	waitFor(t, "2 calls running and 3 queued", func() bool {
		return eng.running.Load() == 2 && srv.waiting.Load() == 3
	})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print:x"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "MCP_EXEC_MAX_QUEUED=3") {
		t.Fatalf("a call over the queue = %v, %v; want isError naming MCP_EXEC_MAX_QUEUED", text(res), err)
	}
	for range 5 {
		if res := <-results; res == nil || res.IsError {
			t.Errorf("a queued call failed: %v", res)
		}
	}
	if p := eng.peak.Load(); p != 2 {
		t.Errorf("peak concurrency = %d, want 2 (MaxConcurrency)", p)
	}
	// The server keeps serving.
	if out, _ := call(t, cs, map[string]any{"code": "print:ok"}); out.Stdout != "ok" {
		t.Errorf("exec after a refused call: stdout = %q", out.Stdout)
	}
}

// waitFor waits for cond: it polls rather than sleeps a fixed time, so it
// holds on a loaded machine.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, what, cond)
}

func TestExecCancel(t *testing.T) {
	opts := testOptions()
	opts.MaxConcurrency = 1
	eng := newFakeEngine()
	_, cs := connect(t, eng, opts, nil)

	// Cancelling the request sends notifications/cancelled: the running
	// call is cancelled at once, and a call waiting for the only slot
	// stops waiting.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:60s"}})
			errs <- err
		}()
	}
	waitFor(t, "one call running", func() bool { return eng.running.Load() == 1 })
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled call: err = %v, want context.Canceled", err)
		}
	}
	// The waiting call may get the slot an instant before its own
	// cancellation arrives; then it is cancelled in the engine too.
	waitFor(t, "the running call cancelled in the engine", func() bool {
		return eng.cancelled.Load() >= 1 && eng.running.Load() == 0
	})
	// The slot is free again.
	if out, _ := call(t, cs, map[string]any{"code": "print:3"}); out.Stdout != "3" {
		t.Errorf("exec after cancelling: stdout = %q, want 3", out.Stdout)
	}
}

func TestShutdownCancelsCalls(t *testing.T) {
	eng := newFakeEngine()
	s, err := New(eng, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	s.serving(ctx)
	srv := s.mcpServer(func(*mcp.CallToolRequest) origin { return origin{client: "test"} })
	st, ct := mcp.NewInMemoryTransports()
	if _, err := srv.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	done := make(chan *mcp.CallToolResult, 1)
	go func() {
		res, _ := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:60s"}})
		done <- res
	}()
	waitFor(t, "the call running", func() bool { return eng.running.Load() == 1 })
	stop()
	s.drain()
	if eng.cancelled.Load() != 1 {
		t.Errorf("shutdown: %d runs cancelled, want 1", eng.cancelled.Load())
	}
	if res := <-done; res == nil || !res.IsError {
		t.Errorf("a call killed by the shutdown = %v, want isError", res)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print:1"}})
	if err == nil && !res.IsError {
		t.Errorf("a call after the shutdown ran: %v", text(res))
	}
}

// A sandbox that cannot run a call is a tool error, not a crash, and its
// details stay in the server's log.
func TestExecSandboxFailure(t *testing.T) {
	_, cs := connect(t, newFakeEngine(), testOptions(), nil)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "fail"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "sandbox could not run") || strings.Contains(text(res), "the fake could not") {
		t.Errorf("exec on a broken sandbox = %v, %v; want isError saying the sandbox could not run, without the details", text(res), err)
	}
	if out, _ := call(t, cs, map[string]any{"code": "print:1"}); out.Stdout != "1" {
		t.Errorf("exec after a sandbox failure: stdout = %q", out.Stdout)
	}
}

func TestExecProgress(t *testing.T) {
	opts := testOptions()
	opts.Progress = 50 * time.Millisecond
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	_, cs := connect(t, newFakeEngine(), opts, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, req.Params)
			mu.Unlock()
		},
	})
	params := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "sleep:400ms"}}
	params.SetProgressToken("tok-1")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	// Without a token, none.
	call(t, cs, map[string]any{"code": "sleep:200ms"})

	mu.Lock()
	defer mu.Unlock()
	if len(got) < 3 {
		t.Fatalf("got %d progress notifications in 400 ms at 50 ms intervals, want ≥ 3", len(got))
	}
	for i, p := range got {
		if p.ProgressToken != "tok-1" {
			t.Errorf("progress %d: token = %v, want tok-1", i, p.ProgressToken)
		}
		if i > 0 && p.Progress <= got[i-1].Progress {
			t.Errorf("progress %d: %v after %v, want increasing", i, p.Progress, got[i-1].Progress)
		}
	}
}

func TestAuditLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	audit, err := OpenAudit(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	opts := testOptions()
	opts.Audit = audit
	_, cs := connect(t, newFakeEngine(), opts, nil)
	const secret = "print:SECRET-CODE"
	call(t, cs, map[string]any{"code": secret, "stdin": "SECRET-STDIN"})
	if res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "1", "timeout_s": 999}}); err != nil || !res.IsError {
		t.Fatalf("bad call: %v, %v", res, err)
	}

	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("audit log mode = %v, want 0600", fi.Mode().Perm())
	}
	data, _ := os.ReadFile(path)
	if strings.Contains(string(data), "SECRET") {
		t.Errorf("audit log holds code, stdin or output: %s", data)
	}
	var recs []map[string]any
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		var r map[string]any
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 2 {
		t.Fatalf("audit log has %d lines, want 2: %s", len(recs), data)
	}
	ok := recs[0]
	for _, k := range []string{"time", "call_id", "code_sha256", "limits", "timed_out", "oom_killed", "stdout_truncated", "stderr_truncated", "duration_ms"} {
		if _, found := ok[k]; !found {
			t.Errorf("audit record lacks %s: %v", k, ok)
		}
	}
	for k, want := range map[string]any{
		"code_sha256": fmt.Sprintf("%x", sha256.Sum256([]byte(secret))),
		"code_bytes":  float64(len(secret)),
		"stdin_bytes": float64(len("SECRET-STDIN")),
		"exit_code":   float64(0),
		"client":      "test",
		"runtime":     "fake",
	} {
		if ok[k] != want {
			t.Errorf("audit record: %s = %v, want %v", k, ok[k], want)
		}
	}
	bad := recs[1]
	if e, _ := bad["error"].(string); !strings.Contains(e, "timeout_s") || bad["exit_code"] != nil {
		t.Errorf("audit record of a bad call: error = %v, exit_code = %v; want the error and no exit code", bad["error"], bad["exit_code"])
	}
}

func TestValidate(t *testing.T) {
	s := &Server{opts: testOptions()}
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name    string
		in      execInput
		want    time.Duration
		wantErr string
	}{
		{"default timeout", execInput{Code: "1"}, 30 * time.Second, ""},
		{"fractional timeout", execInput{Code: "1", TimeoutS: f(0.5)}, 500 * time.Millisecond, ""},
		{"the maximum", execInput{Code: "1", TimeoutS: f(300)}, 300 * time.Second, ""},
		{"over the maximum", execInput{Code: "1", TimeoutS: f(300.5)}, 0, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got 300.5"},
		{"too small to count", execInput{Code: "1", TimeoutS: f(1e-12)}, 0, "got 1e-12"},
		{"empty code", execInput{}, 0, "code is required and must be non-empty"},
		{"whitespace is code", execInput{Code: " "}, 30 * time.Second, ""},
		{"code at the limit", execInput{Code: strings.Repeat("x", 1<<20)}, 30 * time.Second, ""},
		{"code over the limit", execInput{Code: strings.Repeat("x", 1<<20+1)}, 0, "code is 1048577 bytes, over the limit of 1048576 (MCP_EXEC_MAX_CODE_BYTES)"},
		{"NUL in the code", execInput{Code: "print('a')\x00print('b')"}, 0, "code contains a NUL byte at offset 10"},
		{"stdin at the limit", execInput{Code: "1", Stdin: strings.Repeat("x", 1<<20)}, 30 * time.Second, ""},
		{"stdin over the limit", execInput{Code: "1", Stdin: strings.Repeat("x", 1<<20+1)}, 0, "stdin is 1048577 bytes, over the limit of 1048576 (MCP_EXEC_MAX_STDIN_BYTES)"},
		{"NUL in stdin is data", execInput{Code: "1", Stdin: "a\x00b"}, 30 * time.Second, ""},
		{"a CPU limit", execInput{Code: "1", CPULimitS: f(0.5)}, 30 * time.Second, ""},
		{"a CPU limit at the maximum", execInput{Code: "1", CPULimitS: f(300)}, 30 * time.Second, ""},
		{"a CPU limit over the maximum", execInput{Code: "1", CPULimitS: f(301)}, 0, "cpu_limit_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_CPU_S), got 301"},
		{"a CPU limit of 0", execInput{Code: "1", CPULimitS: f(0)}, 0, "cpu_limit_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_CPU_S), got 0"},
	} {
		got, err := s.validate(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("validate(%s) = %v, %v; want error %q", tc.name, got, err, tc.wantErr)
			}
		} else if err != nil || got != tc.want {
			t.Errorf("validate(%s) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		modify func(*Options)
		want   string
	}{
		{"http without token", func(o *Options) { o.Transport = HTTP }, "{AuthToken} is required"},
		{"short token", func(o *Options) { o.Transport = SSE; o.AuthToken = "short" }, "at least 16 characters, got 5"},
		{"no concurrency", func(o *Options) { o.MaxConcurrency = 0 }, "{MaxConcurrency}"},
		{"negative queue", func(o *Options) { o.MaxQueued = -1 }, "{MaxQueued}"},
		{"no code", func(o *Options) { o.MaxCodeBytes = 0 }, "{MaxCodeBytes}"},
		{"default over max", func(o *Options) { o.DefaultTimeout = time.Hour }, "must not exceed {MaxTimeout}"},
	} {
		o := testOptions()
		tc.modify(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Options.Validate() with %s = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if err := testOptions().Validate(); err != nil {
		t.Errorf("Options.Validate() of the test options = %v", err)
	}
}

func TestSummary(t *testing.T) {
	o := testOptions()
	o.MaxOutputBytes = 10
	s, err := New(newFakeEngine(), o)
	if err != nil {
		t.Fatal(err)
	}
	got := s.summary(callText{out: execOutput{Stdout: "0123456789", Stderr: "err", ExitCode: 137, Signal: "SIGKILL", TimedOut: true, OOMKilled: true,
		StdoutTruncated: true, StdoutBytes: 20, DurationMS: 42}, timeout: 1500 * time.Millisecond})
	want := "exit code 137, killed by SIGKILL (signal 9); timed out after 1.5 s: the sandbox was killed; killed by the memory limit (256 MiB); " +
		"stdout truncated at 10 bytes (20 written) (42 ms)\n--- stdout ---\n0123456789\n--- stderr ---\nerr\n"
	if got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}

func TestExecFiles(t *testing.T) {
	opts := testOptions()
	opts.MaxFiles, opts.MaxFileBytes = 3, 100
	eng := newFakeEngine()
	_, cs := connect(t, eng, opts, nil)

	args := map[string]any{"code": "echofiles:truncated", "files": []map[string]any{
		{"path": "data/in.csv", "content": "a,b\n1,2\n"},
		{"path": "raw.bin", "content_base64": "AAEC/w=="},
	}}
	out, res := call(t, cs, args)
	want := []outputFile{
		{Path: "data/in.csv", Size: 8, MIMEType: "text/csv"},
		{Path: "raw.bin", Size: 4, MIMEType: "application/octet-stream"},
		{Path: "plot.png", Size: 12, MIMEType: "image/png"},
	}
	for i := range out.Files {
		if !strings.HasPrefix(out.Files[i].URI, resourcePrefix) {
			t.Errorf("files[%d].uri = %q, want a resource of this server", i, out.Files[i].URI)
		}
		out.Files[i].URI = ""
	}
	if !slices.Equal(out.Files, want) || !out.FilesTruncated {
		t.Errorf("exec with files: files = %+v, truncated %v; want %+v, true", out.Files, out.FilesTruncated, want)
	}
	if len(res.Content) != 4 {
		t.Fatalf("exec with files: %d content blocks, want the text and one per file", len(res.Content))
	}
	if r, ok := res.Content[1].(*mcp.EmbeddedResource); !ok || r.Resource.Text != "a,b\n1,2\n" || r.Resource.MIMEType != "text/csv" ||
		r.Resource.URI != "file:///tmp/outputs/data/in.csv" {
		t.Errorf("content[1] = %#v, want the CSV as a text resource", res.Content[1])
	}
	if r, ok := res.Content[2].(*mcp.EmbeddedResource); !ok || string(r.Resource.Blob) != "\x00\x01\x02\xff" || r.Resource.Text != "" {
		t.Errorf("content[2] = %#v, want the bytes as a blob resource", res.Content[2])
	}
	if img, ok := res.Content[3].(*mcp.ImageContent); !ok || img.MIMEType != "image/png" || len(img.Data) != 12 {
		t.Errorf("content[3] = %#v, want the PNG as an image block", res.Content[3])
	}
	if txt := text(res); !strings.Contains(txt, "files from /tmp/outputs:\n  data/in.csv (8 bytes): below\n  raw.bin (4 bytes): below\n  plot.png (12 bytes): image below\n") ||
		!strings.Contains(txt, "left out") {
		t.Errorf("text = %q, want the files named and the truncation said", txt)
	}

	for _, tc := range []struct {
		name  string
		files any
		want  string
	}{
		{"too many", []map[string]any{{"path": "a", "content": ""}, {"path": "b", "content": ""}, {"path": "c", "content": ""}, {"path": "d", "content": ""}},
			"files: 4 files, over the limit of 3 (MCP_EXEC_MAX_FILES)"},
		{"too big", []map[string]any{{"path": "a", "content": strings.Repeat("x", 60)}, {"path": "b", "content": strings.Repeat("x", 60)}},
			"files: more than 100 bytes in all, over the limit (MCP_EXEC_MAX_FILE_BYTES)"},
		{"absolute", []map[string]any{{"path": "/etc/passwd", "content": ""}}, "files[0].path \"/etc/passwd\": path must be relative"},
		{"dot dot", []map[string]any{{"path": "a/../../x", "content": ""}}, "files[0].path \"a/../../x\": path has a \"..\" element"},
		{"NUL", []map[string]any{{"path": "a\x00b", "content": ""}}, "NUL"},
		{"outputs", []map[string]any{{"path": "outputs/x", "content": ""}}, "/tmp/outputs starts empty"},
		{"both contents", []map[string]any{{"path": "a", "content": "", "content_base64": ""}}, "files[0]: give one of content, content_base64 or uri"},
		{"content and uri", []map[string]any{{"path": "a", "content": "", "uri": resourcePrefix + "x/a"}}, "files[0]: give one of content, content_base64 or uri"},
		{"no content", []map[string]any{{"path": "a"}}, "files[0]: content, content_base64 or uri is required"},
		{"bad base64", []map[string]any{{"path": "a", "content_base64": "!!"}}, "files[0].content_base64"},
		{"twice", []map[string]any{{"path": "a", "content": ""}, {"path": "a", "content": ""}}, "given twice"},
		{"file and dir", []map[string]any{{"path": "a", "content": ""}, {"path": "a/b", "content": ""}}, "is a file and a directory"},
		{"wrong type", "not a list", "files"},
	} {
		before := eng.calls.Load()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "echofiles", "files": tc.files}})
		if err != nil || !res.IsError || !strings.Contains(text(res), tc.want) {
			t.Errorf("exec with %s files = %v, %q; want isError naming %q", tc.name, err, text(res), tc.want)
		}
		if eng.calls.Load() != before {
			t.Errorf("exec with %s files: the engine ran", tc.name)
		}
	}
}

// An image block is only ever what the content is: HTML named x.png is a
// resource, a PNG named x.jpg a PNG.
func TestMimeType(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\n0000")
	html := []byte("<!DOCTYPE html><html><script>alert(1)</script></html>")
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"plot.png", png, "image/png"},
		{"x.png", html, "text/html"},
		{"x.jpg", png, "image/png"},
		{"x.png", []byte{0, 1, 2, 3}, "application/octet-stream"},
		{"data.csv", []byte("a,b\n"), "text/csv"},
		{"notes", []byte("hello"), "text/plain"},
		{"photo.gif", []byte("GIF89a......"), "image/gif"},
	} {
		if got := mimeType(tc.name, tc.data); got != tc.want {
			t.Errorf("mimeType(%q, %.12q) = %q, want %q", tc.name, tc.data, got, tc.want)
		}
	}
	if c, ok := fileContent(runtime.File{Path: "x.png", Data: html}, mimeType("x.png", html)).(*mcp.EmbeddedResource); !ok || c.Resource.Text != string(html) {
		t.Errorf("HTML named x.png: content %#v, want a text resource", c)
	}
}

// Under the process runtime the call's /tmp is its working directory: the
// description tells the model to write there, by relative paths.
func TestDescriptionProcess(t *testing.T) {
	eng := newFakeEngine()
	eng.info = EngineInfo{Runtime: "process", PythonVersion: "3.11.2", Modules: []string{"matplotlib"}}
	srv, err := New(eng, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	d := srv.description()
	for _, want := range []string{"may write only in its working directory", "use relative paths", "write them to outputs/ in the working directory",
		"PNG in outputs/ in the working directory"} {
		if !strings.Contains(d, want) {
			t.Errorf("description under the process runtime lacks %q:\n%s", want, d)
		}
	}
	if strings.Contains(d, "/tmp/outputs") || strings.Contains(d, "read-only except /tmp") {
		t.Errorf("description under the process runtime names the machine's /tmp as the call's:\n%s", d)
	}
}

// The data dir in the description: where, how much as a person reads it,
// and "at least" when the listing stopped at its bound; nothing without.
func TestDescriptionData(t *testing.T) {
	for _, c := range []struct {
		data *DataInfo
		want string
	}{
		{&DataInfo{Path: "/data", Files: 3, Bytes: 6_543_210}, "Data is in /data, read-only: 3 files, 6.5 MB in all;"},
		{&DataInfo{Path: "/data", Files: 1, Bytes: 3_247_127}, "Data is in /data, read-only: 1 file, 3.2 MB in all;"},
		{&DataInfo{Path: "/data", Files: 100000, Bytes: 999, Partial: true}, "Data is in /data, read-only: at least 100000 files, 999 bytes in all;"},
		{nil, ""},
	} {
		eng := newFakeEngine()
		eng.info.Data = c.data
		srv, err := New(eng, testOptions())
		if err != nil {
			t.Fatal(err)
		}
		d := srv.description()
		if c.want == "" && strings.Contains(d, "/data") || !strings.Contains(d, c.want) {
			t.Errorf("description with %+v, want %q:\n%s", c.data, c.want, d)
		}
	}
}

// The output schema's descriptions are struct tags, which cannot be
// computed: each that names the outputs dir must name policy's.
func TestSchemaNamesTheOutputsDir(t *testing.T) {
	n := 0
	for _, typ := range []reflect.Type{reflect.TypeFor[execOutput](), reflect.TypeFor[outputFile]()} {
		for f := range typ.Fields() {
			tag := f.Tag.Get("jsonschema")
			if strings.Contains(tag, "/"+policy.OutputsName) {
				n++
				if !strings.Contains(tag, policy.OutputsDir) {
					t.Errorf("%s.%s's description %q names an outputs dir other than %s", typ.Name(), f.Name, tag, policy.OutputsDir)
				}
			}
		}
	}
	if n < 3 {
		t.Errorf("%d descriptions name the outputs dir, want the 3 that do", n)
	}
}
