package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// Persistent sessions: what a call leaves stays for the next, a timeout
// interrupts before it kills, and what ends the interpreter ends the
// session. The isolation properties on a session's sandbox are the
// property tests' "-session" variants.

// sessionHarness is a session on h's runtime, ended with the test.
type sessionHarness struct {
	*runtime.Session
	t *testing.T
	// parks: each call waits for the session to be parked first
	// (SessionConfig.Park), so that each restores it.
	parks bool
}

func (h *harness) newSession() *sessionHarness {
	h.t.Helper()
	sess, end := h.openSession()
	h.t.Cleanup(func() {
		if err := end(); err != nil {
			h.t.Errorf("closing the session: %v", err)
		}
	})
	return &sessionHarness{Session: sess, t: h.t, parks: h.sessions.Park > 0 && !h.sessions.Background}
}

func (s *sessionHarness) run(code string, opts ...func(*runOpts)) runtime.Result {
	s.t.Helper()
	if s.parks && s.Ended() == "" {
		awaitParked(s.t, s)
	}
	o := runOpts{timeout: 30 * time.Second, maxOutput: 1 << 20, ctx: context.Background()}
	for _, f := range opts {
		f(&o)
	}
	res, err := s.Run(o.ctx, runtime.Request{Code: []byte(code), Stdin: o.stdin, Files: o.files, Timeout: o.timeout, MaxOutputBytes: o.maxOutput})
	if err != nil {
		s.t.Fatalf("session call %q: %v", code, err)
	}
	return res
}

// forEachSessionRuntime runs f on each runtime, the process runtime first
// (make unit runs it).
func forEachSessionRuntime(t *testing.T, f func(t *testing.T, h *harness)) {
	t.Run("process", func(t *testing.T) {
		testenv.Parallel(t)
		f(t, newProcessHarness(t, policy.DefaultLimits()))
	})
	if testing.Short() {
		return
	}
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			f(t, v.harness(t, policy.DefaultLimits()))
		})
		if v.kind == runtime.Runsc && testenv.Full() {
			// Debian's runsc (2022-12, ptrace) pauses a session too.
			t.Run("runsc-debian", func(t *testing.T) {
				testenv.Parallel(t)
				f(t, newHarnessConfig(t, v.kind, policy.DefaultLimits(), runtime.Config{RunscPath: debianRunsc(t)}))
			})
			// Parked as soon as it is frozen: most calls restore it first.
			t.Run("runsc-parked", func(t *testing.T) {
				testenv.Parallel(t)
				f(t, newParkedHarness(t, time.Millisecond))
			})
		}
	}
}

