package server

import (
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func (s *Server) tool() *mcp.Tool {
	f := false
	// The network allowlist opens the code to the hosts it names.
	world := s.info.Network != ""
	return &mcp.Tool{
		Name:        "exec",
		Title:       "Run Python in a sandbox",
		Icons:       icons(),
		Description: s.description(),
		// Written out rather than inferred: the SDK would make the optional
		// timeout_s ["null","number"], and the ranges are checked by the
		// handler so that its errors name the limit and its variable.
		// code is not required by the schema: end_session needs none, and
		// the handler's refusal of a call without it says so.
		InputSchema: map[string]any{
			"type":                 "object",
			"additionalProperties": false,
			"properties": map[string]any{
				"code": map[string]any{
					"type":        "string",
					"description": fmt.Sprintf("Python source, run as a script (__main__); at most %d bytes. Print what you want to see. Required, unless end_session ends a session.", s.opts.MaxCodeBytes),
				},
				"stdin": map[string]any{
					"type":        "string",
					"description": fmt.Sprintf("fed to the program's standard input, then EOF; at most %d bytes", s.opts.MaxStdinBytes),
				},
				"timeout_s": map[string]any{
					"type": "number",
					"description": fmt.Sprintf("wall-clock limit in seconds, > 0 and ≤ %s; default %s",
						fmtSeconds(s.opts.MaxTimeout), fmtSeconds(s.opts.DefaultTimeout)),
				},
				"cpu_limit_s": map[string]any{
					"type": "number",
					"description": fmt.Sprintf("CPU time limit in seconds, all the code's processes together, > 0 and ≤ %s; reaching it ends the run with cpu_limited (beside the wall clock of timeout_s); default none",
						fmtSeconds(s.opts.maxCPU())),
				},
				"binary_output": map[string]any{
					"type":        "boolean",
					"description": "also return stdout and stderr as their bytes, base64-encoded (stdout_base64, stderr_base64)",
				},
				"files": filesSchema(s.opts),
				"session": map[string]any{
					"type":        "string",
					"description": `persistent session: "new" starts one and runs the code in it; the session handle of an earlier result runs the code there, with the variables, imports, working directory and /tmp the last call left. Omit for a fresh sandbox.`,
				},
				"end_session": map[string]any{
					"type":        "boolean",
					"description": "end the persistent session after this call (code may then be empty)",
				},
			},
		},
		Annotations: &mcp.ToolAnnotations{
			ReadOnlyHint:    false,
			DestructiveHint: &f, // each call gets a fresh container; nothing outside it changes
			IdempotentHint:  false,
			OpenWorldHint:   &world, // no network, unless the allowlist names hosts
		},
	}
}

// description tells the model what it is dealing with, from the live
// configuration.
func (s *Server) description() string {
	o, info := s.opts, s.info
	var b strings.Builder
	if o.PersistentMax > 0 {
		fmt.Fprintf(&b, "Run Python %s code in a fresh, locked-down sandbox: every call gets a new one, torn down afterwards, so nothing persists between calls unless they share a persistent session (below). ", info.PythonVersion)
	} else {
		fmt.Fprintf(&b, "Run Python %s code in a fresh, locked-down sandbox: every call gets a new one, torn down afterwards, so nothing persists between calls. ", info.PythonVersion)
	}
	b.WriteString("The code runs as a script (__main__) and its stdout, stderr and exit code are returned; print what you want to see. ")
	// The process runtime's call has no /tmp of its own: its working
	// directory is, and the model must write there by relative paths.
	process := info.Runtime == string(runtime.Process)
	dir, outputs := policy.WorkDir, policy.OutputsDir
	network := "There is no network access."
	if info.Network != "" {
		network = info.Network
	}
	if process {
		dir, outputs = "the working directory", "outputs/ in the working directory"
		fmt.Fprintf(&b, "%s The code may write only in its working directory, its own /tmp (also $TMPDIR and $HOME, %d MiB in all): use relative paths; the machine's /tmp and everything else are read-only. ", network, o.Limits.TmpfsBytes/mib)
	} else {
		fmt.Fprintf(&b, "%s The filesystem is read-only except /tmp (the working directory, a %d MiB tmpfs). ", network, o.Limits.TmpfsBytes/mib)
	}
	switch {
	case len(info.Modules) == 0 && info.MoreModules == 0:
		b.WriteString("Only the Python standard library is available. ")
	case info.MoreModules > 0 && len(info.Modules) > 0:
		fmt.Fprintf(&b, "Importable beyond the standard library: %s, and %d more modules of the host's Python. ", strings.Join(info.Modules, ", "), info.MoreModules)
	case info.MoreModules > 0:
		fmt.Fprintf(&b, "Importable beyond the standard library: %d modules of the host's Python. ", info.MoreModules)
	default:
		fmt.Fprintf(&b, "Importable beyond the standard library: %s. ", strings.Join(info.Modules, ", "))
	}
	if info.Shell {
		b.WriteString("A POSIX shell (/bin/sh) and the common command-line tools exist, so os.system and subprocess with shell=True work. ")
	} else {
		b.WriteString("There is no shell: run programs with subprocess and an argument list. ")
	}
	fmt.Fprintf(&b, "To hand the code data, send files (written under %s before it starts); to get files back, have the code write them to %s: "+
		"each comes back as an image or a resource (at most %d files, %d bytes in all). ", dir, outputs, o.MaxFiles, o.MaxFileBytes)
	if d := info.Data; d != nil {
		more := ""
		if d.Partial {
			more = "at least "
		}
		files := "files"
		if d.Files == 1 && !d.Partial {
			files = "file"
		}
		fmt.Fprintf(&b, "Data is in %s, read-only: %s%d %s, %s in all; read it there rather than sending it in files. ", d.Path, more, d.Files, files, humanBytes(d.Bytes))
	}
	if slices.Contains(info.Modules, "matplotlib") {
		fmt.Fprintf(&b, "plt.show() saves each figure as a PNG in %s, so a plot comes back as an image. ", outputs)
	}
	fmt.Fprintf(&b, "Limits per call: %d MiB of memory, %d processes/threads, %s CPU; a wall-clock timeout of %s s by default, up to %s s with timeout_s; stdout and stderr are each cut at %d bytes; stdin up to %d bytes. ",
		o.Limits.MemoryBytes/mib, o.Limits.Pids, strconv.FormatFloat(o.Limits.CPUs, 'f', -1, 64),
		fmtSeconds(o.DefaultTimeout), fmtSeconds(o.MaxTimeout), o.MaxOutputBytes, o.MaxStdinBytes)
	b.WriteString("If the code ends with an expression, its repr comes back as result, as in a notebook. ")
	fmt.Fprintf(&b, "The text shows at most %d bytes of output (the head and tail of each part; structuredContent has all of it)", o.textBytes())
	if s.store != nil {
		b.WriteString("; files too large to inline come as resource links: read one with resources/read, or pass its uri in files to a later call")
	}
	b.WriteString(". ")
	b.WriteString("A non-zero exit, a timeout or hitting the memory limit is a normal result (exit_code, timed_out, oom_killed), not an error.")
	if o.PersistentMax > 0 {
		fmt.Fprintf(&b, " To keep state between calls (load data once, then explore it), start a persistent session with session \"new\" and pass the returned session handle in later calls: they run one at a time in the same interpreter, like notebook cells; end_session: true ends it. "+
			"A session has the same limits, its own sandbox, and ends after %s s without a call, %s s in all, on a timeout the code does not stop for (it gets KeyboardInterrupt first), on sys.exit() or at the memory limit; at most %d are open, %d per client.",
			fmtSeconds(o.PersistentIdle), fmtSeconds(o.PersistentLifetime), o.PersistentMax, o.perClient())
		if !o.PersistentBackground {
			b.WriteString(" Between calls a session is paused: threads and processes the code started run only while a call runs.")
		}
	}
	if info.Note != "" {
		b.WriteString(" " + info.Note)
	}
	return b.String()
}

// humanBytes is a size as a person reads it: 6.5 MB.
func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'f', 1, 64) + " GB"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + " MB"
	case n >= 1e3:
		return strconv.FormatFloat(float64(n)/1e3, 'f', 1, 64) + " kB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}

// ceilMS rounds up to whole milliseconds: a run of 0.4 ms took time, and
// says so, rather than reading as none at all.
func ceilMS(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

func icons() []mcp.Icon {
	return []mcp.Icon{{Source: "data:image/svg+xml;base64," + base64.StdEncoding.EncodeToString(iconSVG),
		MIMEType: "image/svg+xml", Sizes: []string{"any"}}}
}
