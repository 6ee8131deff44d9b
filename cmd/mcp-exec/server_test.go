package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connect starts an exec server with cfg on the shared sandbox and
// connects a real go-sdk client to it over in-memory transports. At the end
// of the test it checks that no call left anything behind.
func connect(t *testing.T, cfg config, audit *auditLog, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	sb := requireSandbox(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := newExecServer(ctx, cfg, sb, audit, nil)
	srv := s.mcpServer(func(*mcp.CallToolRequest) origin { return origin{client: "test"} }, nil)
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		ss.Wait()
		cancel()
		s.drain()
		waitNoContainers(t, cfg.StateDir, 5*time.Second)
	})
	return cs
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
	return decodeOutput(t, res), res
}

func decodeOutput(t testing.TB, res *mcp.CallToolResult) execOutput {
	t.Helper()
	var out execOutput
	remarshal(t, res.StructuredContent, &out)
	return out
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

func TestToolsList(t *testing.T) {
	cs := connect(t, testConfig(), nil, nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != 1 || res.Tools[0].Name != "exec" {
		t.Fatalf("tools/list: got %d tools, want exactly exec", len(res.Tools))
	}
	tool := res.Tools[0]
	var in, out struct {
		Type       any                       `json:"type"`
		Required   []string                  `json:"required"`
		Properties map[string]map[string]any `json:"properties"`
	}
	remarshal(t, tool.InputSchema, &in)
	remarshal(t, tool.OutputSchema, &out)

	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"inputSchema.type", in.Type, "object"},
		{"inputSchema.required", strings.Join(in.Required, ","), "code"},
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
	// The description comes from the live configuration.
	for _, want := range []string{"Python " + shared.sb.pythonVersion, "no network", "fresh", "256 MiB", "300 s", "1048576 bytes"} {
		if !strings.Contains(tool.Description, want) {
			t.Errorf("tools/list: description lacks %q: %s", want, tool.Description)
		}
	}
}

func TestExec(t *testing.T) {
	cfg := testConfig()
	cfg.MaxOutputBytes = 1000
	cs := connect(t, cfg, nil, nil)
	for _, tc := range []struct {
		name     string
		args     map[string]any
		want     execOutput // compared: Stdout, Stderr, ExitCode and the flags
		inText   string
		maxMS    int64
		checkLen bool
	}{
		{name: "print", args: map[string]any{"code": "print(1)"},
			want: execOutput{Stdout: "1\n"}, inText: "exit code 0"},
		{name: "stdin", args: map[string]any{"code": "import sys; print(sys.stdin.read().upper(), end='')", "stdin": "héllo\n"},
			want: execOutput{Stdout: "HÉLLO\n"}},
		{name: "stderr and exit code", args: map[string]any{"code": "import sys; print('bad', file=sys.stderr); sys.exit(3)"},
			want: execOutput{Stderr: "bad\n", ExitCode: 3}, inText: "exit code 3"},
		{name: "timeout", args: map[string]any{"code": "import time; print('start', flush=True); time.sleep(30)", "timeout_s": 1},
			want: execOutput{Stdout: "start\n", ExitCode: 137, TimedOut: true}, inText: "timed out", maxMS: 5000},
		{name: "invalid UTF-8", args: map[string]any{"code": `import sys; sys.stdout.buffer.write(b"a\xff\xfeb\n")`},
			want: execOutput{Stdout: "a\uFFFDb\n"}},
		{name: "truncated", args: map[string]any{"code": "print('x' * 5000); print('y' * 10, file=__import__('sys').stderr)"},
			want:   execOutput{Stdout: strings.Repeat("x", 1000), Stderr: "yyyyyyyyyy\n", StdoutTruncated: true, Truncated: true},
			inText: "stdout truncated at 1000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, res := call(t, cs, tc.args)
			got := execOutput{Stdout: out.Stdout, Stderr: out.Stderr, ExitCode: out.ExitCode, TimedOut: out.TimedOut,
				OOMKilled: out.OOMKilled, StdoutTruncated: out.StdoutTruncated, StderrTruncated: out.StderrTruncated, Truncated: out.Truncated}
			if got != tc.want {
				t.Errorf("exec(%v) = %+v, want %+v", tc.args, got, tc.want)
			}
			if out.Runtime != "libcontainer" || out.DurationMS <= 0 {
				t.Errorf("exec(%v): runtime = %q, duration_ms = %d", tc.args, out.Runtime, out.DurationMS)
			}
			if tc.maxMS > 0 && out.DurationMS > tc.maxMS {
				t.Errorf("exec(%v): duration_ms = %d, want ≤ %d", tc.args, out.DurationMS, tc.maxMS)
			}
			if txt := text(res); !strings.Contains(txt, tc.inText) || !strings.Contains(txt, strings.TrimSpace(tc.want.Stdout)) {
				t.Errorf("exec(%v): text %q lacks %q or the output", tc.args, txt, tc.inText)
			}
		})
	}
}

