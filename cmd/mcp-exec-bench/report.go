package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// writeTable prints the report for a reader: the host first, then one
// block per runtime where every figure stands next to the baseline's and
// their ratio.
func writeTable(w io.Writer, r *Report) {
	o := r.Options
	fmt.Fprintf(w, "mcp-exec bench, %s (took %s)\n", r.Started.UTC().Format(time.RFC3339), r.Finished.Sub(r.Started).Round(time.Second))
	h := r.Host
	head := &table{}
	head.add("host", fmt.Sprintf("%s, %d cores; %s; %s", h.CPUModel, h.Cores, h.Kernel, h.OS))
	head.add("load", fmt.Sprintf("%s at start, %s at end (1, 5, 15 min)", h.LoadStart, h.LoadEnd))
	head.add("go", h.GoVersion)
	head.add("server", fmt.Sprintf("%s (%s) over stdio, driven by the go-sdk client", r.Server.Path, r.Server.Version))
	head.add("baseline", fmt.Sprintf("%s (%s), Python %s: a fresh `python3 -c CODE` per call, spawned by this program, measured right before each figure it is compared with", r.Baseline.Python, r.Baseline.Resolved, r.Baseline.PythonVersion))
	tput := fmt.Sprintf("%s per level", o.Duration)
	if o.CallsPerWorker > 0 {
		tput = fmt.Sprintf("%d calls per worker", o.CallsPerWorker)
	}
	head.add("method", fmt.Sprintf("latency: %d calls one at a time after %d warm-up, linearly interpolated percentiles; throughput: %s, every call checked", o.N, o.Warmup, tput))
	head.add("ratios", "sandbox/baseline: for latency lower is better, for throughput higher is better")
	head.write(w, "", false)

	for _, rt := range r.Runtimes {
		fmt.Fprintf(w, "\n== %s — %s\n", rt.Runtime, rt.Platform)
		if rt.Skipped != "" {
			fmt.Fprintf(w, "  skipped: %s\n", indent(rt.Skipped, "    "))
			continue
		}
		fmt.Fprintf(w, "  server %s, up in %.2f s; Python %s in the sandbox\n", rt.ServerVersion, rt.StartS, rt.PythonVersion)
		fmt.Fprintf(w, "  env %s\n\n", strings.Join(rt.Env, " "))
		writeLatency(w, rt)
		fmt.Fprintln(w)
		writeThroughput(w, rt)
		fmt.Fprintln(w)
		writeMemory(w, rt)
		writeErrors(w, rt)
	}
}

func writeLatency(w io.Writer, rt RuntimeReport) {
	b := &rt.Bare
	t := &table{}
	t.add("latency, ms", "p50", "p95", "mean", "min", "bare p50", "bare p95", "×p50", "×p95", "errors", "duration_ms", "runtime")
	row := func(name string, l *Latency, base *Latency) {
		if l.Skipped != "" && (base == nil || base.Summary == nil) {
			return // nothing to show on either side; the reasons follow
		}
		cells := []string{name}
		if l.Summary != nil {
			cells = append(cells, fmtMS(l.P50MS), fmtMS(l.P95MS), fmtMS(l.MeanMS), fmtMS(l.MinMS))
		} else {
			cells = append(cells, "n/a", "n/a", "n/a", "n/a")
		}
		if base != nil && base.Summary != nil {
			cells = append(cells, fmtMS(base.P50MS), fmtMS(base.P95MS))
		} else {
			cells = append(cells, "n/a", "n/a")
		}
		errs := errorCount(l.Errors, baseErrors(base))
		if l.Skipped != "" {
			errs = "skipped"
		}
		cells = append(cells, fmtRatio(l.RatioP50), fmtRatio(l.RatioP95), errs)
		if l.DurationMSMean != nil {
			cells = append(cells, fmtMS(*l.DurationMSMean))
		} else {
			cells = append(cells, "n/a")
		}
		t.add(append(cells, seen(l.RuntimeSeen))...)
	}
	for i := range rt.Latency {
		row(rt.Latency[i].Snippet, &rt.Latency[i], at(b.Latency, i))
	}
	if rt.Packages != nil {
		row(rt.Packages.Snippet, rt.Packages, b.Packages)
	}
	t.write(w, "  ", true)
	fmt.Fprintln(w, "  (errors: sandbox/bare; duration_ms: the server's own figure, mean; runtime: what ran the calls)")
	if p := rt.Packages; p != nil && p.Skipped != "" {
		fmt.Fprintf(w, "  %s: skipped: %s\n", p.Snippet, indent(p.Skipped, "    "))
	}
	if p := b.Packages; p != nil && p.Skipped != "" {
		fmt.Fprintf(w, "  %s, bare: skipped: %s\n", p.Snippet, indent(p.Skipped, "    "))
	}
	if ss := rt.Sessions; ss != nil {
		if l := ss.Latency; l.Summary != nil {
			fmt.Fprintf(w, "  persistent session: %s p50 %s ms, p95 %s ms (%s the fresh call's p50); %d idle sessions: cgroup peak %s MiB each, containers' RSS +%s MiB each\n",
				l.Snippet, fmtMS(l.P50MS), fmtMS(l.P95MS), fmtRatio(ss.RatioToFresh), ss.IdleSessions, fmtMB(ss.PeakMemoryKB), fmtMB(ss.IdleRSSKBPerOne))
		}
		if ss.Error != "" {
			fmt.Fprintf(w, "  persistent session: %s\n", ss.Error)
		}
	}
	if p := rt.Parked; p != nil {
		if p.Rounds > 0 {
			fmt.Fprintf(w, "  parked session (MCP_EXEC_PERSISTENT_PARK_S=1, %d rounds): containers' RSS frozen +%s MiB, parked +%s MiB; image %s MiB on disk; park %.0f ms; the next print(1) %.0f ms (live %.1f ms)\n",
				p.Rounds, fmtMB(p.FrozenKB), fmtMB(p.ParkedKB), fmtMB(p.ImageKB), p.ParkMS, p.RestoredCallMS, p.LiveCallMS)
		}
		if p.Error != "" {
			fmt.Fprintf(w, "  parked session: %s\n", p.Error)
		}
	}
}

