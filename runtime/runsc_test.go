package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// These tests run real gVisor sandboxes through runsc. The sandbox-property
// suite (sandbox_test.go) covers both runtimes; what is here is specific to
// runsc: its process tree, its verdict mapping, its seccomp translation, its
// teardown. Where gVisor legitimately differs from libcontainer, the test
// says so and asserts the gVisor expectation.

// runscHarness is a harness on the runsc runtime as a server runs it,
// each sandbox a fork of a template (runsc_fork.go), or a skip (a
// failure under CI=true) naming what this host lacks for it.
func runscHarness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	testenv.Parallel(t)
	testRootfs(t)
	if err := runtime.RunscUsable(runtime.Config{}); err != nil {
		need(t, "%v", err)
	}
	return newForkHarnessKind(t, runtime.Runsc, limits)
}

// runscFreshHarness is runscHarness with a gVisor sandbox per call
// (MCP_EXEC_FORK=false).
func runscFreshHarness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	testenv.Parallel(t)
	testRootfs(t)
	if err := runtime.RunscUsable(runtime.Config{}); err != nil {
		need(t, "%v", err)
	}
	return newHarness(t, runtime.Runsc, limits)
}

// assertNoRunsc checks that no runsc process of this runtime instance is
// left: `runsc run`, the sandbox and the gofer all carry its --root. With
// forking, only the templates' are left, each holding its init and its
// zygote and nothing else: nothing of a call outlives it in there.
func assertNoRunsc(t *testing.T, h *harness) {
	t.Helper()
	rootDir := filepath.Join(runtime.InstanceDir(h.rt), "runsc")
	root := "--root=" + rootDir
	var left []string
	testenv.EventuallyWithin(t, time.Second, "no runsc process of the runtime to be left", func() bool {
		left = left[:0]
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && bytes.Contains(cmd, []byte(root+"\x00")) {
				if st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); bytes.Contains(st, []byte(") Z ")) {
					continue // a zombie holds nothing; its parent reaps it
				}
				if bytes.Contains(cmd, []byte("\x00"+runtime.TemplatePrefix)) {
					continue // a template's, checked below
				}
				left = append(left, e.Name()+": "+string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
			}
		}
		return len(left) == 0
	})
	if len(left) > 0 {
		t.Errorf("runsc processes left: %q", left)
	}
	states, _ := filepath.Glob(filepath.Join(rootDir, runtime.TemplatePrefix+"*_sandbox:*.state"))
	for _, st := range states {
		id := strings.SplitN(filepath.Base(st), "_sandbox:", 2)[0]
		var procs []string
		testenv.EventuallyWithin(t, 2*time.Second, "the template's sandbox to hold only its init and zygote", func() bool {
			out, err := exec.Command(runtime.RunscPath(h.rt), "--root="+rootDir, "ps", id).CombinedOutput()
			if err != nil {
				procs = []string{err.Error(), string(out)}
				return !templateAlive(rootDir, id) // retired meanwhile
			}
			procs = strings.Split(strings.TrimSpace(string(out)), "\n")[1:]
			return len(procs) == 2
		})
	}
}

// templateAlive: runsc still has state of the template id.
func templateAlive(rootDir, id string) bool {
	m, _ := filepath.Glob(filepath.Join(rootDir, id+"_sandbox:*.state"))
	return len(m) > 0
}

func TestRunscPrint(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	res := h.mustRun("print(1)")
	if string(res.Stdout) != "1\n" || len(res.Stderr) != 0 || res.ExitCode != 0 {
		t.Errorf("print(1): stdout %q stderr %q exit %d, want \"1\\n\", \"\", 0", res.Stdout, res.Stderr, res.ExitCode)
	}
	if res.TimedOut || res.OOMKilled || res.StdoutTruncated || res.StderrTruncated {
		t.Errorf("print(1): verdict %+v, want no timeout, OOM or truncation", res)
	}
	if res.PeakMemoryBytes <= 0 {
		t.Errorf("print(1): peak memory %d, want it read from the call's cgroup", res.PeakMemoryBytes)
	}
	// A print(1) may run between two of the kernel's updates of the
	// cgroup's CPU count (a tick or a switch of the sentry's threads), and
	// be counted 0 on a busy machine: code that runs for a while is not.
	if res := h.mustRun("sum(range(3_000_000))"); res.CPUTime <= 0 {
		t.Errorf("a CPU loop: CPU time %v, want it read from the call's cgroup", res.CPUTime)
	}
	assertNoRunsc(t, h)
}

