package runtime_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/runtime"
)

// A call from start to verdict: timeouts, cancellation, output, exit
// codes and stdin, ordinary Python.

func TestTimeoutKillsDetachedDescendants(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession|modeFresh, func(t *testing.T, h *harness) {
		start := time.Now()
		res := h.mustRun(`import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        print("grandchild", os.getpid(), flush=True)
        while True:
            time.sleep(1)
    os._exit(0)
while True:
    time.sleep(1)`, withTimeout(4*time.Second))
		// A session's code is interrupted first, and stops: its session
		// lives on (the harness ends it, and then every process of it).
		want, ended := 137, runtime.SessionEnd("")
		if h.session {
			want = 130
		}
		if !res.TimedOut || res.ExitCode != want || res.Ended != ended {
			t.Errorf("TimedOut = %v, exit = %d, ended %q; want true, %d, %q", res.TimedOut, res.ExitCode, res.Ended, want, ended)
		}
		if !strings.Contains(string(res.Stdout), "grandchild") {
			t.Errorf("stdout = %q, want the grandchild's line", res.Stdout)
		}
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("run took %v after a 4s timeout", el)
		}
		// harness.run has asserted that no process of the call survived.

		// The code's own exit ends the container even with a setsid'd
		// descendant still running.
		res = h.mustRun(`import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
print("parent done")`, withTimeout(60*time.Second))
		if res.TimedOut || res.ExitCode != 0 {
			t.Errorf("parent exit: TimedOut = %v, exit = %d; want false, 0", res.TimedOut, res.ExitCode)
		}
	})
}

func TestOutputFloodIsTruncatedNotBlocked(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		const capBytes = 1 << 20
		res := h.mustRun(`import sys
chunk = b"x" * (1 << 20)
for _ in range(100):
    sys.stdout.buffer.write(chunk)
sys.stdout.flush()
sys.stderr.write("done")`, withMaxOutput(capBytes), withTimeout(120*time.Second))
		if res.TimedOut || res.ExitCode != 0 {
			t.Fatalf("flood: TimedOut = %v, exit = %d, stderr %q; want a normal exit", res.TimedOut, res.ExitCode, res.Stderr)
		}
		if !res.StdoutTruncated || len(res.Stdout) != capBytes || res.StdoutBytes != 100<<20 {
			t.Errorf("stdout: truncated %v, kept %d, counted %d; want true, %d, %d", res.StdoutTruncated, len(res.Stdout), res.StdoutBytes, capBytes, 100<<20)
		}
		if res.StderrTruncated || string(res.Stderr) != "done" {
			t.Errorf("stderr: truncated %v, %q; want false, \"done\"", res.StderrTruncated, res.Stderr)
		}
		t.Logf("100 MiB flood took %v", res.Duration)
	})
}

// A stream past its cap keeps its head and its tail, half the cap each,
// with a line between saying how many bytes were left out: the end of a
// long output (its summary, its traceback) comes back. The byte counts
// are exact, and a cap below the sandbox's own (the request's) is kept
// the same way.
func TestOutputKeepsHeadAndTail(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession, func(t *testing.T, h *harness) {
		const capBytes = 1 << 20
		res := h.mustRun(`import sys
for i in range(50000):
    sys.stdout.write(f"{i:08d} " + "y" * 90 + "\n")
print("the summary")
raise ValueError("the last words")`, withMaxOutput(capBytes), withTimeout(120*time.Second))
		const total = int64(50000*100 + len("the summary\n"))
		marker := regexp.MustCompile(`\n\[… (\d+) bytes left out …\]\n`)
		m := marker.FindSubmatch(res.Stdout)
		if !res.StdoutTruncated || res.StdoutBytes != total || len(res.Stdout) > capBytes || len(res.Stdout) < capBytes-8 || m == nil {
			t.Fatalf("stdout: truncated %v, %d bytes kept of %d counted (want %d, at most the cap %d, with a marker); ends %q",
				res.StdoutTruncated, len(res.Stdout), res.StdoutBytes, total, capBytes, tailOf(res.Stdout, 200))
		}
		left, _ := strconv.Atoi(string(m[1]))
		if kept := len(res.Stdout) - len(m[0]); int64(kept+left) != total {
			t.Errorf("the marker says %d bytes left out, %d kept: want them to add up to %d", left, kept, total)
		}
		if !bytes.HasPrefix(res.Stdout, []byte("00000000 yyy")) || !bytes.HasSuffix(res.Stdout, []byte("y\nthe summary\n")) {
			t.Errorf("stdout begins %q, ends %q: want the first line and the last", res.Stdout[:20], tailOf(res.Stdout, 40))
		}
		if head := res.Stdout[:bytes.Index(res.Stdout, m[0])]; len(head) < capBytes/2-100 {
			t.Errorf("the head is %d bytes, want about half the cap", len(head))
		}
		if !strings.HasSuffix(string(res.Stderr), "ValueError: the last words\n") || res.StderrTruncated {
			t.Errorf("stderr %q: want the whole traceback", res.Stderr)
		}

		// The request's cap, below the sandbox's: the same shape.
		res = h.mustRun(`print("a" * 3000 + "z")`, withMaxOutput(1000))
		m = marker.FindSubmatch(res.Stdout)
		if m == nil || !res.StdoutTruncated || res.StdoutBytes != 3002 || len(res.Stdout) > 1000 ||
			!bytes.HasPrefix(res.Stdout, []byte("aaa")) || !bytes.HasSuffix(res.Stdout, []byte("az\n")) {
			t.Errorf("a 3002-byte line at a cap of 1000: %d bytes %q, truncated %v, counted %d", len(res.Stdout), res.Stdout, res.StdoutTruncated, res.StdoutBytes)
		}
		// Exactly the cap is whole.
		if res = h.mustRun(`print("b" * 999)`, withMaxOutput(1000)); res.StdoutTruncated || len(res.Stdout) != 1000 {
			t.Errorf("1000 bytes at a cap of 1000: %d bytes, truncated %v", len(res.Stdout), res.StdoutTruncated)
		}
	})
}

