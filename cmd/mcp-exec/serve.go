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
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inhuman/mcp-exec/rootfs"
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
	verbose := fs.Bool("v", false, "debug logging (MCP_EXEC_LOG_LEVEL=debug)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mcp-exec [serve] [flags]")
		fs.PrintDefaults()
	}
	cfg, err := loadConfig(fs, args, os.LookupEnv, true)
	// A stdio client shows its user the answer to initialize, not our
	// stderr: a server that cannot start says why there too.
	refuse := func(code int, err error) int {
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		if speaksStdio(cfg) {
			refuseStdio(stdin, stdout, expandFields(shortReason(err)))
		}
		return code
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return refuse(2, err)
	}
	if fs.NArg() > 0 {
		return refuse(2, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}

	// Logs go to stderr only: in stdio mode stdout is the protocol.
	level, sdkLevel := cfg.LogLevel, max(cfg.LogLevel, slog.LevelWarn)
	if *verbose {
		level, sdkLevel = slog.LevelDebug, slog.LevelDebug
	}
	log := newLogger(stderr, cfg.LogFormat, level)
	sdkLog := newLogger(stderr, cfg.LogFormat, sdkLevel).With("component", "mcp")
	for _, w := range cfg.Warnings {
		log.Warn(w)
	}

	tracer, stopTracing, err := startTracing(ctx, os.LookupEnv, log)
	if err != nil {
		return refuse(2, err)
	}
	defer func() {
		// Whatever the batch still holds goes out before the exit.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := stopTracing(ctx); err != nil {
			log.Warn("flushing traces", "err", err)
		}
	}()

	audit, err := server.OpenAudit(cfg.AuditLog, rawStderr, log)
	if err != nil {
		return refuse(2, err)
	}
	defer audit.Close()

	// Bind before the sandbox comes up, so that a busy address fails at
	// once; health and readiness answer from then on, MCP requests wait
	// until the sandbox is ready.
	reg := newRegistry()
	front, err := startFront(cfg, reg, log)
	if err != nil {
		return refuse(1, err)
	}
	defer front.Close(0)

	eng, err := newEngine(ctx, cfg, log)
	if err != nil {
		if ctx.Err() != nil {
			return 0 // stopped while starting
		}
		front.Close(0)
		return refuse(1, firstStartHint(cfg, err))
	}
	defer func() {
		if err := eng.close(); err != nil {
			log.Error("tearing down the sandbox", "err", err)
		}
	}()
	eng.startPool(cfg)
	ec := newEngineCollector(eng, cacheDir(cfg))
	reg.MustRegister(ec)
	go boundCache(ctx, cfg, log, ec.cache)
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
	if _, set := os.LookupEnv("GOGC"); !set {
		server.TuneGC()
	}
	opts := cfg.serverOptions()
	opts.Audit, opts.Logger, opts.SDKLogger = audit, log, sdkLog
	opts.Metrics, opts.Tracer, opts.Ready = reg, tracer, eng.ready
	srv, err := server.New(eng, opts)
	if err != nil {
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 2
	}
	if cfg.Transport == server.Stdio {
		front.SetReady(srv.Ready)
		err = srv.ServeStdio(ctx, stdin, stdout)
	} else {
		err = srv.ServeFront(ctx, front)
	}
	if err != nil && ctx.Err() == nil {
		fmt.Fprintln(stderr, "mcp-exec serve:", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// startFront binds the HTTP transport's address and the metrics address,
// whichever are configured, and serves health, readiness, version and
// metrics on them from now on.
func startFront(cfg config, reg *prometheus.Registry, log *slog.Logger) (*server.Front, error) {
	f := server.NewFront(server.FrontOptions{Transport: cfg.Transport, AuthToken: cfg.AuthToken, Version: version,
		Metrics: reg, MetricsApart: cfg.MetricsAddr != "", Logger: log})
	var ln, opsLn net.Listener
	var err error
	if cfg.Transport != server.Stdio {
		if ln, err = net.Listen("tcp", cfg.Addr); err != nil {
			return nil, fmt.Errorf("{Addr}: %w", err)
		}
	}
	if cfg.MetricsAddr != "" {
		if opsLn, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			if ln != nil {
				ln.Close()
			}
			return nil, fmt.Errorf("{MetricsAddr}: %w", err)
		}
		f.ServeOps(opsLn)
		log.Info("serving metrics", "addr", opsLn.Addr().String(), "url", "http://"+opsLn.Addr().String()+"/metrics")
	}
	if ln != nil {
		f.Serve(ln)
		path := "/mcp"
		if cfg.Transport == server.SSE {
			path = "/sse"
		}
		log.Info("serving", "transport", cfg.Transport, "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String()+path,
			"stateless", cfg.Transport == server.HTTP && cfg.HTTPStateless)
	}
	return f, nil
}

// cacheDir is the rootfs cache cfg uses.
func cacheDir(cfg config) string {
	if cfg.CacheDir != "" {
		return cfg.CacheDir
	}
	return rootfs.DefaultCacheDir()
}

// boundCache removes, least recently used first, the cached rootfs no
// live server uses while the cache is over MCP_EXEC_CACHE_MAX_MB. It runs
// once the server is up, off its start: it waits for builds under way.
func boundCache(ctx context.Context, cfg config, log *slog.Logger, size *cacheSize) {
	if cfg.CacheMaxBytes <= 0 {
		return
	}
	dir := cacheDir(cfg)
	removed, err := rootfs.Prune(ctx, dir, rootfs.PruneOptions{MaxBytes: cfg.CacheMaxBytes})
	for _, e := range removed {
		log.Info("removed a rootfs no server uses, the cache being over its bound", "cache_max_mb", cfg.CacheMaxBytes/mib,
			"rootfs", e.Name, "holds", describeEntry(e), "mib", e.Bytes/mib, "last_used", e.LastUsed.UTC().Format(time.RFC3339))
	}
	if err != nil && ctx.Err() == nil {
		log.Warn("bounding the rootfs cache", "dir", dir, "err", err)
	}
	if len(removed) > 0 {
		size.invalidate()
	}
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
