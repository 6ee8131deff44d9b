package runtime

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// probeTimeout bounds every probe of runsc (each is one short command).
const probeTimeout = 10 * time.Second

// RunscInfo is what doctor reports of runsc, and what NewRunsc checks.
type RunscInfo struct {
	Path    string `json:"path,omitempty"`
	Version string `json:"version,omitempty"`
	// Platform is the gVisor platform that would be used; PlatformReason
	// says why.
	Platform       string `json:"platform,omitempty"`
	PlatformReason string `json:"platform_reason,omitempty"`
	// Platforms are the ones this runsc offers.
	Platforms []string `json:"platforms,omitempty"`
	// OCISeccomp: this runsc can apply the bundle's seccomp filter inside
	// the sandbox (--oci-seccomp), which the runtime always asks for.
	OCISeccomp bool `json:"oci_seccomp"`
	// Limits lists the limits this host lets the runtime enforce (memory,
	// pids, cpu: each through its cgroup controller).
	Limits []string `json:"limits"`
	// Missing lists, each with its fix, what keeps runsc from giving the
	// full sandbox here. Empty means runsc is usable.
	Missing []string `json:"missing,omitempty"`
}

// Available reports whether runsc can give the full sandbox here.
func (i RunscInfo) Available() bool { return len(i.Missing) == 0 }

// Detail is a one-line summary for doctor.
func (i RunscInfo) Detail() string {
	if i.Path == "" {
		return ""
	}
	s := fmt.Sprintf("%s %s", i.Path, i.Version)
	if i.Platform != "" {
		s += fmt.Sprintf(", platform %s (%s)", i.Platform, i.PlatformReason)
	}
	if i.OCISeccomp {
		s += ", --oci-seccomp"
	}
	return s
}

// requiredRunscFlags are the global flags the runtime passes.
var requiredRunscFlags = []string{"root", "network", "platform", "oci-seccomp", "log-fd"}

// ProbeRunsc finds runsc, the platform it would use and what this host
// lacks for it. path is MCP_EXEC_RUNSC (empty: runsc on PATH); platform is
// MCP_EXEC_RUNSC_PLATFORM (empty: probed — systrap where this runsc has it,
// else ptrace; kvm only when asked for by name).
func ProbeRunsc(ctx context.Context, path, platform string) RunscInfo {
	var info RunscInfo
	host := ProbeHost()
	info.Limits = host.EnforceableLimits()

	bin, err := findRunsc(path)
	if err != nil {
		info.Missing = append(info.Missing, err.Error())
		info.Missing = append(info.Missing, host.missingForRunsc()...)
		return info
	}
	info.Path = bin
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()

	// Three short runsc commands, at once: start-up pays for one.
	version := runscAsync(ctx, bin, false, "--version")
	flags := runscAsync(ctx, bin, true, "flags") // runsc prints its flags on stderr
	platforms := runscAsync(ctx, bin, false, "help", "platforms")

	r := <-version
	out, err := r.out, r.err
	if err != nil {
		info.Missing = append(info.Missing, fmt.Sprintf("runsc: %s does not run (%v); reinstall it (apt-get install runsc) or set MCP_EXEC_RUNSC", bin, err))
		return info
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	info.Version = strings.TrimPrefix(strings.TrimSpace(first), "runsc version ")

	if r := <-flags; r.err == nil {
		have := string(r.out)
		var lacking []string
		for _, f := range requiredRunscFlags {
			if !strings.Contains(have, "-"+f+" ") && !strings.Contains(have, "-"+f+"\n") {
				lacking = append(lacking, "--"+f)
			}
		}
		info.OCISeccomp = !slices.Contains(lacking, "--oci-seccomp")
		if len(lacking) > 0 {
			info.Missing = append(info.Missing, fmt.Sprintf("runsc %s lacks %s: install a newer runsc", info.Version, strings.Join(lacking, ", ")))
		}
	} else {
		info.Missing = append(info.Missing, fmt.Sprintf("runsc %s: listing its flags failed: %v", info.Version, r.err))
	}

	if r := <-platforms; r.err == nil {
		info.Platforms = strings.Fields(string(r.out))
	}
	info.Platform, info.PlatformReason, err = choosePlatform(platform, info.Platforms)
	if err != nil {
		info.Missing = append(info.Missing, err.Error())
	}
	if info.Platform == "ptrace" && host.PtraceScope >= 3 {
		info.Missing = append(info.Missing, "ptrace: kernel.yama.ptrace_scope is 3, which forbids the ptrace platform; "+
			"set it to 1 (sysctl kernel.yama.ptrace_scope=1) or choose another platform (MCP_EXEC_RUNSC_PLATFORM)")
	}
	if info.Platform == "kvm" {
		if _, err := os.Stat("/dev/kvm"); err != nil {
			info.Missing = append(info.Missing, "kvm: MCP_EXEC_RUNSC_PLATFORM=kvm but /dev/kvm is not there; unset it to use ptrace")
		}
	}
	info.Missing = append(info.Missing, host.missingForRunsc()...)
	return info
}

// missingForRunsc lists the host-side requirements of the runsc runtime.
func (h Host) missingForRunsc() []string {
	missing := h.missingPrivileges(Runsc)
	missing = append(missing, h.missingControllers()...)
	if !h.SeccompKernel {
		missing = append(missing, "seccomp: the kernel has no seccomp filtering, which gVisor needs (enable CONFIG_SECCOMP_FILTER)")
	}
	return missing
}

// RunscUsable returns an error naming everything the runsc runtime would
// lack on this host with cfg, or nil. Tests use it to decide whether runsc
// can be tested here.
func RunscUsable(cfg Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	info := ProbeRunsc(ctx, cfg.RunscPath, cfg.RunscPlatform)
	if info.Available() {
		return nil
	}
	return fmt.Errorf("%w: this host cannot provide the full sandbox with runsc: %s", ErrUnsupported, strings.Join(info.Missing, "; "))
}

// choosePlatform picks the gVisor platform: the configured one if this
// runsc has it, else systrap, else ptrace. kvm is never picked unprompted:
// it hangs on hosts with nested or missing virtualisation.
func choosePlatform(want string, have []string) (platform, reason string, err error) {
	if want != "" {
		if len(have) > 0 && !slices.Contains(have, want) {
			return "", "", fmt.Errorf("runsc platform %q: this runsc offers only %s (MCP_EXEC_RUNSC_PLATFORM)", want, strings.Join(have, ", "))
		}
		return want, "set by MCP_EXEC_RUNSC_PLATFORM", nil
	}
	switch {
	case slices.Contains(have, "systrap"):
		return "systrap", "probed: the fastest platform without virtualisation", nil
	case slices.Contains(have, "ptrace"):
		return "ptrace", "probed: this runsc has no systrap", nil
	case len(have) == 0:
		return "ptrace", "runsc did not list its platforms; ptrace is its default", nil
	}
	return "", "", fmt.Errorf("runsc platform: this runsc offers only %s, and kvm is used only when asked for "+
		"(MCP_EXEC_RUNSC_PLATFORM=kvm)", strings.Join(have, ", "))
}

// findRunsc resolves MCP_EXEC_RUNSC, or runsc on PATH, to an absolute path.
func findRunsc(path string) (string, error) {
	name := path
	if name == "" {
		name = "runsc"
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if path == "" {
			return "", fmt.Errorf("runsc: not found on PATH; install it (apt-get install runsc) or set MCP_EXEC_RUNSC to its path")
		}
		return "", fmt.Errorf("runsc: MCP_EXEC_RUNSC=%s is not an executable: %v", path, err)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("runsc: resolving %s: %v", p, err)
	}
	return abs, nil
}

func runscOutput(ctx context.Context, bin string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.WaitDelay = time.Second
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return out, fmt.Errorf("%w: %s", err, msg)
		}
	}
	return out, err
}

