package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"runtime/debug"

	"github.com/inhuman/mcp-exec/server"
)

// serveCmd runs the MCP server until its client goes (stdio) or ctx is
// done (SIGTERM, SIGINT): in-flight calls are cancelled, which kills their
// containers, the sandbox is torn down, and the exit status is 0.
func serveCmd(ctx context.Context, args []string, stdin io.Reader, stdout, rawStderr io.Writer) int {
	// What the server says names settings as the operator sets them; the
	// audit log, a record of calls, is written as it is.
	stderr := fieldWriter{rawStderr}
	fs := flag.NewFlagSet("mcp-exec serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	verbose := fs.Bool("v", false, "debug logging")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcp-exec [serve] [flags]")
		fs.PrintDefaults()
	}
	cfg, err := loadConfig(fs, args, os.LookupEnv, true)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "mcp-exec serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}

	// Logs go to stderr only: in stdio mode stdout is the protocol.
	level, sdkLevel := slog.LevelInfo, slog.LevelWarn
	if *verbose {
		level, sdkLevel = slog.LevelDebug, slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	sdkLog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: sdkLevel})).With("component", "mcp")
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}

	audit, err := server.OpenAudit(cfg.AuditLog, rawStderr, log)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 2
	}
	defer audit.Close()

	// Bind before the sandbox comes up, so that a busy address fails at
	// once; connections wait in the backlog until the sandbox is ready.
	var ln net.Listener
	if cfg.Transport != server.Stdio {
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			fmt.Fprintln(stderr, "mcp-exec serve: {Addr}:", err)
			return 1
		}
		defer ln.Close()
	}

	eng, err := newEngine(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			return 0 // stopped while starting
		}
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 1
	}
	defer func() {
		if err := eng.close(); err != nil {
			log.Error("tearing down the sandbox", "err", err)
		}
	}()
	eng.startPool(cfg)
	// What the sandboxes may hold at most: the calls running at once and
	// the persistent sessions, each up to the memory limit, beside the
	// sandboxes the pool keeps ready; and the CPU they may use at once:
	// the calls', and, when they run between their calls, the sessions'.
	log.Info("sandbox ready", "runtime", eng.Info().Runtime, "python", eng.pythonVersion, "max_concurrency", cfg.MaxConcurrency,
		"pool", poolDesc(cfg.PoolSize), "persistent_max", cfg.PersistentMax, "persistent_background", cfg.PersistentBackground,
		"sandbox_memory_max_mib", int64(cfg.MaxConcurrency+cfg.PersistentMax)*cfg.Limits.MemoryBytes/mib,
		"sandbox_cpus_max", sandboxCPUs(cfg))
	if cfg.PersistentBackground && cfg.PersistentMax > 0 {
		log.Warn("persistent sessions run between their calls (MCP_EXEC_PERSISTENT_BACKGROUND=true): each may use its CPU quota at any time, beside MCP_EXEC_MAX_CONCURRENCY",
			"persistent_max", cfg.PersistentMax, "cpus_each", cfg.Limits.CPUs, "sessions_cpus_max", float64(cfg.PersistentMax)*cfg.Limits.CPUs)
	}

	if _, set := os.LookupEnv("GOMEMLIMIT"); !set {
		debug.SetMemoryLimit(server.MemoryTarget)
	}
	opts := cfg.serverOptions()
	opts.Audit, opts.Logger, opts.SDKLogger = audit, log, sdkLog
	srv, err := server.New(eng, opts)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 2
	}
	if cfg.Transport == server.Stdio {
		err = srv.ServeStdio(ctx, stdin, stdout)
	} else {
		err = srv.ServeHTTP(ctx, ln)
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

func poolDesc(n int) string {
	if n < 0 {
		return "adaptive"
	}
	return fmt.Sprint(n)
}

// sandboxCPUs is the CPU the sandboxes may use at once, in cores: each
// running call's quota and, when persistent sessions run between their
// calls (MCP_EXEC_PERSISTENT_BACKGROUND), each session's; a frozen session
// uses none outside its calls, which are among the running ones.
func sandboxCPUs(cfg config) float64 {
	n := cfg.MaxConcurrency
	if cfg.PersistentBackground {
		n += cfg.PersistentMax
	}
	return float64(n) * cfg.Limits.CPUs
}
