package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	goruntime "runtime"
	"strconv"
	"strings"
	"time"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

const mib = 1 << 20

// config is the server's whole configuration, parsed once at the edge from
// the environment and flags. Units are in the names.
type config struct {
	Transport      string
	Addr           string
	AuthToken      string
	DefaultTimeout time.Duration
	MaxTimeout     time.Duration
	MaxOutputBytes int64
	MaxStdinBytes  int64
	Runtime        runtime.Kind
	Rootfs         string // empty: build from Python into the cache
	Python         string // empty: /usr/bin/python3, else python3 on PATH
	Limits         policy.Limits
	MaxConcurrency int
	Progress       time.Duration
	AuditLog       string
	StateDir       string
	RunscPath      string
	RunscPlatform  string
}

func defaultConfig() config {
	return config{
		Transport:      "stdio",
		Addr:           "127.0.0.1:8080",
		DefaultTimeout: 30 * time.Second,
		MaxTimeout:     300 * time.Second,
		MaxOutputBytes: 1 << 20,
		MaxStdinBytes:  1 << 20,
		Runtime:        runtime.Libcontainer,
		Limits:         policy.DefaultLimits(),
		MaxConcurrency: 2 * goruntime.NumCPU(),
		Progress:       5 * time.Second,
		StateDir:       runtime.DefaultStateDir,
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
		{"MCP_EXEC_DEFAULT_TIMEOUT_S", "default-timeout", "wall-clock limit in seconds when a call gives none", secondsValue{&c.DefaultTimeout}},
		{"MCP_EXEC_MAX_TIMEOUT_S", "max-timeout", "largest timeout_s a call may ask for", secondsValue{&c.MaxTimeout}},
		{"MCP_EXEC_MAX_OUTPUT_BYTES", "max-output-bytes", "cap per stream (stdout, stderr)", bytesValue{&c.MaxOutputBytes, 1, 1}},
		{"MCP_EXEC_MAX_STDIN_BYTES", "max-stdin-bytes", "largest stdin accepted", bytesValue{&c.MaxStdinBytes, 1, 0}},
		{"MCP_EXEC_RUNTIME", "runtime", "libcontainer or runsc", kindValue{&c.Runtime}},
		{"MCP_EXEC_ROOTFS", "rootfs", "the read-only Python rootfs to use (default: built from the host's python3 into a cache dir)", stringValue{&c.Rootfs}},
		{"MCP_EXEC_PYTHON", "python", "the host interpreter the default rootfs is built from", stringValue{&c.Python}},
		{"MCP_EXEC_MEMORY_MB", "memory-mb", "memory limit per call in MiB (tmpfs pages count too)", bytesValue{&c.Limits.MemoryBytes, mib, policy.MinMemoryBytes / mib}},
		{"MCP_EXEC_PIDS", "pids", "process/thread limit per call", intValue{&c.Limits.Pids, policy.MinPids}},
		{"MCP_EXEC_CPUS", "cpus", "CPU quota per call, in cores", cpusValue{&c.Limits.CPUs}},
		{"MCP_EXEC_TMPFS_MB", "tmpfs-mb", "size of the writable /tmp in MiB", bytesValue{&c.Limits.TmpfsBytes, mib, policy.MinTmpfsBytes / mib}},
		{"MCP_EXEC_STATE_DIR", "state-dir", "where per-instance container state lives (0700)", stringValue{&c.StateDir}},
		{"MCP_EXEC_RUNSC", "runsc", "path of the runsc binary (default: runsc on PATH)", stringValue{&c.RunscPath}},
		{"MCP_EXEC_RUNSC_PLATFORM", "runsc-platform", "gVisor platform (default: probed; systrap, else ptrace)", stringValue{&c.RunscPlatform}},
	}
	if serverOnly {
		s = append(s,
			setting{"MCP_EXEC_TRANSPORT", "transport", "stdio, http or sse", choiceValue{&c.Transport, []string{"stdio", "http", "sse"}}},
			setting{"MCP_EXEC_ADDR", "addr", "listen address for http and sse", stringValue{&c.Addr}},
			setting{"MCP_EXEC_AUTH_TOKEN", "auth-token", "bearer token, required for http and sse (prefer the environment: flags show in ps)", stringValue{&c.AuthToken}},
			setting{"MCP_EXEC_MAX_CONCURRENCY", "max-concurrency", "calls running at once; more wait their turn", intField{&c.MaxConcurrency, 1}},
			setting{"MCP_EXEC_PROGRESS_S", "progress", "interval of progress notifications in seconds", secondsValue{&c.Progress}},
			setting{"MCP_EXEC_AUDIT_LOG", "audit-log", "path of the audit log (JSON lines), or - for stderr", stringValue{&c.AuditLog}},
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
	return cfg, cfg.validate(serverOnly)
}

func (c *config) validate(serverOnly bool) error {
	var errs []error
	if c.DefaultTimeout > c.MaxTimeout {
		errs = append(errs, fmt.Errorf("MCP_EXEC_DEFAULT_TIMEOUT_S (%v) must not exceed MCP_EXEC_MAX_TIMEOUT_S (%v)",
			c.DefaultTimeout.Seconds(), c.MaxTimeout.Seconds()))
	}
	if serverOnly && c.Transport != "stdio" && c.AuthToken == "" {
		errs = append(errs, fmt.Errorf("MCP_EXEC_AUTH_TOKEN is required with --transport %s: the server refuses to serve HTTP without a bearer token", c.Transport))
	}
	if serverOnly && c.Transport != "stdio" && len(c.AuthToken) < 16 {
		if c.AuthToken != "" {
			errs = append(errs, fmt.Errorf("MCP_EXEC_AUTH_TOKEN must be at least 16 characters, got %d", len(c.AuthToken)))
		}
	}
	if err := c.Limits.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

type stringValue struct{ p *string }

func (v stringValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}
func (v stringValue) Set(s string) error { *v.p = s; return nil }

type choiceValue struct {
	p       *string
	choices []string
}

func (v choiceValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}
func (v choiceValue) Set(s string) error {
	for _, c := range v.choices {
		if s == c {
			*v.p = s
			return nil
		}
	}
	return fmt.Errorf("must be one of %s, got %q", strings.Join(v.choices, ", "), s)
}

type kindValue struct{ p *runtime.Kind }

func (v kindValue) String() string {
	if v.p == nil {
		return ""
	}
	return string(*v.p)
}
func (v kindValue) Set(s string) error {
	k, err := runtime.ParseKind(s)
	if err != nil {
		return err
	}
	*v.p = k
	return nil
}

// secondsValue is a positive number of seconds.
type secondsValue struct{ p *time.Duration }

func (v secondsValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatFloat(v.p.Seconds(), 'f', -1, 64)
}
func (v secondsValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return fmt.Errorf("must be a number of seconds, got %q", s)
	}
	if f <= 0 || f > 24*3600 {
		return fmt.Errorf("must be > 0 and ≤ 86400 seconds, got %v", f)
	}
	*v.p = time.Duration(f * float64(time.Second))
	return nil
}

// bytesValue is an integer count of unit bytes, at least min units.
type bytesValue struct {
	p        *int64
	unit     int64
	minUnits int64
}

func (v bytesValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatInt(*v.p/v.unit, 10)
}
func (v bytesValue) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("must be an integer, got %q", s)
	}
	if n < v.minUnits {
		return fmt.Errorf("must be ≥ %d, got %d", v.minUnits, n)
	}
	if n > math.MaxInt64/v.unit {
		return fmt.Errorf("is too large, got %d", n)
	}
	*v.p = n * v.unit
	return nil
}

type intValue struct {
	p   *int64
	min int64
}

func (v intValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatInt(*v.p, 10)
}
func (v intValue) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return fmt.Errorf("must be an integer, got %q", s)
	}
	if n < v.min {
		return fmt.Errorf("must be ≥ %d, got %d", v.min, n)
	}
	*v.p = n
	return nil
}

type intField struct {
	p   *int
	min int64
}

func (v intField) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}
func (v intField) Set(s string) error {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 32)
	if err != nil {
		return fmt.Errorf("must be an integer, got %q", s)
	}
	if n < v.min {
		return fmt.Errorf("must be ≥ %d, got %d", v.min, n)
	}
	*v.p = int(n)
	return nil
}

type cpusValue struct{ p *float64 }

func (v cpusValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatFloat(*v.p, 'f', -1, 64)
}
func (v cpusValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) {
		return fmt.Errorf("must be a number of cores, got %q", s)
	}
	if f < 0.01 || f > policy.MaxCPUs {
		return fmt.Errorf("must be ≥ 0.01 and ≤ %d, got %v", policy.MaxCPUs, f)
	}
	*v.p = f
	return nil
}
