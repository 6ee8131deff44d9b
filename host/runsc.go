package host

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// ProbeTimeout bounds a probe of runsc (a few short commands).
const ProbeTimeout = 10 * time.Second

// RunscInfo is what doctor reports of runsc, and what the runsc runtime
// checks before it starts.
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
	// Missing lists what keeps runsc from giving the full sandbox here.
	// Empty means runsc is usable.
	Missing []Missing `json:"missing,omitempty"`
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

// RunscFlags are the global flags the runsc runtime passes on every call;
// a runsc that lacks one cannot be used.
func RunscFlags() []string {
	return []string{"root", "network", "platform", "oci-seccomp", "log-fd"}
}

// ProbeRunsc finds runsc, the platform it would use and what this host
// lacks for it. path is the configured binary (empty: runsc on PATH);
// platform the configured platform (empty: probed — systrap where this
// runsc has it, else ptrace; kvm only when asked for by name).
func ProbeRunsc(ctx context.Context, h Host, path, platform string) RunscInfo {
	var info RunscInfo
	info.Limits = h.EnforceableLimits()
	bin, err := findRunsc(path)
	if err != nil {
		info.Missing = append(info.Missing, Missing{What: "runsc", Why: err.Error(),
			Fix: "install it (make runsc, or apt-get install runsc) or set {RunscPath} to its path"})
		info.Missing = append(info.Missing, h.forRunsc()...)
		return info
	}
	info.Path = bin
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()

	// Three short runsc commands, at once: start-up pays for one.
	version := runscAsync(ctx, bin, "--version")
	flags := runscAsync(ctx, bin, "flags")
	platforms := runscAsync(ctx, bin, "help", "platforms")

	r := <-version
	if r.err != nil {
		info.Missing = append(info.Missing, Missing{What: "runsc", Why: fmt.Sprintf("%s does not run (%v)", bin, r.err),
			Fix: "reinstall it (apt-get install runsc) or set {RunscPath}"})
		return info
	}
	first, _, _ := strings.Cut(strings.TrimSpace(string(r.stdout)), "\n")
	info.Version = strings.TrimPrefix(strings.TrimSpace(first), "runsc version ")

	if r := <-flags; r.err == nil {
		// runsc prints its flags on stderr.
		have := string(r.stdout) + string(r.stderr)
		var lacking []string
		for _, f := range RunscFlags() {
			if !strings.Contains(have, "-"+f+" ") && !strings.Contains(have, "-"+f+"\n") {
				lacking = append(lacking, "--"+f)
			}
		}
		info.OCISeccomp = !slices.Contains(lacking, "--oci-seccomp")
		if len(lacking) > 0 {
			info.Missing = append(info.Missing, Missing{What: "runsc flags", Why: fmt.Sprintf("runsc %s lacks %s", info.Version, strings.Join(lacking, ", ")),
				Fix: "install a newer runsc"})
		}
	} else {
		info.Missing = append(info.Missing, Missing{What: "runsc flags", Why: fmt.Sprintf("listing the flags of runsc %s failed: %v", info.Version, r.err)})
	}

	if r := <-platforms; r.err == nil {
		info.Platforms = strings.Fields(string(r.stdout))
	}
	info.Platform, info.PlatformReason, err = choosePlatform(platform, info.Platforms)
	if err != nil {
		info.Missing = append(info.Missing, Missing{What: "runsc platform", Why: err.Error(), Fix: "set {RunscPlatform} to one it offers"})
	}
	if info.Platform == "ptrace" && h.PtraceScope >= 3 {
		info.Missing = append(info.Missing, Missing{What: "ptrace", Why: "kernel.yama.ptrace_scope is 3, which forbids the ptrace platform",
			Fix: "set it to 1 (sysctl kernel.yama.ptrace_scope=1) or choose another platform ({RunscPlatform})"})
	}
	if info.Platform == "kvm" {
		if _, err := os.Stat("/dev/kvm"); err != nil {
			info.Missing = append(info.Missing, Missing{What: "kvm", Why: "{RunscPlatform}=kvm but /dev/kvm is not there",
				Fix: "unset {RunscPlatform} to use ptrace"})
		}
	}
	info.Missing = append(info.Missing, h.forRunsc()...)
	return info
}

// forRunsc lists the host-side requirements of the runsc runtime.
func (h Host) forRunsc() []Missing {
	missing := h.missingPrivileges(Runsc)
	missing = append(missing, h.missingControllers()...)
	if !h.SeccompKernel {
		missing = append(missing, Missing{What: "seccomp", Why: "the kernel has no seccomp filtering, which gVisor needs",
			Fix: "enable CONFIG_SECCOMP_FILTER"})
	}
	return missing
}

// choosePlatform picks the gVisor platform: the configured one if this
// runsc has it, else systrap, else ptrace. kvm is never picked unprompted:
// it hangs on hosts with nested or missing virtualisation.
func choosePlatform(want string, have []string) (platform, reason string, err error) {
	if want != "" {
		if len(have) > 0 && !slices.Contains(have, want) {
			return "", "", fmt.Errorf("runsc platform %q: this runsc offers only %s ({RunscPlatform})", want, strings.Join(have, ", "))
		}
		return want, "set by {RunscPlatform}", nil
	}
	switch {
	case slices.Contains(have, "systrap"):
		return "systrap", "probed: the fastest platform without virtualisation", nil
	case slices.Contains(have, "ptrace"):
		return "ptrace", "probed: this runsc has no systrap", nil
	case len(have) == 0:
		return "ptrace", "runsc did not list its platforms; ptrace is its default", nil
	}
	return "", "", fmt.Errorf("this runsc offers only %s, and kvm is used only when asked for "+
		"({RunscPlatform}=kvm)", strings.Join(have, ", "))
}

// PinnedRunsc is where `make runsc` (.ci/install-runsc) installs the
// pinned current gVisor. The runtime takes it before runsc on PATH (often
// Debian's 2022 one, ptrace only), whatever PATH's order.
const PinnedRunsc = "/usr/local/bin/runsc"

// findRunsc resolves the configured runsc to an absolute path; unset, the
// pinned install if there is one, else runsc on PATH.
func findRunsc(path string) (string, error) {
	name := path
	if name == "" {
		name = "runsc"
		if st, err := os.Stat(PinnedRunsc); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			name = PinnedRunsc
		}
	}
	p, err := exec.LookPath(name)
	if err != nil {
		if path == "" {
			return "", errors.New("not found in " + PinnedRunsc + " nor on PATH")
		}
		return "", fmt.Errorf("{RunscPath}=%s is not an executable: %v", path, err)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("resolving %s: %v", p, err)
	}
	return abs, nil
}

type cmdResult struct {
	stdout, stderr []byte
	err            error
}

// runscAsync runs one short, read-only runsc command in the background,
// with nothing of this process's environment.
func runscAsync(ctx context.Context, bin string, args ...string) <-chan cmdResult {
	ch := make(chan cmdResult, 1)
	go func() {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = []string{}
		cmd.Dir = "/"
		cmd.WaitDelay = time.Second
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		if err != nil {
			if msg := strings.TrimSpace(stderr.String()); msg != "" {
				err = fmt.Errorf("%w: %s", err, msg)
			}
		}
		ch <- cmdResult{stdout.Bytes(), stderr.Bytes(), err}
	}()
	return ch
}