func TestRunscExitCodes(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	for _, tc := range []struct {
		name, code string
		want       int
	}{
		{"zero", "pass", 0},
		{"exit 3", "import sys; sys.exit(3)", 3},
		{"uncaught exception", "raise SystemError('x')", 1},
		// runsc itself exits 128 when it fails; a program that does so
		// must still be a normal result, told apart by runsc's error log.
		{"exit 128", "import sys; sys.exit(128)", 128},
		{"exit 255", "import os; os._exit(255)", 255},
		{"SIGSEGV", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 128 + 11},
		{"SIGKILL", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 128 + 9},
		{"SIGTERM", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 128 + 15},
	} {
		// Cases of one sandbox property, in one harness: errors name them.
		res, err := h.run(tc.code)
		if err != nil {
			t.Fatalf("%s: Run(%q): %v", tc.name, tc.code, err)
		}
		if res.ExitCode != tc.want || res.TimedOut || res.OOMKilled {
			t.Errorf("%s: Run(%q): exit %d timed_out %v oom %v, want exit %d and neither", tc.name, tc.code, res.ExitCode, res.TimedOut, res.OOMKilled, tc.want)
		}
		if wantSig := max(0, tc.want-128); strings.HasPrefix(tc.name, "SIG") && res.Signal != wantSig || !strings.HasPrefix(tc.name, "SIG") && res.Signal != 0 {
			t.Errorf("%s: Run(%q): signal %d, want %d", tc.name, tc.code, res.Signal, wantSig)
		}
	}
	assertNoRunsc(t, h)
}

func TestRunscStdin(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	res := h.mustRun("import sys; d = sys.stdin.read(); print(len(d), d[:5], d[-5:])", withStdin([]byte("hello"+strings.Repeat("x", 200000)+"world")))
	if got, want := string(res.Stdout), "200010 hello world\n"; got != want {
		t.Errorf("stdin echo: %q, want %q (stderr %q)", got, want, res.Stderr)
	}
	// EOF after stdin: input() at the end raises EOFError.
	res = h.mustRun("print(input()); input()", withStdin([]byte("one\n")))
	if string(res.Stdout) != "one\n" || !bytes.Contains(res.Stderr, []byte("EOFError")) {
		t.Errorf("stdin then EOF: stdout %q stderr %q, want \"one\\n\" and EOFError", res.Stdout, res.Stderr)
	}
	// A program that never reads a large stdin is neither blocked nor
	// blocks the call.
	res = h.mustRun("print('ignored')", withStdin(bytes.Repeat([]byte("y"), 1<<20)))
	if string(res.Stdout) != "ignored\n" || res.ExitCode != 0 {
		t.Errorf("unread stdin: stdout %q exit %d, want \"ignored\\n\" 0", res.Stdout, res.ExitCode)
	}
}

func TestRunscTimeoutKillsEverything(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	code := `import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        while True: pass
    time.sleep(1000)
print("started", flush=True)
time.sleep(1000)`
	start := time.Now()
	// gVisor's boot counts against the limit and takes well over a second
	// on a loaded machine: leave the code time to print first.
	res, err := h.run(code, withTimeout(4*time.Second))
	elapsed := time.Since(start)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if !res.TimedOut || res.ExitCode != 128+9 {
		t.Errorf("timed out %v exit %d, want true and 137", res.TimedOut, res.ExitCode)
	}
	if !bytes.Contains(res.Stdout, []byte("started")) {
		t.Errorf("stdout %q: want what was written before the kill", res.Stdout)
	}
	// gVisor's boot counts against the limit; teardown must be prompt.
	if elapsed > 12*time.Second {
		t.Errorf("a 4 s timeout took %v from Run to torn down, want < 12 s", elapsed)
	}
	assertNoRunsc(t, h)
}