func TestExecBadInput(t *testing.T) {
	cfg := testConfig()
	cfg.MaxStdinBytes = 10
	cs := connect(t, cfg, nil, nil)
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"missing code", map[string]any{}, "code"},
		{"empty code", map[string]any{"code": ""}, "code is required and must be non-empty"},
		{"code of the wrong type", map[string]any{"code": 42}, "code"},
		{"timeout zero", map[string]any{"code": "1", "timeout_s": 0}, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got 0"},
		{"timeout negative", map[string]any{"code": "1", "timeout_s": -1}, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got -1"},
		{"timeout over the maximum", map[string]any{"code": "1", "timeout_s": 500}, "timeout_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_TIMEOUT_S), got 500"},
		{"timeout of the wrong type", map[string]any{"code": "1", "timeout_s": "10"}, "timeout_s"},
		{"stdin over its limit", map[string]any{"code": "1", "stdin": "12345678901"}, "stdin is 11 bytes, over the limit of 10 (MCP_EXEC_MAX_STDIN_BYTES)"},
		{"stdin of the wrong type", map[string]any{"code": "1", "stdin": []int{1}}, "stdin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: tc.args})
			if err != nil {
				t.Fatalf("exec(%v): protocol error %v, want isError", tc.args, err)
			}
			if !res.IsError || !strings.Contains(text(res), tc.want) {
				t.Errorf("exec(%v) = isError %v, %q; want isError naming %q", tc.args, res.IsError, text(res), tc.want)
			}
			// The server keeps serving.
			if out, _ := call(t, cs, map[string]any{"code": "print(2)"}); out.Stdout != "2\n" {
				t.Errorf("exec after a bad call: stdout = %q, want 2", out.Stdout)
			}
		})
	}
	t.Run("unknown tool", func(t *testing.T) {
		_, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "eval", Arguments: map[string]any{"code": "1"}})
		if err == nil || !strings.Contains(err.Error(), "eval") {
			t.Errorf("calling tool eval: err = %v, want an error naming it", err)
		}
		if out, _ := call(t, cs, map[string]any{"code": "print(2)"}); out.Stdout != "2\n" {
			t.Errorf("exec after a bad call: stdout = %q, want 2", out.Stdout)
		}
	})
}

func TestExecConcurrency(t *testing.T) {
	const sleep = 2 * time.Second
	for _, tc := range []struct {
		name     string
		calls    int
		slots    int
		min, lim time.Duration
	}{
		// All at once: about one sleep, far from the four of a queue.
		{"parallel", 4, 4, sleep, sleep * 5 / 2},
		// One at a time: the second waits its turn.
		{"one slot", 2, 1, sleep * 2, sleep * 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.MaxConcurrency = tc.slots
			cs := connect(t, cfg, nil, nil)
			start := time.Now()
			var wg sync.WaitGroup
			for range tc.calls {
				wg.Go(func() {
					out, _ := call(t, cs, map[string]any{"code": "import time; time.sleep(2)"})
					if out.ExitCode != 0 {
						t.Errorf("sleep: exit code %d", out.ExitCode)
					}
				})
			}
			wg.Wait()
			if took := time.Since(start); took < tc.min || took > tc.lim {
				t.Errorf("%d sleeps of %v with %d slots took %v, want between %v and %v", tc.calls, sleep, tc.slots, took, tc.min, tc.lim)
			}
		})
	}
}

