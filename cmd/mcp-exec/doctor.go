package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// report is doctor's finding, also its --json output.
type report struct {
	Host     host.Host      `json:"host"`
	Runtime  runtimeReport  `json:"runtime"`
	Rootfs   rootfsReport   `json:"rootfs"`
	Runtimes []runtimeCheck `json:"runtimes"`
	Egress   *egressReport  `json:"egress"`
	OK       bool           `json:"ok"`
	// Blame names what keeps the server from starting: "runtime" (no
	// full sandbox here), "rootfs" (the runtime would do, but the rootfs
	// or its packages cannot be had), or "" when it starts.
	Blame string `json:"blame,omitempty"`
}

// runtimeReport is the runtime the server would use (MCP_EXEC_RUNTIME)
// and what it would do with it.
type runtimeReport struct {
	Selected runtime.Kind `json:"selected"`
	// Resolved is the runtime the server would run calls with: Selected,
	// or what auto chooses.
	Resolved runtime.Kind `json:"resolved,omitempty"`
	// Mode is "full sandbox" when the runtime gives the whole contract
	// here, "process" when each call would be a fresh process with no
	// container of its own (the process runtime, by name or chosen by
	// auto), else "refuse": the server would not start.
	Mode string `json:"mode"`
	// Alternative names the other runtime when it would give the full
	// sandbox and the selected one would not.
	Alternative runtime.Kind `json:"alternative,omitempty"`
	// Advice lists what may still make sandboxes fail on this host.
	Advice []string `json:"advice,omitempty"`
	// Process is what each call gets under the process runtime, when it is
	// the one used, and what this host lacks of it.
	Process *runtime.ProcessIsolation `json:"process,omitempty"`
	// Sandboxes says how each call's sandbox is made: forked from a
	// template (libcontainer with MCP_EXEC_FORK), or a fresh container
	// (or process) from the start; Fork is what the proving run's forks
	// did.
	Sandboxes string              `json:"sandboxes,omitempty"`
	Fork      *runtime.ForkStatus `json:"fork,omitempty"`
}

const (
	modeFull    = "full sandbox"
	modeProcess = "process"
	modeRefuse  = "refuse"
)

// runtimeCheck is one runtime's verdict on this host.
type runtimeCheck struct {
	Kind      runtime.Kind `json:"kind"`
	Available bool         `json:"available"`
	Detail    string       `json:"detail,omitempty"`
	// Platform is gVisor's platform (runsc only).
	Platform string `json:"platform,omitempty"`
	// Limits are the limits (memory, pids, cpu) it can enforce here.
	Limits []string `json:"limits"`
	// Missing lists what keeps it from the full sandbox, each with the fix.
	Missing []host.Missing `json:"missing,omitempty"`
	// InContainer, when a missing item is a privilege, is how a server in
	// a container gets it from its engine.
	InContainer *host.ContainerFix `json:"in_container,omitempty"`
	// Runsc is the whole runsc probe (runsc only).
	Runsc *host.RunscInfo `json:"runsc,omitempty"`
}

type rootfsReport struct {
	// Source says which rootfs the configuration asks for: one built from
	// the host's python3 into the cache, an operator's dir, an image, or
	// none (the process runtime runs the host's interpreter).
	Source        string `json:"source,omitempty"`
	Dir           string `json:"dir,omitempty"`
	CacheDir      string `json:"cache_dir,omitempty"`
	Python        string `json:"python,omitempty"`
	PythonVersion string `json:"python_version,omitempty"`
	// Packages are the Debian packages asked for (MCP_EXEC_PACKAGES),
	// Modules what they make importable; Shell and Preload as set.
	Packages []string `json:"packages,omitempty"`
	Modules  []string `json:"modules,omitempty"`
	Shell    bool     `json:"shell,omitempty"`
	Preload  []string `json:"preload,omitempty"`
	// Proved: Python ran in a sandbox of the selected runtime on it.
	Proved bool   `json:"proved"`
	Error  string `json:"error,omitempty"`
}

