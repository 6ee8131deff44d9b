package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/inhuman/mcp-exec/egress"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
	"github.com/inhuman/mcp-exec/server"
)

const mib = 1 << 20

// config is the server's whole configuration, parsed once at the edge from
// the environment and flags. Units are in the names.
type config struct {
	Transport      server.Transport
	Addr           string
	AuthToken      string
	AuthTokenFile  string // read into AuthToken by loadConfig
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	// MaxCPU bounds a call's cpu_limit_s (0: MaxTimeout).
	MaxCPU time.Duration
	policy.CallCaps
	Runtime runtime.Kind
	// ProcessNamespaces: whether the process runtime puts each call in
	// namespaces of its own.
	ProcessNamespaces runtime.Namespaces
	Rootfs            string // empty: build from Python into the cache
	Python            string // empty: /usr/bin/python3, else python3 on PATH
	RootfsImage       string
	Packages          []string
	Shell             bool
	Preload           []string
	PackagesDir       string
	// DataDir is the operator's dir of data, read-only at /data in every
	// sandbox (data.go).
	DataDir  string
	PoolSize int // -1: adaptive
	// Fork makes libcontainer's sandboxes forks of templates, each of
	// which serves ForkMaxCalls calls for ForkMaxAge at most.
	Fork           bool
	ForkMaxCalls   int
	ForkMaxAge     time.Duration
	Limits         policy.Limits
	MaxConcurrency int
	MaxQueued      int
	Progress       time.Duration
	// TextBytes bounds the text block a model reads of a call;
	// ResourceMaxBytes the output files kept as resources (0: none), each
	// for ResourceTTL.
	TextBytes        int64
	ResourceMaxBytes int64
	ResourceTTL      time.Duration
	// Persistent sessions: at most PersistentMax (0: off), each ended
	// after PersistentIdle without a call or PersistentLifetime in all.
	PersistentMax      int
	PersistentIdle     time.Duration
	PersistentLifetime time.Duration
	// PersistentPerClient sessions one client may hold (0: the server's
	// default, half of PersistentMax); PersistentBackground lets a
	// session's threads run between its calls instead of freezing it.
	PersistentPerClient  int
	PersistentBackground bool
	// PersistentPark: a frozen session idle this long is saved to disk
	// and its sandbox ended, until its next call (runsc; 0 never).
	PersistentPark time.Duration
	AuditLog       string
	SessionIdle    time.Duration
	MaxSessions    int
	HTTPStateless  bool
	StateDir       string
	RunscPath      string
	RunscPlatform  string
	// Egress is the network sandboxes may reach (egress.go); the zero
	// value is none.
	Egress egress.Settings
	// Operations: metrics on a listener of their own, the log's format
	// and level, the rootfs cache and its bound, and whether an unknown
	// MCP_EXEC_* variable stops the server (ops.go).
	MetricsAddr   string
	LogFormat     logFormat
	LogLevel      slog.Level
	CacheDir      string // "": rootfs.DefaultCacheDir()
	CacheMaxBytes int64  // 0: unbounded
	StrictConfig  bool
	// Warnings are what loadConfig found worth saying but not refusing;
	// serve logs them once its logger exists.
	Warnings []string
}

func defaultConfig() config {
	return config{
		Transport:          server.Stdio,
		Addr:               "127.0.0.1:8080",
		DefaultTimeout:     30 * time.Second,
		MaxTimeout:         300 * time.Second,
		CallCaps:           policy.DefaultCallCaps(),
		Runtime:            runtime.Libcontainer,
		ProcessNamespaces:  runtime.NamespacesAuto,
		Limits:             policy.DefaultLimits(),
		MaxConcurrency:     2 * goruntime.NumCPU(),
		MaxQueued:          4 * 2 * goruntime.NumCPU(),
		Progress:           2 * time.Second,
		TextBytes:          server.DefaultTextBytes,
		ResourceMaxBytes:   64 * mib,
		ResourceTTL:        600 * time.Second,
		PersistentMax:      8,
		PersistentIdle:     600 * time.Second,
		PersistentPark:     60 * time.Second,
		PersistentLifetime: 3600 * time.Second,
		SessionIdle:        600 * time.Second,
		PoolSize:           -1,
		Fork:               true,
		ForkMaxCalls:       runtime.DefaultForkMaxCalls,
		ForkMaxAge:         runtime.DefaultForkMaxAge,
		MaxSessions:        1000,
		StateDir:           runtime.DefaultStateDir,
		LogFormat:          logText,
		LogLevel:           slog.LevelInfo,
		CacheMaxBytes:      defaultCacheMaxMB * mib,
	}
}

