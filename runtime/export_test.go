package runtime

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
)

// SubvertInits makes the init of every call's sandbox prepared from now
// on play one the code subverted: no parent-death signal, no exit when the
// host goes. Only a test's server of its own calls it.
func SubvertInits() { subvertInits.Store(true) }

// BundleOf is the bundle a sandbox was made of, for leak checks.
func BundleOf(sb Sandbox) *bundle.Bundle { return sb.(*sandbox).b }

// SessionBundle is the bundle of a session's sandbox.
func SessionBundle(s *Session) *bundle.Bundle { return s.sb.b }

// bundlePreparer is a runtime's Prepare after its bundle is made.
type bundlePreparer interface {
	prepareBundle(ctx context.Context, b *bundle.Bundle) (Sandbox, error)
}

// PrepareBundle prepares the sandbox of a bundle the test made itself
// (bundle.New in BundleDir(rt), its init in InitDir(rt)), which it knows
// even when the preparation fails.
func PrepareBundle(ctx context.Context, rt Runtime, b *bundle.Bundle) (Sandbox, error) {
	return rt.(bundlePreparer).prepareBundle(ctx, b)
}

// RunBundle is Run on a bundle the test made itself.
func RunBundle(ctx context.Context, rt Runtime, b *bundle.Bundle, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		b.Remove()
		return Result{}, err
	}
	sb, err := PrepareBundle(ctx, rt, b)
	if err != nil {
		return Result{}, err
	}
	res, err := runValid(ctx, sb, req)
	if cerr := sb.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return res, err
}

// BundleDir is where a runtime makes its bundles.
func BundleDir(rt Runtime) string {
	switch r := rt.(type) {
	case *LibcontainerRuntime:
		return r.inst.bundleDir()
	case *RunscRuntime:
		return r.inst.bundleDir()
	case *ProcessRuntime:
		return r.dir
	}
	panic("no bundle dir")
}

// InitDir is where a runtime's sandboxes find their init.
func InitDir(rt Runtime) string {
	switch r := rt.(type) {
	case *LibcontainerRuntime:
		return r.inst.initDir()
	case *RunscRuntime:
		return r.inst.initDir()
	case *ProcessRuntime:
		return processInitDir
	}
	panic("no init dir")
}

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

// WithForksAsUID runs f with every fork of rt's code process asked to
// take uid, whatever its bundle says: a template whose forks are not
// confined.
func WithForksAsUID(rt Runtime, uid uint32, f func()) {
	id := InstanceID(rt)
	forkUID.Store(id, uid)
	defer forkUID.Delete(id)
	f()
}

// SessionCPU is the CPU time a session's sandbox has used so far, as the
// host's kernel accounts it: its cgroups' count, or, in the process
// runtime (no cgroup), the sum over the live threads below its init, a
// zombie leader's included.
func SessionCPU(s *Session) time.Duration {
	if pc, ok := s.sb.c.(*procContainer); ok {
		var ticks int64
		for _, pid := range descendants(pc.cmd.Process.Pid) {
			threads, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stat", pid))
			for _, stat := range threads {
				if f := statFields(stat); len(f) > 12 {
					u, _ := strconv.ParseInt(f[11], 10, 64)
					k, _ := strconv.ParseInt(f[12], 10, 64)
					ticks += u + k
				}
			}
		}
		return time.Duration(ticks) * 10 * time.Millisecond
	}
	return s.sb.c.cpu()
}

// WithForkSeccomp runs f with the filters of rt's templates made in it,
// and of their forks, edited by edit: a hole a test opens to attack what
// stands behind the filter, in its own runtime only.
func WithForkSeccomp(rt Runtime, edit func(*specs.LinuxSeccomp), f func()) {
	id := InstanceID(rt)
	forkSeccompEdit.Store(id, edit)
	defer forkSeccompEdit.Delete(id)
	f()
}

// WithReapTimeout runs f with templates given d to report a call reaped.
func WithReapTimeout(d time.Duration, f func()) {
	old := reapTimeout
	reapTimeout = d
	defer func() { reapTimeout = old }()
	f()
}

// ParkDir is where a runsc runtime's instance keeps parked images.
func ParkDir(rt Runtime) string {
	if r, ok := rt.(*RunscRuntime); ok {
		return r.parkRoot
	}
	return ""
}

// SessionCgroups are the cgroups of a session's runsc sandbox, by
// controller.
func SessionCgroups(s *Session) map[string]string {
	if rc, ok := s.sb.c.(*runscContainer); ok && rc.cg != nil {
		return rc.cg.paths
	}
	return nil
}

// RunscPath is the runsc binary a runsc runtime runs.
func RunscPath(rt Runtime) string { return rt.(*RunscRuntime).info.Path }
