package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/inhuman/mcp-exec/runtime"
)

// exitSandboxFailed is the status when the sandbox itself could not run,
// as with docker run and runc.
const exitSandboxFailed = 125

// runCmd runs one piece of Python in the sandbox and mirrors its output and
// exit status.
func runCmd(ctx context.Context, args []string, stdout, progStderr io.Writer) int {
	// What mcp-exec says names settings as the operator sets them; the
	// program's own stderr is mirrored untouched.
	stderr := fieldWriter{progStderr}
	fs := flag.NewFlagSet("mcp-exec run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	code := fs.String("c", "", "Python code to run (instead of FILE)")
	stdinFile := fs.String("stdin", "", "file fed to the program's standard input")
	var timeout time.Duration
	fs.Var(seconds(&timeout), "timeout", "wall-clock limit in seconds (default MCP_EXEC_DEFAULT_TIMEOUT_S)")
	verbose := fs.Bool("v", false, "log to stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcp-exec run [-c CODE | FILE] [--stdin FILE] [--timeout S]")
		fs.PrintDefaults()
	}
	cfg, err := loadConfig(fs, args, os.LookupEnv, false)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "mcp-exec run:", err)
		return 2
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "mcp-exec run: "+format+"\n", a...)
		return exitSandboxFailed
	}

	var src []byte
	switch {
	case *code != "" && fs.NArg() > 0:
		fmt.Fprintln(stderr, "mcp-exec run: give either -c CODE or FILE, not both")
		return 2
	case *code != "":
		src = []byte(*code)
	case fs.NArg() == 1:
		if src, err = os.ReadFile(fs.Arg(0)); err != nil {
			return fail("reading code file: %v", err)
		}
	default:
		fs.Usage()
		return 2
	}
	var in []byte
	if *stdinFile != "" {
		if in, err = os.ReadFile(*stdinFile); err != nil {
			return fail("reading --stdin file: %v", err)
		}
		if int64(len(in)) > cfg.MaxStdinBytes {
			return fail("--stdin file is %d bytes, over the limit of %d (MCP_EXEC_MAX_STDIN_BYTES)", len(in), cfg.MaxStdinBytes)
		}
	}
	if timeout == 0 {
		timeout = cfg.DefaultTimeout
	}
	if timeout > cfg.MaxTimeout {
		fmt.Fprintf(stderr, "mcp-exec run: --timeout must be > 0 and ≤ %v (MCP_EXEC_MAX_TIMEOUT_S), got %v\n", cfg.MaxTimeout.Seconds(), timeout.Seconds())
		return 2
	}

	log := slog.New(slog.DiscardHandler)
	if *verbose {
		log = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if int64(len(src)) > cfg.MaxCodeBytes {
		return fail("the code is %d bytes, over the limit of %d (MCP_EXEC_MAX_CODE_BYTES)", len(src), cfg.MaxCodeBytes)
	}
	if i := bytes.IndexByte(src, 0); i >= 0 {
		return fail("the code contains a NUL byte at offset %d; Python would silently stop reading there", i)
	}
	eng, err := newEngine(ctx, cfg, log)
	if err != nil {
		return fail("%v", err)
	}
	defer eng.close()
	res, err := eng.Run(ctx, runtime.Request{Code: src, Stdin: in, Timeout: timeout, MaxOutputBytes: cfg.MaxOutputBytes})
	stdout.Write(res.Stdout)
	progStderr.Write(res.Stderr)
	if err != nil {
		return fail("%v", err)
	}
	switch {
	case res.TimedOut:
		fmt.Fprintf(stderr, "mcp-exec run: timed out after %v; the container was killed\n", timeout)
	case res.OOMKilled:
		fmt.Fprintf(stderr, "mcp-exec run: killed by the memory limit (%d MiB)\n", cfg.Limits.MemoryBytes/mib)
	}
	if res.PidsLimitHit {
		fmt.Fprintf(stderr, "mcp-exec run: hit the process limit (%d, MCP_EXEC_PIDS)\n", cfg.Limits.Pids)
	}
	if res.StdoutTruncated || res.StderrTruncated {
		fmt.Fprintf(stderr, "mcp-exec run: output truncated at %d bytes per stream\n", cfg.MaxOutputBytes)
	}
	return res.ExitCode
}
