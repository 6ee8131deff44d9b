package runtime_test

import (
	"context"
	"errors"
	"fmt"
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
}

func (h *harness) newSession() *sessionHarness {
	h.t.Helper()
	sess, end := h.openSession()
	h.t.Cleanup(func() {
		if err := end(); err != nil {
			h.t.Errorf("closing the session: %v", err)
		}
	})
	return &sessionHarness{Session: sess, t: h.t}
}

func (s *sessionHarness) run(code string, opts ...func(*runOpts)) runtime.Result {
	s.t.Helper()
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
			s := v.harness(t, lim).newSession()
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
