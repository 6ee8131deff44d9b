package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// The process runtime under attack, as mcp-exec 0.5.4's drop-in runs it:
// the server as uid 65532 with no capabilities and no_new_privs (setpriv,
// what docker run --user 65532:65532 --cap-drop ALL --security-opt
// no-new-privileges gives), and as root. Each attack is one an adversarial
// review made work before the process runtime confined its calls.

const processToken = "not-for-the-code-0123456789"

// processServer is the real binary serving over stdio with the process
// runtime, its calls' dirs under tmp.
type processServer struct {
	cs     *mcp.ClientSession
	stderr *syncBuffer
	tmp    string
	cmd    *exec.Cmd
}

func startProcessServer(t *testing.T, asRoot bool, env ...string) *processServer {
	t.Helper()
	testenv.Root(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		testenv.Missing(t, "setpriv is not installed (util-linux)")
	}
	bin, dir := publicBinary(t)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o1777)
	argv := []string{bin, "serve"}
	if !asRoot {
		argv = append([]string{"setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", "--inh-caps=-all",
			"--bounding-set=-all", "--no-new-privs"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home"), "TMPDIR=" + tmp,
		"MCP_EXEC_RUNTIME=process", "MCP_EXEC_AUTH_TOKEN=" + processToken, "MCP_EXEC_POOL_SIZE=0",
		"MCP_EXEC_STATE_DIR=" + filepath.Join(dir, "state")}, env...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return &processServer{cs: cs, stderr: stderr, tmp: tmp, cmd: cmd}
}

// call runs one exec and returns its structured result.
func (s *processServer) call(t *testing.T, args map[string]any) (execOutput, *mcp.CallToolResult) {
	t.Helper()
	out, res, err := s.tryCall(args)
	if err != nil {
		t.Fatal(err)
	}
	return out, res
}

// tryCall is call for another goroutine than the test's: it fails nothing.
func (s *processServer) tryCall(args map[string]any) (execOutput, *mcp.CallToolResult, error) {
	res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: args})
	if err != nil || res.IsError {
		return execOutput{}, res, fmt.Errorf("exec: %v %+v\n%s", err, res, s.stderr.String())
	}
	var out execOutput
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	return out, res, err
}

// probe runs code that prints one JSON object and decodes it.
func (s *processServer) probe(t *testing.T, code string, v any) {
	t.Helper()
	out, _ := s.call(t, map[string]any{"code": code})
	if err := json.Unmarshal([]byte(out.Stdout), v); err != nil {
		t.Fatalf("probe printed %q (exit %d, stderr %q): %v", out.Stdout, out.ExitCode, out.Stderr, err)
	}
}

// waitDirsGone waits for the calls' dirs to be removed: a call's teardown
// runs after its result, off its time.
func (s *processServer) waitDirsGone(t *testing.T) {
	t.Helper()
	testenv.EventuallyWithin(t, 10*time.Second, "the calls' dirs to be removed", func() bool {
		entries, _ := filepath.Glob(filepath.Join(s.tmp, "mcp-exec-*", "*-*"))
		return len(entries) == 0
	})
}

// processModes are the two ways the server runs the process runtime.
var processModes = []struct {
	name string
	root bool
}{{"uid65532", false}, {"root", true}}

// The code can neither read the server's environment nor its memory, nor
// signal it or its own init: the server is not dumpable (its /proc files
// are root's), and the code's Landlock domain refuses whatever lies
// outside it.
func TestProcessServerOutOfReach(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m.root)
			var got map[string]int
			s.probe(t, `import json, os
def ppid(pid):
    return int(open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()[1])
init = os.getppid()
server = ppid(init)
out = {"server": server}
def try_(name, f):
    try:
        f(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
try_("read /proc/server/environ", lambda: open("/proc/%d/environ" % server, "rb").read())
try_("open /proc/server/mem rw", lambda: open("/proc/%d/mem" % server, "r+b"))
try_("list /proc/server/fd", lambda: os.listdir("/proc/%d/fd" % server))
try_("readlink /proc/server/cwd", lambda: os.readlink("/proc/%d/cwd" % server))
try_("signal the server", lambda: os.kill(server, 0))
try_("signal the init", lambda: os.kill(init, 0))
try_("open /proc/init/mem rw", lambda: open("/proc/%d/mem" % init, "r+b"))
out["server environ owner"] = os.stat("/proc/%d/environ" % server).st_uid
out["server uid"] = int([l for l in open("/proc/%d/status" % server) if l.startswith("Uid:")][0].split()[1])
print(json.dumps(out))`, &got)
			for _, k := range []string{"read /proc/server/environ", "open /proc/server/mem rw", "list /proc/server/fd",
				"readlink /proc/server/cwd", "signal the server", "signal the init", "open /proc/init/mem rw"} {
				if got[k] == 0 {
					t.Errorf("%s: succeeded, want a permission error", k)
				}
			}
			// Not dumpable: its /proc files are root's, whatever its uid.
			if got["server uid"] != 0 && got["server environ owner"] != 0 {
				t.Errorf("the server (uid %d) is dumpable: its /proc/<pid>/environ is owned by uid %d", got["server uid"], got["server environ owner"])
			}
			if strings.Contains(s.stderr.String(), processToken) {
				t.Errorf("the token is in the server's log")
			}
		})
	}
}

