package server

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inhuman/mcp-exec/runtime"
)

// The server's metrics: what it sees of each call (its verdict, how long
// it waited and ran, what it used) and of its own state (slots, queue,
// persistent sessions, HTTP sessions). Labels are a fixed vocabulary —
// runtime, verdict, stream, allowed, direction — never a call's code,
// output, client or a session handle: each value a caller could choose
// would be a new series, and a handle in a label would hand it to whoever
// reads the metrics. Nor a host of the network allowlist's: the code
// names the hosts it asks for (refused ones included, and any name under
// a wildcard), so the hosts are in the audit log, not in a label.

// Verdicts, a call's outcome in one word, for the metrics, the log line and
// the trace. The order in verdictOf is the precedence.
const (
	verdictOK        = "ok"
	verdictExit      = "exit_nonzero"
	verdictTimeout   = "timeout"
	verdictOOM       = "oom"
	verdictPids      = "pids"
	verdictCancelled = "cancelled"
	verdictSandbox   = "sandbox_error"
	verdictInput     = "refused_input"
	verdictBusy      = "refused_busy"
	verdictRefused   = "refused"
)

// verdicts lists every verdict, so that each series exists from the start
// (a rate over a series that appears only with its first call misses it).
var verdicts = []string{verdictOK, verdictExit, verdictTimeout, verdictOOM, verdictPids,
	verdictCancelled, verdictSandbox, verdictInput, verdictBusy, verdictRefused}

// metrics are the server's collectors; a nil *metrics records nothing.
type metrics struct {
	calls      *prometheus.CounterVec
	duration   prometheus.Observer
	queueWait  prometheus.Observer
	cpu        prometheus.Observer
	peakMemory prometheus.Observer
	output     *prometheus.CounterVec
	truncated  *prometheus.CounterVec
	egress     *prometheus.CounterVec
	egressIO   *prometheus.CounterVec
}

// newMetrics registers the server's collectors with reg: the per-call ones
// and gauges read from s when scraped.
func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	rt := s.info.Runtime
	m := &metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcp_exec_calls_total",
			Help: "exec calls by runtime and verdict: ok, exit_nonzero, timeout, oom, pids, cancelled, sandbox_error, refused_input, refused_busy, refused."},
			[]string{"runtime", "verdict"}),
		output: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcp_exec_call_output_bytes_total",
			Help: "Bytes the code wrote, by stream, including what went past the cap."}, []string{"stream"}),
		truncated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcp_exec_call_truncations_total",
			Help: "Calls whose stream went past its cap (MCP_EXEC_MAX_OUTPUT_BYTES), by stream."}, []string{"stream"}),
		egress: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcp_exec_egress_destinations_total",
			Help: "Hosts calls asked the network allowlist's proxy for (each host:port once a call), by whether it let them through."}, []string{"allowed"}),
		egressIO: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "mcp_exec_egress_bytes_total",
			Help: "Bytes calls moved to (out) and from (in) the hosts the network allowlist let them reach, TLS included."}, []string{"direction"}),
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets,
			ConstLabels: prometheus.Labels{"runtime": rt}})
	}
	seconds := []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	duration := hist("mcp_exec_call_duration_seconds", "Wall-clock time of the code's run (duration_ms), for calls whose code ran.", seconds)
	queueWait := hist("mcp_exec_call_queue_wait_seconds", "Time a call waited for a concurrency slot (MCP_EXEC_MAX_CONCURRENCY).",
		[]float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300})
	cpu := hist("mcp_exec_call_cpu_seconds", "CPU time of the code's processes (cpu_ms), for calls whose code ran.", seconds)
	peak := hist("mcp_exec_call_peak_memory_bytes", "Highest memory use of the call's sandbox (peak_memory_bytes), when the runtime knows it.",
		prometheus.ExponentialBuckets(4<<20, 2, 10)) // 4 MiB … 2 GiB
	m.duration, m.queueWait, m.cpu, m.peakMemory = duration, queueWait, cpu, peak
	for _, v := range verdicts {
		m.calls.WithLabelValues(rt, v)
	}
	for _, st := range []string{"stdout", "stderr"} {
		m.output.WithLabelValues(st)
		m.truncated.WithLabelValues(st)
	}
	for i, v := range []string{"true", "false"} {
		m.egress.WithLabelValues(v)
		m.egressIO.WithLabelValues([]string{"out", "in"}[i])
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	cs := []prometheus.Collector{m.calls, m.output, m.truncated, m.egress, m.egressIO, duration, queueWait, cpu, peak,
		gauge("mcp_exec_slots", "Concurrency slots: calls that may run at once (MCP_EXEC_MAX_CONCURRENCY).",
			func() float64 { return float64(cap(s.sem)) }),
		gauge("mcp_exec_slots_in_use", "Concurrency slots held by running calls.",
			func() float64 { return float64(len(s.sem)) }),
		gauge("mcp_exec_queue_depth", "Calls waiting for a concurrency slot (at most MCP_EXEC_MAX_QUEUED).",
			func() float64 { return float64(s.waiting.Load()) }),
		gauge("mcp_exec_persistent_sessions_open", "Persistent sessions open, each a sandbox held between its calls (at most MCP_EXEC_PERSISTENT_MAX).",
			func() float64 { return float64(s.persist.count()) }),
		gauge("mcp_exec_http_sessions_open", "MCP sessions open over streamable HTTP (at most MCP_EXEC_MAX_SESSIONS), or legacy SSE streams.",
			func() float64 { return float64(s.ops.httpSessionCount()) }),
		gauge("mcp_exec_ready", "1 while the server is ready for calls (GET /readyz), else 0.",
			func() float64 {
				if s.Ready() != nil {
					return 0
				}
				return 1
			}),
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// observe records one finished call.
func (m *metrics) observe(verdict string, res runtime.Result, ran bool, queue time.Duration, queued bool, runtimeName string) {
	if m == nil {
		return
	}
	m.calls.WithLabelValues(runtimeName, verdict).Inc()
	for _, d := range res.Egress {
		m.egress.WithLabelValues(strconv.FormatBool(d.Allowed)).Inc()
		m.egressIO.WithLabelValues("out").Add(float64(d.BytesOut))
		m.egressIO.WithLabelValues("in").Add(float64(d.BytesIn))
	}
	if queued {
		m.queueWait.Observe(queue.Seconds())
	}
	if !ran {
		return
	}
	m.duration.Observe(res.Duration.Seconds())
	m.cpu.Observe(res.CPUTime.Seconds())
	if res.PeakMemoryBytes > 0 {
		m.peakMemory.Observe(float64(res.PeakMemoryBytes))
	}
	m.output.WithLabelValues("stdout").Add(float64(res.StdoutBytes))
	m.output.WithLabelValues("stderr").Add(float64(res.StderrBytes))
	if res.StdoutTruncated {
		m.truncated.WithLabelValues("stdout").Inc()
	}
	if res.StderrTruncated {
		m.truncated.WithLabelValues("stderr").Inc()
	}
}

// count is how many persistent sessions are open.
func (ss *sessions) count() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.live)
}