// A watched call's newest output is shown while it runs, past the cap
// too: progress messages keep up with a program that printed more than
// the cap.
func TestLiveOutputPastTheCap(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession, func(t *testing.T, h *harness) {
		h.cfg.MaxOutputBytes = 1000 // the sandbox's own cap: its init keeps the head
		live := &runtime.Live{}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.run(`import sys, time
sys.stdout.write("x" * 3000 + "\n")
print("the newest line", flush=True)
time.sleep(120)`, withMaxOutput(1000), withLive(live), withContext(ctx), withTimeout(120*time.Second))
		}()
		testenv.Eventually(t, "the newest line past the cap in the live view", func() bool {
			_, tail, _ := live.Last()
			return strings.Contains(string(tail), "the newest line")
		})
		cancel()
		<-done
	})
}

// tailOf is the last n bytes of b.
func tailOf(b []byte, n int) []byte { return b[max(0, len(b)-n):] }

func TestOutputBytesPassThrough(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		res := h.mustRun(`import sys
sys.stdout.buffer.write(b"\xff\xfe ok \xe2\x82")
sys.stderr.buffer.write(b"err \x80")`)
		if string(res.Stdout) != "\xff\xfe ok \xe2\x82" || string(res.Stderr) != "err \x80" {
			t.Errorf("stdout %q stderr %q: bytes were altered", res.Stdout, res.Stderr)
		}
	})
}

func TestExitCodesAndStdin(t *testing.T) {
	forEachRuntimeAndProcess(t, modePooled|modeSession, func(t *testing.T, h *harness) {
		for _, tc := range []struct {
			code string
			want int
		}{
			{"pass", 0},
			{"import sys; sys.exit(3)", 3},
			{"raise SystemExit(255)", 255},
			{"1/0", 1},
			{"import ctypes; ctypes.string_at(0)", 128 + 11},
		} {
			if res := h.mustRun(tc.code); res.ExitCode != tc.want {
				t.Errorf("%s: exit %d, want %d (stderr %s)", tc.code, res.ExitCode, tc.want, res.Stderr)
			}
		}
		res := h.mustRun(`import sys; data = sys.stdin.read(); print(len(data), data[:5], sys.stdin.read() == "")`,
			withStdin([]byte("hello"+strings.Repeat("x", 200<<10))))
		if want := fmt.Sprintf("%d hello True\n", 5+200<<10); string(res.Stdout) != want {
			t.Errorf("stdin echo = %q, want %q", res.Stdout, want)
		}
		// A program that never reads its stdin is not held up by it.
		res = h.mustRun(`print("ignored")`, withStdin(make([]byte, 1<<20)))
		if res.ExitCode != 0 || string(res.Stdout) != "ignored\n" {
			t.Errorf("unread stdin: exit %d stdout %q", res.ExitCode, res.Stdout)
		}
	})
}

func TestOrdinaryPythonWorks(t *testing.T) {
	forEachRuntime(t, modeBatteries, func(t *testing.T, h *harness) {
		res := h.mustRun(`import json, sqlite3, decimal, ssl, hashlib, subprocess, sys, threading, multiprocessing, tempfile, locale
threads = [threading.Thread(target=lambda: sum(range(10000))) for _ in range(16)]
[t.start() for t in threads]; [t.join() for t in threads]
out = subprocess.run([sys.executable, "-c", "print(6*7)"], capture_output=True, text=True, check=True).stdout.strip()
def sq(x): return x * x
if __name__ == "__main__":
    with multiprocessing.Pool(2) as p:
        mp = p.map(sq, range(5))
    db = sqlite3.connect(":memory:"); db.execute("create table t(x)"); db.execute("insert into t values (1)")
    with tempfile.NamedTemporaryFile() as f:
        f.write(b"x")
    print(json.dumps({"sub": out, "mp": mp, "db": db.execute("select x from t").fetchone()[0],
      "dec": str(decimal.Decimal("1.1") + decimal.Decimal("2.2")), "ssl": ssl.OPENSSL_VERSION[:7],
      "sha": hashlib.sha256(b"").hexdigest()[:8]}))`, withTimeout(60*time.Second))
		want := `{"sub": "42", "mp": [0, 1, 4, 9, 16], "db": 1, "dec": "3.3", "ssl": "OpenSSL", "sha": "e3b0c442"}` + "\n"
		if res.PidsLimitHit || res.OOMKilled || res.TimedOut {
			t.Errorf("ordinary Python: pids limit hit %v, OOM %v, timed out %v; want none", res.PidsLimitHit, res.OOMKilled, res.TimedOut)
		}
		if res.ExitCode != 0 || string(res.Stdout) != want {
			t.Errorf("exit %d\nstdout %s\nwant   %s\nstderr %s", res.ExitCode, res.Stdout, want, res.Stderr)
		}
	})
}

