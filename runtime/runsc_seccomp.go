package runtime

import (
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// gvisorMounts returns the bundle's mounts as this runsc takes them: it
// refuses the recursive options (rro, rnosuid, rnodev), which it does not
// need: a bind mount is one mount of gVisor's own kernel, whose flags
// cover all the gofer serves below it, host mounts there included
// (TestBindsReadOnlyAllTheWayDown).
func gvisorMounts(ms []specs.Mount) []specs.Mount {
	out := make([]specs.Mount, len(ms))
	for i, m := range ms {
		m.Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool {
			return o == "rro" || o == "rnosuid" || o == "rnodev"
		})
		out[i] = m
	}
	return out
}

// gvisorSeccomp returns the bundle's seccomp section as this runsc can
// apply it with --oci-seccomp. It changes one thing: runsc ignores a
// rule's errnoRet and answers EPERM (Debian's 2022 runsc, and still the
// 2026-09 one: runsc/specutils/seccomp), so a rule that asks for
// ENOSYS (clone3, so that the C library falls back to clone, whose flags
// the filter can check) would answer EPERM and break every thread start.
// Where gVisor's own kernel answers ENOSYS for that syscall — its syscall
// table says so — the rule becomes an allow, which yields the very ENOSYS
// the policy asks for. Everything else is passed through untouched.
func gvisorSeccomp(s *specs.LinuxSeccomp, unimplemented map[string]bool) *specs.LinuxSeccomp {
	out := *s
	out.Syscalls = nil
	for _, rule := range s.Syscalls {
		nosys := rule.Action == specs.ActErrno && rule.ErrnoRet != nil && *rule.ErrnoRet == uint(unix.ENOSYS) && len(rule.Args) == 0
		if !nosys {
			out.Syscalls = append(out.Syscalls, rule)
			continue
		}
		var keep, allow []string
		for _, n := range rule.Names {
			if unimplemented[n] {
				allow = append(allow, n)
			} else {
				keep = append(keep, n)
			}
		}
		if len(keep) > 0 {
			r := rule
			r.Names = keep
			out.Syscalls = append(out.Syscalls, r)
		}
		if len(allow) > 0 {
			out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{Names: allow, Action: specs.ActAllow})
		}
	}
	return &out
}

// sweepRunsc kills what a dead instance's runsc root dir still has running.
// The instance's cgroups (holding the sandboxes, gofers and stubs) are
// swept by state.go; this catches `runsc run` processes, which live in the
// server's cgroup, should one have survived its parent-death signal. The
// state itself goes with the instance dir.
func sweepRunsc(instanceDir string, log *slog.Logger) {
	root := filepath.Join(instanceDir, "runsc")
	if _, err := os.Stat(root); err != nil {
		return
	}
	if n := killRunscProcesses(root); n > 0 {
		log.Info("killed runsc processes of a dead server instance", "root", root, "processes", n)
	}
}