// The code runs under the product's seccomp filter, with what this runtime
// shares with every other call refused too: IP sockets, System V IPC.
func TestProcessSeccomp(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m.root)
			var got map[string]any
			s.probe(t, `import ctypes, json, socket
libc = ctypes.CDLL(None, use_errno=True)
out = {"Seccomp": [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")][0]}
def errno_of(name, rc):
    out[name] = ctypes.get_errno() if rc < 0 else 0
for name, fam in [("AF_INET", socket.AF_INET), ("AF_INET6", socket.AF_INET6), ("AF_UNIX", socket.AF_UNIX)]:
    try:
        socket.socket(fam, socket.SOCK_STREAM).close(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
errno_of("shmget", libc.shmget(0, 4096, 0o1600))
errno_of("unshare", libc.unshare(0x10000000))
errno_of("ptrace", libc.ptrace(16, 1, 0, 0))
errno_of("keyctl", libc.syscall(250, 0, 0, 0, 0))
print(json.dumps(out))`, &got)
			if got["Seccomp"] != "2" {
				t.Errorf("Seccomp: %v, want 2 (a filter)", got["Seccomp"])
			}
			for _, k := range []string{"AF_INET", "AF_INET6", "shmget", "unshare", "ptrace", "keyctl"} {
				if got[k] != float64(1) {
					t.Errorf("%s: errno %v, want EPERM (1)", k, got[k])
				}
			}
			if got["AF_UNIX"] != float64(0) {
				t.Errorf("AF_UNIX: errno %v, want it allowed", got["AF_UNIX"])
			}
		})
	}
}

// Nothing of a call outlives it: not a setsid'd grandchild of code that
// tried to kill its init first (the init is out of its reach), and not one
// whose init is killed from outside mid-call (the server, their subreaper,
// kills them).
func TestProcessNothingOutlivesTheCall(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m.root)
			marker := fmt.Sprintf("mcp-exec-orphan-%d", time.Now().UnixNano())
			spawn := fmt.Sprintf(`import os, signal, subprocess, sys, time
init = os.getppid()
if os.fork() == 0:
    os.setsid()
    try:
        os.kill(init, signal.SIGKILL)
        print("killed the init", flush=True)
    except OSError as e:
        print("could not kill the init:", e.errno, flush=True)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # %s"], start_new_session=True)
    time.sleep(300)
    os._exit(0)
time.sleep(%%s)
print("main done", flush=True)`, marker)
			out, _ := s.call(t, map[string]any{"code": fmt.Sprintf(spawn, "1"), "timeout_s": 20})
			if strings.Contains(out.Stdout, "killed the init") {
				t.Errorf("the code killed its init: %q", out.Stdout)
			}
			// Its leftovers held its output open: the call still ends when
			// its main process does.
			if out.TimedOut || !strings.Contains(out.Stdout, "main done") {
				t.Errorf("the call ran to its timeout (%v) or did not end its main process: %q", out.TimedOut, out.Stdout)
			}
			waitGone(t, marker, 5*time.Second)

			// The init killed from outside, as an OOM kill or a code that
			// got to it would: its orphans come back to the server.
			done := make(chan execOutput, 1)
			go func() {
				out, _, err := s.tryCall(map[string]any{"code": fmt.Sprintf(spawn, "60"), "timeout_s": 90})
				if err != nil {
					t.Error(err)
				}
				done <- out
			}()
			var daemon int
			testenv.EventuallyWithin(t, 30*time.Second, "the call's setsid grandchild to run", func() bool {
				daemon = pidOf(marker)
				return daemon > 0
			})
			init := daemon
			for {
				ppid, err := parentOf(init)
				if err != nil || ppid <= 1 {
					t.Fatalf("no init above the call's process %d", daemon)
				}
				init = ppid
				if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", init)); bytes.HasPrefix(cmd, []byte("mcp-exec-init\x00")) {
					break
				}
			}
			if err := syscall.Kill(init, syscall.SIGKILL); err != nil {
				t.Fatalf("killing the init %d: %v", init, err)
			}
			killed := time.Now()
			defer func() {
				t.Logf("the call's processes were gone %v after its init was killed", time.Since(killed).Round(time.Millisecond))
			}()
			select {
			case out := <-done:
				if out.ExitCode != 137 {
					t.Errorf("a call whose init was killed: exit %d, want 137", out.ExitCode)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the call whose init was killed did not end")
			}
			waitGone(t, marker, 5*time.Second)
			s.waitDirsGone(t)
		})
	}
}