// setting ties one environment variable to the flag of the same meaning.
type setting struct {
	env, flag, usage string
	value            flag.Value
}

// settings lists every configurable value. serverOnly ones are not offered
// by the one-shot subcommands.
func (c *config) settings(serverOnly bool) []setting {
	s := []setting{
		{"MCP_EXEC_DEFAULT_TIMEOUT_S", "default-timeout", "wall-clock limit in seconds when a call gives none", seconds(&c.DefaultTimeout)},
		{"MCP_EXEC_MAX_TIMEOUT_S", "max-timeout", "largest timeout_s a call may ask for", seconds(&c.MaxTimeout)},
		{"MCP_EXEC_MAX_OUTPUT_BYTES", "max-output-bytes", "cap per stream (stdout, stderr)", byteCount(&c.MaxOutputBytes, 1, 1)},
		{"MCP_EXEC_MAX_STDIN_BYTES", "max-stdin-bytes", "largest stdin accepted", byteCount(&c.MaxStdinBytes, 1, 0)},
		{"MCP_EXEC_MAX_CODE_BYTES", "max-code-bytes", "largest code accepted", byteCount(&c.MaxCodeBytes, 1, 1)},
		{"MCP_EXEC_MAX_FILES", "max-files", "most files a call may send, and return from " + policy.OutputsDir, integer(&c.MaxFiles, 0)},
		{"MCP_EXEC_MAX_FILE_BYTES", "max-file-bytes", "most bytes of files a call may send, and return", byteCount(&c.MaxFileBytes, 1, 0)},
		{"MCP_EXEC_RUNTIME", "runtime", "libcontainer, runsc, process (a fresh process per call; the outer container is the boundary) or auto (the strictest this host allows)", &value[runtime.Kind]{p: &c.Runtime, parse: runtime.ParseKind}},
		{"MCP_EXEC_PROCESS_NAMESPACES", "process-namespaces", "process runtime: each call in user, pid, mount, network, IPC and UTS namespaces of its own where the host allows them (auto), always (true: refuse to start without), or never (false)", &value[runtime.Namespaces]{p: &c.ProcessNamespaces, parse: runtime.ParseNamespaces}},
		{"MCP_EXEC_ROOTFS", "rootfs", "the read-only Python rootfs to use (default: built from the host's python3 into a cache dir)", str(&c.Rootfs)},
		{"MCP_EXEC_PYTHON", "python", "the host interpreter the default rootfs is built from", str(&c.Python)},
		{"MCP_EXEC_ROOTFS_IMAGE", "rootfs-image", "a docker save tarball or OCI image-layout dir (PATH or PATH:TAG) whose filesystem becomes the rootfs", str(&c.RootfsImage)},
		{"MCP_EXEC_PACKAGES", "packages", "Python packages importable in every sandbox, from the host's Debian python3-* packages (comma-separated PyPI names: numpy,pandas,...)", list(&c.Packages)},
		{"MCP_EXEC_SHELL", "shell", "/bin/sh and the common command-line tools (busybox) in the sandbox", boolean(&c.Shell)},
		{"MCP_EXEC_PRELOAD", "preload", "modules every sandbox's interpreter imports as it starts, ahead of the call in a prepared one (comma-separated, e.g. numpy,pandas)", list(&c.Preload)},
		{"MCP_EXEC_POOL_SIZE", "pool-size", "sandboxes prepared ahead: adaptive (up to the concurrency), a number, or 0 for none", &value[int]{p: &c.PoolSize, parse: parsePoolSize,
			format: func(n int) string {
				if n < 0 {
					return "adaptive"
				}
				return strconv.Itoa(n)
			}}},
		{"MCP_EXEC_FORK", "fork", "libcontainer and runsc: fork each sandbox from a template interpreter that never runs a call's code (fresh namespaces, cgroups and /tmp per call; under runsc inside a gVisor sandbox per call slot); false: a fresh container or gVisor sandbox per call from the start", boolean(&c.Fork)},
		{"MCP_EXEC_FORK_MAX_CALLS", "fork-max-calls", "calls a template forks sandboxes for before it is replaced", integer(&c.ForkMaxCalls, 1)},
		{"MCP_EXEC_FORK_MAX_AGE_S", "fork-max-age", "seconds after which a template is replaced", seconds(&c.ForkMaxAge)},
		{"MCP_EXEC_PACKAGES_DIR", "packages-dir", "a directory of importable packages (e.g. pip install --target DIR), mounted read-only on the import path", str(&c.PackagesDir)},
		{"MCP_EXEC_DATA_DIR", "data-dir", "a directory of data, mounted read-only (nosuid, nodev, noexec, all the way down) at " + policy.DataDir + " in every sandbox", str(&c.DataDir)},
		{"MCP_EXEC_MEMORY_MB", "memory-mb", "memory limit per call in MiB (tmpfs pages count too)", byteCount(&c.Limits.MemoryBytes, mib, policy.MinMemoryBytes/mib)},
		{"MCP_EXEC_PIDS", "pids", "process/thread limit per call", integer(&c.Limits.Pids, policy.MinPids)},
		{"MCP_EXEC_CPUS", "cpus", "CPU quota per call, in cores", &value[float64]{p: &c.Limits.CPUs, parse: parseCPUs}},
		{"MCP_EXEC_TMPFS_MB", "tmpfs-mb", "size of the writable /tmp in MiB", byteCount(&c.Limits.TmpfsBytes, mib, policy.MinTmpfsBytes/mib)},
		{"MCP_EXEC_STATE_DIR", "state-dir", "where per-instance container state lives (0700)", str(&c.StateDir)},
		{"MCP_EXEC_RUNSC", "runsc", "path of the runsc binary (default: /usr/local/bin/runsc where make runsc installs it, else runsc on PATH)", str(&c.RunscPath)},
		{"MCP_EXEC_RUNSC_PLATFORM", "runsc-platform", "gVisor platform (default: probed; systrap, else ptrace)", str(&c.RunscPlatform)},
		// Operations.
		{"MCP_EXEC_CACHE_DIR", "cache-dir", "where built rootfs and flattened images are cached (default: /var/cache/mcp-exec/rootfs for root, else ~/.cache/mcp-exec/rootfs)", str(&c.CacheDir)},
		{"MCP_EXEC_STRICT_CONFIG", "strict-config", "an unknown MCP_EXEC_* variable stops the server instead of being a warning", boolean(&c.StrictConfig)},
	}
	s = append(s, c.egressSettings()...)
	if serverOnly {
		s = append(s,
			setting{"MCP_EXEC_TRANSPORT", "transport", "stdio, http or sse", &value[server.Transport]{p: &c.Transport, parse: server.ParseTransport}},
			setting{"MCP_EXEC_ADDR", "addr", "listen address for http and sse", str(&c.Addr)},
			setting{"MCP_EXEC_AUTH_TOKEN", "auth-token", "bearer token, required for http and sse (prefer the environment: flags show in ps)", str(&c.AuthToken)},
			setting{"MCP_EXEC_AUTH_TOKEN_FILE", "auth-token-file", "file holding the bearer token, e.g. a systemd credential or a mounted Secret (instead of MCP_EXEC_AUTH_TOKEN)", str(&c.AuthTokenFile)},
			setting{"MCP_EXEC_MAX_CONCURRENCY", "max-concurrency", "calls running at once; more wait their turn", integer(&c.MaxConcurrency, 1)},
			setting{"MCP_EXEC_MAX_QUEUED", "max-queued", "calls waiting for a slot; one more is refused (default 4 × max-concurrency)", integer(&c.MaxQueued, 0)},
			setting{"MCP_EXEC_PROGRESS_S", "progress", "interval of progress notifications in seconds", seconds(&c.Progress)},
			setting{"MCP_EXEC_MAX_CPU_S", "max-cpu", "largest cpu_limit_s (a call's CPU time limit, all its processes together) a call may ask for (default: max-timeout)", seconds(&c.MaxCPU)},
			setting{"MCP_EXEC_TEXT_BYTES", "text-bytes", "budget of the text block a model reads of a call: the head and tail of each part past it (structuredContent keeps everything up to max-output-bytes)", byteCount(&c.TextBytes, 1, 1024)},
			setting{"MCP_EXEC_RESOURCE_MAX_MB", "resource-max-mb", "output files kept as resources (resource_link, resources/read, files[].uri) for the client that made them, in MiB in all, a client at most half; 0 keeps none and every file comes inline", byteCount(&c.ResourceMaxBytes, mib, 0)},
			setting{"MCP_EXEC_RESOURCE_TTL_S", "resource-ttl", "an output file kept as a resource lives this long after its call", seconds(&c.ResourceTTL)},
			setting{"MCP_EXEC_PERSISTENT_MAX", "persistent-max", "persistent sessions open at most (a sandbox each, kept between a caller's calls); 0 turns them off", integer(&c.PersistentMax, 0)},
			setting{"MCP_EXEC_PERSISTENT_IDLE_S", "persistent-idle", "a persistent session without a call this long is ended", seconds(&c.PersistentIdle)},
			setting{"MCP_EXEC_PERSISTENT_LIFETIME_S", "persistent-lifetime", "a persistent session is ended this long after it began", seconds(&c.PersistentLifetime)},
			setting{"MCP_EXEC_PERSISTENT_PER_CLIENT", "persistent-per-client", "persistent sessions one client (an HTTP session, the stdio peer) may hold; default half of persistent-max", integer(&c.PersistentPerClient, 1)},
			setting{"MCP_EXEC_PERSISTENT_PARK_S", "persistent-park", "under runsc, a frozen persistent session without a call this long is checkpointed to disk (under /var/tmp/mcp-exec-parked) and its sandbox ended, costing disk, not memory; its next call restores it first; 0 never", secondsOrNever(&c.PersistentPark)},
			setting{"MCP_EXEC_PERSISTENT_BACKGROUND", "persistent-background", "a persistent session's threads and processes run on between its calls, each session using up to its CPU quota beside max-concurrency (default false: frozen between calls)", boolean(&c.PersistentBackground)},
			setting{"MCP_EXEC_AUDIT_LOG", "audit-log", "path of the audit log (JSON lines), or - for stderr", str(&c.AuditLog)},
			setting{"MCP_EXEC_SESSION_IDLE_S", "session-idle", "an HTTP session idle this long is closed", seconds(&c.SessionIdle)},
			setting{"MCP_EXEC_MAX_SESSIONS", "max-sessions", "HTTP sessions open at most; a new one closes the least recently used", integer(&c.MaxSessions, 1)},
			setting{"MCP_EXEC_HTTP_STATELESS", "http-stateless", "streamable HTTP without sessions (any replica answers any request)", boolean(&c.HTTPStateless)},
			// Operations.
			setting{"MCP_EXEC_METRICS_ADDR", "metrics-addr", "a listen address of its own for /metrics, /healthz, /readyz and /version, without the token (default: /metrics on the HTTP transport, behind the token)", str(&c.MetricsAddr)},
			setting{"MCP_EXEC_LOG_FORMAT", "log-format", "text or json", &value[logFormat]{p: &c.LogFormat, parse: parseLogFormat}},
			setting{"MCP_EXEC_LOG_LEVEL", "log-level", "debug, info, warn or error", &value[slog.Level]{p: &c.LogLevel, parse: parseLogLevel,
				format: func(l slog.Level) string { return strings.ToLower(l.String()) }}},
			setting{"MCP_EXEC_CACHE_MAX_MB", "cache-max-mb", "the rootfs cache's bound in MiB: rootfs no live server uses are removed beyond it at start, least recently used first; 0 for none", byteCount(&c.CacheMaxBytes, mib, 0)},
		)
	}
	return s
}