func TestRunscCancelKillsAtOnce(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	ctx, cancel := context.WithCancel(context.Background())
	var cancelled atomic.Int64
	time.AfterFunc(1500*time.Millisecond, func() { cancelled.Store(time.Now().UnixNano()); cancel() })
	_, err := h.run("import time; time.sleep(1000)", withContext(ctx), withTimeout(time.Minute))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Run after cancel: err %v, want context.Canceled", err)
	}
	// From the cancel, not the start: gVisor's boot on a busy machine is
	// not what this measures.
	if elapsed := time.Since(time.Unix(0, cancelled.Load())); elapsed > 6*time.Second {
		t.Errorf("cancel took %v to tear down, want < 6 s", elapsed)
	}
	assertNoRunsc(t, h)
}

// An OOM kill usually takes the whole gVisor sandbox (the host kernel kills
// the sentry, which holds the code's memory): the status is 137 and the
// call's memory cgroup is what says it was the limit.
func TestRunscOOM(t *testing.T) {
	limits := policy.DefaultLimits()
	limits.MemoryBytes = 96 << 20
	h := runscHarness(t, limits)
	for _, tc := range []struct{ name, code string }{
		{"heap", "x = bytearray(1 << 30); print('survived')"},
		// gVisor's tmpfs lives in the sentry's memory: its pages count.
		{"tmpfs", "f = open('/tmp/f', 'wb')\nfor i in range(60): f.write(b'x' * (1 << 20))\nx = bytearray(60 << 20)\nprint('survived')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := h.run(tc.code)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !res.OOMKilled || res.ExitCode != 128+9 || bytes.Contains(res.Stdout, []byte("survived")) {
				t.Errorf("oom_killed %v exit %d stdout %q, want true, 137, nothing", res.OOMKilled, res.ExitCode, res.Stdout)
			}
		})
	}
	// A program that kills itself with SIGKILL is not an OOM.
	res := h.mustRun("import os; os.kill(os.getpid(), 9)")
	if res.OOMKilled || res.ExitCode != 137 {
		t.Errorf("self-SIGKILL: oom_killed %v exit %d, want false 137", res.OOMKilled, res.ExitCode)
	}
	assertNoRunsc(t, h)
}

// A call whose output files cost gVisor's tmpfs more memory than is left
// once the code has exited (some 2.5 KB an inode) meets its memory limit
// while the init collects them: the verdict says both, the exit and the
// OOM kill, and the result says the files were lost rather than that
// there were none (red team 3, F3).
func TestRunscOOMWhileCollectingFilesSaysSo(t *testing.T) {
	limits := policy.DefaultLimits()
	limits.MemoryBytes = 256 << 20
	h := runscHarness(t, limits)
	res := h.mustRun(`import os
for d in range(30):
    p = "/tmp/outputs/d%02d" % d
    os.mkdir(p)
    for i in range(4000):
        os.close(os.open("%s/f%05d" % (p, i), os.O_CREAT | os.O_WRONLY, 0o644))
print("made")`, withTimeout(60*time.Second))
	if string(res.Stdout) != "made\n" || res.ExitCode != 0 || !res.OOMKilled {
		t.Fatalf("120,000 files under a 256 MiB limit: stdout %q, exit %d, oom %v; want the code to finish and the limit to be met after", res.Stdout, res.ExitCode, res.OOMKilled)
	}
	if !strings.Contains(string(res.Stderr), "before its output files were all collected (the memory limit killed it)") {
		t.Errorf("the files lost to the OOM kill are not said: files %d, stderr %q", len(res.Files), res.Stderr)
	}
}

