// Command mcp-exec-bench measures what a client of mcp-exec sees. For each
// runtime it starts the real server (mcp-exec serve, stdio transport),
// drives it with the official Go MCP client, and reports exec latency
// (calls back to back, and one call per --pace as an agent makes them),
// throughput at several concurrencies and the server's memory. In the same
// run it measures the bare baseline the same way — a fresh stock
// /usr/bin/python3 -c CODE per call — and prints every figure next to it as
// a ratio.
//
// It is a benchmark, not a test: it asserts no timing. It does check every
// result (stdout and exit status), because a failed call is fast: it is
// counted and reported as an error, never timed as if it had succeeded.
//
// Invariants a maintainer must keep:
//   - It relies only on the exec tool's contract (input code; output
//     stdout, exit_code, duration_ms, runtime), not on the server's
//     internals, so that it measures the server before and after they
//     change.
//   - The baseline is a real interpreter binary, never a shim script (which
//     would flatter the ratio), measured in the same run on the same host.
//   - The exit status is non-zero only when nothing could be measured: a
//     runtime the server refuses is skipped with the reason printed.
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command line, parsed once.
type options struct {
	Server         string        `json:"server"`
	Python         string        `json:"python"`
	Runtimes       []string      `json:"runtimes"`
	N              int           `json:"n"`
	Warmup         int           `json:"warmup"`
	Duration       time.Duration `json:"-"`
	DurationS      float64       `json:"duration_s"`
	CallsPerWorker int           `json:"calls_per_worker,omitempty"`
	Concurrency    []int         `json:"concurrency"`
	Settle         time.Duration `json:"-"`
	SettleS        float64       `json:"settle_s"`
	Pace           time.Duration `json:"-"`
	PaceS          float64       `json:"pace_s"`
	Packages       []string      `json:"packages,omitempty"`
	Preload        bool          `json:"preload,omitempty"`
	Env            []string      `json:"env,omitempty"`
	JSON           string        `json:"-"`
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	o := options{}
	fs := flag.NewFlagSet("mcp-exec-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.Server, "server", "bin/mcp-exec", "the mcp-exec binary to start as `mcp-exec serve`")
	fs.StringVar(&o.Python, "python", "/usr/bin/python3", "the baseline interpreter (a binary, not a shim script)")
	runtimes := fs.String("runtimes", "libcontainer,libcontainer+fresh,runsc,runsc+fresh,runsc/ptrace,runsc@/usr/bin/runsc",
		"comma-separated MCP_EXEC_RUNTIME values to measure, each optionally with /PLATFORM (gVisor's) and @PATH (the runsc binary); +fresh: sandboxes fresh containers or gVisor sandboxes, not forks (MCP_EXEC_FORK=false)")
	fs.IntVar(&o.N, "n", 30, "timed calls per snippet for latency")
	fs.IntVar(&o.Warmup, "warmup", 3, "untimed calls per snippet before the timed ones")
	fs.DurationVar(&o.Duration, "duration", 10*time.Second, "how long each throughput level runs")
	fs.IntVar(&o.CallsPerWorker, "calls", 0, "calls per worker for throughput instead of --duration (0: use --duration)")
	concurrency := fs.String("concurrency", "1,2,4,8", "comma-separated numbers of parallel callers for throughput")
	fs.DurationVar(&o.Settle, "settle", 2*time.Second, "pause before the idle memory sample")
	fs.DurationVar(&o.Pace, "pace", time.Second, "also time print(1) (and the packages' import) one call per `D`, as an agent calls, besides back to back (0: don't)")
	packages := fs.String("packages", "", "comma-separated packages (PyPI names) passed as MCP_EXEC_PACKAGES; measures importing them")
	fs.BoolVar(&o.Preload, "preload", false, "with --packages, the packages' server also imports them ahead in its prepared sandboxes (MCP_EXEC_PRELOAD)")
	fs.Func("env", "`KEY=VAL` for the server's environment (repeatable), e.g. MCP_EXEC_POOL_SIZE=0", func(s string) error {
		k, _, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want KEY=VAL, got %q", s)
		}
		o.Env = append(o.Env, s)
		return nil
	})
	fs.StringVar(&o.JSON, "json", "", "also write every result, machine-readable, to `FILE`")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	o.Runtimes = splitList(*runtimes)
	o.Packages = splitList(*packages)
	for _, s := range splitList(*concurrency) {
		c, err := strconv.Atoi(s)
		if err != nil || c < 1 {
			return o, fmt.Errorf("--concurrency: want numbers ≥ 1, got %q", s)
		}
		o.Concurrency = append(o.Concurrency, c)
	}
	switch {
	case len(o.Runtimes) == 0:
		return o, errors.New("--runtimes: none given")
	case o.N < 1:
		return o, fmt.Errorf("--n must be ≥ 1, got %d", o.N)
	case o.Pace < 0:
		return o, fmt.Errorf("--pace must be ≥ 0, got %v", o.Pace)
	case o.Warmup < 0:
		return o, fmt.Errorf("--warmup must be ≥ 0, got %d", o.Warmup)
	case o.CallsPerWorker < 0:
		return o, fmt.Errorf("--calls must be ≥ 0, got %d", o.CallsPerWorker)
	case o.CallsPerWorker == 0 && o.Duration <= 0:
		return o, fmt.Errorf("--duration must be > 0, got %v", o.Duration)
	case o.Settle < 0:
		return o, fmt.Errorf("--settle must be ≥ 0, got %v", o.Settle)
	}
	o.DurationS, o.SettleS, o.PaceS = o.Duration.Seconds(), o.Settle.Seconds(), o.Pace.Seconds()
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}