func writeThroughput(w io.Writer, rt RuntimeReport) {
	t := &table{}
	t.add("throughput, calls/s", "sandbox", "bare", "×", "p50 ms", "bare p50 ms", "calls", "errors")
	for i, tp := range rt.Throughput {
		bt := rt.Bare.Throughput[i]
		t.add(fmt.Sprintf("concurrency %d", tp.Concurrency),
			fmt.Sprintf("%.2f", tp.CallsPerS), fmt.Sprintf("%.2f", bt.CallsPerS), fmtRatio(tp.Ratio),
			optMS(tp.P50MS), optMS(bt.P50MS),
			fmt.Sprintf("%d/%d", tp.Calls, bt.Calls), errorCount(tp.Errors, bt.Errors))
	}
	t.write(w, "  ", true)
	fmt.Fprintln(w, "  (p50: the latency each call saw under that load; calls and errors: sandbox/bare)")

	c := &table{}
	c.add("CPU per call, ms", "total", "code", "server", "start", "bare", "×")
	for i, tp := range rt.Throughput {
		bt := rt.Bare.Throughput[i]
		if tp.CPU == nil || bt.CPU == nil {
			continue
		}
		c.add(fmt.Sprintf("concurrency %d", tp.Concurrency), fmt.Sprintf("%.1f", tp.CPU.TotalMS),
			optMS(tp.CPU.CodeMS), optMS(tp.CPU.ServerMS), optMS(tp.CPU.StartMS),
			fmt.Sprintf("%.1f", bt.CPU.TotalMS), fmtRatio(ratio(tp.CPU.TotalMS, bt.CPU.TotalMS)))
	}
	if len(c.rows) > 1 {
		c.write(w, "  ", true)
		fmt.Fprintln(w, "  (the machine's CPU while the level ran, less this program's; code: the results' cpu_ms; server: its own process;")
		fmt.Fprintln(w, "  start: the rest, making, starting and ending sandboxes, templates' forks and the kernel's work included)")
	}

	a := &table{}
	a.add("CPU per call, kernel-accounted, ms", "total", "server", "helpers", "sandboxes (code)", "templates", "kernel threads", "bare", "×")
	for i, tp := range rt.Throughput {
		if tp.CPU == nil || tp.CPU.Accounted == nil {
			continue
		}
		ac := tp.CPU.Accounted
		bare, r := "-", "-"
		if bc := rt.Bare.Throughput[i].CPU; bc != nil && bc.Accounted != nil {
			bare, r = fmt.Sprintf("%.1f", bc.Accounted.TotalMS), fmtRatio(ratio(ac.TotalMS, bc.Accounted.TotalMS))
		}
		a.add(fmt.Sprintf("concurrency %d", tp.Concurrency), fmt.Sprintf("%.1f", ac.TotalMS),
			fmt.Sprintf("%.1f", ac.ServerMS), fmt.Sprintf("%.1f", ac.HelpersMS),
			fmt.Sprintf("%.1f (%s)", ac.SandboxesMS, optMS(tp.CPU.CodeMS)), fmt.Sprintf("%.1f", ac.TemplatesMS),
			fmt.Sprintf("%.1f", ac.KernelMS), bare, r)
	}
	if len(a.rows) > 1 {
		a.write(w, "  ", true)
		fmt.Fprintln(w, "  (each part as the kernel accounts it, whatever else the machine runs: the server process; its reaped children;")
		fmt.Fprintln(w, "  the calls' cgroups, of which the code's cpu_ms; the templates' cgroups; the kernel's threads, the machine's;")
		fmt.Fprintln(w, "  bare: the interpreters' own CPU, accounted to this program when it reaped them)")
	}
}