// doctorCmd reports what isolation this host supports and exits non-zero
// when the selected runtime cannot give the full sandbox.
func doctorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// The host checks name settings as fields; the report names them as
	// the operator sets them.
	stdout, stderr = fieldWriter{stdout}, fieldWriter{stderr}
	fs := flag.NewFlagSet("mcp-exec doctor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	cfg, err := loadConfig(fs, args, os.LookupEnv, false)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "mcp-exec doctor:", err)
		return 2
	}
	r := report{Host: host.Probe(), Runtime: runtimeReport{Selected: cfg.Runtime}}
	lc := runtimeCheck{Kind: runtime.Libcontainer, Missing: r.Host.ForLibcontainer(), Limits: r.Host.EnforceableLimits()}
	lc.Available = len(lc.Missing) == 0
	if r.Host.SeccompLibrary != "" {
		lc.Detail = "in-process, libseccomp " + r.Host.SeccompLibrary
	}
	rs := host.ProbeRunsc(ctx, r.Host, cfg.RunscPath, cfg.RunscPlatform)
	r.Runtimes = []runtimeCheck{lc, {Kind: runtime.Runsc, Available: rs.Available(), Detail: rs.Detail(),
		Platform: rs.Platform, Limits: rs.Limits, Missing: rs.Missing, Runsc: &rs}}
	for i, c := range r.Runtimes {
		if slices.ContainsFunc(c.Missing, func(m host.Missing) bool { return m.Privilege }) {
			fix := host.FixInContainer(c.Kind)
			r.Runtimes[i].InContainer = &fix
		}
	}

	lcAvail, rsAvail := r.Runtimes[0].Available, r.Runtimes[1].Available
	// The exit status says whether any runtime gives the full sandbox.
	r.OK = lcAvail || rsAvail
	r.Runtime.Resolved = cfg.Runtime
	switch cfg.Runtime {
	case runtime.Auto:
		r.Runtime.Resolved = runtime.Process
		if lcAvail {
			r.Runtime.Resolved = runtime.Libcontainer
		} else if rsAvail {
			r.Runtime.Resolved = runtime.Runsc
		}
	case runtime.Libcontainer:
		r.OK = lcAvail
		if !lcAvail && rsAvail {
			r.Runtime.Alternative = runtime.Runsc
		}
	case runtime.Runsc:
		r.OK = rsAvail
		if !rsAvail && lcAvail {
			r.Runtime.Alternative = runtime.Libcontainer
		}
	}
	starts := true
	switch r.Runtime.Resolved {
	case runtime.Process:
		r.Runtime.Mode = modeProcess
	case runtime.Libcontainer:
		r.Runtime.Mode, starts = modeFull, lcAvail
	case runtime.Runsc:
		r.Runtime.Mode, starts = modeFull, rsAvail
	}
	r.Egress = egressReportFor(cfg)
	if !starts {
		r.Runtime.Mode = modeRefuse
	}
	r.Runtime.Advice = r.Host.Advice()
	r.Rootfs = describeRootfs(ctx, cfg)
	if !starts {
		r.Blame = "runtime"
	} else if r.Rootfs.Error != "" {
		// The rootfs cannot be had whatever the runtime: say so, rather
		// than start a sandbox to fail the same way.
		starts, r.OK, r.Runtime.Mode, r.Blame = false, false, modeRefuse, "rootfs"
	}
	if starts {
		// Prove it: build or find the rootfs and run Python in the sandbox.
		sb, err := newEngine(ctx, cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			r.OK = false
			r.Runtime.Mode = modeRefuse
			r.Rootfs.Error = err.Error()
			r.Blame = "rootfs"
			if errors.Is(err, runtime.ErrUnsupported) {
				r.Blame = "runtime"
			}
			if errors.Is(err, runtime.ErrNetworkUnsupported) {
				r.Egress.Error, r.Rootfs.Error = err.Error(), ""
			}
		} else {
			r.Runtime.Resolved = sb.rt.Kind()
			if p, ok := sb.rt.(*runtime.ProcessRuntime); ok {
				iso := p.Isolation()
				r.Runtime.Process = &iso
			}
			if lc, ok := sb.rt.(runtime.Forker); ok && cfg.Fork {
				if lc.Forking().Forks == 0 {
					// A cached rootfs is not proven again: prove the fork.
					runtime.Run(ctx, sb.rt, sb.bundleCfg, runtime.Request{Code: []byte("pass"), Timeout: time.Minute, MaxOutputBytes: 1 << 10})
				}
				st := lc.Forking()
				r.Runtime.Fork = &st
			}
			r.Runtime.Sandboxes = sandboxesMade(sb.rt, cfg)
			r.Rootfs.Dir = sb.bundleCfg.Rootfs
			r.Rootfs.Python = sb.bundleCfg.Python
			r.Rootfs.PythonVersion = sb.pythonVersion
			r.Rootfs.Modules = sb.contents.Modules
			r.Rootfs.Proved = true
			if sb.rt.Kind() == runtime.Process {
				r.Rootfs.Source = "none: the process runtime runs the host's interpreter"
				r.Rootfs.Dir, r.Rootfs.CacheDir = "", ""
			}
			sb.close()
		}
	}

	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(r)
	} else {
		printReport(stdout, r)
	}
	if !r.OK {
		return 1
	}
	return 0
}

