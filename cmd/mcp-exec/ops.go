package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	goruntime "runtime"
	"slices"
	"strings"

	"github.com/inhuman/mcp-exec/internal/names"
)

// What an operator watches and how the configuration is checked beyond
// each value's own range: the log's format and level, unknown MCP_EXEC_*
// variables, limits that cannot hold together.

// defaultCacheMaxMB bounds the rootfs cache by default: a few rootfs with
// packages (each 120–350 MB) and an image or two fit, an afternoon of
// trying package sets does not pile up.
const defaultCacheMaxMB = 4096

// logFormat is how the server writes its log.
type logFormat string

const (
	logText logFormat = "text"
	logJSON logFormat = "json"
)

func parseLogFormat(s string) (logFormat, error) {
	switch f := logFormat(strings.ToLower(strings.TrimSpace(s))); f {
	case logText, logJSON:
		return f, nil
	}
	return "", fmt.Errorf("must be text or json, got %q", s)
}

func parseLogLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("must be debug, info, warn or error, got %q", s)
}

// newLogger writes records of level and above to w in format, one whole
// line per Write (fieldWriter relies on that).
func newLogger(w io.Writer, format logFormat, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// environ is the process's environment, where unknown variables are
// looked for; tests replace it.
var environ = os.Environ

// checkEnviron says what is wrong with the MCP_EXEC_* variables of env
// that no setting reads: a typo (MCP_EXEC_MEMRY_MB) would otherwise be
// ignored, and the server run with a limit other than the operator meant.
// Each is a warning naming the closest known variable, or, with
// MCP_EXEC_STRICT_CONFIG=true, an error.
func (c *config) checkEnviron(env []string) error {
	known := knownVars()
	var unknown []string
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "MCP_EXEC_") && !slices.Contains(known, name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	var errs []error
	for _, name := range unknown {
		msg := fmt.Sprintf("%s is not a variable mcp-exec knows, and is ignored; the closest known is %s", name, closest(name, known))
		if c.StrictConfig {
			errs = append(errs, fmt.Errorf("%s (MCP_EXEC_STRICT_CONFIG=true refuses it)", msg))
		} else {
			c.Warnings = append(c.Warnings, msg+" (MCP_EXEC_STRICT_CONFIG=true would refuse it)")
		}
	}
	return errors.Join(errs...)
}

// knownVars are the variables of every setting, the server's included:
// one set for `run` is not a typo.
func knownVars() []string {
	var c config
	var vars []string
	for _, s := range c.settings(true) {
		vars = append(vars, s.env)
	}
	return vars
}

// closest is the name in known nearest to name by edit distance.
func closest(name string, known []string) string {
	best, dist := "", -1
	for _, k := range known {
		if d := names.Distance(name, k); dist < 0 || d < dist {
			best, dist = k, d
		}
	}
	return best
}

// hostCPUs is how many CPUs this process may run on; tests replace it.
var hostCPUs = goruntime.NumCPU

// limitsTogether refuses limits that are each in range but cannot hold
// together, naming both settings.
func (c *config) limitsTogether() []error {
	var errs []error
	l := c.Limits
	if n := hostCPUs(); l.CPUs > float64(n) {
		errs = append(errs, fmt.Errorf("MCP_EXEC_CPUS (%v) is more than the %d CPUs this host has: the quota could never be used; at most %d", l.CPUs, n, n))
	}
	if l.TmpfsBytes > l.MemoryBytes {
		errs = append(errs, fmt.Errorf("MCP_EXEC_TMPFS_MB (%d MiB) must not exceed MCP_EXEC_MEMORY_MB (%d MiB): what /tmp holds counts against the memory limit, so the memory limit would kill the code long before /tmp is full",
			l.TmpfsBytes/mib, l.MemoryBytes/mib))
	}
	return errs
}