func writeMemory(w io.Writer, rt RuntimeReport) {
	t := &table{}
	head := []string{"memory, MiB (VmRSS unless said)", "idle"}
	for _, tp := range rt.Throughput {
		head = append(head, fmt.Sprintf("peak c=%d", tp.Concurrency))
	}
	t.add(head...)
	server := []string{"server + non-container children"}
	containers := []string{"containers (sum; processes)"}
	bare := []string{"bare python processes (sum)", "-"}
	var whole []string
	if m := rt.IdleMemory; m != nil {
		server = append(server, fmtMB(m.TotalServerKB()))
		containers = append(containers, fmt.Sprintf("%s (%d)", fmtMB(m.ContainersKB), m.ContainerProcs))
		if m.PssKB > 0 {
			whole = []string{"all of it, proportional (PSS)", fmtMB(m.PssKB)}
			for range rt.Throughput {
				whole = append(whole, "-")
			}
		}
	} else {
		server, containers = append(server, "n/a"), append(containers, "n/a")
	}
	for i, tp := range rt.Throughput {
		m := tp.PeakMemory
		server = append(server, fmtMB(m.TotalServerKB()))
		containers = append(containers, fmt.Sprintf("%s (%d)", fmtMB(m.ContainersKB), m.ContainerProcs))
		if bm := rt.Bare.Throughput[i].PeakMemory; bm != nil {
			bare = append(bare, fmtMB(bm.HelpersKB))
		} else {
			bare = append(bare, "n/a")
		}
	}
	t.add(server...)
	t.add(containers...)
	t.add(bare...)
	if whole != nil {
		t.add(whole...)
	}
	t.write(w, "  ", true)
	fmt.Fprintln(w, "  (containers: processes that entered other namespaces, and theirs; sums count shared pages once per process;")
	fmt.Fprintln(w, "  PSS splits a shared page among its sharers, the machine's loss: forked sandboxes share their template's)")
}

func writeErrors(w io.Writer, rt RuntimeReport) {
	var lines []string
	add := func(what string, n int, samples []string) {
		for _, s := range samples {
			lines = append(lines, fmt.Sprintf("  %s (%d in all): %s", what, n, s))
		}
	}
	for _, side := range []struct {
		name       string
		latency    []Latency
		throughput []Throughput
	}{
		{"", slices.Concat(rt.Latency, deref(rt.Packages)), rt.Throughput},
		{"bare ", slices.Concat(rt.Bare.Latency, deref(rt.Bare.Packages)), rt.Bare.Throughput},
	} {
		for _, l := range side.latency {
			add(side.name+l.Snippet, l.Errors, l.ErrorSamples)
		}
		for _, tp := range side.throughput {
			add(fmt.Sprintf("%sthroughput at concurrency %d", side.name, tp.Concurrency), tp.Errors, tp.ErrorSamples)
		}
	}
	if rt.StopError != "" {
		lines = append(lines, "  stopping the server: "+indent(rt.StopError, "    "))
	}
	if len(lines) > 0 {
		fmt.Fprintln(w, "  errors:")
		fmt.Fprintln(w, strings.Join(lines, "\n"))
	}
}

func at(ls []Latency, i int) *Latency {
	if i >= len(ls) {
		return nil
	}
	return &ls[i]
}

func deref(l *Latency) []Latency {
	if l == nil {
		return nil
	}
	return []Latency{*l}
}

func baseErrors(l *Latency) int {
	if l == nil {
		return 0
	}
	return l.Errors
}

func errorCount(sandbox, bare int) string { return fmt.Sprintf("%d/%d", sandbox, bare) }

func optMS(ms *float64) string {
	if ms == nil {
		return "n/a"
	}
	return fmtMS(*ms)
}

// seen lists the runtimes the server said ran the calls, with counts when
// there was more than one.
func seen(m map[string]int) string {
	if len(m) == 0 {
		return "n/a"
	}
	if len(m) == 1 {
		for k := range m {
			return k
		}
	}
	var parts []string
	for k, n := range m {
		parts = append(parts, k+"×"+strconv.Itoa(n))
	}
	return strings.Join(parts, ",")
}

func indent(s, prefix string) string { return strings.ReplaceAll(s, "\n", "\n"+prefix) }

// table aligns cells in columns: the first left, the others right when
// numeric is set (figures line up on their last digit).
type table struct{ rows [][]string }

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer, prefix string, numeric bool) {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		b.WriteString(prefix)
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(c))
			switch {
			case i == 0:
				b.WriteString(c + pad)
			case numeric:
				b.WriteString("  " + pad + c)
			default:
				b.WriteString(" " + c + pad)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

func writeJSON(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the report: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}
