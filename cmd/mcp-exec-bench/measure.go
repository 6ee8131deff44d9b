package main

import (
	"context"
	"sync"
	"time"
)

// snippet is a piece of code to time and what a correct run prints.
type snippet struct {
	Code   string
	Stdout string
}

var (
	printOne = snippet{Code: "print(1)", Stdout: "1\n"}
	// The standard-library imports an evaluator's snippet typically starts
	// with: the cost of a cold interpreter loading modules from the rootfs.
	stdlibImports = snippet{Code: "import json, re, decimal, sqlite3", Stdout: ""}
	// A program that is mostly system calls: what a runtime that sits
	// between the code and the kernel (gVisor) costs it.
	syscallHeavy = snippet{Code: "import os\nfor _ in range(20000):\n    os.stat('/')", Stdout: ""}
)

// syscallCalls is how many timed calls the syscall-heavy program gets: it
// takes seconds on gVisor's ptrace platform.
const syscallCalls = 5

// outcome is what a call reported besides its wall-clock time (which the
// measuring loop takes itself). The baseline reports nothing.
type outcome struct {
	durationMS float64
	hasDur     bool
	runtime    string
	cpuMS      float64 // the result's cpu_ms (the sandbox's cgroup)
}

// caller makes one call of a fixed snippet and checks its result; an error
// is a failed call.
type caller func(ctx context.Context) (outcome, error)

// Latency is the distribution of one snippet's calls, one at a time.
type Latency struct {
	Snippet      string   `json:"snippet"`
	N            int      `json:"n"` // successful timed calls
	Errors       int      `json:"errors"`
	ErrorSamples []string `json:"error_samples,omitempty"`
	*Summary              // nil when no call succeeded
	// What the server said of its own calls (sandbox only): the mean of
	// duration_ms, and how many calls each runtime ran.
	DurationMSMean *float64       `json:"duration_ms_mean,omitempty"`
	RuntimeSeen    map[string]int `json:"runtime_seen,omitempty"`
	// Sandbox over baseline, lower is better; absent without a baseline.
	RatioP50 *float64 `json:"ratio_p50,omitempty"`
	RatioP95 *float64 `json:"ratio_p95,omitempty"`
	Skipped  string   `json:"skipped,omitempty"`
}

// Throughput is one concurrency level: workers each looping calls.
type Throughput struct {
	Concurrency  int      `json:"concurrency"`
	Calls        int      `json:"calls"` // successful
	Errors       int      `json:"errors"`
	ErrorSamples []string `json:"error_samples,omitempty"`
	ElapsedS     float64  `json:"elapsed_s"`
	CallsPerS    float64  `json:"calls_per_s"`
	// The latency each call saw under this load.
	P50MS *float64 `json:"p50_ms,omitempty"`
	// Sandbox over baseline, higher is better; absent without a baseline.
	Ratio *float64 `json:"ratio,omitempty"`
	// Highest memory seen while this level ran, sampled every 50 ms.
	PeakMemory *Memory `json:"peak_memory,omitempty"`
	// CPU is what a call cost in CPU time, by part.
	CPU *CPUSplit `json:"cpu_per_call,omitempty"`
	// cpuMS is the sum of the calls' cpu_ms.
	cpuMS float64
}

// maxErrorSamples bounds what a report repeats of failures that are
// usually all alike.
const maxErrorSamples = 5

// tally collects calls from any number of workers.
type tally struct {
	mu      sync.Mutex
	times   []time.Duration
	errs    int
	samples []string
	durSum  float64
	cpuSum  float64
	durN    int
	seen    map[string]int
}

func (t *tally) add(d time.Duration, o outcome, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.errs++
		if len(t.samples) < maxErrorSamples {
			t.samples = append(t.samples, err.Error())
		}
		return
	}
	t.times = append(t.times, d)
	t.cpuSum += o.cpuMS
	if o.hasDur {
		t.durSum += o.durationMS
		t.durN++
	}
	if o.runtime != "" {
		if t.seen == nil {
			t.seen = map[string]int{}
		}
		t.seen[o.runtime]++
	}
}

func timed(ctx context.Context, call caller) (time.Duration, outcome, error) {
	start := time.Now()
	o, err := call(ctx)
	return time.Since(start), o, err
}

// measureLatency makes warmup untimed calls, then n timed ones, one at a
// time. A failed call, warm-up or not, is counted as an error and not timed.
func measureLatency(ctx context.Context, code string, n, warmup int, gap time.Duration, call caller) Latency {
	var t tally
	for range warmup {
		if ctx.Err() != nil {
			break
		}
		if _, _, err := timed(ctx, call); err != nil {
			t.add(0, outcome{}, err)
		}
	}
	for range n {
		// Untimed: what the caller does between calls.
		if gap > 0 && !pause(ctx, gap) || ctx.Err() != nil {
			break
		}
		t.add(timed(ctx, call))
	}
	l := Latency{Snippet: code, N: len(t.times), Errors: t.errs, ErrorSamples: t.samples, Summary: summarize(t.times), RuntimeSeen: t.seen}
	if t.durN > 0 {
		m := t.durSum / float64(t.durN)
		l.DurationMSMean = &m
	}
	return l
}

// measureThroughput runs workers that each loop calls until d has passed
// (or, with perWorker > 0, that many calls each). Calls in flight when
// time is up are waited for and counted, and so is the time they take:
// the rate is successful calls over the whole elapsed time.
func measureThroughput(ctx context.Context, workers int, d time.Duration, perWorker int, call caller) Throughput {
	var t tally
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				if perWorker > 0 && i >= perWorker || perWorker == 0 && !time.Now().Before(deadline) {
					return
				}
				t.add(timed(ctx, call))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	tp := Throughput{
		Concurrency:  workers,
		Calls:        len(t.times),
		Errors:       t.errs,
		ErrorSamples: t.samples,
		ElapsedS:     elapsed.Seconds(),
		CallsPerS:    float64(len(t.times)) / elapsed.Seconds(),
		cpuMS:        t.cpuSum,
	}
	if s := summarize(t.times); s != nil {
		tp.P50MS = &s.P50MS
	}
	return tp
}
