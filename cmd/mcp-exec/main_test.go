package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/sirupsen/logrus"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// The test binary starts containers: libcontainer re-executes it as
// "<test binary> init", which init.go's init() turns into the container's
// init before any test code runs (it is part of this package, so of this
// binary too).
func TestMain(m *testing.M) {
	logrus.SetLevel(logrus.ErrorLevel) // as main does
	code := m.Run()
	shared.close()
	if binary.dir != "" {
		os.RemoveAll(binary.dir)
	}
	os.Exit(code)
}

// shared is the one sandbox the in-process tests use: creating one runs a
// probe container, and the tests vary only the server's own settings.
var shared sharedSandbox

type sharedSandbox struct {
	once     sync.Once
	sb       *engine
	stateDir string
	skip     string // why sandbox tests cannot run here
}

func (s *sharedSandbox) close() {
	if s.sb != nil {
		s.sb.close()
	}
	if s.stateDir != "" {
		os.RemoveAll(s.stateDir)
	}
}

// requireSandbox is the one place that decides whether a test that starts
// containers can run: it skips with the reason, or fails under CI=true,
// where a missing prerequisite is a broken build machine.
func requireSandbox(t testing.TB) *engine {
	t.Helper()
	testenv.Real(t)
	shared.once.Do(func() {
		if os.Geteuid() != 0 {
			shared.skip = fmt.Sprintf("starting containers needs root, running as uid %d", os.Geteuid())
			return
		}
		dir, err := os.MkdirTemp("", "mcp-exec-test-state-")
		if err != nil {
			shared.skip = err.Error()
			return
		}
		shared.stateDir = dir
		cfg := defaultConfig()
		cfg.StateDir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if shared.sb, err = newEngine(ctx, cfg, nil); err != nil {
			shared.skip = "the sandbox cannot start on this host: " + err.Error()
		}
	})
	if shared.skip != "" {
		testenv.Missing(t, "%s", shared.skip)
	}
	return shared.sb
}

// testConfig is the default configuration with the shared sandbox's state.
func testConfig() config {
	cfg := defaultConfig()
	cfg.StateDir = shared.stateDir
	return cfg
}

// binaryPath builds mcp-exec once, as make build does, so that the tests
// of the whole binary do not depend on the order of make targets.
var binary struct {
	once sync.Once
	path string
	err  error
	dir  string
}

func binaryPath(t testing.TB) string {
	t.Helper()
	binary.once.Do(func() {
		binary.dir, binary.err = os.MkdirTemp("", "mcp-exec-test-bin-")
		if binary.err != nil {
			return
		}
		binary.path = filepath.Join(binary.dir, "mcp-exec")
		// As make build does: static, as the binary is the sandbox's init.
		cmd := exec.Command("go", "build", "-tags", "seccomp netgo osusergo", "-ldflags", "-extldflags=-static", "-o", binary.path, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			binary.err = fmt.Errorf("building mcp-exec: %v\n%s", err, out)
		}
	})
	if binary.err != nil {
		t.Fatal(binary.err)
	}
	return binary.path
}

// instances lists the server instance ids under a state dir.
func instances(t testing.TB, stateDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(stateDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && uuid.Validate(e.Name()) == nil {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// leftovers lists what the calls of one instance still hold: container
// state, bundles, and call cgroups under any controller.
func leftovers(stateDir, instance string) []string {
	var left []string
	for _, sub := range []string{"containers", "bundles"} {
		entries, _ := os.ReadDir(filepath.Join(stateDir, instance, sub))
		for _, e := range entries {
			left = append(left, filepath.Join(sub, e.Name()))
		}
	}
	var cgroups []string
	for _, pattern := range []string{"/sys/fs/cgroup/*/mcp-exec/" + instance + "/*", "/sys/fs/cgroup/mcp-exec/" + instance + "/*"} {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() {
				cgroups = append(cgroups, m)
			}
		}
	}
	if len(cgroups) > 0 {
		left = append(left, fmt.Sprintf("%d cgroups such as %s", len(cgroups), cgroups[0]))
	}
	return left
}

// waitNoContainers waits until no call of any instance under stateDir
// holds anything, and fails the test if that takes longer than d.
func waitNoContainers(t testing.TB, stateDir string, d time.Duration) {
	t.Helper()
	var left []string
	defer func() {
		if len(left) > 0 {
			t.Logf("calls still held: %s", strings.Join(left, ", "))
		}
	}()
	testenv.EventuallyWithin(t, d, "no call to hold anything", func() bool {
		left = nil
		for _, id := range instances(t, stateDir) {
			left = append(left, leftovers(stateDir, id)...)
		}
		return len(left) == 0
	})
}

// waitContainers waits until n containers run under stateDir.
func waitContainers(t testing.TB, stateDir string, n int, d time.Duration) {
	t.Helper()
	testenv.EventuallyWithin(t, d, fmt.Sprintf("%d containers to run", n), func() bool {
		got := 0
		for _, id := range instances(t, stateDir) {
			entries, _ := os.ReadDir(filepath.Join(stateDir, id, "containers"))
			got += len(entries)
		}
		return got >= n
	})
}

// assertGone checks that a stopped server left nothing: no instance dir
// under its state dir, no cgroup of its instance.
func assertGone(t testing.TB, stateDir string, instance string) {
	t.Helper()
	entries, err := os.ReadDir(stateDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("state dir %s: %s left behind", stateDir, e.Name())
	}
	if instance == "" {
		return
	}
	for _, pattern := range []string{"/sys/fs/cgroup/*/mcp-exec/" + instance, "/sys/fs/cgroup/mcp-exec/" + instance} {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			t.Errorf("cgroup %s left behind", m)
		}
	}
}