func printReport(w io.Writer, r report) {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	h := r.Host
	fmt.Fprintf(w, "host\n")
	fmt.Fprintf(w, "  euid:               %d\n", h.EUID)
	fmt.Fprintf(w, "  namespaces:         %s\n", strings.Join(h.Namespaces, " "))
	fmt.Fprintf(w, "  user namespaces:    %s\n", yes(h.UserNamespaces))
	fmt.Fprintf(w, "  cgroups:            %s (%s)\n", h.CgroupVersion, strings.Join(h.CgroupControllers, " "))
	fmt.Fprintf(w, "  seccomp (kernel):   %s\n", yes(h.SeccompKernel))
	lib := h.SeccompLibrary
	if lib == "" {
		lib = "NO (built without -tags seccomp)"
	}
	fmt.Fprintf(w, "  seccomp (library):  %s\n", lib)
	fmt.Fprintf(w, "  user namespace:     %s\n", userNS(h))
	fmt.Fprintf(w, "  capabilities:       %d effective (--json lists them)\n", len(h.Capabilities))
	fmt.Fprintf(w, "  writable cgroups:   %s\n", orNone(h.CgroupWritable))
	fmt.Fprintf(w, "runtimes\n")
	for _, c := range r.Runtimes {
		mark := "available"
		if !c.Available {
			mark = "UNAVAILABLE"
		}
		sel := ""
		if c.Kind == r.Runtime.Selected {
			sel = " (selected)"
		}
		fmt.Fprintf(w, "  %s: %s%s", c.Kind, mark, sel)
		if c.Detail != "" {
			fmt.Fprintf(w, " — %s", c.Detail)
		}
		fmt.Fprintln(w)
		fmt.Fprintf(w, "    limits enforceable: %s\n", orNone(c.Limits))
		for _, m := range c.Missing {
			fmt.Fprintf(w, "    missing: %s\n", m)
		}
		if f := c.InContainer; f != nil {
			fmt.Fprintf(w, "    if mcp-exec runs in a container, its engine grants the privileges above with:\n")
			fmt.Fprintf(w, "      docker:     %s\n", f.Docker)
			fmt.Fprintf(w, "      Kubernetes: %s\n", f.Kubernetes)
		}
	}
	for _, a := range r.Runtime.Advice {
		fmt.Fprintf(w, "advice: %s\n", a)
	}
	printRootfs(w, r.Rootfs)
	if r.Runtime.Sandboxes != "" {
		fmt.Fprintf(w, "sandboxes: %s\n", r.Runtime.Sandboxes)
	}
	printEgress(w, r.Egress)
	sel := string(r.Runtime.Selected)
	if r.Runtime.Resolved != "" && r.Runtime.Resolved != r.Runtime.Selected {
		sel += " → " + string(r.Runtime.Resolved)
	}
	switch {
	case r.Egress != nil && r.Egress.Error != "":
		fmt.Fprintf(w, "verdict: NOT OK — the server would refuse to start: %s\n", r.Egress.Error)
	case r.Runtime.Mode == modeProcess:
		each := "each call is a fresh process with no container of its own"
		if p := r.Runtime.Process; p != nil {
			fmt.Fprintf(w, "process isolation: %s\n", p.Summary())
			for _, m := range p.Missing {
				fmt.Fprintf(w, "  missing: %s\n", m)
			}
			if p.Namespaces {
				each = "each call is a fresh process in namespaces of its own, with no container (no cgroup or root filesystem) of its own"
			}
		}
		fmt.Fprintf(w, "verdict: mode %q (%s): the server starts, and %s; "+
			"the container mcp-exec runs in is the boundary for what the process runtime does not confine", r.Runtime.Mode, sel, each)
		if !r.OK {
			fmt.Fprintf(w, ". No runtime gives the full sandbox here: fix what is listed above for one")
		}
		fmt.Fprintln(w)
	case r.OK:
		fmt.Fprintf(w, "verdict: OK — mode %q: %s gives the full sandbox on this host\n", r.Runtime.Mode, sel)
	case r.Blame == "rootfs":
		fmt.Fprintf(w, "verdict: NOT OK — mode %q: %s gives the full sandbox on this host, but the server would refuse to start: "+
			"its rootfs cannot be had (the rootfs error above says why and how to fix it)\n", r.Runtime.Mode, sel)
	default:
		fmt.Fprintf(w, "verdict: NOT OK — mode %q: the server would refuse to start, as %s cannot give the full sandbox here; fix what is listed above", r.Runtime.Mode, sel)
		switch {
		case r.Runtime.Alternative != "":
			fmt.Fprintf(w, ", or use MCP_EXEC_RUNTIME=%s, which can", r.Runtime.Alternative)
		case r.Host.EUID != 0 && r.Runtime.Selected != runtime.Auto:
			fmt.Fprintf(w, "; or, on a desktop, set MCP_EXEC_RUNTIME=auto: each call is then a fresh process confined by Landlock and seccomp, less than a container")
		}
		fmt.Fprintln(w)
	}
}