func TestSessionKeepsState(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		res := s.run("import json, os\nx = 41\nos.makedirs('d', exist_ok=True)\nos.chdir('d')\nopen('f.txt', 'w').write('kept')\nx + 1")
		if res.ExitCode != 0 || string(res.Value) != "42" || res.Ended != "" {
			t.Fatalf("first call: exit %d, value %q, ended %q, stderr %s", res.ExitCode, res.Value, res.Ended, res.Stderr)
		}
		res = s.run("print(x, json.dumps([1]), os.getcwd().endswith('/d'), open('f.txt').read())\nNone")
		if got := string(res.Stdout); got != "41 [1] True kept\n" || len(res.Value) != 0 {
			t.Errorf("second call: stdout %q, value %q; stderr %s", got, res.Value, res.Stderr)
		}
		// stdin, files and outputs are the call's own.
		res = s.run("import sys\nprint(sys.stdin.read())\nopen('../outputs/o.txt', 'w').write('out')",
			withStdin([]byte("fed")), withFiles(runtime.File{Path: "in.txt", Data: []byte("in")}))
		if string(res.Stdout) != "fed\n" || len(res.Files) != 1 || res.Files[0].Path != "o.txt" {
			t.Errorf("third call: stdout %q, files %v; stderr %s", res.Stdout, res.Files, res.Stderr)
		}
		res = s.run("import os\nprint(open('../in.txt').read(), os.listdir('../outputs'), sys.stdin.read() == '')")
		if string(res.Stdout) != "in [] True\n" || len(res.Files) != 0 {
			t.Errorf("fourth call: stdout %q, files %v; stderr %s", res.Stdout, res.Files, res.Stderr)
		}
		// A result past the cap is cut, and says so.
		if res = s.run("'y' * 5000", withMaxOutput(1000)); len(res.Value) != 1000 || !res.ValueTruncated {
			t.Errorf("a long result: %d bytes, truncated %v", len(res.Value), res.ValueTruncated)
		}
		if res = s.run("'y' * 998", withMaxOutput(1000)); len(res.Value) != 1000 || res.ValueTruncated {
			t.Errorf("a result at the cap: %d bytes, truncated %v", len(res.Value), res.ValueTruncated)
		}
		// A call larger than a pipe holds, with its stdin.
		big := strings.Repeat("a", 300<<10)
		res = s.run("import sys\nbig = '"+big+"'\nlen(big) + len(sys.stdin.read())", withStdin([]byte(big)))
		if string(res.Value) != fmt.Sprint(2*len(big)) {
			t.Errorf("a large call: value %q, stderr %.300s", res.Value, res.Stderr)
		}
		// A traceback points at the call's own lines; an exception keeps
		// the session.
		res = s.run("def f():\n    return 1 / 0\nf()")
		if res.ExitCode != 1 || !strings.Contains(string(res.Stderr), `line 2, in f`) || strings.Contains(string(res.Stderr), `"<string>"`) || res.Ended != "" {
			t.Errorf("an exception: exit %d, ended %q, stderr %s", res.ExitCode, res.Ended, res.Stderr)
		}
		res = s.run("x = (")
		if res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "SyntaxError") || strings.Contains(string(res.Stderr), "Traceback") {
			t.Errorf("a syntax error: exit %d, stderr %s", res.ExitCode, res.Stderr)
		}
		if res = s.run("x"); string(res.Value) != "41" {
			t.Errorf("after the errors: value %q, stderr %s", res.Value, res.Stderr)
		}
		// sys.exit ends it, with its status.
		if res = s.run("import sys; sys.exit(4)"); res.ExitCode != 4 || res.Ended != runtime.EndExited {
			t.Errorf("sys.exit: exit %d, ended %q", res.ExitCode, res.Ended)
		}
		if _, err := s.Run(context.Background(), runtime.Request{Code: []byte("x"), Timeout: time.Second, MaxOutputBytes: 100}); !errors.Is(err, runtime.ErrSessionEnded) {
			t.Errorf("a call after the end: %v, want ErrSessionEnded", err)
		}
	})
}

func TestSessionTimeout(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		s.run("y = 7")
		// The interrupt stops the code: the session lives on.
		res := s.run("import time\nprint('before', flush=True)\ntime.sleep(60)", withTimeout(time.Second))
		if !res.TimedOut || res.ExitCode != 130 || res.Ended != "" || !strings.Contains(string(res.Stderr), "KeyboardInterrupt") {
			t.Fatalf("interrupted: timed out %v, exit %d, ended %q, stderr %s", res.TimedOut, res.ExitCode, res.Ended, res.Stderr)
		}
		if res = s.run("y"); string(res.Value) != "7" {
			t.Errorf("after the interrupt: value %q, stderr %s", res.Value, res.Stderr)
		}
		// A cancelled call is interrupted too, and its session lives on.
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(500*time.Millisecond, cancel)
		if _, err := s.Run(ctx, runtime.Request{Code: []byte("import time\ntime.sleep(60)"), Timeout: time.Minute, MaxOutputBytes: 1 << 20}); !errors.Is(err, context.Canceled) {
			t.Errorf("a cancelled call: %v, want context.Canceled", err)
		}
		if res = s.run("y + 1"); string(res.Value) != "8" || res.Ended != "" {
			t.Errorf("after the cancelled call: value %q, ended %q, stderr %s", res.Value, res.Ended, res.Stderr)
		}
		// Code that catches it is killed a moment later, and the session
		// with it.
		start := time.Now()
		res = s.run("import time\nwhile True:\n    try:\n        time.sleep(60)\n    except KeyboardInterrupt:\n        pass", withTimeout(time.Second))
		if !res.TimedOut || res.Ended != runtime.EndTimeout || res.ExitCode != 137 {
			t.Errorf("caught interrupt: timed out %v, exit %d, ended %q", res.TimedOut, res.ExitCode, res.Ended)
		}
		if el := time.Since(start); el > 10*time.Second {
			t.Errorf("the caught interrupt took %v to end", el)
		}
	})
}

func TestSessionOOMEnds(t *testing.T) {
	testenv.Real(t)
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			lim := policy.DefaultLimits()
			lim.MemoryBytes = 128 << 20
			h := v.harness(t, lim)
			if v.kind == runtime.Runsc {
				h.sessions.Park = time.Millisecond // the OOM comes after a restore
			}
			s := h.newSession()
			s.run("a = 1")
			res := s.run("x = bytearray(512 << 20)")
			if !res.OOMKilled || res.Ended != runtime.EndOOM {
				t.Errorf("over the memory limit: oom %v, ended %q, exit %d, stderr %s", res.OOMKilled, res.Ended, res.ExitCode, res.Stderr)
			}
		})
	}
}

