package runtime

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// gvisorMounts returns the bundle's mounts as this runsc takes them: it
// refuses the recursive options (rro, rnosuid, rnodev, rnoexec), which it does not
// need: a bind mount is one mount of gVisor's own kernel, whose flags
// cover all the gofer serves below it, host mounts there included
// (TestBindsReadOnlyAllTheWayDown).
func gvisorMounts(ms []specs.Mount) []specs.Mount {
	out := make([]specs.Mount, len(ms))
	for i, m := range ms {
		m.Options = slices.DeleteFunc(slices.Clone(m.Options), func(o string) bool {
			return o == "rro" || o == "rnosuid" || o == "rnodev" || o == "rnoexec"
		})
		out[i] = m
	}
	return out
}

// gvisorSeccomp returns the bundle's seccomp section as runsc can apply
// it with --oci-seccomp, to everything in the sandbox the init included.
// runsc ignores a rule's errnoRet and answers EPERM (Debian's 2022 runsc,
// and still the 2026-09 one: runsc/specutils/seccomp), so a rule that
// asks for another errno — clone3's ENOSYS, which makes the C library fall
// back to clone, whose flags the filter can check — would answer EPERM
// and break every thread start. Such rules become allows here: the init
// installs the exact filter in the code's process itself (gVisor's kernel
// implements seccomp(2) with every errno), stacked on this one, so the
// code gets the errno the policy asks for. EPERM rules and the default
// are passed through: this filter still bounds what the init may do.
func gvisorSeccomp(s *specs.LinuxSeccomp) *specs.LinuxSeccomp {
	out := *s
	out.Syscalls = nil
	for _, rule := range s.Syscalls {
		if rule.Action == specs.ActErrno && rule.ErrnoRet != nil && *rule.ErrnoRet != uint(unix.EPERM) {
			rule.Action, rule.ErrnoRet, rule.Args = specs.ActAllow, nil, nil
		}
		out.Syscalls = append(out.Syscalls, rule)
	}
	return &out
}

// filterCache compiles seccomp sections into BPF programs once per
// distinct section (every call of a server has the same), by the library
// libcontainer uses: the runsc init's exact filter, a forked sandbox's.
type filterCache struct {
	mu      sync.Mutex
	filters map[string][]byte
}

func (fc *filterCache) compile(s *specs.LinuxSeccomp) ([]byte, error) {
	key, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if bpf, ok := fc.filters[string(key)]; ok {
		return bpf, nil
	}
	bpf, err := compileSeccomp(s)
	if err != nil {
		return nil, err
	}
	if fc.filters == nil {
		fc.filters = map[string][]byte{}
	}
	fc.filters[string(key)] = bpf
	return bpf, nil
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