func TestRunscOutputFloodIsTruncatedPromptly(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	const total = 64 << 20
	start := time.Now()
	res := h.mustRun(fmt.Sprintf(`import sys
b = b"x" * (1 << 20)
for _ in range(%d): sys.stdout.buffer.write(b)
sys.stdout.flush()
print("stderr done", file=sys.stderr)`, total>>20), withMaxOutput(64<<10))
	elapsed := time.Since(start)
	if !res.StdoutTruncated || len(res.Stdout) != 64<<10 || res.StdoutBytes != total {
		t.Errorf("stdout: truncated %v kept %d counted %d, want true, %d, %d", res.StdoutTruncated, len(res.Stdout), res.StdoutBytes, 64<<10, total)
	}
	if res.ExitCode != 0 || res.TimedOut || string(res.Stderr) != "stderr done\n" {
		t.Errorf("exit %d timed out %v stderr %q: the program must run to its end, unblocked", res.ExitCode, res.TimedOut, res.Stderr)
	}
	if elapsed > 20*time.Second {
		t.Errorf("64 MiB of output took %v, want < 20 s", elapsed)
	}
}

// gVisor's kernel implements ptrace, user namespaces and more in the
// sandbox itself; with --oci-seccomp the bundle's filter still answers
// EPERM, and clone3 answers ENOSYS so that threads start through clone.
func TestRunscSeccompInsideGVisor(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	var got map[string][2]int
	h.probe(`import ctypes, json, os, threading
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == 0 and nr == 56:
        os._exit(0)
    return [r, ctypes.get_errno()]
out = {
  "ptrace": call(101, 0, 0, 0, 0),
  "unshare CLONE_NEWUSER": call(272, 0x10000000),
  "clone CLONE_NEWUSER": call(56, 0x10000000 | 17, 0, 0, 0, 0),
  "clone CLONE_PARENT": call(56, 0x8000 | 17, 0, 0, 0, 0),
  "keyctl": call(250, 0, -3, 0),
  "mount": call(165, 0, 0, 0, 0, 0),
  "bpf": call(321, 0, 0, 0),
  "setns": call(308, -1, 0),
  "clone3": call(435, 0, 0),
}
t = threading.Thread(target=lambda: None); t.start(); t.join()
pid = os.fork()
if pid == 0: os._exit(7)
out["thread and fork"] = [0, os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])]
print(json.dumps(out))`, &got)
	for name, r := range got {
		want := [2]int{-1, 1} // EPERM
		switch name {
		case "clone3":
			want = [2]int{-1, 38} // ENOSYS
		case "thread and fork":
			want = [2]int{0, 7}
		}
		if r != want {
			t.Errorf("%s: got %v, want %v", name, r, want)
		}
	}
	if len(got) != 10 {
		t.Errorf("probe answered %d calls, want 10: %v", len(got), got)
	}
}

