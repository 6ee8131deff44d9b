package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// requireRun decides whether the benchmark can run here and builds the
// server it drives, as make build does. Under CI=true a missing
// prerequisite fails the test; elsewhere it skips saying what is missing.
func requireRun(t *testing.T) (server string) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping a benchmark run, which starts containers")
	}
	missing := ""
	if os.Geteuid() != 0 {
		missing = fmt.Sprintf("starting containers needs root, running as uid %d", os.Geteuid())
	} else if _, err := baselinePython("/usr/bin/python3"); err != nil {
		missing = "the baseline: " + err.Error()
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatal(missing)
		}
		t.Skip(missing)
	}
	server = filepath.Join(t.TempDir(), "mcp-exec")
	// As make build does: the binary is also the sandbox's init, which
	// must be static.
	cmd := exec.Command("go", "build", "-tags", "seccomp netgo osusergo", "-ldflags=-extldflags=-static", "-o", server, "github.com/inhuman/mcp-exec/cmd/mcp-exec")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building mcp-exec: %v\n%s", err, out)
	}
	return server
}

// TestRun runs the whole benchmark, briefly, against the built server and
// checks what it reports — the keys of the JSON and that no call failed —
// never how fast anything was.
func TestRun(t *testing.T) {
	server := requireRun(t)
	out := filepath.Join(t.TempDir(), "bench.json")
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Two levels rather than four: the test checks the report, and the
	// machine is shared.
	// runsc/ptrace: a variant, its platform passed through;
	// libcontainer+fresh: fresh containers, forking off.
	args := []string{"--server", server, "--runtimes", "libcontainer,libcontainer+fresh,runsc/ptrace", "--n", "3", "--warmup", "1", "--duration", "1s", "--concurrency", "1,8", "--settle", "100ms", "--pace", "50ms", "--packages", "numpy", "--json", out}
	if code := run(ctx, args, &stdout, &stderr); code != 0 {
		t.Fatalf("mcp-exec-bench %s: exit status %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, &stdout, &stderr)
	}
	t.Logf("the table:\n%s", &stdout)
	for _, want := range []string{"host ", "load ", "baseline ", "== libcontainer", "print(1)", "import json, re, decimal, sqlite3", "20,000 os.stat", "persistent session: ", "concurrency 8", "×"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("the table has no %q", want)
		}
	}

	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	// Decoded generically, so that a renamed field fails here.
	var rep map[string]any
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("the JSON report: %v", err)
	}
	j := jsonChecker{t: t}
	j.has(rep, "started", "finished", "host", "options", "server", "baseline", "runtimes")
	j.has(j.obj(rep, "host"), "cpu_model", "cores", "kernel", "os", "go_version", "load_start", "load_end")
	j.has(j.obj(rep, "server"), "path", "version")
	j.has(j.obj(rep, "baseline"), "python", "resolved", "python_version")

	measured := map[string]bool{}
	for _, r := range j.list(rep, "runtimes", 3) {
		entry, _ := r["runtime"].(string)
		kind, _ := runtimeSettings(entry)
		j.has(r, "runtime", "platform", "env")
		if p, _ := r["platform"].(string); entry == "runsc/ptrace" && !strings.Contains(p, "platform ptrace") {
			t.Errorf("runtime %s: platform %q, want ptrace (MCP_EXEC_RUNSC_PLATFORM passed on)", entry, p)
		}
		if env := fmt.Sprint(r["env"]); entry == "libcontainer+fresh" && !strings.Contains(env, "MCP_EXEC_FORK=false") {
			t.Errorf("runtime %s: env %s, want MCP_EXEC_FORK=false", entry, env)
		}
		if reason, ok := r["skipped"].(string); ok {
			if reason == "" || kind == "libcontainer" {
				t.Errorf("runtime %s skipped (%q): libcontainer must run here, and a skip must say why", kind, reason)
			}
			continue
		}
		measured[kind] = true
		j.has(r, "server_version", "start_s", "python_version", "latency", "idle_memory", "throughput", "packages")
		// Two snippets back to back, print(1) paced, and the syscall-heavy
		// program.
		for _, l := range j.list(r, "latency", 4) {
			j.has(l, "snippet", "n", "errors", "p50_ms", "p95_ms", "mean_ms", "min_ms", "ratio_p50", "ratio_p95", "duration_ms_mean", "runtime_seen")
			j.equal(l, "n", 3.0)
			j.equal(l, "errors", 0.0)
			// The server says it ran the runtime it was started with.
			if seen := j.obj(l, "runtime_seen"); seen[kind] != 3.0 || len(seen) != 1 {
				t.Errorf("runtime %s, %v: runtime_seen = %v, want only %s×3", kind, l["snippet"], seen, kind)
			}
		}
		j.has(j.obj(r, "idle_memory"), "server_kb", "helpers_kb", "containers_kb", "container_procs")
		ss := j.obj(r, "sessions")
		j.has(ss, "latency", "ratio_to_fresh_p50", "idle_sessions", "cgroup_peak_kb_mean", "idle_rss_kb_per_session")
		if pk, _ := ss["cgroup_peak_kb_mean"].(float64); pk <= 0 {
			t.Errorf("runtime %s: an idle session's cgroup peak = %v, want > 0", kind, ss["cgroup_peak_kb_mean"])
		}
		j.equal(j.obj(ss, "latency"), "errors", 0.0)
		for _, tp := range j.list(r, "throughput", 2) {
			j.has(tp, "concurrency", "calls", "errors", "elapsed_s", "calls_per_s", "ratio", "peak_memory")
			j.equal(tp, "errors", 0.0)
			j.has(j.obj(tp, "peak_memory"), "server_kb", "helpers_kb", "containers_kb", "container_procs")
			cpu := j.obj(tp, "cpu_per_call")
			j.has(cpu, "total_ms", "server_ms", "start_ms", "code_ms")
			if st, _ := cpu["start_ms"].(float64); st <= 0 {
				t.Errorf("runtime %s: a call's start CPU = %v, want > 0 (a sandbox is made per call)", entry, cpu["start_ms"])
			}
		}
		j.oneOf(j.obj(r, "packages"), "p50_ms", "skipped")

		base := j.obj(r, "baseline")
		j.has(base, "latency", "throughput", "packages")
		for _, l := range j.list(base, "latency", 4) {
			j.has(l, "snippet", "n", "errors", "p50_ms", "p95_ms", "mean_ms", "min_ms", "max_ms")
			j.equal(l, "n", 3.0)
			j.equal(l, "errors", 0.0)
		}
		for _, tp := range j.list(base, "throughput", 2) {
			j.has(tp, "concurrency", "calls", "errors", "elapsed_s", "calls_per_s", "p50_ms", "peak_memory")
			j.equal(tp, "errors", 0.0)
		}
		j.oneOf(j.obj(base, "packages"), "p50_ms", "skipped")
	}
	if !measured["libcontainer"] {
		t.Errorf("libcontainer was not measured")
	}
}