// Two calls at once cannot reach each other: with the path of the other's
// dir in hand (the test hands it over: /proc would not), a call can
// neither read the other's input files nor plant one in its outputs, and
// no /proc/<pid>/cwd shows where another call is.
func TestProcessCallsDoNotMeet(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m.root)
			victim := make(chan *mcp.CallToolResult, 1)
			go func() {
				_, res, err := s.tryCall(map[string]any{"code": `import os, time
time.sleep(8)
print(sorted(os.listdir("outputs")))`, "files": []map[string]any{{"path": "secret.txt", "content": "B-SECRET"}}, "timeout_s": 30})
				if err != nil {
					t.Error(err)
				}
				victim <- res
			}()
			var secret string
			testenv.EventuallyWithin(t, 30*time.Second, "the victim call's input file", func() bool {
				matches, _ := filepath.Glob(filepath.Join(s.tmp, "mcp-exec-*", "*", "work", "secret.txt"))
				if len(matches) == 1 {
					secret = matches[0]
				}
				return secret != ""
			})
			victimDir := filepath.Dir(secret)
			var got map[string]any
			out, _ := s.call(t, map[string]any{"stdin": victimDir, "code": `import json, os, sys
d = sys.stdin.read().strip()
out = {}
def try_(name, f):
    try:
        out[name] = f()
    except OSError as e:
        out[name] = e.errno
try_("read the other's file", lambda: open(d + "/secret.txt").read())
try_("list the other's dir", lambda: os.listdir(d))
try_("plant in the other's outputs", lambda: open(d + "/outputs/planted.txt", "w").write("from A"))
cwds = []
for p in os.listdir("/proc"):
    if p.isdigit() and int(p) != os.getpid():
        try:
            cwds.append(os.readlink("/proc/%s/cwd" % p))
        except OSError:
            pass
out["cwds"] = cwds
out["uid"] = os.getuid()
print(json.dumps(out))`})
			if err := json.Unmarshal([]byte(out.Stdout), &got); err != nil {
				t.Fatalf("attacker printed %q: %v (stderr %q)", out.Stdout, err, out.Stderr)
			}
			for _, k := range []string{"read the other's file", "list the other's dir", "plant in the other's outputs"} {
				if _, isErrno := got[k].(float64); !isErrno {
					t.Errorf("%s: got %v, want a permission error", k, got[k])
				}
			}
			for _, c := range got["cwds"].([]any) {
				if strings.Contains(c.(string), "mcp-exec-") {
					t.Errorf("another call's dir is visible through /proc/<pid>/cwd: %v", c)
				}
			}
			res := <-victim
			if res == nil {
				t.FailNow()
			}
			vout := decodeOutput(t, res)
			if strings.Contains(vout.Stdout, "planted") {
				t.Errorf("a file planted by another call came back in the victim's result: %q", vout.Stdout)
			}
			var full struct {
				Files []struct{ Path string } `json:"files"`
			}
			remarshal(t, res.StructuredContent, &full)
			if len(full.Files) != 0 {
				t.Errorf("the victim's result holds files it did not write: %v", full.Files)
			}
			if m.root {
				var uid struct{ UID int }
				remarshal(t, got, &uid)
				if uid.UID == 0 || uid.UID == 65532 {
					t.Errorf("a call under a root server runs as uid %d, want one of its own", uid.UID)
				}
			}
		})
	}
}