// sandboxesMade says how rt makes each call's sandbox, from what its
// proving run did.
func sandboxesMade(rt runtime.Runtime, cfg config) string {
	lc, ok := rt.(runtime.Forker)
	fresh := "a fresh container"
	if rt.Kind() == runtime.Runsc {
		fresh = "a gVisor sandbox of its own"
	}
	switch {
	case rt.Kind() == runtime.Process:
		if p, ok := rt.(*runtime.ProcessRuntime); ok && p.Isolation().Namespaces {
			return "a fresh confined process per call, in user, pid, mount, network, IPC and UTS namespaces of its own"
		}
		return "a fresh confined process per call, without namespaces of its own (MCP_EXEC_PROCESS_NAMESPACES=false, or this host refuses them: see the missing list)"
	case !ok:
		return fresh + " per call"
	case !cfg.Fork:
		return fresh + " per call (MCP_EXEC_FORK=false)"
	}
	st := lc.Forking()
	switch {
	case st.Disabled != "":
		return fresh + " per call: forking from a template failed here (" + st.Disabled + ")"
	case st.Forks == 0 && st.LastError != "":
		return fresh + " per call: the proving fork failed (" + st.LastError + "); the server tries forking again, and makes " + fresh + " for each call a fork fails"
	}
	where := ""
	if rt.Kind() == runtime.Runsc {
		where = ", inside a gVisor sandbox per call slot that its calls share, each in namespaces of its own"
	}
	return fmt.Sprintf("forked from a template per call%s (MCP_EXEC_FORK=true; templates replaced after MCP_EXEC_FORK_MAX_CALLS=%d calls or MCP_EXEC_FORK_MAX_AGE_S=%g s)",
		where, cfg.ForkMaxCalls, cfg.ForkMaxAge.Seconds())
}

