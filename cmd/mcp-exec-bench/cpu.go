package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPUSplit is the CPU time one call cost on average at a throughput level,
// in milliseconds, split by who spent it. For the baseline only Total is
// known (the interpreters, reaped by this program).
//
//   - Code: each result's cpu_ms, what the sandbox's cgroup accounted from
//     when the code was handed over to its exit (under runsc gVisor's
//     sentry and gofer included).
//   - Server: the server process itself (MCP, libcontainer in-process,
//     the pool).
//   - Start: every other process the server started and reaped, less the
//     code's part: making and starting the sandbox (runc's init stages,
//     the init, the interpreter's start; gVisor's boot, `runsc run`) and
//     tearing it down.
//
// Server and helpers come from the kernel's figures of the server process
// (/proc/<pid>/stat: its own time and its reaped descendants'), read before
// and after the level, at the clock tick's 10 ms resolution over hundreds
// of calls.
type CPUSplit struct {
	TotalMS  float64  `json:"total_ms"`
	ServerMS *float64 `json:"server_ms,omitempty"`
	StartMS  *float64 `json:"start_ms,omitempty"`
	CodeMS   *float64 `json:"code_ms,omitempty"`
}

// procCPU is a process's own and its reaped children's CPU time.
type procCPU struct{ self, children float64 } // ms

// readProcCPU reads utime+stime and cutime+cstime of pid.
func readProcCPU(pid int) (procCPU, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procCPU{}, err
	}
	// The command name may hold spaces and parentheses: fields start
	// after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procCPU{}, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime..cstime are fields 14..17.
	if len(f) < 15 {
		return procCPU{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	var v [4]float64
	for k := range v {
		n, err := strconv.ParseUint(f[11+k], 10, 64)
		if err != nil {
			return procCPU{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
		v[k] = float64(n) * 1000 / clockTicks
	}
	return procCPU{self: v[0] + v[1], children: v[2] + v[3]}, nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// childrenCPU is the CPU time of this program's reaped children, in ms.
func childrenCPU() float64 {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_CHILDREN, &ru) != nil {
		return 0
	}
	ms := func(t unix.Timeval) float64 { return float64(t.Sec)*1000 + float64(t.Usec)/1000 }
	return ms(ru.Utime) + ms(ru.Stime)
}

// serverSplit is the per-call split of a level the server ran: before and
// after are its /proc figures, sandboxMS the sum of the calls' cpu_ms.
func serverSplit(before, after procCPU, codeMS float64, calls int) *CPUSplit {
	if calls == 0 {
		return nil
	}
	n := float64(calls)
	self := (after.self - before.self) / n
	children := (after.children - before.children) / n
	code := codeMS / n
	// Children include the sandboxes' processes (reaped by the server or
	// by runsc, whose figures roll up), the code's among them. Reaping
	// lags a call a little, so clamp at zero.
	start := max(children-code, 0)
	return &CPUSplit{TotalMS: self + start + code, ServerMS: &self, StartMS: &start, CodeMS: &code}
}