// maxConcurrency is the highest throughput level, which the server must
// run at once for the level to mean anything.
func (o options) maxConcurrency() int {
	if len(o.Concurrency) == 0 {
		return 1
	}
	return slices.Max(o.Concurrency)
}

// serverEnv is the environment of a server under test: ours without any
// MCP_EXEC_ setting (the run must say exactly what the server was given),
// then the concurrency every level needs, then --env, then what this
// server is for (its runtime, its packages), each later one winning.
// It returns the whole environment and the MCP_EXEC_ part, sorted, for the
// report.
func serverEnv(base []string, o options, set ...string) (env, shown []string) {
	for _, kv := range base {
		if !strings.HasPrefix(kv, "MCP_EXEC_") {
			env = append(env, kv)
		}
	}
	c := o.maxConcurrency()
	vals := map[string]string{
		"MCP_EXEC_MAX_CONCURRENCY": strconv.Itoa(max(c, 8)),
		// A queue that never refuses a call of ours: refusals would be
		// errors of the benchmark, not of the server.
		"MCP_EXEC_MAX_QUEUED": strconv.Itoa(max(16*c, 128)),
	}
	for _, kv := range append(slices.Clone(o.Env), set...) {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	keys := make([]string, 0, len(vals))
	for k := range vals {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp.Compare)
	for _, k := range keys {
		env = append(env, k+"="+vals[k])
		if strings.HasPrefix(k, "MCP_EXEC_") {
			shown = append(shown, k+"="+vals[k])
		}
	}
	return env, shown
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "mcp-exec-bench:", err)
		return 2
	}
	rep, err := bench(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec-bench:", err)
		return 1
	}
	writeTable(stdout, rep)
	if o.JSON != "" {
		if err := writeJSON(o.JSON, rep); err != nil {
			fmt.Fprintln(stderr, "mcp-exec-bench:", err)
			return 1
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "mcp-exec-bench: interrupted; the figures above are partial")
		return 1
	}
	for _, r := range rep.Runtimes {
		if r.Skipped == "" {
			return 0
		}
	}
	fmt.Fprintln(stderr, "mcp-exec-bench: no runtime could be measured")
	return 1
}