func userNS(h host.Host) string {
	if h.InitialUserNS {
		return "the host's (initial)"
	}
	return fmt.Sprintf("a child namespace (uid_map %s)", h.UIDMap)
}

func orNone(list []string) string {
	if len(list) == 0 {
		return "none"
	}
	return strings.Join(list, " ")
}

// describeRootfs says which rootfs cfg asks for and what it holds, without
// a sandbox: what doctor can say as any user, before proving it.
func describeRootfs(ctx context.Context, cfg config) rootfsReport {
	r := rootfsReport{Shell: cfg.Shell, Preload: cfg.Preload}
	if n, err := cfg.rootfsOptions().Normalize(); err == nil {
		r.Packages = n.Packages
	}
	switch {
	case cfg.RootfsImage != "":
		r.Source, r.CacheDir = "the image {RootfsImage}="+cfg.RootfsImage+", flattened into the cache", cacheDir(cfg)
		return r
	case cfg.Rootfs != "":
		r.Source, r.Dir = "the operator's {Rootfs}", cfg.Rootfs
		if err := rootfs.Check(cfg.Rootfs); err != nil {
			r.Error = err.Error()
		}
	default:
		r.Source, r.CacheDir = "built from the host's python3 into the cache", cacheDir(cfg)
	}
	py, err := rootfs.FindPython(ctx, cfg.Python)
	if err != nil {
		r.Error = fmt.Sprintf("finding python ({Python}): %v", err)
		return r
	}
	r.Python, r.PythonVersion = py.Path, py.Version
	contents, err := rootfs.Describe(py, cfg.rootfsOptions())
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.Modules = contents.Modules
	if cfg.Rootfs == "" {
		if key, err := cfg.rootfsOptions().Key(py); err == nil {
			if target, err := os.Readlink(filepath.Join(r.CacheDir, key)); err == nil {
				r.Dir = filepath.Join(r.CacheDir, target)
			}
		}
	}
	return r
}

func printRootfs(w io.Writer, r rootfsReport) {
	fmt.Fprintf(w, "rootfs\n")
	if r.Source != "" {
		fmt.Fprintf(w, "  source:    %s\n", r.Source)
	}
	switch {
	case r.Dir != "":
		fmt.Fprintf(w, "  dir:       %s\n", r.Dir)
	case r.CacheDir != "":
		fmt.Fprintf(w, "  dir:       not built yet: the server builds it into %s at its first start\n", r.CacheDir)
	}
	if r.PythonVersion != "" {
		fmt.Fprintf(w, "  python:    %s (%s)\n", r.PythonVersion, r.Python)
	}
	pkgs := "none (the standard library only)"
	if len(r.Packages) > 0 {
		pkgs = strings.Join(r.Packages, " ")
	}
	fmt.Fprintf(w, "  packages:  %s\n", pkgs)
	if len(r.Modules) > 0 {
		fmt.Fprintf(w, "  imports:   %s\n", strings.Join(r.Modules, " "))
	}
	if r.Shell {
		fmt.Fprintf(w, "  shell:     /bin/sh and busybox's tools\n")
	}
	if len(r.Preload) > 0 {
		fmt.Fprintf(w, "  preload:   %s\n", strings.Join(r.Preload, " "))
	}
	switch {
	case r.Error != "":
		fmt.Fprintf(w, "  error:     %s\n", r.Error)
	case r.Proved:
		fmt.Fprintf(w, "  proved:    Python ran in a sandbox on it\n")
	default:
		fmt.Fprintf(w, "  proved:    no (no sandbox can start here to prove it)\n")
	}
}