// The call's /tmp is its own dir, not the machine's: writing to the
// machine's /tmp fails, and the dir is bounded in total by the /tmp size,
// not file by file, and gone after the call.
func TestProcessScratchIsBoundedAndGone(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m.root, "MCP_EXEC_TMPFS_MB=8", "MCP_EXEC_MAX_FILE_BYTES=1048576")
			name := fmt.Sprintf("mcp-exec-leftover-%d", time.Now().UnixNano())
			out, _ := s.call(t, map[string]any{"code": fmt.Sprintf(`import errno
try:
    open("/tmp/%s", "w").write("x")
    print("wrote the machine's /tmp")
except OSError as e:
    print("refused", e.errno)`, name)})
			if !strings.HasPrefix(out.Stdout, "refused") {
				t.Errorf("writing the machine's /tmp: %q, want it refused", out.Stdout)
			}
			if _, err := os.Stat(filepath.Join("/tmp", name)); err == nil {
				t.Errorf("/tmp/%s is left on the machine", name)
			}
			// Three files of 6 MiB each, under an 8 MiB /tmp.
			out, _ = s.call(t, map[string]any{"code": `import os
chunk = b"x" * (1 << 20)
written = 0
for i in range(3):
    with open("f%d" % i, "wb") as f:
        for _ in range(6):
            f.write(chunk); f.flush(); os.fsync(f.fileno())
            written += len(chunk)
print("wrote", written >> 20, "MiB")`, "timeout_s": 30})
			if strings.Contains(out.Stdout, "wrote 18 MiB") || out.ExitCode != 137 || !strings.Contains(out.Stderr, "went past its size, 8 MiB") {
				t.Errorf("18 MiB under an 8 MiB /tmp: exit %d, stdout %q, stderr %q; want the call killed at the bound and saying so", out.ExitCode, out.Stdout, out.Stderr)
			}
			// What fits, fits.
			out, _ = s.call(t, map[string]any{"code": `open("f", "wb").write(b"x" * (6 << 20)); print("ok")`})
			if out.Stdout != "ok\n" || out.ExitCode != 0 {
				t.Errorf("6 MiB under an 8 MiB /tmp: exit %d, %q %q", out.ExitCode, out.Stdout, out.Stderr)
			}
			s.waitDirsGone(t)
		})
	}
}

// Under root, concurrent calls have uids of their own, so a call that
// exhausts its per-user kernel limits (inotify instances) leaves another
// its own.
func TestProcessPerUserLimitsNotSharedUnderRoot(t *testing.T) {
	s := startProcessServer(t, true)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.tryCall(map[string]any{"code": `import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 10000 and libc.inotify_init1(0) >= 0:
    n += 1
print(n, flush=True)
open("exhausted", "w").write(str(n))
time.sleep(10)`, "timeout_s": 30})
	}()
	testenv.EventuallyWithin(t, 30*time.Second, "the first call to exhaust its inotify instances", func() bool {
		matches, _ := filepath.Glob(filepath.Join(s.tmp, "mcp-exec-*", "*", "work", "exhausted"))
		return len(matches) == 1
	})
	var got struct{ Errno int }
	s.probe(t, `import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print(json.dumps({"errno": ctypes.get_errno() if fd < 0 else 0}))`, &got)
	if got.Errno != 0 {
		t.Errorf("inotify_init1 in a second call failed with errno %d while the first held its limit", got.Errno)
	}
	wg.Wait()
}

// pidOf finds the process whose command line holds marker.
func pidOf(marker string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte(marker)) && !bytes.Contains(cmd, []byte("pgrep")) {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	return 0
}

func parentOf(pid int) (int, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return strconv.Atoi(f[1])
}

// waitGone waits for every process holding marker to be gone.
func waitGone(t *testing.T, marker string, d time.Duration) {
	t.Helper()
	testenv.EventuallyWithin(t, d, "the call's processes ("+marker+") to be gone", func() bool { return pidOf(marker) == 0 })
}
