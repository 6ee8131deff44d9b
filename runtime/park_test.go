package runtime_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// Parked sessions (runsc): a frozen session idle past its Park is saved
// to disk and its sandbox ended; its next call restores it where it
// stood. The session tests run on a session parked after a millisecond
// too (forEachSessionRuntime's runsc-parked).

// newParkedHarness is a runsc harness whose sessions park after park,
// their images in a dir of the test's.
func newParkedHarness(t *testing.T, park time.Duration) *harness {
	t.Helper()
	testenv.Real(t)
	dir := filepath.Join(t.TempDir(), "parked") // made by the runtime, 0700
	// As a server runs runsc: its calls forked, its sessions gVisor
	// sandboxes of their own (runtime.SessionPreparer).
	h := newHarnessConfig(t, runtime.Runsc, policy.DefaultLimits(), runtime.Config{ParkDir: dir, Fork: runtime.ForkConfig{Enabled: true}})
	h.sessions.Park = park
	t.Cleanup(func() {
		// Nothing of a parked session outlives it: not its image.
		// (The instance's lock file is the runtime's, which goes with it.)
		left, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
		left = slices.DeleteFunc(left, func(p string) bool { return filepath.Base(p) == ".lock" })
		if len(left) != 0 {
			t.Errorf("parked images left after the runtime closed: %v", left)
		}
	})
	return h
}