type cmdResult struct {
	out []byte
	err error
}

// runscAsync runs a short runsc command in the background; combined takes
// stderr into the output too.
func runscAsync(ctx context.Context, bin string, combined bool, args ...string) <-chan cmdResult {
	ch := make(chan cmdResult, 1)
	go func() {
		if !combined {
			out, err := runscOutput(ctx, bin, args...)
			ch <- cmdResult{out, err}
			return
		}
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = []string{}
		cmd.Dir = "/"
		cmd.WaitDelay = time.Second
		out, err := cmd.CombinedOutput()
		ch <- cmdResult{out, err}
	}()
	return ch
}

// runscUnimplemented returns the syscalls of this architecture that runsc
// itself answers with ENOSYS, from its own compatibility table.
func runscUnimplemented(ctx context.Context, bin string) (map[string]bool, error) {
	arch := goruntime.GOARCH
	out, err := runscOutput(ctx, bin, "help", "syscalls", "-format", "json", "-os", "linux", "-arch", arch)
	if err != nil {
		return nil, err
	}
	var table map[string]map[string]struct {
		Syscalls map[string]struct {
			Name    string `json:"name"`
			Support string `json:"support"`
			Note    string `json:"note"`
		} `json:"syscalls"`
	}
	if err := json.Unmarshal(out, &table); err != nil {
		return nil, fmt.Errorf("decoding the syscall table: %w", err)
	}
	unimpl := map[string]bool{}
	for _, sc := range table["linux"][arch].Syscalls {
		if sc.Support == "Unimplemented" && strings.Contains(sc.Note, "invalid system call number") {
			unimpl[sc.Name] = true
		}
	}
	return unimpl, nil
}

// gvisorSeccomp returns the bundle's seccomp section as this runsc can
// apply it with --oci-seccomp. It changes one thing: runsc before 2023
// ignores a rule's errnoRet and answers EPERM, so a rule that asks for
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

func init() { runscSweep = sweepRunsc }

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
