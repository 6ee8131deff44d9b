package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// sandbox wires rootfs, bundle and runtime together: it is what the exec
// tool and the run subcommand call.
type sandbox struct {
	rt            runtime.Runtime
	bundleCfg     bundle.Config
	pythonVersion string
	log           *slog.Logger
}

// errSandboxStart marks failures to set up the sandbox at all, which the
// CLI reports with exit status 125.
var errSandboxStart = errors.New("sandbox unavailable")

// newSandbox creates the runtime (refusing when the host cannot give the
// full sandbox) and finds or builds the rootfs.
func newSandbox(ctx context.Context, cfg config, log *slog.Logger) (_ *sandbox, retErr error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rtCfg := runtime.Config{
		StateDir:      cfg.StateDir,
		Logger:        log,
		RunscPath:     cfg.RunscPath,
		RunscPlatform: cfg.RunscPlatform,
	}
	rt, err := runtime.New(cfg.Runtime, rtCfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errSandboxStart, err)
	}
	defer func() {
		if retErr != nil {
			rt.Close()
		}
	}()
	s := &sandbox{rt: rt, log: log}

	dir := cfg.Rootfs
	if dir == "" {
		py, err := rootfs.FindPython(ctx, cfg.Python)
		if err != nil {
			return nil, fmt.Errorf("%w: finding python (MCP_EXEC_PYTHON): %w", errSandboxStart, err)
		}
		start := time.Now()
		// A cached rootfs was proven at build time by running Python in a
		// real sandbox; it is not re-run on every start.
		dir, err = rootfs.Ensure(ctx, py, rootfs.Options{}, rootfs.DefaultCacheDir(), func(ctx context.Context, dir string) error {
			_, err := s.validateRootfs(ctx, dir, cfg.Limits)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("%w: preparing the default rootfs: %w", errSandboxStart, err)
		}
		s.pythonVersion = py.Version
		log.Debug("rootfs ready", "dir", dir, "python", py.Path, "elapsed", time.Since(start))
	} else {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, fmt.Errorf("%w: MCP_EXEC_ROOTFS: %w", errSandboxStart, err)
		}
		dir = abs
		if err := rootfs.Check(dir); err != nil {
			return nil, fmt.Errorf("%w: MCP_EXEC_ROOTFS=%s is not a usable rootfs: %w", errSandboxStart, dir, err)
		}
		// A rootfs of the operator's making is proven once per start.
		version, err := s.validateRootfs(ctx, dir, cfg.Limits)
		if err != nil {
			return nil, fmt.Errorf("%w: MCP_EXEC_ROOTFS=%s: %w", errSandboxStart, dir, err)
		}
		s.pythonVersion = version
	}
	s.bundleCfg = bundle.Config{Rootfs: dir, Python: rootfs.PythonPath, Limits: cfg.Limits}
	return s, nil
}

// validateRootfs runs the interpreter inside a real sandbox on dir and
// returns its version: a rootfs that cannot run Python there is refused.
func (s *sandbox) validateRootfs(ctx context.Context, dir string, limits policy.Limits) (string, error) {
	bcfg := bundle.Config{Rootfs: dir, Python: rootfs.PythonPath, Limits: limits}
	probe := "import sys, json, sqlite3, ssl, decimal, ctypes, multiprocessing\n" +
		"print('%d.%d.%d' % sys.version_info[:3])\n"
	res, err := s.runWith(ctx, bcfg, []byte(probe), nil, 60*time.Second, 64<<10)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 || res.TimedOut {
		return "", fmt.Errorf("python did not start in the sandbox (exit %d): %s",
			res.ExitCode, strings.TrimSpace(lastLines(res.Stderr, 3)))
	}
	return strings.TrimSpace(string(res.Stdout)), nil
}

// run runs code in a fresh container.
func (s *sandbox) run(ctx context.Context, code, stdin []byte, timeout time.Duration, maxOutput int64) (runtime.Result, error) {
	return s.runWith(ctx, s.bundleCfg, code, stdin, timeout, maxOutput)
}

func (s *sandbox) runWith(ctx context.Context, bcfg bundle.Config, code, stdin []byte, timeout time.Duration, maxOutput int64) (runtime.Result, error) {
	b, err := bundle.New(s.rt.BundleDir(), bcfg, bundle.Input{ID: uuid.NewString(), Code: code})
	if err != nil {
		return runtime.Result{}, fmt.Errorf("%w: creating bundle: %w", runtime.ErrSandbox, err)
	}
	return runtime.Run(ctx, s.rt, b, runtime.Request{Stdin: stdin, Timeout: timeout, MaxOutputBytes: maxOutput})
}

func (s *sandbox) close() error { return s.rt.Close() }

func lastLines(b []byte, n int) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