// awaitParked waits for s to be parked.
func awaitParked(t *testing.T, s interface{ Parked() bool }) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !s.Parked() {
		if time.Now().After(deadline) {
			t.Fatalf("the session was not parked within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSessionParkedHoldsNoMemory: parked, a session's sandbox has no
// process left and its image is on disk; restored, it goes on with all it
// had: variables, a thread it started, its /tmp, its pid, and its memory
// limit.
func TestSessionParkedHoldsNoMemory(t *testing.T) {
	h := newParkedHarness(t, 50*time.Millisecond)
	s := h.newSession()
	res := s.run("import os, threading, time\nticks = []\nthreading.Thread(target=lambda: [ticks.append(1) or time.sleep(0.001) for _ in iter(int, 1)], daemon=True).start()\nopen('/tmp/kept', 'w').write('k')\nblob = bytearray(32 << 20)\npid = os.getpid()\nlen(blob)")
	if res.ExitCode != 0 || string(res.Value) != "33554432" {
		t.Fatalf("first call: exit %d, value %q, stderr %s", res.ExitCode, res.Value, res.Stderr)
	}
	awaitParked(t, s)
	cg := runtime.SessionCgroups(s.Session)
	for _, p := range cg {
		if data, _ := os.ReadFile(filepath.Join(p, "cgroup.procs")); len(strings.TrimSpace(string(data))) != 0 {
			t.Errorf("parked, the session's cgroup %s still holds processes %s", p, data)
		}
	}
	if mem := filepath.Join(cg["memory"], "memory.usage_in_bytes"); cg["memory"] != "" {
		if b, err := os.ReadFile(mem); err == nil {
			if n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); n > 5<<20 {
				t.Errorf("parked, the session's cgroup still charges %d bytes", n)
			}
		}
	}
	images, _ := filepath.Glob(filepath.Join(runtime.ParkDir(h.rt), "*", "*", "*.img"))
	if len(images) == 0 {
		t.Errorf("parked, no image in %s", runtime.ParkDir(h.rt))
	}
	res = s.run("n = len(ticks)\ntime.sleep(0.2)\nprint(len(blob), open('/tmp/kept').read(), os.getpid() == pid, len(ticks) > n)")
	if got := string(res.Stdout); got != "33554432 k True True\n" || res.Ended != "" {
		t.Errorf("restored: stdout %q, ended %q, stderr %s", got, res.Ended, res.Stderr)
	}
	if images, _ := filepath.Glob(filepath.Join(runtime.ParkDir(h.rt), "*", "*-*")); len(images) != 0 {
		t.Errorf("restored, the image is still on disk: %v", images)
	}
	// The limits hold after a restore: the memory limit ends the session.
	awaitParked(t, s)
	res = s.run("x = bytearray(10 << 30)")
	if !res.OOMKilled || res.Ended != runtime.EndOOM {
		t.Errorf("past the memory limit after a restore: oom %v, ended %q, exit %d", res.OOMKilled, res.Ended, res.ExitCode)
	}
}

// TestSessionParkedRestoreFailureEnds: a session whose image cannot be
// restored ends, its call failing with the reason, and never runs in
// another state.
func TestSessionParkedRestoreFailureEnds(t *testing.T) {
	h := newParkedHarness(t, 50*time.Millisecond)
	s := h.newSession()
	if res := s.run("x = 1"); res.ExitCode != 0 {
		t.Fatalf("first call: exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	awaitParked(t, s)
	images, _ := filepath.Glob(filepath.Join(runtime.ParkDir(h.rt), "*", "*", "checkpoint.img"))
	if len(images) != 1 {
		t.Fatalf("parked: images %v", images)
	}
	if err := os.WriteFile(images[0], []byte("not an image"), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := s.Run(context.Background(), runtime.Request{Code: []byte("print(x)"), Timeout: 10 * time.Second, MaxOutputBytes: 1000})
	if err == nil || !strings.Contains(err.Error(), "restoring the parked session") {
		t.Errorf("a call to a session that cannot be restored: %v (stdout %q), want an error saying so", err, res.Stdout)
	}
	if len(res.Stdout) != 0 {
		t.Errorf("a session that was not restored ran code: stdout %q", res.Stdout)
	}
	if _, err := s.Run(context.Background(), runtime.Request{Code: []byte("print(x)"), Timeout: 10 * time.Second, MaxOutputBytes: 1000}); err == nil {
		t.Errorf("the next call ran")
	}
}

// TestSessionParkDirNotPrivateIsRefused: a park dir someone else could
// enter (or made first, in /var/tmp) is never written to: the session
// stays frozen, in memory, and says why in the log.
func TestSessionParkDirNotPrivateIsRefused(t *testing.T) {
	testenv.Real(t)
	dir := filepath.Join(t.TempDir(), "parked")
	if err := os.Mkdir(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	// As a server runs runsc: its calls forked, its sessions gVisor
	// sandboxes of their own (runtime.SessionPreparer).
	h := newHarnessConfig(t, runtime.Runsc, policy.DefaultLimits(), runtime.Config{ParkDir: dir, Fork: runtime.ForkConfig{Enabled: true}})
	logs := &logLines{}
	h.sessions.Park = time.Millisecond
	h.sessions.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s := h.newSession()
	s.parks = false // it is never parked
	if res := s.run("x = 7"); res.ExitCode != 0 {
		t.Fatalf("first call: exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "could not be parked") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal logged within 30 s; log: %s", logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(logs.String(), "mode 0700") {
		t.Errorf("the refusal does not say what the park dir must be: %s", logs.String())
	}
	if s.Parked() {
		t.Errorf("the session was parked into a dir anyone may enter")
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*", "*")); len(left) != 0 {
		t.Errorf("written into a park dir anyone may enter: %v", left)
	}
	if res := s.run("print(x)"); string(res.Stdout) != "7\n" {
		t.Errorf("the frozen session's next call: stdout %q, stderr %s", res.Stdout, res.Stderr)
	}
}

// TestSessionParkRetried: a park that failed is tried again, later: a
// session whose checkpoint failed once (here: its park dir was not
// private, until the operator fixed it) is parked by a later try rather
// than left frozen, holding its memory, until a call that may never come.
func TestSessionParkRetried(t *testing.T) {
	testenv.Real(t)
	dir := filepath.Join(t.TempDir(), "parked")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	h := newHarnessConfig(t, runtime.Runsc, policy.DefaultLimits(), runtime.Config{ParkDir: dir, Fork: runtime.ForkConfig{Enabled: true}})
	logs := &logLines{}
	// Tries at 0.3, 0.9, 2.1 and 4.5 s of idleness: time enough for the
	// fix below to come between the first and the last on a busy machine.
	h.sessions.Park = 300 * time.Millisecond
	h.sessions.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s := h.newSession()
	s.parks = false // the harness's own wait for a park: this test waits itself
	if res := s.run("x = 7"); res.ExitCode != 0 {
		t.Fatalf("first call: exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), "could not be parked") {
		if time.Now().After(deadline) {
			t.Fatalf("no failed park logged within 30 s; log: %s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); !s.Parked(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the session was not parked by a later try within 30 s; log: %s", logs.String())
		}
	}
	if res := s.run("print(x)"); string(res.Stdout) != "7\n" {
		t.Errorf("restored after a retried park: stdout %q, stderr %s", res.Stdout, res.Stderr)
	}
}

// logLines is a log the test reads while it is written.
type logLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// A server that starts beside a live one, with a state dir of its own
// and the same park dir (two operators' servers, or a restart of one of
// several), leaves the live one's parked images be: its session, restored,
// has what it had. Only a dead instance's images are swept.
func TestSessionParkedSurvivesAnotherServer(t *testing.T) {
	h := newParkedHarness(t, 50*time.Millisecond)
	s := h.newSession()
	if res := s.run("kept = 41"); res.ExitCode != 0 {
		t.Fatalf("first call: exit %d, stderr %s", res.ExitCode, res.Stderr)
	}
	awaitParked(t, s)
	other, err := runtime.New(runtime.Runsc, runtime.Config{StateDir: filepath.Join(t.TempDir(), "other-state"), ParkDir: runtime.ParkDir(h.rt)})
	if err != nil {
		t.Fatalf("starting another runtime on the same park dir: %v", err)
	}
	defer other.Close()
	if res := s.run("kept + 1"); res.ExitCode != 0 || string(res.Value) != "42" {
		t.Errorf("after another server started: exit %d, value %q, stderr %s; want the session restored", res.ExitCode, res.Value, res.Stderr)
	}
}
