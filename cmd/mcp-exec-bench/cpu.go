package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/uuid"
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
	// Accounted is the same level split by the kernel's own accounting
	// of each part; nil for the baseline.
	Accounted *Accounted `json:"accounted,omitempty"`
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

// childrenCPU is the CPU time of this program's reaped children, in ms
// (the baseline's interpreters).
func childrenCPU() float64 {
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_CHILDREN, &ru)
	ms := func(t unix.Timeval) float64 { return float64(t.Sec)*1000 + float64(t.Usec)/1000 }
	return ms(ru.Utime) + ms(ru.Stime)
}

// Accounted is a level's CPU per call as the kernel accounts it to each
// part, in ms: immune to whatever else the machine runs (other test
// suites on a shared machine), unlike TotalMS. Each is read before and
// after the level:
//
//   - Server: the server process (all its threads).
//   - Helpers: the server's children it reaped meanwhile (a `runsc run`
//     per call; a container's runc init stage before it joins the
//     container's cgroups).
//   - Sandboxes: the instance's calls' cgroups (cpuacct counts a removed
//     child in its parent): the call's init and processes, its part of
//     a gVisor sandbox; Code, the results' cpu_ms, is part of it.
//   - Templates: the instance's templates' cgroups: a template's init and
//     interpreter forking each call (the fork's first copy-on-write faults
//     until the call's init moves the code's process into the call's
//     cgroups included).
//   - Kernel: the kernel's own threads (kthreadd's children: a network
//     namespace's teardown, say) — the whole machine's, so other work
//     that makes the kernel work is counted too.
type Accounted struct {
	ServerMS    float64 `json:"server_ms"`
	HelpersMS   float64 `json:"helpers_ms"`
	SandboxesMS float64 `json:"sandboxes_ms"`
	TemplatesMS float64 `json:"templates_ms"`
	KernelMS    float64 `json:"kernel_threads_ms"`
	TotalMS     float64 `json:"total_ms"`
}

// accountedCPU is one reading of everything Accounted is made of.
type accountedCPU struct {
	server                         procCPU
	sandboxes, templates, kthreads float64
	ok                             bool
}

// readAccounted reads the server's accounting; inst is its instance's
// cgroup dirs ("" when unknown: then only the server's own is read).
func readAccounted(pid int, inst instanceCgroups) accountedCPU {
	a := accountedCPU{}
	p, err := readProcCPU(pid)
	if err != nil {
		return a
	}
	a.server, a.ok = p, true
	a.sandboxes = cgroupUsageMS(inst.calls)
	a.templates = cgroupUsageMS(inst.templates)
	a.kthreads = kernelThreadsMS()
	return a
}

// accountedSplit is the per-call difference of two readings.
func accountedSplit(before, after accountedCPU, calls int) *Accounted {
	if !before.ok || !after.ok || calls == 0 {
		return nil
	}
	n := float64(calls)
	a := &Accounted{
		ServerMS:    (after.server.self - before.server.self) / n,
		HelpersMS:   (after.server.children - before.server.children) / n,
		SandboxesMS: max(after.sandboxes-before.sandboxes, 0) / n,
		TemplatesMS: max(after.templates-before.templates, 0) / n,
		KernelMS:    max(after.kthreads-before.kthreads, 0) / n,
	}
	a.TotalMS = a.ServerMS + a.HelpersMS + a.SandboxesMS + a.TemplatesMS + a.KernelMS
	return a
}

// instanceCgroups are the cpuacct (v1) or unified (v2) dirs that hold an
// instance's calls' and templates' cgroups.
type instanceCgroups struct{ calls, templates string }

// findInstance finds the server's instance — its state dir's lock, which
// the server holds open — and so the cgroup parents of its sandboxes
// (runtime/state.go: <controller>/mcp-exec/<instance> and
// <instance>.templates).
func findInstance(pid int) (instanceCgroups, bool) {
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return instanceCgroups{}, false
	}
	for _, e := range ents {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasSuffix(target, "/lock") {
			continue
		}
		id := filepath.Base(filepath.Dir(target))
		if _, err := uuid.Parse(id); err != nil {
			continue
		}
		for _, root := range []string{"/sys/fs/cgroup/cpuacct/mcp-exec", "/sys/fs/cgroup/mcp-exec"} {
			if _, err := os.Stat(filepath.Join(root, id)); err == nil {
				return instanceCgroups{calls: filepath.Join(root, id), templates: filepath.Join(root, id+".templates")}, true
			}
		}
		// The cgroups come with the first sandbox: v1 unless the
		// unified hierarchy is all there is.
		root := "/sys/fs/cgroup/cpuacct/mcp-exec"
		if _, err := os.Stat("/sys/fs/cgroup/cpuacct"); err != nil {
			root = "/sys/fs/cgroup/mcp-exec"
		}
		return instanceCgroups{calls: filepath.Join(root, id), templates: filepath.Join(root, id+".templates")}, true
	}
	return instanceCgroups{}, false
}

// cgroupUsageMS is a cgroup's CPU time with its descendants', in ms; 0
// when it does not exist (yet, or any more).
func cgroupUsageMS(dir string) float64 {
	if dir == "" {
		return 0
	}
	if b, err := os.ReadFile(filepath.Join(dir, "cpuacct.usage")); err == nil {
		ns, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return float64(ns) / 1e6
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return float64(us) / 1e3
		}
	}
	return 0
}

// kernelThreadsMS is the CPU time of the kernel's threads (kthreadd and
// its children), in ms.
func kernelThreadsMS() float64 {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var total float64
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		// f[1] is the parent (field 4); utime and stime fields 14 and 15.
		if len(f) < 13 || (pid != 2 && f[1] != "2") {
			continue
		}
		u, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		total += float64(u+st) * 1000 / clockTicks
	}
	return total
}
