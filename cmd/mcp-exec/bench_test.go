package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// BenchmarkExecStdio measures what a client sees: an exec of print(1)
// through one stdio server, call after call, against the baseline of
// `python3 -c 'print(1)'` on the host, measured in the same run. The
// baseline is the interpreter the rootfs is built from (not a PATH shim,
// such as pyenv's bash script, which would flatter the ratio). The metric
// that matters is the ratio of the medians, x-python3. sandbox-p50-ms, the
// same run in-process without MCP, shows what the server adds.
func BenchmarkExecStdio(b *testing.B) {
	sb := requireSandbox(b)
	py, err := rootfs.FindPython(context.Background(), defaultConfig().Python)
	if err != nil {
		b.Fatalf("finding the baseline interpreter: %v", err)
	}
	python := py.Path
	cmd := exec.Command(binaryPath(b), "serve")
	cmd.Env = serverEnv(filepath.Join(b.TempDir(), "state"))
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer cs.Close()
	params := &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "print(1)"}}
	if _, err := cs.CallTool(ctx, params); err != nil { // warm up: page cache, first session
		b.Fatal(err)
	}

	execTimes := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		res, err := cs.CallTool(ctx, params)
		execTimes = append(execTimes, time.Since(start))
		if err != nil || res.IsError {
			b.Fatalf("exec: %v, %v", res, err)
		}
		if out := decodeOutput(b, res); out.Stdout != "1\n" {
			b.Fatalf("exec(print(1)): stdout = %q", out.Stdout)
		}
	}
	b.StopTimer()

	pyTimes := make([]time.Duration, 0, b.N)
	for range b.N {
		start := time.Now()
		out, err := exec.Command(python, "-c", "print(1)").Output()
		pyTimes = append(pyTimes, time.Since(start))
		if err != nil || string(out) != "1\n" {
			b.Fatalf("python3 -c 'print(1)': %q, %v", out, err)
		}
	}
	sbTimes := make([]time.Duration, 0, b.N)
	for range b.N {
		start := time.Now()
		res, err := sb.Run(ctx, runtime.Request{Code: []byte("print(1)"), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
		sbTimes = append(sbTimes, time.Since(start))
		if err != nil || string(res.Stdout) != "1\n" {
			b.Fatalf("sandbox run: %q, %v", res.Stdout, err)
		}
	}
	execP50, pyP50 := median(execTimes), median(pyTimes)
	b.ReportMetric(float64(execP50.Microseconds())/1000, "exec-p50-ms")
	b.ReportMetric(float64(median(sbTimes).Microseconds())/1000, "sandbox-p50-ms")
	b.ReportMetric(float64(pyP50.Microseconds())/1000, "python3-p50-ms")
	b.ReportMetric(float64(execP50)/float64(pyP50), "x-python3")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkRunCLI measures `mcp-exec run -c 'print(1)'` from the shell,
// start-up included, against the host interpreter in the same run.
func BenchmarkRunCLI(b *testing.B) {
	requireSandbox(b)
	py, err := rootfs.FindPython(context.Background(), defaultConfig().Python)
	if err != nil {
		b.Fatalf("finding the baseline interpreter: %v", err)
	}
	env := serverEnv(filepath.Join(b.TempDir(), "state"))
	var cli, base []time.Duration
	for i := 0; i < b.N; i++ {
		cmd := exec.Command(binaryPath(b), "run", "-c", "print(1)")
		cmd.Env = env
		t0 := time.Now()
		if out, err := cmd.Output(); err != nil || string(out) != "1\n" {
			b.Fatalf("mcp-exec run: %v %q", err, out)
		}
		cli = append(cli, time.Since(t0))
		t1 := time.Now()
		if out, err := exec.Command(py.Path, "-c", "print(1)").Output(); err != nil || string(out) != "1\n" {
			b.Fatalf("baseline: %v %q", err, out)
		}
		base = append(base, time.Since(t1))
	}
	slices.Sort(cli)
	slices.Sort(base)
	b.ReportMetric(float64(cli[len(cli)/2])/float64(time.Millisecond), "run-p50-ms")
	b.ReportMetric(float64(base[len(base)/2])/float64(time.Millisecond), "python3-p50-ms")
	b.ReportMetric(float64(cli[len(cli)/2])/float64(base[len(base)/2]), "x-python3")
}
