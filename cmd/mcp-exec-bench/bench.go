package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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

// Baseline is the interpreter bare Python runs on.
type Baseline struct {
	Python        string `json:"python"`
	Resolved      string `json:"resolved"`
	PythonVersion string `json:"python_version"`
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
	Sessions      *Sessions    `json:"sessions,omitempty"`
	Parked        *Parked      `json:"parked_session,omitempty"`
	StopError     string       `json:"stop_error,omitempty"`
	// The baseline's figures, each measured right before the sandbox's
	// that it is compared with.
	Bare Bare `json:"baseline"`
}

// Bare is bare Python measured the way the sandbox is: a fresh process per
// call, spawned by this program.
type Bare struct {
	Latency    []Latency    `json:"latency,omitempty"`
	Throughput []Throughput `json:"throughput,omitempty"`
	Packages   *Latency     `json:"packages,omitempty"`
}

// sampleEvery is how often memory is read under load.
const sampleEvery = 50 * time.Millisecond

// snippets are what the latency tables time, in order, on both sides.
var snippets = []snippet{printOne, stdlibImports}

// bench measures each runtime against the baseline. It fails only when
// nothing can be measured: no server binary, no baseline interpreter.
//
// The baseline is measured per runtime, each figure right before the
// sandbox's it is compared with, not once for the run: on a shared machine
// the load drifts over the minutes a run takes, and a ratio of figures
// taken minutes apart would measure the drift. It is measured before, not
// interleaved call by call, so that whatever the server does after a call
// (refilling a pool) is not charged to the baseline.
func bench(ctx context.Context, o options, log io.Writer) (*Report, error) {
	rep := &Report{Started: time.Now(), Host: describeHost(), Options: o, Server: ServerInfo{Path: o.Server}}
	if _, err := os.Stat(o.Server); err != nil {
		return nil, fmt.Errorf("finding the server (make build, or --server PATH): %w", err)
	}
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
	for _, kind := range o.Runtimes {
		if ctx.Err() != nil {
			break
		}
		rep.Runtimes = append(rep.Runtimes, measureRuntime(ctx, o, kind, resolved, log))
	}
	rep.Host.LoadEnd = loadAverage()
	rep.Finished = time.Now()
	return rep, nil
}

// paced labels a snippet timed one call per gap.
func paced(code string, gap time.Duration) string {
	if gap <= 0 {
		return code
	}
	return fmt.Sprintf("%s, one call per %v", code, gap)
}

func progress(log io.Writer, format string, args ...any) {
	fmt.Fprintf(log, "mcp-exec-bench: "+format+"\n", args...)
}

