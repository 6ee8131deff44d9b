package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// CPUSplit is the CPU time one call cost on average at a throughput level,
// in milliseconds, split by who spent it. Total is what the whole machine
// spent while the level ran (/proc/stat), less this program's own: every
// process and the kernel's threads, which is where a forked sandbox's
// template and a network namespace's teardown spend theirs. For the
// baseline only Total is known.
//
//   - Code: each result's cpu_ms, what the sandbox's cgroup accounted from
//     when the code was handed over to its exit (under runsc gVisor's
//     sentry and gofer included).
//   - Server: the server process itself (MCP, libcontainer in-process,
//     the pool).
//   - Start: the rest — making and starting the sandbox (runc's init
//     stages, the init, the interpreter's start; a template's fork;
//     gVisor's boot, `runsc run`) and tearing it down.
//
// The figures are the kernel's, read before and after the level, at the
// clock tick's 10 ms resolution over hundreds of calls; on a machine doing
// other work Total counts that work too.
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

// serverSplit is the per-call split of a level the server ran: before and
// after are its /proc figures, machineMS what the machine spent meanwhile
// (machineCPU), codeMS the sum of the calls' cpu_ms.
func serverSplit(before, after procCPU, machineMS, codeMS float64, calls int) *CPUSplit {
	if calls == 0 {
		return nil
	}
	n := float64(calls)
	self := (after.self - before.self) / n
	code := codeMS / n
	// The figures come at different resolutions: clamp at zero.
	start := max(machineMS/n-self-code, 0)
	return &CPUSplit{TotalMS: self + start + code, ServerMS: &self, StartMS: &start, CodeMS: &code}
}

// machineCPU is the CPU time every CPU of the machine has spent busy, in
// ms, less this program's own.
func machineCPU() float64 {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	var ticks float64
	// user nice system idle iowait irq softirq steal: all but the idle.
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		if i < len(f) {
			n, _ := strconv.ParseUint(f[i], 10, 64)
			ticks += float64(n)
		}
	}
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	ms := func(t unix.Timeval) float64 { return float64(t.Sec)*1000 + float64(t.Usec)/1000 }
	return ticks*1000/clockTicks - ms(ru.Utime) - ms(ru.Stime)
}
