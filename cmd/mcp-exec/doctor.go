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
	"strings"

	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// report is doctor's finding, also its --json output.
type report struct {
	Host     runtime.Host   `json:"host"`
	Runtime  runtimeReport  `json:"runtime"`
	Rootfs   rootfsReport   `json:"rootfs"`
	Runtimes []runtimeCheck `json:"runtimes"`
	OK       bool           `json:"ok"`
}

type runtimeReport struct {
	Selected runtime.Kind `json:"selected"`
}

type runtimeCheck struct {
	Kind      runtime.Kind `json:"kind"`
	Available bool         `json:"available"`
	Detail    string       `json:"detail,omitempty"`
	Missing   []string     `json:"missing,omitempty"`
}

type rootfsReport struct {
	Dir           string `json:"dir,omitempty"`
	Python        string `json:"python,omitempty"`
	PythonVersion string `json:"python_version,omitempty"`
	Error         string `json:"error,omitempty"`
}

// doctorCmd reports what isolation this host supports and exits non-zero
// when the selected runtime cannot give the full sandbox.
func doctorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
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
	r := report{Host: runtime.ProbeHost(), Runtime: runtimeReport{Selected: cfg.Runtime}}
	lc := runtimeCheck{Kind: runtime.Libcontainer, Missing: r.Host.MissingForLibcontainer()}
	lc.Available = len(lc.Missing) == 0
	rs := runtime.ProbeRunsc(ctx, cfg.RunscPath, cfg.RunscPlatform)
	r.Runtimes = []runtimeCheck{lc, {Kind: runtime.Runsc, Available: rs.Available(), Detail: rs.Detail(), Missing: rs.Missing}}

	selected := lc
	if cfg.Runtime == runtime.Runsc {
		selected = r.Runtimes[1]
	}
	r.OK = selected.Available
	if r.OK {
		// Prove it: build or find the rootfs and run Python in the sandbox.
		sb, err := newSandbox(ctx, cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			r.OK = false
			r.Rootfs.Error = err.Error()
		} else {
			r.Rootfs.Dir = sb.bundleCfg.Rootfs
			r.Rootfs.Python = sb.bundleCfg.Python
			r.Rootfs.PythonVersion = sb.pythonVersion
			sb.close()
		}
	} else if cfg.Rootfs != "" {
		r.Rootfs.Dir = cfg.Rootfs
		if err := rootfs.Check(cfg.Rootfs); err != nil {
			r.Rootfs.Error = err.Error()
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
		for _, m := range c.Missing {
			fmt.Fprintf(w, "    missing: %s\n", m)
		}
	}
	fmt.Fprintf(w, "rootfs\n")
	if r.Rootfs.Dir != "" {
		fmt.Fprintf(w, "  dir:     %s\n", r.Rootfs.Dir)
	}
	if r.Rootfs.PythonVersion != "" {
		fmt.Fprintf(w, "  python:  %s (%s)\n", r.Rootfs.PythonVersion, r.Rootfs.Python)
	}
	if r.Rootfs.Error != "" {
		fmt.Fprintf(w, "  error:   %s\n", r.Rootfs.Error)
	}
	if r.OK {
		fmt.Fprintf(w, "verdict: OK — %s gives the full sandbox on this host\n", r.Runtime.Selected)
	} else {
		fmt.Fprintf(w, "verdict: NOT OK — %s cannot give the full sandbox here; fix what is listed above\n", r.Runtime.Selected)
	}
}