// pause waits d unless ctx is done first, and reports whether it waited.
func pause(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// runtimeSettings turns a --runtimes entry into the server's settings:
// KIND, optionally /PLATFORM (gVisor's) and @PATH (the runsc binary), as
// in runsc/ptrace@/usr/bin/runsc.
func runtimeSettings(entry string) (kind string, set []string) {
	entry, fresh := strings.CutSuffix(entry, "+fresh")
	if fresh {
		// Sandboxes fresh containers (libcontainer) or gVisor sandboxes
		// (runsc), not forks.
		set = append(set, "MCP_EXEC_FORK=false")
	}
	rest, path, hasPath := strings.Cut(entry, "@")
	kind, platform, hasPlatform := strings.Cut(rest, "/")
	set = append(set, "MCP_EXEC_RUNTIME="+kind)
	if hasPlatform {
		set = append(set, "MCP_EXEC_RUNSC_PLATFORM="+platform)
	}
	if hasPath {
		set = append(set, "MCP_EXEC_RUNSC="+path)
	}
	return kind, set
}

func measureRuntime(ctx context.Context, o options, entry, python string, log io.Writer) (r RuntimeReport) {
	kind, set := runtimeSettings(entry)
	env, shown := serverEnv(os.Environ(), o, set...)
	r = RuntimeReport{Runtime: entry, Env: shown, Platform: describeRuntime(ctx, o.Server, env, kind)}
	kind = entry // the label of its progress lines
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
	// Whatever the server does once started (filling a pool) is done
	// before the baseline is measured.
	if !pause(ctx, o.Settle) {
		return r
	}

	type timing struct {
		sn  snippet
		gap time.Duration
	}
	var timings []timing
	for _, sn := range snippets {
		timings = append(timings, timing{sn, 0})
	}
	// Back to back, a call finds the pool still refilling from the one
	// before; an agent calls far less often, and finds it full.
	if o.Pace > 0 {
		timings = append(timings, timing{printOne, o.Pace})
	}
	for _, tm := range timings {
		label := paced(tm.sn.Code, tm.gap)
		progress(log, "%s: latency of %s, bare then sandbox", kind, label)
		b := measureLatency(ctx, label, o.N, o.Warmup, tm.gap, pythonCaller(python, tm.sn))
		l := measureLatency(ctx, label, o.N, o.Warmup, tm.gap, srv.caller(tm.sn))
		if l.Summary != nil && b.Summary != nil {
			l.RatioP50 = ratio(l.P50MS, b.P50MS)
			l.RatioP95 = ratio(l.P95MS, b.P95MS)
		}
		r.Bare.Latency = append(r.Bare.Latency, b)
		r.Latency = append(r.Latency, l)
	}

	if ctx.Err() == nil && len(r.Latency) > 0 {
		r.Sessions = measureSessions(ctx, o, srv, r.Latency[0], log)
	}
	if ctx.Err() == nil {
		progress(log, "%s: latency of 20,000 os.stat, bare then sandbox", kind)
		n := min(o.N, syscallCalls)
		b := measureLatency(ctx, "20,000 os.stat", n, 1, 0, pythonCaller(python, syscallHeavy))
		l := measureLatency(ctx, "20,000 os.stat", n, 1, 0, srv.caller(syscallHeavy))
		if l.Summary != nil && b.Summary != nil {
			l.RatioP50, l.RatioP95 = ratio(l.P50MS, b.P50MS), ratio(l.P95MS, b.P95MS)
		}
		r.Bare.Latency = append(r.Bare.Latency, b)
		r.Latency = append(r.Latency, l)
	}

	// Idle: warmed up, and given time for whatever the server does
	// between calls to finish.
	if !pause(ctx, o.Settle) {
		return r
	}
	if m, err := readIdleMemory(srv.pid()); err == nil {
		r.IdleMemory = &m
	}

	for _, c := range o.Concurrency {
		progress(log, "%s: throughput at concurrency %d, bare then sandbox", kind, c)
		// Sampled like the server, so that both sides pay for the
		// sampling; what it sees is the interpreters' memory.
		// The server is a child of ours too, and none of the baseline's.
		s := sampleMemory(os.Getpid(), sampleEvery, srv.pid())
		cpu0, kids0 := machineCPU(), childrenCPU()
		b := measureThroughput(ctx, c, o.Duration, o.CallsPerWorker, pythonCaller(python, printOne))
		b.PeakMemory = &Memory{HelpersKB: s.Stop().HelpersKB}
		if b.Calls > 0 {
			b.CPU = &CPUSplit{TotalMS: (machineCPU() - cpu0) / float64(b.Calls)}
			// The interpreters' own, as the kernel accounted them when
			// this program reaped them: what the sandbox's accounted
			// total compares with.
			b.CPU.Accounted = &Accounted{TotalMS: (childrenCPU() - kids0) / float64(b.Calls)}
		}
		r.Bare.Throughput = append(r.Bare.Throughput, b)

		s = sampleMemory(srv.pid(), sampleEvery)
		before, errBefore := readProcCPU(srv.pid())
		inst, _ := findInstance(srv.pid())
		acc0 := readAccounted(srv.pid(), inst)
		machine := machineCPU()
		tp := measureThroughput(ctx, c, o.Duration, o.CallsPerWorker, srv.caller(printOne))
		machine = machineCPU() - machine
		acc1 := readAccounted(srv.pid(), inst)
		peak := s.Stop()
		tp.PeakMemory = &peak
		if after, err := readProcCPU(srv.pid()); err == nil && errBefore == nil {
			tp.CPU = serverSplit(before, after, machine, tp.cpuMS, tp.Calls)
			tp.CPU.Accounted = accountedSplit(acc0, acc1, tp.Calls)
		}
		tp.Ratio = ratio(tp.CallsPerS, b.CallsPerS)
		r.Throughput = append(r.Throughput, tp)
		// The server's aftermath (refills) is not the next baseline's.
		if !pause(ctx, o.Settle) {
			return r
		}
	}

	if len(o.Packages) > 0 && ctx.Err() == nil {
		r.Bare.Packages, r.Packages = measurePackages(ctx, o, entry, python, log)
	}
	if kind == "runsc" || strings.HasPrefix(entry, "runsc") {
		if ctx.Err() == nil {
			r.Parked = measureParked(ctx, o, entry, log)
		}
	}
	return r
}

// measurePackages measures importing the packages, bare then in a server
// of its own started with MCP_EXEC_PACKAGES, so that the other figures stay
// comparable between runs with and without --packages.
func measurePackages(ctx context.Context, o options, kind, python string, log io.Writer) (bare, sandbox *Latency) {
	_, set := runtimeSettings(kind)
	sn := importSnippet(o.Packages)
	progress(log, "%s: latency of %s, bare", kind, sn.Code)
	bare = &Latency{Snippet: sn.Code}
	call := pythonCaller(python, sn)
	if _, err := call(ctx); err != nil {
		bare.Skipped = fmt.Sprintf("the host's %s cannot import them: %v", python, err)
	} else {
		*bare = measureLatency(ctx, paced(sn.Code, o.Pace), o.N, max(o.Warmup-1, 0), o.Pace, call)
	}

	pkgs := "MCP_EXEC_PACKAGES=" + strings.Join(o.Packages, ",")
	extra := append(set, pkgs)
	label := sn.Code
	if o.Preload {
		mods := strings.ReplaceAll(strings.TrimPrefix(sn.Code, "import "), " ", "")
		extra = append(extra, "MCP_EXEC_PRELOAD="+mods)
		pkgs += " MCP_EXEC_PRELOAD=" + mods
		label += ", preloaded"
	}
	env, _ := serverEnv(os.Environ(), o, extra...)
	progress(log, "%s: starting a server with %s", kind, pkgs)
	srv, err := startServer(ctx, o.Server, env)
	if err != nil {
		progress(log, "%s: packages skipped: %v", kind, err)
		return bare, &Latency{Snippet: sn.Code, Skipped: fmt.Sprintf("the server refused %s: %v", pkgs, err)}
	}
	defer srv.close()
	call = srv.caller(sn)
	// The first call doubles as a probe: a server that ignores the variable
	// starts fine and fails the import.
	if _, err := call(ctx); err != nil {
		progress(log, "%s: packages skipped: %v", kind, err)
		return bare, &Latency{Snippet: sn.Code, Skipped: fmt.Sprintf("the server took %s but the import failed: %v", pkgs, err)}
	}
	progress(log, "%s: latency of %s, sandbox", kind, sn.Code)
	l := measureLatency(ctx, paced(label, o.Pace), o.N, max(o.Warmup-1, 0), o.Pace, call)
	if l.Summary != nil && bare.Summary != nil {
		l.RatioP50 = ratio(l.P50MS, bare.P50MS)
		l.RatioP95 = ratio(l.P95MS, bare.P95MS)
	}
	return bare, &l
}

// Sessions is what persistent sessions cost: a call in a live session
// against a fresh one, and the memory an idle session holds.
type Sessions struct {
	// Latency of print(1) in one live session; RatioToFresh its p50 over
	// the fresh call's, measured just before.
	Latency      Latency  `json:"latency"`
	RatioToFresh *float64 `json:"ratio_to_fresh_p50,omitempty"`
	// IdleSessions were opened, each after a call that set a variable:
	// their sandboxes' peak memory as the kernel's cgroup counts it
	// (mean), and how much the resident memory of the server's containers
	// grew per session once they were idle.
	IdleSessions    int    `json:"idle_sessions"`
	PeakMemoryKB    int64  `json:"cgroup_peak_kb_mean"`
	IdleRSSKBPerOne int64  `json:"idle_rss_kb_per_session"`
	Error           string `json:"error,omitempty"`
}

// idleSessions is how many sessions the memory figure opens.
const idleSessions = 4

func measureSessions(ctx context.Context, o options, srv *server, fresh Latency, log io.Writer) *Sessions {
	r := &Sessions{IdleSessions: idleSessions}
	progress(log, "%s: persistent sessions: a call in a live one, and the memory of idle ones", fresh.Snippet)
	open := func() (execOutput, error) {
		return srv.exec(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "x = list(range(1000))", "session": "new"}})
	}
	end := func(h string) {
		srv.exec(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "", "session": h, "end_session": true}})
	}
	first, err := open()
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Latency = measureLatency(ctx, printOne.Code+" (in a session)", o.N, o.Warmup, 0, srv.sessionCaller(printOne, first.Session))
	if r.Latency.Summary != nil && fresh.Summary != nil {
		r.RatioToFresh = ratio(r.Latency.P50MS, fresh.P50MS)
	}
	end(first.Session)

	if !pause(ctx, o.Settle) {
		return r
	}
	before, err := readMemory(srv.pid())
	if err != nil {
		r.Error = err.Error()
		return r
	}
	var handles []string
	var peak int64
	for range idleSessions {
		out, err := open()
		if err != nil {
			r.Error = err.Error()
			break
		}
		handles = append(handles, out.Session)
		peak += out.PeakMemory
	}
	if len(handles) > 0 && pause(ctx, o.Settle) {
		if after, err := readMemory(srv.pid()); err == nil {
			r.IdleRSSKBPerOne = (after.ContainersKB - before.ContainersKB) / int64(len(handles))
		}
		r.PeakMemoryKB = peak / int64(len(handles)) >> 10
	}
	for _, h := range handles {
		end(h)
	}
	return r
}
