package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// Report is everything one run measured; --json writes it as is.
type Report struct {
	Started  time.Time       `json:"started"`
	Finished time.Time       `json:"finished"`
	Host     Host            `json:"host"`
	Options  options         `json:"options"`
	Server   ServerInfo      `json:"server"`
	Baseline Baseline        `json:"baseline"`
	Runtimes []RuntimeReport `json:"runtimes"`
}

type ServerInfo struct {
	Path    string `json:"path"`
	Version string `json:"version"`
}

// Baseline is bare Python, measured the way the sandbox is: a fresh
// process per call, spawned by this program.
type Baseline struct {
	Python        string       `json:"python"`
	Resolved      string       `json:"resolved"`
	PythonVersion string       `json:"python_version"`
	Latency       []Latency    `json:"latency"`
	Throughput    []Throughput `json:"throughput"`
	Packages      *Latency     `json:"packages,omitempty"`
}

// RuntimeReport is one runtime's server, measured against the baseline.
type RuntimeReport struct {
	Runtime       string       `json:"runtime"`
	Skipped       string       `json:"skipped,omitempty"`
	Platform      string       `json:"platform"`
	Env           []string     `json:"env"`
	ServerVersion string       `json:"server_version,omitempty"`
	StartS        float64      `json:"start_s,omitempty"`
	PythonVersion string       `json:"python_version,omitempty"`
	Latency       []Latency    `json:"latency,omitempty"`
	IdleMemory    *Memory      `json:"idle_memory,omitempty"`
	Throughput    []Throughput `json:"throughput,omitempty"`
	Packages      *Latency     `json:"packages,omitempty"`
	StopError     string       `json:"stop_error,omitempty"`
}

// sampleEvery is how often memory is read under load.
const sampleEvery = 50 * time.Millisecond

// snippets are what the latency tables time, in order, on both sides.
var snippets = []snippet{printOne, stdlibImports}

// bench measures the baseline, then each runtime. It fails only when
// nothing can be measured: no server binary, no baseline interpreter.
func bench(ctx context.Context, o options, log io.Writer) (*Report, error) {
	rep := &Report{Started: time.Now(), Host: describeHost(), Options: o, Server: ServerInfo{Path: o.Server}}
	v, err := serverVersion(ctx, o.Server)
	if err != nil {
		return nil, err
	}
	rep.Server.Version = v
	resolved, err := baselinePython(o.Python)
	if err != nil {
		return nil, err
	}
	pv, err := pythonVersion(ctx, resolved)
	if err != nil {
		return nil, err
	}
	rep.Baseline = Baseline{Python: o.Python, Resolved: resolved, PythonVersion: pv}
	measureBaseline(ctx, o, &rep.Baseline, log)
	for _, kind := range o.Runtimes {
		if ctx.Err() != nil {
			break
		}
		rep.Runtimes = append(rep.Runtimes, measureRuntime(ctx, o, kind, &rep.Baseline, log))
	}
	rep.Host.LoadEnd = loadAverage()
	rep.Finished = time.Now()
	return rep, nil
}

func progress(log io.Writer, format string, args ...any) {
	fmt.Fprintf(log, "mcp-exec-bench: "+format+"\n", args...)
}

func measureBaseline(ctx context.Context, o options, b *Baseline, log io.Writer) {
	for _, sn := range snippets {
		progress(log, "baseline: latency of %s", sn.Code)
		b.Latency = append(b.Latency, measureLatency(ctx, sn.Code, o.N, o.Warmup, pythonCaller(b.Resolved, sn)))
	}
	for _, c := range o.Concurrency {
		progress(log, "baseline: throughput at %d parallel", c)
		// Sampled like the server, so that both sides pay for the sampling;
		// what it sees is the interpreters' memory.
		s := sampleMemory(os.Getpid(), sampleEvery)
		tp := measureThroughput(ctx, c, o.Duration, o.CallsPerWorker, pythonCaller(b.Resolved, printOne))
		peak := s.Stop()
		tp.PeakMemory = &Memory{HelpersKB: peak.HelpersKB}
		b.Throughput = append(b.Throughput, tp)
	}
	if len(o.Packages) == 0 {
		return
	}
	sn := importSnippet(o.Packages)
	progress(log, "baseline: latency of %s", sn.Code)
	call := pythonCaller(b.Resolved, sn)
	if _, err := call(ctx); err != nil {
		b.Packages = &Latency{Snippet: sn.Code, Skipped: fmt.Sprintf("the host's %s cannot import them: %v", b.Resolved, err)}
		return
	}
	l := measureLatency(ctx, sn.Code, o.N, max(o.Warmup-1, 0), call)
	b.Packages = &l
}

