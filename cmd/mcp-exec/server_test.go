package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/server"
)

// connect serves the shared engine with cfg's server options and
// connects a real go-sdk client to it over in-memory transports. At the end
// of the test it checks that no call left anything behind.
func connect(t *testing.T, cfg config, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	eng := requireSandbox(t)
	srv, err := server.New(eng, cfg.serverOptions())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, ct := mcp.NewInMemoryTransports()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, st, "test") }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cs.Close()
		cancel()
		<-served
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

// execOutput is the part of the exec tool's structured result the tests
// read.
type execOutput struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int    `json:"exit_code"`
	TimedOut        bool   `json:"timed_out"`
	OOMKilled       bool   `json:"oom_killed"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	Truncated       bool   `json:"truncated"`
	DurationMS      int64  `json:"duration_ms"`
	Runtime         string `json:"runtime"`
	Session         string `json:"session"`
	SessionEnded    string `json:"session_ended"`
	PidsLimited     bool   `json:"pids_limited"`
	CPUMS           int64  `json:"cpu_ms"`
	PeakMemoryBytes int64  `json:"peak_memory_bytes"`
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

func TestExec(t *testing.T) {
	cfg := testConfig()
	cfg.MaxOutputBytes = 1000
	cs := connect(t, cfg, nil)
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
			want: execOutput{Stdout: "a\uFFFD\uFFFDb\n"}}, // one U+FFFD a byte: counts hold
		{name: "truncated", args: map[string]any{"code": "print('x' * 5000); print('y' * 10, file=__import__('sys').stderr)"},
			// The head and the tail, the line between them counted in the cap.
			want: execOutput{Stdout: strings.Repeat("x", 485) + "\n[… 4032 bytes left out …]\n" + strings.Repeat("x", 483) + "\n",
				Stderr: "yyyyyyyyyy\n", StdoutTruncated: true, Truncated: true},
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
