package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	tests := []struct {
		sorted []float64
		p      float64
		want   float64
	}{
		{[]float64{7}, 50, 7},
		{[]float64{7}, 95, 7},
		{[]float64{1, 2, 3, 4}, 0, 1},
		{[]float64{1, 2, 3, 4}, 50, 2.5}, // the mean of the middle two
		{[]float64{1, 2, 3, 4}, 95, 3.85},
		{[]float64{1, 2, 3, 4}, 100, 4},
		{[]float64{1, 2, 3}, 50, 2},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180, 190, 200}, 95, 190.5},
	}
	for _, tt := range tests {
		if got := percentile(tt.sorted, tt.p); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("percentile(%v, %v) = %v, want %v", tt.sorted, tt.p, got, tt.want)
		}
	}
	if got := percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("percentile(nil, 50) = %v, want NaN", got)
	}
}

func TestSummarize(t *testing.T) {
	if got := summarize(nil); got != nil {
		t.Errorf("summarize(nil) = %+v, want nil", got)
	}
	ms := time.Millisecond
	got := summarize([]time.Duration{40 * ms, 10 * ms, 30 * ms, 20 * ms}) // unsorted on purpose
	want := Summary{P50MS: 25, P95MS: 38.5, MeanMS: 25, MinMS: 10, MaxMS: 40}
	if got == nil || math.Abs(got.P50MS-want.P50MS) > 1e-9 || math.Abs(got.P95MS-want.P95MS) > 1e-9 ||
		got.MeanMS != want.MeanMS || got.MinMS != want.MinMS || got.MaxMS != want.MaxMS {
		t.Errorf("summarize(40, 10, 30, 20 ms) = %+v, want %+v", got, want)
	}
}

func TestRatio(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	tests := []struct {
		sandbox, baseline float64
		want              *float64
		text              string
	}{
		{143, 43, f(143.0 / 43), "3.33×"},
		{7.4, 23, f(7.4 / 23), "0.32×"},
		{931, 47.5, f(931 / 47.5), "19.6×"},
		{4300, 30, f(4300.0 / 30), "143×"},
		{1, 1, f(1), "1.00×"},
		{5, 0, nil, "n/a"}, // no baseline figure: no ratio, not +Inf
		{0, 5, nil, "n/a"}, // no successful call: no ratio, not 0×
		{math.NaN(), 5, nil, "n/a"},
		{math.Inf(1), 5, nil, "n/a"},
	}
	for _, tt := range tests {
		got := ratio(tt.sandbox, tt.baseline)
		if (got == nil) != (tt.want == nil) || got != nil && math.Abs(*got-*tt.want) > 1e-9 {
			t.Errorf("ratio(%v, %v) = %v, want %v", tt.sandbox, tt.baseline, deref1(got), deref1(tt.want))
		}
		if text := fmtRatio(got); text != tt.text {
			t.Errorf("fmtRatio(ratio(%v, %v)) = %q, want %q", tt.sandbox, tt.baseline, text, tt.text)
		}
	}
}

func deref1(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}

// A failed call is counted and reported, never timed.
func TestMeasureCountsFailures(t *testing.T) {
	var n atomic.Int64
	call := func(context.Context) (outcome, error) {
		if n.Add(1)%3 == 0 {
			return outcome{}, errors.New("exit_code 1: boom")
		}
		return outcome{durationMS: 5, hasDur: true, runtime: "libcontainer"}, nil
	}
	l := measureLatency(context.Background(), "x", 9, 3, 0, call) // 12 calls: 1 warm-up and 3 timed ones fail
	if l.N != 6 || l.Errors != 4 || len(l.ErrorSamples) != 4 || l.Summary == nil {
		t.Errorf("measureLatency: n = %d, errors = %d, samples = %d, summary = %v; want 6, 4, 4, non-nil", l.N, l.Errors, len(l.ErrorSamples), l.Summary)
	}
	if l.DurationMSMean == nil || *l.DurationMSMean != 5 || l.RuntimeSeen["libcontainer"] != 6 {
		t.Errorf("measureLatency: duration_ms mean = %v, runtime seen = %v; want 5, libcontainer×6", deref1(l.DurationMSMean), l.RuntimeSeen)
	}

	n.Store(0)
	tp := measureThroughput(context.Background(), 3, 0, 4, call) // 12 calls, 4 fail
	if tp.Calls != 8 || tp.Errors != 4 || len(tp.ErrorSamples) != 4 || tp.Concurrency != 3 {
		t.Errorf("measureThroughput: calls = %d, errors = %d, samples = %d, concurrency = %d; want 8, 4, 4, 3", tp.Calls, tp.Errors, len(tp.ErrorSamples), tp.Concurrency)
	}

	never := func(context.Context) (outcome, error) { return outcome{}, errors.New("refused") }
	if l := measureLatency(context.Background(), "x", 3, 0, 0, never); l.Summary != nil || l.N != 0 || l.Errors != 3 {
		t.Errorf("measureLatency of failing calls: n = %d, errors = %d, summary = %+v; want 0, 3, nil", l.N, l.Errors, l.Summary)
	}
}