// jsonChecker reads a generically decoded JSON report and reports what is
// missing by its path.
type jsonChecker struct{ t *testing.T }

func (j jsonChecker) has(m map[string]any, keys ...string) {
	j.t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			j.t.Errorf("the report has no %q in %s", k, brief(m))
		}
	}
}

func (j jsonChecker) oneOf(m map[string]any, a, b string) {
	j.t.Helper()
	_, okA := m[a]
	_, okB := m[b]
	if okA == okB {
		j.t.Errorf("the report has %s: %v and %s: %v in %s, want exactly one", a, okA, b, okB, brief(m))
	}
}

func (j jsonChecker) equal(m map[string]any, key string, want any) {
	j.t.Helper()
	if got := m[key]; got != want {
		j.t.Errorf("the report has %s = %v in %s, want %v", key, got, brief(m), want)
	}
}

func (j jsonChecker) obj(m map[string]any, key string) map[string]any {
	j.t.Helper()
	o, ok := m[key].(map[string]any)
	if !ok {
		j.t.Errorf("the report's %q is %T, want an object", key, m[key])
	}
	return o
}

func (j jsonChecker) list(m map[string]any, key string, n int) []map[string]any {
	j.t.Helper()
	l, ok := m[key].([]any)
	if !ok || len(l) != n {
		j.t.Errorf("the report's %q = %s, want a list of %d", key, brief(m[key]), n)
		return nil
	}
	var out []map[string]any
	for _, e := range l {
		o, ok := e.(map[string]any)
		if !ok {
			j.t.Errorf("the report's %q holds a %T, want objects", key, e)
			continue
		}
		out = append(out, o)
	}
	return out
}

func brief(v any) string {
	b, _ := json.Marshal(v)
	if len(b) > 300 {
		return string(b[:300]) + "…"
	}
	return string(b)
}