// A session that filled its /tmp gets an ordinary failed call for files
// that do not fit, and keeps its state.
func TestSessionFullTmpKeepsSession(t *testing.T) {
	testenv.Real(t)
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, policy.DefaultLimits())
			s := h.newSession()
			fill := ("kept = 5\nf = open('fill', 'wb')\ntry:\n    while True:\n        f.write(b'x' * 65536)\n        f.flush()\nexcept OSError:\n    pass\n'full'")
			if res := s.run(fill); string(res.Value) != "'full'" {
				t.Fatalf("filling /tmp: value %q, stderr %s", res.Value, res.Stderr)
			}
			res := s.run("print('ran')", withFiles(runtime.File{Path: "in.bin", Data: make([]byte, 1<<20)}))
			if res.ExitCode != 1 || res.Ended != "" || len(res.Stdout) != 0 || !strings.Contains(string(res.Stderr), "writing input file in.bin") {
				t.Errorf("files into a full /tmp: exit %d, ended %q, stdout %q, stderr %s", res.ExitCode, res.Ended, res.Stdout, res.Stderr)
			}
			if res = s.run("import os\nos.remove('fill')\nkept"); string(res.Value) != "5" {
				t.Errorf("after the failed call: value %q, stderr %s", res.Value, res.Stderr)
			}
		})
	}
}

// idleWindow is how long a session waits between two calls in the tests of
// what it does meanwhile: long enough that anything of it still running
// would use a good part of it, on a busy machine too.
const idleWindow = 2 * time.Second

// idleCPU is the CPU time h's session s used, by the host kernel's count,
// over idleWindow with no call under way, and the most it may use: none
// at all, frozen, but for gVisor, whose kernel (the sentry) stays up and
// idles while runsc pause holds every task of it (measured: ~0.3 ms a
// second).
func idleCPU(t *testing.T, h *harness, s *sessionHarness) (used, allowed time.Duration) {
	t.Helper()
	before := runtime.SessionCPU(s.Session)
	time.Sleep(idleWindow)
	used = runtime.SessionCPU(s.Session) - before
	if h.kind == runtime.Runsc {
		allowed = idleWindow / 40
	}
	return used, allowed
}

// A thread the code left counting counts only while a call runs: between
// calls the session's sandbox is frozen (runsc: paused). The host kernel's
// count of the sandbox's CPU time does not move, and the thread's own CPU
// clock, read at the end of one call and the start of the next, moved
// only by the moments before the freeze and after the thaw.
func TestSessionFrozenBetweenCalls(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		res := s.run(`import threading, time
n = 0
def count():
    global n
    while True:
        n += 1
counter = threading.Thread(target=count, daemon=True)
counter.start()
clock = time.pthread_getcpuclockid(counter.ident)
while n < 1000:
    time.sleep(0.01)
time.clock_gettime(clock)`)
		if res.ExitCode != 0 || res.Ended != "" {
			t.Fatalf("starting the counter: exit %d, ended %q, stderr %s", res.ExitCode, res.Ended, res.Stderr)
		}
		atEnd, err := strconv.ParseFloat(string(res.Value), 64)
		if err != nil {
			t.Fatalf("the counter's CPU clock: %q", res.Value)
		}
		used, allowed := idleCPU(t, h, s)
		if used > allowed {
			t.Errorf("between calls the session used %v of CPU in %v, want at most %v: its counting thread ran on", used, idleWindow, allowed)
		}
		res = s.run("time.clock_gettime(clock), n")
		var atStart float64
		var count int
		if _, err := fmt.Sscanf(string(res.Value), "(%g, %d)", &atStart, &count); err != nil {
			t.Fatalf("the next call: value %q, stderr %s", res.Value, res.Stderr)
		}
		if gap := time.Duration((atStart - atEnd) * float64(time.Second)); gap > idleWindow/4 {
			t.Errorf("the counting thread ran %v between the calls (%v apart), by its own CPU clock", gap, idleWindow)
		}
		// And it counts on while a call runs: frozen, not killed.
		res = s.run("before = n\ntime.sleep(0.5)\nn > before")
		if string(res.Value) != "True" {
			t.Errorf("during a call the thread did not count: value %q, stderr %s", res.Value, res.Stderr)
		}
		t.Logf("between calls: %v of CPU in %v (host's count)", used, idleWindow)
	})
}