func TestCancelKillsAtOnce(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession|modeFresh, func(t *testing.T, h *harness) {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		start := time.Now()
		_, err := h.run(`import time; time.sleep(120)`, withContext(ctx), withTimeout(120*time.Second))
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run after cancel: err = %v, want context.Canceled", err)
		}
		if el := time.Since(start); el > 15*time.Second {
			t.Errorf("cancelled run took %v", el)
		}
	})
}

// The driver is invisible to code that looks at how it was run: a fresh
// call is a script, as python3 /code/main.py would run it. A session's
// later call is a cell of the same __main__: the script's name stays, its
// traceback names the cell, and the session's timeout owns SIGINT.
func TestCodeRunsAsAScript(t *testing.T) {
	forEachRuntimeAndProcess(t, modeSession, func(t *testing.T, h *harness) {
		wantOut, wantLine := "__main__ main.py main.py 1 True True True\n", "main.py\", line 7, in <module>"
		if h.session {
			wantOut, wantLine = "__main__ main.py main.py 1 True True False\n", "<cell 2>\", line 7, in <module>"
		}
		res := h.mustRun(`import os, signal, sys, __main__
print(__name__, os.path.basename(__file__), os.path.basename(sys.argv[0]), len(sys.argv),
      sys.path[0] == os.path.dirname(os.path.abspath(__file__)), __main__.__dict__ is globals(),
      signal.getsignal(signal.SIGINT) is signal.default_int_handler)
def f():
    raise ValueError("x")
f()`)
		if got := string(res.Stdout); got != wantOut {
			t.Errorf("stdout %q, want %q; stderr %s", got, wantOut, res.Stderr)
		}
		if tb := string(res.Stderr); res.ExitCode != 1 || !strings.HasPrefix(tb, "Traceback (most recent call last):\n  File \"") || !strings.Contains(tb, wantLine) || strings.Contains(tb, "<string>") {
			t.Errorf("exit %d, traceback %s", res.ExitCode, tb)
		}
	})
}

// The interpreter ends as a script's does, however the sandbox was made:
// a thread that is not a daemon is waited for, atexit's functions run, a
// file the code wrote and never closed is flushed, and SystemExit's
// message and status are the interpreter's. (A forked interpreter ends
// without tearing down what its template made: see driver.py's _end.)
func TestInterpreterEndsAsAScript(t *testing.T) {
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		res := h.mustRun(`import atexit, os, sys, threading, time
class Noisy:
    def __del__(self):
        print("finalized", flush=True)
keep = Noisy()
f = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "outputs", "unclosed.txt"), "w")
f.write("written, never closed")
atexit.register(lambda: print("atexit ran", flush=True))
def late():
    time.sleep(0.3)
    print("thread joined", flush=True)
threading.Thread(target=late).start()
sys.exit("bye from SystemExit")`)
		if h.session {
			// A session's call ends the session there (exited), with the
			// same message and status; its interpreter ends as a script's.
			if res.Ended != runtime.EndExited {
				t.Errorf("ended %q, want %q", res.Ended, runtime.EndExited)
			}
		}
		if res.ExitCode != 1 || !strings.Contains(string(res.Stderr), "bye from SystemExit") {
			t.Errorf("exit %d, stderr %q; want 1 and the SystemExit message", res.ExitCode, res.Stderr)
		}
		for _, want := range []string{"thread joined\n", "atexit ran\n", "finalized\n"} {
			if !strings.Contains(string(res.Stdout), want) {
				t.Errorf("stdout %q lacks %q", res.Stdout, want)
			}
		}
		if i, j := strings.Index(string(res.Stdout), "thread joined"), strings.Index(string(res.Stdout), "atexit ran"); i > j {
			t.Errorf("stdout %q: atexit ran before the thread was joined", res.Stdout)
		}
		var got string
		for _, f := range res.Files {
			if f.Path == "unclosed.txt" {
				got = string(f.Data)
			}
		}
		if got != "written, never closed" {
			t.Errorf("unclosed.txt came back as %q (files %d), want what was written", got, len(res.Files))
		}
	})
}