// gVisor-specific: /proc/self/status has no NoNewPrivs or CapAmb line, so
// no_new_privs is read with prctl, and gVisor has no ambient capabilities
// at all (PR_CAP_AMBIENT fails with EINVAL).
func TestRunscIdentityCapsNetwork(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	var got struct {
		UID, GID, EUID, EGID int
		Groups               []int
		Status               map[string]string
		NNP                  int
		Bounding             []int
		Ifaces               []string
		Connect              int
		Hostname             string
	}
	h.probe(`import ctypes, errno, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
st = dict((k, v.strip()) for k, v in (l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l))
s = socket.socket(); s.settimeout(2)
try:
    s.connect(("1.1.1.1", 53)); c = 0
except OSError as e:
    c = e.errno
print(json.dumps({"UID": os.getuid(), "GID": os.getgid(), "EUID": os.geteuid(), "EGID": os.getegid(),
  "Groups": os.getgroups(), "Status": st, "NNP": libc.prctl(39, 0, 0, 0, 0),
  "Bounding": [c for c in range(41) if libc.prctl(23, c, 0, 0, 0) == 1],
  "Ifaces": [n for _, n in socket.if_nameindex()], "Connect": c, "Hostname": socket.gethostname()}))`, &got)
	if got.UID != policy.UID || got.EUID != policy.UID || got.GID != policy.GID || got.EGID != policy.GID || len(got.Groups) != 0 {
		t.Errorf("ids uid %d euid %d gid %d egid %d groups %v, want %d and no groups", got.UID, got.EUID, got.GID, got.EGID, got.Groups, policy.UID)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapBnd"} {
		if got.Status[k] != "0000000000000000" {
			t.Errorf("%s = %q, want 0000000000000000", k, got.Status[k])
		}
	}
	if got.Status["Seccomp"] != "2" {
		t.Errorf("Seccomp = %q, want 2: --oci-seccomp must install the bundle's filter", got.Status["Seccomp"])
	}
	if got.NNP != 1 {
		t.Errorf("prctl(PR_GET_NO_NEW_PRIVS) = %d, want 1", got.NNP)
	}
	if len(got.Bounding) != 0 {
		t.Errorf("capabilities in the bounding set: %v, want none", got.Bounding)
	}
	if len(got.Ifaces) != 1 || got.Ifaces[0] != "lo" {
		t.Errorf("interfaces %v, want only lo", got.Ifaces)
	}
	if got.Connect == 0 {
		t.Errorf("connect to 1.1.1.1:53 succeeded, want a failure")
	}
	if got.Hostname != policy.Hostname {
		t.Errorf("hostname %q, want %q", got.Hostname, policy.Hostname)
	}
}

// The limits are enforced by the host's cgroups on the sandbox's host
// processes. gVisor-specific for pids: threads of the code are not host
// tasks (they are bounded by memory), processes are (one ptrace stub each),
// and when the host limit is hit the sentry cannot start a thread and the
// whole sandbox ends, instead of fork failing with EAGAIN.
func TestRunscLimits(t *testing.T) {
	limits := policy.DefaultLimits()
	limits.CPUs = 0.25
	limits.Pids = 64
	h := runscHarness(t, limits)

	res := h.mustRun("import time\nend = time.time() + 2\nwhile time.time() < end: pass")
	if ratio := float64(res.CPUTime) / float64(res.Duration); res.CPUTime <= 0 || ratio > 0.25*1.6 {
		t.Errorf("CPU time %v over %v (%.2f cores), want ≤ 0.25 × 1.6 cores under a 0.25 quota", res.CPUTime, res.Duration, ratio)
	}

	res = h.mustRun(`import os, time
for i in range(500):
    if os.fork() == 0:
        time.sleep(30); os._exit(0)
print("forked 500", flush=True)`, withTimeout(60*time.Second))
	if bytes.Contains(res.Stdout, []byte("forked 500")) || res.ExitCode == 0 || res.TimedOut {
		t.Errorf("fork bomb under pids=64: exit %d timed out %v stdout %q, want the sandbox ended early", res.ExitCode, res.TimedOut, res.Stdout)
	}
	assertNoRunsc(t, h)
}

// A sandbox runsc cannot create is an error (ErrSandbox, with runsc's own
// message), not a result, and leaves nothing behind.
func TestRunscSandboxFailureIsAnError(t *testing.T) {
	t.Run("fresh", func(t *testing.T) { testRunscSandboxFailure(t, runscFreshHarness(t, policy.DefaultLimits())) })
	// A template that cannot start either: the call gets a gVisor
	// sandbox of its own, whose failure is the call's error.
	t.Run("forked", func(t *testing.T) {
		runscHarness(t, policy.DefaultLimits()) // the skip, where runsc is missing
		testRunscSandboxFailure(t, newForkHarnessConfigKind(t, runtime.Runsc, policy.DefaultLimits(), runtime.ForkConfig{Enabled: true}, false))
	})
}