// loadConfig applies the environment, then the flags, then validates.
// Every error names the variable or flag at fault.
func loadConfig(fs *flag.FlagSet, args []string, getenv func(string) (string, bool), serverOnly bool) (config, error) {
	cfg := defaultConfig()
	settings := cfg.settings(serverOnly)
	for _, s := range settings {
		fs.Var(s.value, s.flag, s.usage+" (env "+s.env+")")
	}
	for _, s := range settings {
		if v, ok := getenv(s.env); ok {
			if err := s.value.Set(v); err != nil {
				return cfg, fmt.Errorf("%s: %w", s.env, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if err := cfg.checkEnviron(environ()); err != nil {
		return cfg, err
	}
	if err := cfg.readAuthTokenFile(); err != nil {
		return cfg, err
	}
	// The queue's default follows the concurrency, however that was set.
	_, queuedByEnv := getenv("MCP_EXEC_MAX_QUEUED")
	queuedByFlag := false
	fs.Visit(func(f *flag.Flag) { queuedByFlag = queuedByFlag || f.Name == "max-queued" })
	if !queuedByEnv && !queuedByFlag {
		cfg.MaxQueued = 4 * cfg.MaxConcurrency
	}

	// The libraries name fields; the operator reads variables.
	return cfg, named(cfg.validate(serverOnly))
}

// readAuthTokenFile moves the token from MCP_EXEC_AUTH_TOKEN_FILE into
// AuthToken, so that systemd's LoadCredential= and Kubernetes' Secret
// volumes hand it over without it ever being in an environment block or
// argv. The trailing newline that editors and "echo" add is not part of the
// token.
func (c *config) readAuthTokenFile() error {
	if c.AuthTokenFile == "" {
		return nil
	}
	if c.AuthToken != "" {
		return errors.New("MCP_EXEC_AUTH_TOKEN and MCP_EXEC_AUTH_TOKEN_FILE are both set: set one")
	}
	data, err := os.ReadFile(c.AuthTokenFile)
	if err != nil {
		return fmt.Errorf("MCP_EXEC_AUTH_TOKEN_FILE: reading the token: %w", err)
	}
	if fi, err := os.Stat(c.AuthTokenFile); err == nil && fi.Mode().Perm()&0o004 != 0 {
		c.Warnings = append(c.Warnings, fmt.Sprintf("MCP_EXEC_AUTH_TOKEN_FILE %s is readable by every user (mode %v): "+
			"whoever on this host can read it can call the server; make it 0400 (Kubernetes: the Secret volume's defaultMode: 0400)",
			c.AuthTokenFile, fi.Mode().Perm()))
	}
	c.AuthToken = strings.TrimRight(string(data), "\r\n")
	if c.AuthToken == "" {
		return fmt.Errorf("MCP_EXEC_AUTH_TOKEN_FILE: %s is empty", c.AuthTokenFile)
	}
	return nil
}

func (c *config) validate(serverOnly bool) error {
	var errs []error
	if serverOnly {
		// The server's options hold the timeouts and the limits too.
		errs = append(errs, c.serverOptions().Validate())
	} else {
		if c.DefaultTimeout > c.MaxTimeout {
			errs = append(errs, fmt.Errorf("MCP_EXEC_DEFAULT_TIMEOUT_S (%v) must not exceed MCP_EXEC_MAX_TIMEOUT_S (%v)",
				c.DefaultTimeout.Seconds(), c.MaxTimeout.Seconds()))
		}
		errs = append(errs, c.Limits.Validate())
	}
	errs = append(errs, c.sandboxErrors()...)
	return errors.Join(errs...)
}

// sandboxErrors checks what every subcommand that makes sandboxes shares.
func (c *config) sandboxErrors() []error {
	var errs []error
	if err := c.rootfsOptions().Validate(); err != nil {
		errs = append(errs, err)
	}
	if (len(c.Packages) > 0 || c.Shell || len(c.Preload) > 0) && c.RootfsImage != "" {
		errs = append(errs, errors.New("MCP_EXEC_PACKAGES, MCP_EXEC_SHELL and MCP_EXEC_PRELOAD build the default rootfs from the host's packages; they cannot change MCP_EXEC_ROOTFS_IMAGE, whose image brings its own"))
	}
	if c.Rootfs != "" && c.RootfsImage != "" {
		errs = append(errs, errors.New("MCP_EXEC_ROOTFS and MCP_EXEC_ROOTFS_IMAGE both name the rootfs: set one"))
	}
	if c.PackagesDir != "" {
		if fi, err := os.Stat(c.PackagesDir); err != nil || !fi.IsDir() {
			errs = append(errs, fmt.Errorf("MCP_EXEC_PACKAGES_DIR=%s is not a directory (%v)", c.PackagesDir, err))
		} else if abs, err := filepath.Abs(c.PackagesDir); err == nil {
			c.PackagesDir = abs
		}
	}
	if err := c.checkDataDir(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Egress.Validate(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, c.limitsTogether()...)
	if c.MaxFileBytes >= c.Limits.TmpfsBytes {
		errs = append(errs, fmt.Errorf("MCP_EXEC_MAX_FILE_BYTES (%d) must be below the /tmp size, MCP_EXEC_TMPFS_MB (%d MiB): the files are written there",
			c.MaxFileBytes, c.Limits.TmpfsBytes/mib))
	}
	return errs
}

// rootfsOptions is what the default rootfs is built with.
// With the network allowlist on, the rootfs built here has pip (Debian's
// python3-pip), so that a sandbox can install from an index it allows; an
// operator's rootfs or image has it or not, as its maker chose.
func (c *config) rootfsOptions() rootfs.Options {
	pkgs := c.Packages
	builtHere := c.Rootfs == "" && c.RootfsImage == ""
	if c.Egress.Enabled() && builtHere && !slices.Contains(pkgs, "pip") && !slices.Contains(pkgs, "python3-pip") {
		pkgs = append(slices.Clone(pkgs), "pip")
	}
	return rootfs.Options{Packages: pkgs, Shell: c.Shell, Preload: c.Preload}
}

func parsePoolSize(s string) (int, error) {
	if strings.TrimSpace(s) == "adaptive" {
		return -1, nil
	}
	n, err := parseInt(s, 0, 1024)
	if err != nil {
		return 0, fmt.Errorf("must be adaptive or a number from 0 to 1024: %w", err)
	}
	return int(n), nil
}

// serverOptions are the server's part of the configuration.
func (c *config) serverOptions() server.Options {
	return server.Options{
		DefaultTimeout:       c.DefaultTimeout,
		MaxTimeout:           c.MaxTimeout,
		MaxCPU:               c.MaxCPU,
		CallCaps:             c.CallCaps,
		Limits:               c.Limits,
		MaxConcurrency:       c.MaxConcurrency,
		MaxQueued:            c.MaxQueued,
		Progress:             c.Progress,
		TextBytes:            c.TextBytes,
		ResourceMaxBytes:     c.ResourceMaxBytes,
		ResourceTTL:          c.ResourceTTL,
		PersistentMax:        c.PersistentMax,
		PersistentIdle:       c.PersistentIdle,
		PersistentLifetime:   c.PersistentLifetime,
		PersistentPerClient:  c.PersistentPerClient,
		PersistentBackground: c.PersistentBackground,
		Transport:            c.Transport,
		AuthToken:            c.AuthToken,
		SessionIdle:          c.SessionIdle,
		MaxSessions:          c.MaxSessions,
		Stateless:            c.HTTPStateless,
		Version:              version,
	}
}

// value is a flag.Value of any type: parse turns the text of a flag or an
// environment variable into a T, or says why it cannot.
type value[T any] struct {
	p      *T
	parse  func(string) (T, error)
	format func(T) string // nil: fmt's %v
}

func (v *value[T]) String() string {
	if v == nil || v.p == nil {
		return ""
	}
	if v.format != nil {
		return v.format(*v.p)
	}
	return fmt.Sprint(*v.p)
}

// target is where the value is written: the settings table finds the
// field it sets from it.
func (v *value[T]) target() any { return v.p }

func (v *value[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

func str(p *string) *value[string] {
	return &value[string]{p: p, parse: func(s string) (string, error) { return s, nil }}
}

// list is a comma-separated list; blanks around items are dropped. An
// empty item (numpy,,pandas; a trailing comma) is refused: it is a
// mistake, and what was meant there cannot be told. An empty value is
// the empty list.
func list(p *[]string) *value[[]string] {
	return &value[[]string]{p: p, format: func(l []string) string { return strings.Join(l, ",") },
		parse: func(s string) ([]string, error) {
			if strings.TrimSpace(s) == "" {
				return nil, nil
			}
			var out []string
			for i, item := range strings.Split(s, ",") {
				if item = strings.TrimSpace(item); item == "" {
					return nil, fmt.Errorf("item %d of %q is empty: remove the extra comma", i+1, s)
				}
				out = append(out, item)
			}
			return out, nil
		}}
}

func boolean(p *bool) *value[bool] {
	return &value[bool]{p: p, parse: func(s string) (bool, error) {
		b, err := strconv.ParseBool(strings.TrimSpace(s))
		if err != nil {
			return false, fmt.Errorf("must be true or false, got %q", s)
		}
		return b, nil
	}}
}

// seconds is a positive number of seconds, at most a day.
func seconds(p *time.Duration) *value[time.Duration] {
	return &value[time.Duration]{p: p, parse: parseSeconds,
		format: func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }}
}

// secondsOrNever is seconds, or 0 for never.
func secondsOrNever(p *time.Duration) *value[time.Duration] {
	v := seconds(p)
	v.parse = func(s string) (time.Duration, error) {
		if f, err := strconv.ParseFloat(strings.TrimSpace(s), 64); err == nil && f == 0 {
			return 0, nil
		}
		d, err := parseSeconds(s)
		if err != nil {
			return 0, fmt.Errorf("%w (or 0: never)", err)
		}
		return d, nil
	}
	return v
}

func parseSeconds(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("must be a number of seconds, got %q", s)
	}
	if f <= 0 || f > 24*3600 {
		return 0, fmt.Errorf("must be > 0 and ≤ 86400 seconds, got %v", f)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// byteCount is an integer count of unit bytes, at least minUnits.
func byteCount(p *int64, unit, minUnits int64) *value[int64] {
	return &value[int64]{p: p, format: func(n int64) string { return strconv.FormatInt(n/unit, 10) },
		parse: func(s string) (int64, error) {
			n, err := parseInt(s, minUnits, math.MaxInt64/unit)
			return n * unit, err
		}}
}

// integer is an integer of at least min.
func integer[T int | int64](p *T, min int64) *value[T] {
	return &value[T]{p: p, parse: func(s string) (T, error) {
		n, err := parseInt(s, min, math.MaxInt32)
		return T(n), err
	}}
}

func parseInt(s string, min, max int64) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("must be an integer, got %q", s)
	}
	if n < min {
		return 0, fmt.Errorf("must be ≥ %d, got %d", min, n)
	}
	if n > max {
		return 0, fmt.Errorf("is too large, got %d", n)
	}
	return n, nil
}

func parseCPUs(s string) (float64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) {
		return 0, fmt.Errorf("must be a number of cores, got %q", s)
	}
	if f < 0.01 || f > policy.MaxCPUs {
		return 0, fmt.Errorf("must be ≥ 0.01 and ≤ %d, got %v", policy.MaxCPUs, f)
	}
	return f, nil
}
