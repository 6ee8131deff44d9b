package runtime

import (
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
)

// SubvertInit makes b's init play one the code subverted: no parent-death
// signal, no exit when the host goes.
func SubvertInit(b *bundle.Bundle) { subvertedInits.Store(b.ID, true) }

// InstanceID exposes the instance id of a runtime for leak checks.
func InstanceID(rt Runtime) string {
	switch r := rt.(type) {
	case *LibcontainerRuntime:
		return r.inst.id
	}
	if r, ok := rt.(interface{ instanceID() string }); ok {
		return r.instanceID()
	}
	return ""
}

// InstanceDir exposes the instance's state directory for leak checks.
func InstanceDir(rt Runtime) string {
	switch r := rt.(type) {
	case *LibcontainerRuntime:
		return r.inst.dir
	}
	if r, ok := rt.(interface{ instanceDir() string }); ok {
		return r.instanceDir()
	}
	return ""
}

// WithoutSupervisionTimer turns the supervision's own timeout timer off,
// as if it had failed, until t and its subtests end: only the watchdog
// can end a call then. A test calls it before its subtests start, which
// run in parallel.
func WithoutSupervisionTimer(t testing.TB) {
	supervisionTimer = false
	t.Cleanup(func() { supervisionTimer = true })
}

// WatchdogGrace is how long past its timeout a call may run.
const WatchdogGrace = watchdogGrace

// WithForkTimeout runs f with forks given d to answer.
func WithForkTimeout(d time.Duration, f func()) {
	old := forkTimeout
	forkTimeout = d
	defer func() { forkTimeout = old }()
	f()
}

// WithForksAsUID runs f with every fork's code process asked to take uid,
// whatever its bundle says: a template whose forks are not confined.
func WithForksAsUID(uid uint32, f func()) {
	forkUID = &uid
	defer func() { forkUID = nil }()
	f()
}

// SessionCPU is the CPU time a session's sandbox has used so far, as the
// host's kernel accounts it: its cgroups' count, or, in the process
// runtime (no cgroup), the sum over the live processes below its init.
func SessionCPU(s *Session) time.Duration {
	if pc, ok := s.sb.c.(*procContainer); ok {
		var ticks int64
		for _, pid := range descendants(pc.cmd.Process.Pid) {
			t, _ := cpuTicks(pid)
			ticks += t
		}
		return time.Duration(ticks) * 10 * time.Millisecond
	}
	return s.sb.c.cpu()
}

// WithForkSeccomp runs f with the filters of templates made in it, and of
// their forks, edited by edit: a hole a test opens to attack what stands
// behind the filter.
func WithForkSeccomp(edit func(*specs.LinuxSeccomp), f func()) {
	forkSeccompEdit = edit
	defer func() { forkSeccompEdit = nil }()
	f()
}

// WithReapTimeout runs f with templates given d to report a call reaped.
func WithReapTimeout(d time.Duration, f func()) {
	old := reapTimeout
	reapTimeout = d
	defer func() { reapTimeout = old }()
	f()
}