func testRunscSandboxFailure(t *testing.T, h *harness) {
	cfg := h.cfg
	cfg.Rootfs = filepath.Join(t.TempDir(), "no-such-rootfs")
	if err := os.Mkdir(cfg.Rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := bundle.New(runtime.BundleDir(h.rt), cfg, uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	res, err := runtime.RunBundle(context.Background(), h.rt, b, runtime.Request{Code: []byte("print(1)"), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
	if !errors.Is(err, runtime.ErrSandbox) || !strings.Contains(err.Error(), "the interpreter did not start") || !strings.Contains(err.Error(), "No such file") {
		t.Errorf("Run on an empty rootfs: res %+v err %v, want ErrSandbox saying the interpreter could not start", res, err)
	}
	h.assertClean(b)
	assertNoRunsc(t, h)
}

// TestRunscDeadServerIsSwept kills a server (a child test process) in the
// middle of a call and checks that its sandbox dies with it, and that the
// next runtime on the same state dir removes everything it left.
func TestRunscDeadServerIsSwept(t *testing.T) {
	if dir := os.Getenv("MCP_EXEC_TEST_DEAD_SERVER"); dir != "" {
		deadServer(t, dir)
		return
	}
	testRootfs(t)
	if err := runtime.RunscUsable(runtime.Config{}); err != nil {
		need(t, "%v", err)
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(os.Args[0], "-test.run=^TestRunscDeadServerIsSwept$", "-test.v")
	cmd.Env = append(os.Environ(), "MCP_EXEC_TEST_DEAD_SERVER="+stateDir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var inst string
	buf := make([]byte, 4096)
	var seen []byte
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && inst == "" {
		n, err := out.Read(buf)
		seen = append(seen, buf[:n]...)
		if i := bytes.Index(seen, []byte("RUNNING ")); i >= 0 {
			if j := bytes.IndexByte(seen[i:], '\n'); j > 0 {
				inst = string(seen[i+len("RUNNING ") : i+j])
			}
		}
		if err != nil {
			break
		}
	}
	if inst == "" {
		t.Fatalf("the server never reported a running call: %s", seen)
	}
	root := "--root=" + filepath.Join(stateDir, inst, "runsc") + "\x00"
	if n := countProcs(root); n < 3 {
		t.Fatalf("%d runsc processes for the running call, want run, sandbox and gofer", n)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	// The parent-death chain: server → runsc run → sandbox and gofer.
	testenv.EventuallyWithin(t, 5*time.Second, "the runsc processes to die with their server", func() bool { return countProcs(root) == 0 })
	rt, err := runtime.New(runtime.Runsc, runtime.Config{StateDir: stateDir})
	if err != nil {
		t.Fatalf("runtime.New on the dead server's state dir: %v", err)
	}
	if _, err := os.Stat(filepath.Join(stateDir, inst)); !os.IsNotExist(err) {
		t.Errorf("the dead instance's dir is still there (err %v)", err)
	}
	assertNoCgroups(t, inst, false)
	if err := rt.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// deadServer is the child of TestRunscDeadServerIsSwept: it starts a call
// that never ends, says so, and waits to be killed.
func deadServer(t *testing.T, stateDir string) {
	rt, err := runtime.New(runtime.Runsc, runtime.Config{StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	py, err := rootfs.FindPython(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	dir, err := rootfs.Ensure(context.Background(), py, rootfs.Options{}, rootfs.DefaultCacheDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testBundleConfig(dir, rt, policy.DefaultLimits())
	b, err := bundle.New(runtime.BundleDir(rt), cfg, uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	sb, err := runtime.PrepareBundle(context.Background(), rt, b)
	if err != nil {
		t.Fatal(err)
	}
	// Prepared: the sandbox has booted and its interpreter waits.
	fmt.Printf("RUNNING %s\n", runtime.InstanceID(rt))
	sb.Run(context.Background(), runtime.Request{Code: []byte("print('up', flush=True)\nimport time; time.sleep(1000)"),
		Timeout: 10 * time.Minute, MaxOutputBytes: 1 << 20})
	t.Fatal("the call ended before the server was killed")
}

func countProcs(arg string) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmd, []byte(arg)) {
			continue
		}
		if st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); bytes.Contains(st, []byte(") Z ")) {
			continue
		}
		n++
	}
	return n
}

// Calls run in parallel, each in its own sandbox with its own streams.
func TestRunscConcurrentCalls(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	const n = 4
	type out struct {
		i   int
		res runtime.Result
		err error
	}
	ch := make(chan out, n)
	for i := 0; i < n; i++ {
		go func() {
			b, err := bundle.New(runtime.BundleDir(h.rt), h.cfg, uuid.NewString())
			if err != nil {
				ch <- out{i: i, err: err}
				return
			}
			res, err := runtime.RunBundle(context.Background(), h.rt, b, runtime.Request{
				Code:    []byte(fmt.Sprintf("import sys; print(%d); print(sys.stdin.read(), file=sys.stderr)", i)),
				Stdin:   []byte(fmt.Sprint("in", i)),
				Timeout: 60 * time.Second, MaxOutputBytes: 1 << 20})
			ch <- out{i, res, err}
		}()
	}
	for k := 0; k < n; k++ {
		o := <-ch
		if o.err != nil {
			t.Errorf("call %d: %v", o.i, o.err)
			continue
		}
		if got, want := string(o.res.Stdout)+string(o.res.Stderr), fmt.Sprintf("%d\nin%d\n", o.i, o.i); got != want || o.res.ExitCode != 0 {
			t.Errorf("call %d: output %q exit %d, want %q 0", o.i, got, o.res.ExitCode, want)
		}
	}
	assertNoRunsc(t, h)
}

// runscTemplates lists the ids of h's runsc templates that runsc has
// state of.
func runscTemplates(h *harness) []string {
	rootDir := filepath.Join(runtime.InstanceDir(h.rt), "runsc")
	states, _ := filepath.Glob(filepath.Join(rootDir, runtime.TemplatePrefix+"*_sandbox:*.state"))
	var ids []string
	for _, st := range states {
		ids = append(ids, strings.SplitN(filepath.Base(st), "_sandbox:", 2)[0])
	}
	return ids
}

// guestProc is a process inside a gVisor sandbox, as `runsc ps` lists it.
type guestProc struct {
	PID, PPID int
	Cmd       string
}

// runscPs lists the processes inside the sandbox of container id.
func runscPs(t *testing.T, h *harness, id string) []guestProc {
	t.Helper()
	out, err := exec.Command(runtime.RunscPath(h.rt), "--root="+filepath.Join(runtime.InstanceDir(h.rt), "runsc"), "ps", id).Output()
	if err != nil {
		return nil
	}
	// UID PID PPID C TTY STIME TIME CMD, under a header.
	var procs []guestProc
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 8 {
			t.Fatalf("runsc ps: %q", out)
		}
		p := guestProc{Cmd: f[len(f)-1]}
		p.PID, _ = strconv.Atoi(f[1])
		p.PPID, _ = strconv.Atoi(f[2])
		procs = append(procs, p)
	}
	return procs
}

// A child the code made its template interpreter's (CLONE_PARENT, were
// the filter to let it through) is reaped inside gVisor like the code's
// own process: 20 such calls are forks of one template, which holds its
// init and zygote only after them (TestForkedCloneParentChildIsReaped is
// libcontainer's).
func TestRunscForkedCloneParentChildIsReaped(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	runtime.WithForkSeccomp(h.rt, allowCloneParent, func() {
		h.mustRun("print(1)")
		tpl := runscTemplates(h)
		if len(tpl) != 1 {
			t.Fatalf("templates %v, want one", tpl)
		}
		for i := 0; i < 20; i++ {
			res := h.mustRun(cloneParentAttack)
			f := strings.Fields(string(res.Stdout))
			if len(f) != 2 || f[0] == "-1" {
				t.Fatalf("call %d: stdout %q stderr %q: the clone was refused, so this test attacks nothing", i, res.Stdout, res.Stderr)
			}
		}
		if got := runscTemplates(h); !slices.Equal(got, tpl) {
			t.Errorf("templates after 20 calls %v, want the one that served them all, %v", got, tpl)
		}
		if st := h.forking(); st.Forks != 21 || st.Idle != 1 || st.Busy != 0 || st.LastError != "" {
			t.Errorf("forking after 21 calls: %+v; want 21 forks of one template, idle", st)
		}
		testenv.Eventually(t, "the template to hold its init and zygote only", func() bool { return len(runscPs(t, h, tpl[0])) == 2 })
	})
}

// A template that does not report a call reaped (its zygote stopped
// mid-call inside gVisor, so the code's process is never waited for) is
// killed whole within the bound of the call's first kill (a cancellation
// here, long before the watchdog's deadline would end it), and replaced.
func TestRunscForkedUnreportedReapReplacesTemplate(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	h.mustRun("print(1)")
	tpl := runscTemplates(h)
	if len(tpl) != 1 {
		t.Fatalf("templates %v, want one", tpl)
	}
	runtime.WithReapTimeout(time.Second, func() {
		b, err := bundle.New(runtime.BundleDir(h.rt), h.cfg, uuid.NewString())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.RunBundle(ctx, h.rt, b, runtime.Request{Code: []byte("import time; time.sleep(120)"), Timeout: 120 * time.Second, MaxOutputBytes: 1 << 20})
		}()
		var zygote int
		testenv.Eventually(t, "the call's code to run", func() bool {
			procs := runscPs(t, h, tpl[0])
			for _, p := range procs {
				if p.PPID == 1 && strings.Contains(p.Cmd, "python") {
					zygote = p.PID
				}
			}
			return len(procs) > 3 && zygote != 0
		})
		out, err := exec.Command(runtime.RunscPath(h.rt), "--root="+filepath.Join(runtime.InstanceDir(h.rt), "runsc"), "kill", fmt.Sprintf("--pid=%d", zygote), tpl[0], "STOP").CombinedOutput()
		if err != nil {
			t.Fatalf("stopping the zygote: %v: %s", err, out)
		}
		cancel()
		testenv.EventuallyWithin(t, 20*time.Second, "the template that did not report to be gone, by the bound (the watchdog's deadline is 2 minutes away)", func() bool {
			return !slices.Contains(runscTemplates(h), tpl[0])
		})
		<-done
	})
	res := h.mustRun("print(1)")
	if string(res.Stdout) != "1\n" {
		t.Errorf("after the template was replaced a call printed %q, want \"1\\n\"", res.Stdout)
	}
}

// A cancelled call is killed from inside its template at once (the
// template's init ends the call's pid namespace): the call returns
// promptly, nothing of it is left in the template, and the template,
// unharmed, serves the next call. Were the template not to kill it, the
// bound on its report would end the whole gVisor sandbox instead.
func TestRunscForkedCancelKeepsTemplate(t *testing.T) {
	h := runscHarness(t, policy.DefaultLimits())
	h.mustRun("print(1)")
	tpl := runscTemplates(h)
	if len(tpl) != 1 {
		t.Fatalf("templates %v, want one", tpl)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		testenv.Eventually(t, "the call's code to run", func() bool { return len(runscPs(t, h, tpl[0])) > 3 })
		cancel()
	}()
	start := time.Now()
	_, err := h.run("import os, time\nif os.fork() == 0:\n    time.sleep(120)\ntime.sleep(120)", withContext(ctx), withTimeout(120*time.Second))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled call: %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the cancelled call returned after %v", took)
	}
	testenv.Eventually(t, "the template to hold its init and zygote only", func() bool { return len(runscPs(t, h, tpl[0])) == 2 })
	h.mustRun("print(1)")
	if got := runscTemplates(h); !slices.Equal(got, tpl) {
		t.Errorf("templates after a cancelled call %v, want the same one, %v", got, tpl)
	}
}