// Code that tells the init its call is over (a forged end frame on the
// driver's pipe) gets the call's result back at once and spins on: the
// session is frozen all the same, and the spinning gains no CPU after the
// call returned. Closing the session leaves nothing of it.
func TestSessionForgedEndGainsNoCPU(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		res := s.run(`import os
os.write(3, b"d" + (4).to_bytes(4, "big") + (0).to_bytes(4, "big"))
while True:
    pass`)
		if res.ExitCode != 0 || res.Ended != "" || res.TimedOut {
			t.Fatalf("the forged end: exit %d, ended %q, timed out %v; want the call over, the session on", res.ExitCode, res.Ended, res.TimedOut)
		}
		if used, allowed := idleCPU(t, h, s); used > allowed {
			t.Errorf("after the call returned, its spinning code used %v of CPU in %v, want at most %v", used, idleWindow, allowed)
		} else {
			t.Logf("after the forged end: %v of CPU in %v", used, idleWindow)
		}
	})
}

// A process the code detached (its own session, its parent gone, so an
// orphan of the init) is frozen with the rest: it uses no CPU between
// calls.
func TestSessionFrozenDetached(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		res := s.run(`import subprocess, sys, time
spin = "import os\nif os.fork():\n    os._exit(0)\nos.setsid()\nopen('spinning', 'w').close()\nwhile True:\n    pass"
subprocess.run([sys.executable, "-c", spin], start_new_session=True)
import os
while not os.path.exists("spinning"):
    time.sleep(0.01)`)
		if res.ExitCode != 0 || res.Ended != "" {
			t.Fatalf("detaching a spinner: exit %d, ended %q, stderr %s", res.ExitCode, res.Ended, res.Stderr)
		}
		if used, allowed := idleCPU(t, h, s); used > allowed {
			t.Errorf("between calls a detached spinner used %v of CPU in %v, want at most %v", used, idleWindow, allowed)
		}
	})
}

// Code that arranged to wake itself (a timer whose signal is SIGCONT, due
// once the call is over) does not run between calls either: the freezer
// cgroup and gVisor's pause ignore it; the process runtime, whose stop it
// undoes, kills the session as soon as it sees the code run.
func TestSessionSelfWakeGainsNoCPU(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		res := s.run(`import ctypes, signal, threading
libc = ctypes.CDLL(None, use_errno=True)
class sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("pad", ctypes.c_byte * 48)]
class timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
class itimerspec(ctypes.Structure):
    _fields_ = [("interval", timespec), ("value", timespec)]
# Handled, not ignored: the kernel parks a timer whose signal is ignored
# (SIGCONT's default) until it no longer is.
signal.signal(signal.SIGCONT, lambda *_: None)
timer = ctypes.c_void_p()
# SIGEV_SIGNAL on CLOCK_MONOTONIC, every second from a second after this
# call: one comes once the session is frozen, however late a busy machine
# freezes it. (Not every few ms: a SIGSTOP discards a pending SIGCONT,
# and a periodic timer whose signal was discarded is not armed again.)
assert libc.timer_create(1, ctypes.byref(sigevent(signo=signal.SIGCONT, notify=0)), ctypes.byref(timer)) == 0, ctypes.get_errno()
assert libc.timer_settime(timer, 0, ctypes.byref(itimerspec(timespec(1, 0), timespec(1, 0))), None) == 0, ctypes.get_errno()
def spin():
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()`)
		if res.ExitCode != 0 || res.Ended != "" {
			t.Fatalf("arming the timer: exit %d, ended %q, stderr %s", res.ExitCode, res.Ended, res.Stderr)
		}
		if h.kind == runtime.Process {
			testenv.EventuallyWithin(t, 5*time.Second, "the session that woke itself to be killed", func() bool { return s.Ended() != "" })
			if _, err := s.Run(context.Background(), runtime.Request{Code: []byte("1"), Timeout: time.Second, MaxOutputBytes: 100}); !errors.Is(err, runtime.ErrSessionEnded) {
				t.Errorf("a call after the session woke itself: %v, want ErrSessionEnded", err)
			}
			return
		}
		if used, allowed := idleCPU(t, h, s); used > allowed {
			t.Errorf("code that wakes itself used %v of CPU between calls in %v, want at most %v", used, idleWindow, allowed)
		}
		if res = s.run("1 + 1"); string(res.Value) != "2" {
			t.Errorf("the next call: value %q, stderr %s", res.Value, res.Stderr)
		}
	})
}