func measureRuntime(ctx context.Context, o options, kind string, b *Baseline, log io.Writer) (r RuntimeReport) {
	env, shown := serverEnv(os.Environ(), o, "MCP_EXEC_RUNTIME="+kind)
	r = RuntimeReport{Runtime: kind, Env: shown, Platform: describeRuntime(ctx, o.Server, env, kind)}
	progress(log, "%s: starting the server", kind)
	srv, err := startServer(ctx, o.Server, env)
	if err != nil {
		r.Skipped = err.Error()
		progress(log, "%s: skipped: %v", kind, err)
		return r
	}
	defer func() {
		if err := srv.close(); err != nil {
			r.StopError = err.Error()
		}
	}()
	r.ServerVersion, r.StartS = srv.version, srv.started.Seconds()
	r.PythonVersion = srv.pythonVersion(ctx)

	for i, sn := range snippets {
		progress(log, "%s: latency of %s", kind, sn.Code)
		l := measureLatency(ctx, sn.Code, o.N, o.Warmup, srv.caller(sn))
		if l.Summary != nil && b.Latency[i].Summary != nil {
			l.RatioP50 = ratio(l.P50MS, b.Latency[i].P50MS)
			l.RatioP95 = ratio(l.P95MS, b.Latency[i].P95MS)
		}
		r.Latency = append(r.Latency, l)
	}

	// Idle: warmed up, and given time for whatever the server does
	// between calls (a pool refilling) to finish.
	select {
	case <-ctx.Done():
		return r
	case <-time.After(o.Settle):
	}
	if m, err := readMemory(srv.pid()); err == nil {
		r.IdleMemory = &m
	}

	for i, c := range o.Concurrency {
		progress(log, "%s: throughput at concurrency %d", kind, c)
		s := sampleMemory(srv.pid(), sampleEvery)
		tp := measureThroughput(ctx, c, o.Duration, o.CallsPerWorker, srv.caller(printOne))
		peak := s.Stop()
		tp.PeakMemory = &peak
		tp.Ratio = ratio(tp.CallsPerS, b.Throughput[i].CallsPerS)
		r.Throughput = append(r.Throughput, tp)
	}

	if len(o.Packages) > 0 && ctx.Err() == nil {
		r.Packages = measurePackages(ctx, o, kind, b.Packages, log)
	}
	return r
}

// measurePackages starts a server of its own with MCP_EXEC_PACKAGES, so
// that the other figures stay comparable between runs with and without
// --packages.
func measurePackages(ctx context.Context, o options, kind string, base *Latency, log io.Writer) *Latency {
	sn := importSnippet(o.Packages)
	pkgs := "MCP_EXEC_PACKAGES=" + strings.Join(o.Packages, ",")
	env, _ := serverEnv(os.Environ(), o, "MCP_EXEC_RUNTIME="+kind, pkgs)
	progress(log, "%s: starting a server with %s", kind, pkgs)
	srv, err := startServer(ctx, o.Server, env)
	if err != nil {
		progress(log, "%s: packages skipped: %v", kind, err)
		return &Latency{Snippet: sn.Code, Skipped: fmt.Sprintf("the server refused %s: %v", pkgs, err)}
	}
	defer srv.close()
	call := srv.caller(sn)
	// The first call doubles as a probe: a server that ignores the variable
	// starts fine and fails the import.
	if _, err := call(ctx); err != nil {
		progress(log, "%s: packages skipped: %v", kind, err)
		return &Latency{Snippet: sn.Code, Skipped: fmt.Sprintf("the server took %s but the import failed: %v", pkgs, err)}
	}
	progress(log, "%s: latency of %s", kind, sn.Code)
	l := measureLatency(ctx, sn.Code, o.N, max(o.Warmup-1, 0), call)
	if l.Summary != nil && base != nil && base.Summary != nil {
		l.RatioP50 = ratio(l.P50MS, base.P50MS)
		l.RatioP95 = ratio(l.P95MS, base.P95MS)
	}
	return &l
}