func TestExecCancel(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConcurrency = 1
	cs := connect(t, cfg, nil, nil)

	// Cancelling the request sends notifications/cancelled: the running
	// call's container is killed at once, and a call waiting for the only
	// slot stops waiting.
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(60)"}})
			errs <- err
		}()
	}
	waitContainers(t, cfg.StateDir, 1, 10*time.Second)
	cancel()
	for range 2 {
		if err := <-errs; !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled call: err = %v, want context.Canceled", err)
		}
	}
	waitNoContainers(t, cfg.StateDir, 3*time.Second)
	// The slot is free again.
	if out, _ := call(t, cs, map[string]any{"code": "print(3)"}); out.Stdout != "3\n" {
		t.Errorf("exec after cancelling: stdout = %q, want 3", out.Stdout)
	}
}

// A sandbox that cannot run a call is a tool error, not a crash.
func TestExecSandboxFailure(t *testing.T) {
	requireSandbox(t)
	cfg := testConfig()
	cfg.StateDir = filepath.Join(t.TempDir(), "state")
	sb, err := newSandbox(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	sb.close() // what a broken host would do to it
	s := newExecServer(context.Background(), cfg, sb, nil, nil)
	srv := s.mcpServer(func(*mcp.CallToolRequest) origin { return origin{client: "test"} }, nil)
	st, ct := mcp.NewInMemoryTransports()
	if _, err := srv.Connect(context.Background(), st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print(1)"}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "sandbox could not run") {
		t.Errorf("exec on a broken sandbox = %v, %v; want isError saying the sandbox could not run", res, err)
	}
	assertGone(t, cfg.StateDir, "")
}

func TestExecProgress(t *testing.T) {
	cfg := testConfig()
	cfg.Progress = 200 * time.Millisecond
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	cs := connect(t, cfg, nil, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, req.Params)
			mu.Unlock()
		},
	})
	params := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import time; time.sleep(1.5)"}}
	params.SetProgressToken("tok-1")
	if _, err := cs.CallTool(context.Background(), params); err != nil {
		t.Fatal(err)
	}
	// Without a token, none.
	call(t, cs, map[string]any{"code": "import time; time.sleep(0.5)"})

	mu.Lock()
	defer mu.Unlock()
	if len(got) < 3 {
		t.Fatalf("got %d progress notifications in 1.5 s at 200 ms intervals, want ≥ 3", len(got))
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
	audit, err := openAudit(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.close()
	cs := connect(t, testConfig(), audit, nil)
	const secret = "print('SECRET-CODE')"
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
		"runtime":     "libcontainer",
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

func TestValidate(t *testing.T) {
	s := &execServer{cfg: defaultConfig()}
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
		{"stdin at the limit", execInput{Code: "1", Stdin: strings.Repeat("x", 1<<20)}, 30 * time.Second, ""},
		{"stdin over the limit", execInput{Code: "1", Stdin: strings.Repeat("x", 1<<20+1)}, 0, "stdin is 1048577 bytes, over the limit of 1048576 (MCP_EXEC_MAX_STDIN_BYTES)"},
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

func TestSummary(t *testing.T) {
	cfg := defaultConfig()
	cfg.MaxOutputBytes = 10
	got := summary(execOutput{Stdout: "0123456789", Stderr: "err", ExitCode: 137, TimedOut: true, OOMKilled: true,
		StdoutTruncated: true, DurationMS: 42}, 1500*time.Millisecond, cfg)
	want := "exit code 137; timed out after 1.5 s, the container was killed; killed by the memory limit (256 MiB); " +
		"stdout truncated at 10 bytes (42 ms)\n--- stdout ---\n0123456789\n--- stderr ---\nerr\n"
	if got != want {
		t.Errorf("summary = %q, want %q", got, want)
	}
}