// selfWakeZombie leaves a process whose thread-group leader has exited
// (SYS_exit on its main thread: a zombie while its threads live) with a
// worker thread that a POSIX timer wakes with SIGCONT every second, so
// once the session is frozen too, and that then spins (red team F2: a watch
// that knew processes, not threads, never looked at it). The call ends
// once the leader is gone: a grandchild the leader thread forked learns
// of it by its parent-death signal, and says so.
const selfWakeZombie = `import ctypes, os, platform, signal, threading, time
libc = ctypes.CDLL(None, use_errno=True)
class sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("pad", ctypes.c_byte * 48)]
class timespec(ctypes.Structure):
    _fields_ = [("s", ctypes.c_long), ("ns", ctypes.c_long)]
class itimerspec(ctypes.Structure):
    _fields_ = [("interval", timespec), ("value", timespec)]
r, w = os.pipe()
if os.fork() == 0:
    signal.signal(signal.SIGCONT, lambda *_: None)
    def spin():
        timer = ctypes.c_void_p()
        assert libc.timer_create(1, ctypes.byref(sigevent(signo=signal.SIGCONT, notify=0)), ctypes.byref(timer)) == 0
        # Every second from a second on: one comes after the freeze,
        # however late a busy machine freezes the session.
        assert libc.timer_settime(timer, 0, ctypes.byref(itimerspec(timespec(1, 0), timespec(1, 0))), None) == 0
        while True:
            pass
    threading.Thread(target=spin).start()
    ready, go = os.pipe()
    if os.fork() == 0:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
        libc.prctl(1, signal.SIGUSR1)  # PR_SET_PDEATHSIG: the leader thread's end
        os.write(go, b"r")
        signal.sigwait([signal.SIGUSR1])
        os.write(w, b"x")
        time.sleep(3600)
    os.read(ready, 1)
    libc.syscall(60 if platform.machine() == "x86_64" else 93, 0)  # SYS_exit: the leader ends, the worker runs on
os.read(r, 1)`

// A process whose leader has exited, its worker thread woken by its own
// timer once the session is frozen, gains no CPU either: the container
// runtimes' freezers hold every task; the process runtime's watch looks
// at each thread and ends the session as soon as one runs, saying so.
func TestSessionZombieLeaderWakesItself(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		s := h.newSession()
		res := s.run(selfWakeZombie)
		if res.ExitCode != 0 || res.Ended != "" {
			t.Fatalf("arming the timer: exit %d, ended %q, stderr %s", res.ExitCode, res.Ended, res.Stderr)
		}
		frozen := time.Now()
		if h.kind == runtime.Process {
			testenv.EventuallyWithin(t, 5*time.Second, "the session that woke itself to be killed", func() bool { return s.Ended() != "" })
			t.Logf("ended %v after the call", time.Since(frozen).Round(time.Millisecond))
			_, err := s.Run(context.Background(), runtime.Request{Code: []byte("1"), Timeout: time.Second, MaxOutputBytes: 100})
			var ended *runtime.EndedError
			if !errors.As(err, &ended) || ended.Reason != runtime.EndExited || !strings.Contains(ended.Detail, "ran while the session was frozen") {
				t.Errorf("a call after the session woke itself: %v, want it ended (exited) for running while frozen", err)
			}
			return
		}
		if used, allowed := idleCPU(t, h, s); used > allowed {
			t.Errorf("a zombie leader's worker that wakes itself used %v of CPU between calls in %v, want at most %v", used, idleWindow, allowed)
		}
		if res = s.run("1 + 1"); string(res.Value) != "2" {
			t.Errorf("the next call: value %q, stderr %s", res.Value, res.Stderr)
		}
	})
}

// MCP_EXEC_PERSISTENT_BACKGROUND's session is a notebook's kernel: what
// the code left running runs on between calls.
func TestSessionBackgroundRunsBetweenCalls(t *testing.T) {
	forEachSessionRuntime(t, func(t *testing.T, h *harness) {
		h.sessions.Background = true
		s := h.newSession()
		s.run("import threading, time\nn = 0\ndef count():\n    global n\n    while True:\n        n += 1\nthreading.Thread(target=count, daemon=True).start()")
		used, _ := idleCPU(t, h, s)
		if used < idleWindow/20 {
			t.Errorf("in the background the counting thread used %v of CPU in %v: it did not run", used, idleWindow)
		}
	})
}