func TestCheck(t *testing.T) {
	zero, one := 0, 1
	tests := []struct {
		name    string
		out     execOutput
		want    string
		wantErr string // "" for none
	}{
		{"ok", execOutput{Stdout: "1\n", ExitCode: &zero}, "1\n", ""},
		{"ok, nothing printed", execOutput{ExitCode: &zero}, "", ""},
		{"wrong stdout", execOutput{Stdout: "2\n", ExitCode: &zero}, "1\n", `stdout "2\n"`},
		{"non-zero exit", execOutput{Stderr: "Traceback…\nModuleNotFoundError: No module named 'numpy'\n", ExitCode: &one}, "", "exit_code 1: ModuleNotFoundError: No module named 'numpy'"},
		{"no exit_code", execOutput{Stdout: "1\n"}, "1\n", "no exit_code"},
		{"timed out", execOutput{ExitCode: &zero, TimedOut: true}, "", "timed out"},
		{"oom", execOutput{ExitCode: &zero, OOMKilled: true}, "", "memory limit"},
	}
	for _, tt := range tests {
		err := check(tt.out, tt.want)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("check(%s) = %v, want nil", tt.name, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("check(%s) = %v, want an error with %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestServerEnv(t *testing.T) {
	o := options{Concurrency: []int{1, 2, 16}, Env: []string{"MCP_EXEC_POOL_SIZE=0", "MCP_EXEC_MAX_CONCURRENCY=32", "MCP_EXEC_RUNTIME=runsc"}}
	base := []string{"PATH=/usr/bin", "MCP_EXEC_ROOTFS=/elsewhere", "HOME=/root"}
	env, shown := serverEnv(base, o, "MCP_EXEC_RUNTIME=libcontainer")
	wantShown := []string{"MCP_EXEC_MAX_CONCURRENCY=32", "MCP_EXEC_MAX_QUEUED=256", "MCP_EXEC_POOL_SIZE=0", "MCP_EXEC_RUNTIME=libcontainer"}
	if !slices.Equal(shown, wantShown) {
		t.Errorf("serverEnv: MCP_EXEC_ part = %q, want %q", shown, wantShown)
	}
	wantEnv := append([]string{"PATH=/usr/bin", "HOME=/root"}, wantShown...)
	if !slices.Equal(env, wantEnv) {
		t.Errorf("serverEnv: env = %q, want %q", env, wantEnv)
	}
	_, shown = serverEnv(nil, options{Concurrency: []int{1, 2}})
	if want := []string{"MCP_EXEC_MAX_CONCURRENCY=8", "MCP_EXEC_MAX_QUEUED=128"}; !slices.Equal(shown, want) {
		t.Errorf("serverEnv with no --env: %q, want %q", shown, want)
	}
}

func TestImportSnippet(t *testing.T) {
	tests := []struct {
		packages []string
		want     string
	}{
		{[]string{"numpy", "pandas"}, "import numpy, pandas"},
		{[]string{"Pillow", "pyyaml", "python-dateutil", "scikit-learn"}, "import PIL, yaml, dateutil, sklearn"},
		{[]string{"typing-extensions"}, "import typing_extensions"},
	}
	for _, tt := range tests {
		if got := importSnippet(tt.packages); got.Code != tt.want || got.Stdout != "" {
			t.Errorf("importSnippet(%q) = %+v, want code %q printing nothing", tt.packages, got, tt.want)
		}
	}
}

func TestParseOptions(t *testing.T) {
	o, err := parseOptions([]string{"--runtimes", "runsc, libcontainer", "--concurrency", "1,4", "--env", "MCP_EXEC_POOL_SIZE=0", "--env", "A=b=c", "--n", "5"}, &strings.Builder{})
	if err != nil {
		t.Fatalf("parseOptions: %v", err)
	}
	if !slices.Equal(o.Runtimes, []string{"runsc", "libcontainer"}) || !slices.Equal(o.Concurrency, []int{1, 4}) ||
		!slices.Equal(o.Env, []string{"MCP_EXEC_POOL_SIZE=0", "A=b=c"}) || o.N != 5 || o.Warmup != 3 || o.Duration != 10*time.Second || o.Server != "bin/mcp-exec" {
		t.Errorf("parseOptions: %+v", o)
	}
	for _, bad := range [][]string{{"--n", "0"}, {"--concurrency", "0"}, {"--concurrency", "x"}, {"--env", "novalue"}, {"--runtimes", ","}, {"--duration", "0s"}, {"extra"}} {
		if _, err := parseOptions(bad, &strings.Builder{}); err == nil {
			t.Errorf("parseOptions(%q) = nil error, want one", bad)
		}
	}
}

func TestTable(t *testing.T) {
	var b strings.Builder
	tb := &table{}
	tb.add("latency, ms", "p50", "×p50")
	tb.add("print(1)", "143.1", "3.33×")
	tb.add("import json", "9.0", "n/a")
	tb.write(&b, "  ", true)
	want := "" +
		"  latency, ms    p50   ×p50\n" +
		"  print(1)     143.1  3.33×\n" +
		"  import json    9.0    n/a\n"
	if got := b.String(); got != want {
		t.Errorf("table.write:\n%s\nwant:\n%s", got, want)
	}
}

// The memory walk needs no root: a child of ours is a helper (it shares
// our namespaces), not a container, and a skipped one is left out.
func TestReadMemory(t *testing.T) {
	var pids []int
	for range 2 {
		cmd := exec.Command("sleep", "30")
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting sleep: %v", err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		pids = append(pids, cmd.Process.Pid)
	}
	// A sleep that is still loading its libraries grows between the two
	// readings: measure once both sleep.
	for _, pid := range pids {
		deadline := time.Now().Add(10 * time.Second)
		for {
			w, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
			if strings.Contains(string(w), "sleep") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sleep %d is not sleeping after 10 s (wchan %q)", pid, w)
			}
			time.Sleep(time.Millisecond)
		}
	}
	all, err := readMemory(os.Getpid())
	if err != nil {
		t.Fatalf("readMemory(self): %v", err)
	}
	if all.ServerKB <= 0 || all.HelpersKB <= 0 || all.ContainersKB != 0 || all.ContainerProcs != 0 {
		t.Errorf("readMemory(self with two sleeping children) = %+v, want server and helpers > 0, no containers", all)
	}
	if all.PssKB != 0 {
		t.Errorf("readMemory(self).PssKB = %d, want 0: only readIdleMemory reads smaps_rollup", all.PssKB)
	}
	// PSS divides what the children share with us (the test binary's
	// text, forked from us) among us, so it is below the RSS sum.
	idle, err := readIdleMemory(os.Getpid())
	if err != nil {
		t.Fatalf("readIdleMemory(self): %v", err)
	}
	if rss := idle.TotalServerKB(); idle.PssKB <= 0 || idle.PssKB > rss {
		t.Errorf("readIdleMemory(self).PssKB = %d KiB, want > 0 and <= %d (the RSS sum)", idle.PssKB, rss)
	}
	one, err := readMemory(os.Getpid(), pids[0])
	if err != nil {
		t.Fatalf("readMemory(self, skipping one): %v", err)
	}
	if one.HelpersKB <= 0 || one.HelpersKB >= all.HelpersKB {
		t.Errorf("readMemory(self, skipping one of two children): helpers = %d KiB, want > 0 and < %d (both)", one.HelpersKB, all.HelpersKB)
	}
}

func TestReadProcCPU(t *testing.T) {
	// Burn some CPU, so that a clock tick or two pass.
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	c, err := readProcCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if c.self <= 0 || c.children < 0 {
		t.Errorf("readProcCPU(self) = %+v, want own time > 0", c)
	}
}

func TestServerSplit(t *testing.T) {
	// 10 calls: the server spent 200 ms, the machine 1200 ms in all, the
	// code 600 ms.
	s := serverSplit(procCPU{self: 100}, procCPU{self: 300}, 1200, 600, 10)
	if s.TotalMS != 120 || *s.ServerMS != 20 || *s.CodeMS != 60 || *s.StartMS != 40 {
		t.Errorf("serverSplit = total %v, server %v, code %v, start %v; want 120, 20, 60, 40", s.TotalMS, *s.ServerMS, *s.CodeMS, *s.StartMS)
	}
	// Resolutions differ: a machine figure below the others' is no
	// negative start.
	if s := serverSplit(procCPU{}, procCPU{self: 10}, 50, 50, 1); *s.StartMS != 0 {
		t.Errorf("start = %v, want 0 when the machine's figure lags", *s.StartMS)
	}
	if serverSplit(procCPU{}, procCPU{}, 0, 0, 0) != nil {
		t.Errorf("serverSplit of no calls is not nil")
	}
	if m := machineCPU(); m <= 0 {
		t.Errorf("machineCPU() = %v, want the machine's busy time so far", m)
	}
}
