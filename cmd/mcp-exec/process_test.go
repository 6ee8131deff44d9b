package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
// no-new-privileges gives), and as root; each with its calls in
// namespaces of their own (a desktop user's host allows them) and without
// (MCP_EXEC_PROCESS_NAMESPACES=false: what a host that refuses them gets,
// as the 0.5.4 docker flags do). Each attack is one an adversarial review
// made work before the process runtime confined its calls.

const processToken = "not-for-the-code-0123456789"

// processMode is one way the server runs the process runtime.
type processMode struct {
	name string
	root bool // the server as root: a uid per call
	ns   bool // each call in namespaces of its own
}

// processModes are the ways the server runs the process runtime.
var processModes = []processMode{
	{"uid65532", false, true}, {"root", true, true},
	{"uid65532-nonamespaces", false, false}, {"root-nonamespaces", true, false},
}

// processServer is the real binary serving over stdio with the process
// runtime, its calls' dirs under tmp.
type processServer struct {
	cs     *mcp.ClientSession
	stderr *testenv.SyncBuffer
	tmp    string
	cmd    *exec.Cmd
}

func startProcessServer(t *testing.T, m processMode, env ...string) *processServer {
	t.Helper()
	return startProcessServerWithGroups(t, m, nil, env...)
}

// startProcessServerWithGroups is startProcessServer with an
// unprivileged server in these supplementary groups, as a desktop user
// is in his (docker, sudo, …); a root server has root's.
func startProcessServerWithGroups(t *testing.T, m processMode, groups []int, env ...string) *processServer {
	t.Helper()
	return startProcessServerUnder(t, m, groups, nil, env...)
}

// startProcessServerUnder is startProcessServerWithGroups with the
// server started through wrap (e.g. prlimit and its options).
func startProcessServerUnder(t *testing.T, m processMode, groups []int, wrap []string, env ...string) *processServer {
	t.Helper()
	s, _, err := tryProcessServerUnder(t, m, groups, wrap, env...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryProcessServer is startProcessServer for a server that may refuse to
// start: the error says what it said.
func tryProcessServer(t *testing.T, m processMode, env ...string) (*processServer, *testenv.SyncBuffer, error) {
	return tryProcessServerUnder(t, m, nil, nil, env...)
}

// tryProcessServerUnder is tryProcessServer as startProcessServerUnder
// starts it.
func tryProcessServerUnder(t *testing.T, m processMode, groups []int, wrap []string, env ...string) (*processServer, *testenv.SyncBuffer, error) {
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
	if !m.root {
		g := "--clear-groups"
		if len(groups) > 0 {
			var ids []string
			for _, id := range groups {
				ids = append(ids, strconv.Itoa(id))
			}
			g = "--groups=" + strings.Join(ids, ",")
		}
		argv = append([]string{"setpriv", "--reuid=65532", "--regid=65532", g, "--inh-caps=-all",
			"--bounding-set=-all", "--no-new-privs"}, argv...)
	}
	argv = append(wrap[:len(wrap):len(wrap)], argv...)
	cmd := exec.Command(argv[0], argv[1:]...)
	// With namespaces asked for, not merely allowed: a host that refuses
	// them must not pass these tests on the confinement without.
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home"), "TMPDIR=" + tmp,
		"MCP_EXEC_RUNTIME=process", "MCP_EXEC_AUTH_TOKEN=" + processToken, "MCP_EXEC_POOL_SIZE=0",
		"MCP_EXEC_STATE_DIR=" + filepath.Join(dir, "state"), "MCP_EXEC_PROCESS_NAMESPACES=" + strconv.FormatBool(m.ns)}, env...)
	stderr := &testenv.SyncBuffer{}
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil && strings.Contains(stderr.String(), "refuses the process runtime namespaces") {
		testenv.Missing(t, "this host refuses the process runtime namespaces of its own:\n%s", stderr.String())
	}
	if err != nil {
		return nil, stderr, fmt.Errorf("connecting: %v\n%s", err, stderr.String())
	}
	t.Cleanup(func() { cs.Close() })
	return &processServer{cs: cs, stderr: stderr, tmp: tmp, cmd: cmd}, stderr, nil
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

// callDir finds the work dir of a running call that holds a file name:
// on the host, or, in a call's own mount namespace, where only the
// call's processes see it, through its init's /proc/<pid>/root. It
// returns the dir as the host names it, or "".
func (s *processServer) callDir(name string) string {
	pattern := filepath.Join(s.tmp, "mcp-exec-*", "*", "work", name)
	roots := []string{""}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); bytes.HasPrefix(cmd, []byte("mcp-exec-init\x00")) {
			roots = append(roots, filepath.Join("/proc", e.Name(), "root"))
		}
	}
	for _, root := range roots {
		if m, _ := filepath.Glob(root + pattern); len(m) == 1 {
			return strings.TrimPrefix(filepath.Dir(m[0]), root)
		}
	}
	return ""
}

// The code can neither read the server's environment, memory or command
// line, nor signal it or its own init, though it is handed the server's
// pid: in namespaces of its own no such process is there; without, the
// server is not dumpable (its /proc files are root's) and the code's
// Landlock domain refuses whatever lies outside it, the server's /proc
// dir included.
func TestProcessServerOutOfReach(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			server := s.cmd.Process.Pid // setpriv execs the server: the same pid
			var got map[string]int
			out, _ := s.call(t, map[string]any{"stdin": strconv.Itoa(server), "code": `import json, os, sys
server = int(sys.stdin.read())
init = os.getppid()
out = {}
def try_(name, f):
    try:
        f(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
try_("read /proc/server/environ", lambda: open("/proc/%d/environ" % server, "rb").read())
try_("read /proc/server/cmdline", lambda: open("/proc/%d/cmdline" % server, "rb").read())
try_("open /proc/server/mem rw", lambda: open("/proc/%d/mem" % server, "r+b"))
try_("list /proc/server/fd", lambda: os.listdir("/proc/%d/fd" % server))
try_("readlink /proc/server/cwd", lambda: os.readlink("/proc/%d/cwd" % server))
try_("signal the server", lambda: os.kill(server, 0))
try_("signal the init", lambda: os.kill(init, 0))
try_("open /proc/init/mem rw", lambda: open("/proc/%d/mem" % init, "r+b"))
print(json.dumps(out))`})
			if err := json.Unmarshal([]byte(out.Stdout), &got); err != nil {
				t.Fatalf("probe printed %q (exit %d, stderr %q): %v", out.Stdout, out.ExitCode, out.Stderr, err)
			}
			for _, k := range []string{"read /proc/server/environ", "read /proc/server/cmdline", "open /proc/server/mem rw",
				"list /proc/server/fd", "readlink /proc/server/cwd", "signal the server", "signal the init", "open /proc/init/mem rw"} {
				if v, ok := got[k]; !ok || v == 0 {
					t.Errorf("%s: succeeded (%v), want an error", k, got)
				}
			}
			// Not dumpable: its /proc files are root's, whatever its uid.
			var st syscall.Stat_t
			if err := syscall.Stat(fmt.Sprintf("/proc/%d/environ", server), &st); err != nil || st.Uid != 0 {
				t.Errorf("the server is dumpable: its /proc/<pid>/environ is owned by uid %d (%v)", st.Uid, err)
			}
			if strings.Contains(s.stderr.String(), processToken) {
				t.Errorf("the token is in the server's log")
			}
		})
	}
}

// The code runs under the product's seccomp filter, with what this runtime
// shares with every other call refused too: IP sockets, System V IPC, and
// without a root of its own unix sockets.
func TestProcessSeccomp(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			var got map[string]any
			s.probe(t, `import ctypes, json, os, socket
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
errno_of("unshare mount", libc.unshare(0x00020000))
errno_of("setns", libc.setns(os.open("/proc/self/ns/user", os.O_RDONLY), 0))
errno_of("mount", libc.mount(b"none", os.getcwd().encode(), b"tmpfs", 0, None))
errno_of("ptrace", libc.ptrace(16, 1, 0, 0))
errno_of("keyctl", libc.syscall(250, 0, 0, 0, 0))
print(json.dumps(out))`, &got)
			if got["Seccomp"] != "2" {
				t.Errorf("Seccomp: %v, want 2 (a filter)", got["Seccomp"])
			}
			for _, k := range []string{"AF_INET", "AF_INET6", "shmget", "unshare", "unshare mount", "setns", "mount", "ptrace", "keyctl"} {
				if got[k] != float64(1) {
					t.Errorf("%s: errno %v, want EPERM (1)", k, got[k])
				}
			}
			// Unix sockets only in a root of the call's own, where no
			// pathname socket of the host's is (process_sockets_test.go).
			if want := map[bool]float64{true: 0, false: 1}[m.ns]; got["AF_UNIX"] != want {
				t.Errorf("AF_UNIX: errno %v, want %v", got["AF_UNIX"], want)
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
			s := startProcessServer(t, m)
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
			s := startProcessServer(t, m)
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
			var victimDir string
			testenv.EventuallyWithin(t, 30*time.Second, "the victim call's input file", func() bool {
				victimDir = s.callDir("secret.txt")
				return victimDir != ""
			})
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
try:
    pids = os.listdir("/proc")
except PermissionError:
    pids = []   # without namespaces: no other process is visible at all
for p in pids:
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
// not file by file, and gone after the call. In namespaces of its own the
// dir is a tmpfs of that size: a write past it fails with ENOSPC, as in a
// container; without, the init measures it and kills the call past it.
func TestProcessScratchIsBoundedAndGone(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m, "MCP_EXEC_TMPFS_MB=8", "MCP_EXEC_MAX_FILE_BYTES=1048576")
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
			// Eight files of 6 MiB each, under an 8 MiB /tmp. The measure
			// lags a writer: on an idle machine by a few MiB, on one with
			// two busy loops beside the tests by 27 MiB once; what holds
			// there is that the writer is killed before it is done.
			out, _ = s.call(t, map[string]any{"code": `import os
chunk = b"x" * (1 << 20)
written = 0
try:
    for i in range(8):
        with open("f%d" % i, "wb") as f:
            for _ in range(6):
                f.write(chunk); f.flush(); os.fsync(f.fileno())
                written += 1
                print("wrote", written, flush=True)
except OSError as e:
    print("refused:", e.strerror)
    raise SystemExit(3)
print("kept", written, "MiB")`, "timeout_s": 30})
			if n := lastCount(out.Stdout, "wrote "); m.ns && (out.ExitCode != 3 || !strings.Contains(out.Stdout, "No space left on device") || n > 8) {
				t.Errorf("48 MiB under an 8 MiB /tmp: exit %d, %d MiB written, stdout %q, stderr %q; want ENOSPC at the bound", out.ExitCode, n, out.Stdout, out.Stderr)
			} else if !m.ns && (strings.Contains(out.Stdout, "kept") || out.ExitCode != 137 || strings.Count(out.Stderr, "went past its size, 8 MiB") != 1 || n >= 48) {
				t.Errorf("48 MiB under an 8 MiB /tmp: exit %d, %d MiB written, stderr %q; want the call killed past the bound, before its end, and saying so once", out.ExitCode, n, out.Stderr)
			} else {
				t.Logf("48 MiB under an 8 MiB /tmp: %d MiB written, then exit %d", n, out.ExitCode)
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

// Files without a name count: a file the code unlinks while it holds it
// open, or makes with O_TMPFILE, takes the /tmp's room as much as a named
// one, and the walk of the dir does not see it (the finding: 84 MiB held
// under a 16 MiB bound). In namespaces of its own the tmpfs refuses the
// write past its size; without, the init counts what the call's processes
// hold through their descriptors, and through their mappings, and kills
// the call past the bound, as it kills a process that hides its files.
func TestProcessNamelessFilesBounded(t *testing.T) {
	const hold = `import os, sys, time
chunk = b"x" * (1 << 20)
held, total = [], 0
try:
    for i in range(12):
        if i % 2:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600)
        else:
            fd = os.open("f%d" % i, os.O_CREAT | os.O_WRONLY, 0o600)
            os.unlink("f%d" % i)
        for _ in range(8):
            os.write(fd, chunk)
            total += 1
            print("held", total, flush=True)
        held.append(fd)
    time.sleep(1)
    print("kept", total, "MiB")
except OSError as e:
    print("refused:", e.strerror)
    sys.exit(3)`
	// Through mappings alone: each file mapped whole, its descriptor
	// closed, its name gone. (Mapped in part, it would count in part.)
	const mapped = `import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
total = 0
for i in range(24):
    fd = os.open("m%d" % i, os.O_CREAT | os.O_RDWR, 0o600)
    os.write(fd, b"x" * (4 << 20))
    if libc.mmap(None, 4 << 20, 1, 1, fd, 0) in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap")
    os.close(fd)
    os.unlink("m%d" % i)
    total += 4
    print("held", total, flush=True)
time.sleep(1)
print("kept", total, "MiB")`
	// A process that hides its descriptors from the init (it is not
	// dumpable: its /proc/<pid>/fd is root's).
	const hidden = `import ctypes, time
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
time.sleep(1)
print("kept")`
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m, "MCP_EXEC_TMPFS_MB=16")
			held := func(out execOutput) int { return lastCount(out.Stdout, "held ") }
			out, _ := s.call(t, map[string]any{"code": hold, "timeout_s": 30})
			t.Logf("96 MiB without a name under a 16 MiB /tmp: %d MiB held, then exit %d", held(out), out.ExitCode)
			switch {
			case strings.Contains(out.Stdout, "kept"):
				t.Errorf("%d MiB held without a name under a 16 MiB /tmp: the call kept it all", held(out))
			case m.ns && (out.ExitCode != 3 || !strings.Contains(out.Stdout, "No space left") || held(out) > 16):
				t.Errorf("files without a name: exit %d, %d MiB held, stdout %q; want ENOSPC at 16 MiB", out.ExitCode, held(out), out.Stdout)
			case !m.ns && (out.ExitCode != 137 || !strings.Contains(out.Stderr, "without a name, went past its size, 16 MiB") || held(out) >= 96):
				// The bound is a measure: on a machine with two busy loops
				// beside the tests it let 59 MiB through once; what holds is
				// that the call is killed before it has it all, saying why.
				t.Errorf("files without a name: exit %d, %d MiB held, stderr %q; want the call killed past 16 MiB, before its end, saying why", out.ExitCode, held(out), out.Stderr)
			}
			if m.ns {
				return // the tmpfs bounds every file on it, mapped or not
			}
			out, _ = s.call(t, map[string]any{"code": mapped, "timeout_s": 30})
			t.Logf("96 MiB through mappings alone: %d MiB held, then exit %d", held(out), out.ExitCode)
			if strings.Contains(out.Stdout, "kept") || out.ExitCode != 137 || held(out) >= 96 {
				t.Errorf("files held through mappings alone: exit %d, %d MiB held, stdout %q; want the call killed past 16 MiB, before its end", out.ExitCode, held(out), out.Stdout)
			}
			if m.root {
				return // a root init reads what any process holds
			}
			out, _ = s.call(t, map[string]any{"code": hidden, "timeout_s": 30})
			if strings.Contains(out.Stdout, "kept") || out.ExitCode != 137 || !strings.Contains(out.Stderr, "hides the files it holds") {
				t.Errorf("a process hiding its files: exit %d, stdout %q, stderr %q; want the call killed, saying why", out.ExitCode, out.Stdout, out.Stderr)
			}
		})
	}
}

// No call reads another process's command line: not the server's, not a
// concurrent call's subprocess (whose arguments may be anything: a
// password, a URL with a token). In namespaces of its own the call's
// /proc shows only its own processes; without, its Landlock domain reads
// of /proc only the machine's entries and its own main process.
func TestProcessOtherProcessesHidden(t *testing.T) {
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			marker := fmt.Sprintf("mcp-exec-argv-secret-%d", time.Now().UnixNano())
			other := make(chan execOutput, 1)
			go func() {
				out, _, err := s.tryCall(map[string]any{"code": fmt.Sprintf(`import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", %q])
time.sleep(6)
p.kill()`, marker), "timeout_s": 30})
				if err != nil {
					t.Error(err)
				}
				other <- out
			}()
			var pid int
			testenv.EventuallyWithin(t, 30*time.Second, "the other call's subprocess", func() bool {
				pid = pidOf(marker)
				return pid > 0
			})
			var got struct {
				Listed              any
				Seen                []string
				Procs               []int
				Self                int
				Marker, ServerCmdln any
			}
			out, _ := s.call(t, map[string]any{"stdin": fmt.Sprintf("%d %d", pid, s.cmd.Process.Pid), "code": fmt.Sprintf(`import json, os, sys
marker = %q.encode()
pid, server = map(int, sys.stdin.read().split())
out = {"Seen": [], "Procs": [], "Self": os.getpid()}
try:
    for p in os.listdir("/proc"):
        if p.isdigit():
            out["Procs"].append(int(p))
            try:
                if marker in open("/proc/%%s/cmdline" %% p, "rb").read():
                    out["Seen"].append(p)
            except OSError:
                pass
    out["Listed"] = True
except OSError as e:
    out["Listed"] = e.errno
for k, p in [("Marker", pid), ("ServerCmdln", server)]:
    try:
        out[k] = open("/proc/%%d/cmdline" %% p, "rb").read().decode(errors="replace")
    except OSError as e:
        out[k] = e.errno
print(json.dumps(out))`, marker)})
			if err := json.Unmarshal([]byte(out.Stdout), &got); err != nil {
				t.Fatalf("probe printed %q (stderr %q): %v", out.Stdout, out.Stderr, err)
			}
			if len(got.Seen) > 0 {
				t.Errorf("a call read another call's subprocess's command line in /proc/%v", got.Seen)
			}
			for k, v := range map[string]any{"the other call's subprocess": got.Marker, "the server": got.ServerCmdln} {
				if _, isErrno := v.(float64); !isErrno {
					t.Errorf("%s's /proc/<pid>/cmdline, its pid in hand: read %q, want an error", k, v)
				}
			}
			// Its own processes, and none other: the init (pid 1) and itself.
			slices.Sort(got.Procs)
			if m.ns && (got.Listed != true || !slices.Equal(got.Procs, []int{1, got.Self})) {
				t.Errorf("in namespaces of its own, /proc lists %v (listed: %v), want only the init (1) and the code (%d)", got.Procs, got.Listed, got.Self)
			}
			if !m.ns && got.Listed != float64(syscall.EACCES) {
				t.Errorf("without namespaces, listing /proc: %v, want EACCES (%d pids listed)", got.Listed, len(got.Procs))
			}
			<-other
		})
	}
}

// In namespaces of its own a call is bubblewrap's sandbox: under an
// unprivileged server its uid mapped to itself and nothing else,
// setgroups denied (a root server makes them without a user namespace,
// and the code is the call's own uid); only lo (up), its own hostname,
// the machine's files read-only, its /tmp a tmpfs; and no way out through
// them: no capability, no_new_privs, and the seccomp filter refuses new
// namespaces, setns and mount to the code (the init made them before it
// started the code).
func TestProcessNamespaces(t *testing.T) {
	for _, m := range processModes {
		if !m.ns {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			var got struct {
				UID, PID, PPID  int
				UIDMap, GIDMap  []string
				Setgroups       string
				Ifaces          map[string]int
				Hostname, TmpFS string
				RootOptions     string
				Caps            []string
				NoNewPrivs      string
				Refused         map[string]int
			}
			s.probe(t, `import ctypes, fcntl, json, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
out = {"UID": os.getuid(), "PID": os.getpid(), "PPID": os.getppid(), "Hostname": os.uname().nodename,
       "UIDMap": open("/proc/self/uid_map").read().split(), "GIDMap": open("/proc/self/gid_map").read().split(),
       "Setgroups": open("/proc/self/setgroups").read().strip(), "Refused": {}}
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
out["Ifaces"] = {n: struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", n.encode(), 0)))[1] & 1
                 for _, n in socket.if_nameindex()}
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if f[4] == os.getcwd():
        out["TmpFS"] = f[f.index("-") + 1]
    if f[4] == "/":
        out["RootOptions"] = f[5]
status = {k: v.strip() for k, v in (l.split(":", 1) for l in open("/proc/self/status") if ":" in l)}
out["Caps"] = [status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")]
out["NoNewPrivs"] = status["NoNewPrivs"]
def refused(name, f):
    try:
        rc = f()
        out["Refused"][name] = ctypes.get_errno() if isinstance(rc, int) and rc < 0 else 0
    except OSError as e:
        out["Refused"][name] = e.errno
refused("write the machine's files", lambda: open("/usr/lib/mcp-exec-planted", "w"))
refused("unshare a user namespace", lambda: libc.unshare(0x10000000))
refused("unshare a mount namespace", lambda: libc.unshare(0x00020000))
refused("setns", lambda: libc.setns(os.open("/proc/self/ns/user", os.O_RDONLY), 0))
refused("mount", lambda: libc.mount(b"none", os.getcwd().encode(), b"tmpfs", 0, None))
refused("setgroups", lambda: os.setgroups([]))
refused("setuid 0", lambda: os.setuid(0))
print(json.dumps(out))`, &got)
			uid := strconv.Itoa(got.UID)
			// A root server makes them without a user namespace: the code
			// is the call's own uid of the host's.
			if !m.root && (!slices.Equal(got.UIDMap, []string{uid, uid, "1"}) || len(got.GIDMap) != 3 || got.GIDMap[2] != "1" || got.Setgroups != "deny") {
				t.Errorf("uid_map %v, gid_map %v, setgroups %q; want one id each, mapped to itself (%s), setgroups denied", got.UIDMap, got.GIDMap, got.Setgroups, uid)
			}
			if m.root && !slices.Equal(got.UIDMap, []string{"0", "0", "4294967295"}) {
				t.Errorf("uid_map %v under a root server, want the host's", got.UIDMap)
			}
			if (got.UID == 0 || got.UID == 65532) == m.root {
				t.Errorf("the code's uid is %d, want the server's own unprivileged, a call's own under root", got.UID)
			}
			if got.PPID != 1 || len(got.Ifaces) != 1 || got.Ifaces["lo"] != 1 || got.Hostname != "sandbox" || got.TmpFS != "tmpfs" {
				t.Errorf("parent %d, interfaces %v (1: up), hostname %q, /tmp on %q; want the init as pid 1, only lo and up, sandbox, a tmpfs",
					got.PPID, got.Ifaces, got.Hostname, got.TmpFS)
			}
			// Read-only below Landlock too, which refuses the same writes.
			if !slices.Contains(strings.Split(got.RootOptions, ","), "ro") {
				t.Errorf("the machine's root is mounted %q in the call, want ro", got.RootOptions)
			}
			for _, c := range got.Caps {
				if c != "0000000000000000" {
					t.Errorf("capabilities %v, want none in any set", got.Caps)
					break
				}
			}
			if got.NoNewPrivs != "1" {
				t.Errorf("NoNewPrivs %q, want 1", got.NoNewPrivs)
			}
			for name, errno := range got.Refused {
				if errno == 0 {
					t.Errorf("%s: succeeded, want it refused", name)
				}
			}
			if len(got.Refused) != 7 {
				t.Errorf("the probe tried %d escapes, want 7: %v", len(got.Refused), got.Refused)
			}
		})
	}
}

// A frozen session's process whose thread-group leader has exited, its
// worker thread woken by its own timer (red team F2), runs no further
// than the watch's next look: the session is ended, and the next call,
// the log and the audit log say why, truthfully (the reason stays
// "exited", the contract's word, not "the interpreter ended").
func TestProcessFrozenSessionThatRunsIsEnded(t *testing.T) {
	// As runtime's selfWakeZombie; the worker counts in a file.
	const code = `import ctypes, os, platform, signal, threading, time
libc = ctypes.CDLL(None, use_errno=True)
class sigevent(ctypes.Structure):
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int), ("pad", ctypes.c_byte * 48)]
class itimerspec(ctypes.Structure):
    _fields_ = [("i_s", ctypes.c_long), ("i_ns", ctypes.c_long), ("v_s", ctypes.c_long), ("v_ns", ctypes.c_long)]
r, w = os.pipe()
if os.fork() == 0:
    signal.signal(signal.SIGCONT, lambda *_: None)
    def spin():
        timer = ctypes.c_void_p()
        libc.timer_create(0, ctypes.byref(sigevent(signo=signal.SIGCONT, notify=0)), ctypes.byref(timer))
        # Every second from a second after this call: one comes after the
        # freeze, however late a busy machine freezes it.
        libc.timer_settime(timer, 0, ctypes.byref(itimerspec(1, 0, 1, 0)), None)
        n = 0
        while True:
            n += 1
            if n % 1_000_000 == 0:
                open("spin", "w").write(str(n))
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
    libc.syscall(60 if platform.machine() == "x86_64" else 93, 0)
os.read(r, 1)
print("armed")`
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "mcp-exec-audit-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			os.Chmod(dir, 0o777)
			audit := filepath.Join(dir, "audit.log")
			s := startProcessServer(t, m, "MCP_EXEC_AUDIT_LOG="+audit)
			out, _ := s.call(t, map[string]any{"code": code, "session": "new"})
			if out.Stdout != "armed\n" || out.SessionEnded != "" {
				t.Fatalf("the first call: %q %q, session ended %q", out.Stdout, out.Stderr, out.SessionEnded)
			}
			frozen := time.Now()
			testenv.EventuallyWithin(t, 10*time.Second, "the session that ran while frozen to be ended", func() bool {
				return strings.Contains(s.stderr.String(), "persistent session ended")
			})
			t.Logf("ended %v after the call", time.Since(frozen).Round(time.Millisecond))
			res, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec",
				Arguments: map[string]any{"code": `print(open("spin").read())`, "session": out.Session}})
			if err != nil || !res.IsError {
				t.Fatalf("a call to the ended session: %v %+v, want isError", err, res)
			}
			msg := res.Content[0].(*mcp.TextContent).Text
			if !strings.Contains(msg, "exited: killed by the server: a process of the session ran while the session was frozen") ||
				strings.Contains(msg, "sys.exit or a crash") {
				t.Errorf("the call after: %q, want the session ended, saying it ran while frozen", msg)
			}
			if log := s.stderr.String(); !strings.Contains(log, `detail="killed by the server: a process of the session ran while the session was frozen`) {
				t.Errorf("the server's log does not say why the session ended:\n%s", log)
			}
			var ended bool
			for _, l := range strings.Split(string(mustRead(t, audit)), "\n") {
				ended = ended || strings.Contains(l, `"event":"session_end"`) && strings.Contains(l, `"session_ended":"exited"`) &&
					strings.Contains(l, `"session_end_detail":"killed by the server: a process of the session ran while the session was frozen`)
			}
			if !ended {
				t.Errorf("the audit log has no session_end saying why:\n%s", mustRead(t, audit))
			}
		})
	}
}

// One call forking until the kernel refuses takes its share of processes
// (MCP_EXEC_PIDS) and no more: the verdict says it hit the limit, and a
// call beside it runs as ever. Without namespaces an unprivileged
// server's calls share its uid, and so the kernel's per-user count (red
// team F9: a bomb at the uid's limit made every other call "a problem of
// the server"); each call's limit is then the uid's count at its start
// plus its share, set as the call is claimed: sandboxes prepared ahead
// (pooled) wait while the count moves, and their limits with it.
func TestProcessForkBombTakesItsShareOnly(t *testing.T) {
	const pids = 64
	type run struct {
		processMode
		pool string
	}
	runs := []run{{processMode{"uid65532-nonamespaces-pooled", false, false}, "4"}}
	for _, m := range processModes {
		runs = append(runs, run{m, "0"})
	}
	for _, r := range runs {
		m := r.processMode
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m, fmt.Sprintf("MCP_EXEC_PIDS=%d", pids), "MCP_EXEC_POOL_SIZE="+r.pool)
			bomb := make(chan execOutput, 1)
			go func() {
				out, _, err := s.tryCall(map[string]any{"code": `import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        n += 1
except OSError as e:
    print("forked", n, "then errno", e.errno, flush=True)
open("capped", "w").close()
time.sleep(6)`, "timeout_s": 60})
				if err != nil {
					t.Error(err)
				}
				bomb <- out
			}()
			testenv.EventuallyWithin(t, 30*time.Second, "the fork bomb to reach its limit", func() bool { return s.callDir("capped") != "" })
			for i := range 4 {
				out, res, err := s.tryCall(map[string]any{"code": `import subprocess, sys
print(subprocess.run([sys.executable, "-c", "print('other call')"], capture_output=True, text=True).stdout, end="")`})
				if res != nil && res.IsError {
					t.Errorf("a call beside the fork bomb (%d) failed: %s", i, text(res))
				} else if err != nil || out.Stdout != "other call\n" || out.ExitCode != 0 || out.PidsLimited {
					t.Errorf("a call beside the fork bomb (%d): %q %q exit %d, pids_limited %v: %v", i, out.Stdout, out.Stderr, out.ExitCode, out.PidsLimited, err)
				}
			}
			out := <-bomb
			n := lastCount(out.Stdout, "forked ")
			t.Logf("the bomb: %q, pids_limited %v", out.Stdout, out.PidsLimited)
			if !out.PidsLimited || !strings.Contains(out.Stdout, "errno 11") {
				t.Errorf("the fork bomb: pids_limited %v, stdout %q; want the limit hit (EAGAIN) and said", out.PidsLimited, out.Stdout)
			}
			// Its share, less the init and the interpreter; with a uid
			// shared with the server, what the uid's count moved by since
			// the call was counted, either way.
			if n > pids || n < pids/2 {
				t.Errorf("the fork bomb made %d processes, want its share (%d) at most, and most of it", n, pids)
			}
		})
	}
}

// Where the server's uid has a process limit of its own (its hard
// RLIMIT_NPROC, e.g. a container's ulimit -u) and every call shares that
// uid, a call's share stops short of it by a reserve, whatever
// MCP_EXEC_PIDS says: a fork bomb that reaches it leaves the server room
// to start the next call, whose code runs. The server's soft limit, here
// below the bomb's reach, is raised to the hard one for that.
func TestProcessForkBombLeavesTheUIDsLimitRoom(t *testing.T) {
	m := processMode{"uid65532-nonamespaces", false, false}
	// Other tests on this machine run as this uid too: the limit is set
	// above what it runs now.
	hard := uidTasks(t, 65532) + 200
	s := startProcessServerUnder(t, m, nil, []string{"prlimit", fmt.Sprintf("--nproc=%d:%d", hard-120, hard), "--"}, "MCP_EXEC_PIDS=4096")
	bomb := make(chan execOutput, 1)
	go func() {
		out, _, err := s.tryCall(map[string]any{"code": `import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(40)
            os._exit(0)
        n += 1
except OSError as e:
    print("forked", n, "then errno", e.errno, flush=True)
open("capped", "w").close()
time.sleep(6)`, "timeout_s": 60})
		if err != nil {
			t.Error(err)
		}
		bomb <- out
	}()
	testenv.EventuallyWithin(t, 30*time.Second, "the fork bomb to reach its limit", func() bool { return s.callDir("capped") != "" })
	for i := range 3 {
		out, res, err := s.tryCall(map[string]any{"code": `print("other call")`})
		if res != nil && res.IsError {
			t.Errorf("a call beside the fork bomb (%d) failed: %s\n%s", i, text(res), s.stderr.String())
		} else if err != nil || out.Stdout != "other call\n" || out.ExitCode != 0 {
			t.Errorf("a call beside the fork bomb (%d): %q %q exit %d: %v", i, out.Stdout, out.Stderr, out.ExitCode, err)
		}
	}
	out := <-bomb
	t.Logf("the uid's limit %d: the bomb %q, pids_limited %v", hard, out.Stdout, out.PidsLimited)
	if !out.PidsLimited || !strings.Contains(out.Stdout, "errno 11") {
		t.Errorf("the fork bomb: pids_limited %v, stdout %q, stderr %q; want the limit hit (EAGAIN) and said", out.PidsLimited, out.Stdout, out.Stderr)
	}
}

// In a container with a process limit of its own (docker run
// --pids-limit, a pids cgroup around the server and every call), a call's
// share is no more than that cgroup leaves less the server's reserve,
// whatever MCP_EXEC_PIDS says: a fork bomb at its share leaves the server
// room to start the next call. The description states that limit.
func TestProcessForkBombLeavesTheContainersPidsRoom(t *testing.T) {
	testenv.Root(t)
	const max = 120
	dir := filepath.Join("/sys/fs/cgroup/pids", fmt.Sprintf("mcp-exec-test-outer-%d", time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		testenv.Missing(t, "no cgroup v1 pids hierarchy to make a container's pids cgroup in: %v", err)
	}
	t.Cleanup(func() {
		testenv.EventuallyWithin(t, 30*time.Second, "the outer pids cgroup to empty", func() bool { return os.Remove(dir) == nil })
	})
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(max)), 0); err != nil {
		t.Fatal(err)
	}
	m := processMode{"uid65532-nonamespaces", false, false}
	s := startProcessServerUnder(t, m, nil, []string{"sh", "-c", `echo $$ > "$0"/cgroup.procs && exec "$@"`, dir}, "MCP_EXEC_PIDS=4096")
	tools, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := tools.Tools[0].Description; !strings.Contains(d, fmt.Sprintf("The container's own process limit (%d) bounds the server and all calls together", max)) {
		t.Errorf("the description does not state the container's process limit: %s", d)
	}
	bomb := make(chan execOutput, 1)
	go func() {
		out, _, err := s.tryCall(map[string]any{"code": `import os, time
n = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(40)
            os._exit(0)
        n += 1
except OSError as e:
    print("forked", n, "then errno", e.errno, flush=True)
open("capped", "w").close()
time.sleep(6)`, "timeout_s": 60})
		if err != nil {
			t.Error(err)
		}
		bomb <- out
	}()
	testenv.EventuallyWithin(t, 30*time.Second, "the fork bomb to reach its limit", func() bool { return s.callDir("capped") != "" })
	for i := range 3 {
		out, res, err := s.tryCall(map[string]any{"code": `print("other call")`})
		if res != nil && res.IsError {
			t.Errorf("a call beside the fork bomb (%d) failed: %s\n%s", i, text(res), s.stderr.String())
		} else if err != nil || out.Stdout != "other call\n" || out.ExitCode != 0 {
			t.Errorf("a call beside the fork bomb (%d): %q %q exit %d: %v", i, out.Stdout, out.Stderr, out.ExitCode, err)
		}
	}
	out := <-bomb
	t.Logf("a container's pids.max %d: the bomb %q, pids_limited %v", max, out.Stdout, out.PidsLimited)
	if !out.PidsLimited || !strings.Contains(out.Stdout, "errno 11") {
		t.Errorf("the fork bomb: pids_limited %v, stdout %q, stderr %q; want the limit hit (EAGAIN) and said", out.PidsLimited, out.Stdout, out.Stderr)
	}
}

// uidTasks counts the tasks of uid's processes, as RLIMIT_NPROC does.
func uidTasks(t *testing.T, uid int) int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range entries {
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		var real, threads int
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "Uid:"); ok {
				fmt.Sscan(v, &real)
			} else if v, ok := strings.CutPrefix(l, "Threads:"); ok {
				fmt.Sscan(v, &threads)
			}
		}
		if real == uid {
			n += threads
		}
	}
	return n
}

// What the verdict says is measured, not made up (issue 24, red team
// F8): with no cgroup to count for it, the process runtime's init reads
// the kernel's counts of the call's processes (their CPU time, the peak
// resident set of the largest), and its memory limit, an rlimit that
// refuses an allocation rather than kill, is oom_killed when the
// MemoryError ends the code, said as such.
func TestProcessVerdictsMeasured(t *testing.T) {
	const burn = `import os, time
def burn(s):
    t = time.process_time()
    while time.process_time() - t < s:
        pass
`
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			out, _ := s.call(t, map[string]any{"code": burn + `burn(0.6)
if os.fork() == 0:
    burn(0.4)
    b = bytearray(120 << 20)
    for i in range(0, len(b), 4096):
        b[i] = 1
    os._exit(0)
os.wait()
print("done")`})
			t.Logf("1 s of CPU in two processes, 120 MiB in one: cpu_ms %d, peak_memory_bytes %d", out.CPUMS, out.PeakMemoryBytes)
			if out.Stdout != "done\n" || out.CPUMS < 950 || out.CPUMS > 3000 || out.PeakMemoryBytes < 120<<20 || out.PeakMemoryBytes > 200<<20 {
				t.Errorf("cpu_ms %d, peak_memory_bytes %d (stdout %q, stderr %q); want about 1000 ms and 120 MiB", out.CPUMS, out.PeakMemoryBytes, out.Stdout, out.Stderr)
			}
			out, res := s.call(t, map[string]any{"code": "x = bytearray(1 << 30)"})
			if !out.OOMKilled || out.ExitCode != 1 || !strings.Contains(text(res), "the memory limit (256 MiB) refused an allocation, and the MemoryError ended the code") {
				t.Errorf("1 GiB under a 256 MiB limit: oom_killed %v, exit %d, text %q; want the limit's verdict", out.OOMKilled, out.ExitCode, text(res))
			}
			out, _ = s.call(t, map[string]any{"code": "try:\n    x = bytearray(1 << 30)\nexcept MemoryError:\n    print('caught')"})
			if out.OOMKilled || out.Stdout != "caught\n" {
				t.Errorf("a MemoryError the code caught: oom_killed %v, stdout %q; want no verdict of the limit", out.OOMKilled, out.Stdout)
			}
			// A session's call is told its own.
			first, _ := s.call(t, map[string]any{"code": burn + "burn(0.8)", "session": "new"})
			next, _ := s.call(t, map[string]any{"code": "burn(0.1)", "session": first.Session})
			if first.CPUMS < 750 || next.CPUMS < 80 || next.CPUMS > 500 {
				t.Errorf("a session's calls of 0.8 s and 0.1 s of CPU: cpu_ms %d and %d", first.CPUMS, next.CPUMS)
			}
		})
	}
}

// The process runtime runs the host's Python: the description says what
// that imports (the batteries by name, the rest of its site-packages
// counted), and how its limits, rlimits, differ; plt.show() comes back
// as a figure, through the backend a container's rootfs has, as it does
// there (issue 24).
func TestProcessDescriptionAndFigures(t *testing.T) {
	if _, err := os.Stat("/usr/lib/python3/dist-packages/matplotlib"); err != nil {
		testenv.Missing(t, "the host's Python has no matplotlib (apt-get install python3-matplotlib)")
	}
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			tools, err := s.cs.ListTools(context.Background(), nil)
			if err != nil {
				t.Fatal(err)
			}
			d := tools.Tools[0].Description
			for _, want := range []string{"Importable beyond the standard library: ", "matplotlib", "numpy", "more modules of the host's Python",
				"counts in the memory limit", "reported as oom_killed"} {
				if !strings.Contains(d, want) {
					t.Errorf("the description does not say %q: %s", want, d)
				}
			}
			if shared := strings.Contains(d, "counts the server's own uid"); shared != (!m.root && !m.ns) {
				t.Errorf("the description says the process limit is the server's uid's: %v, want %v", shared, !m.root && !m.ns)
			}
			if strings.Contains(d, "Only the Python standard library") {
				t.Errorf("the description says only the standard library imports: %s", d)
			}
			out, res := s.call(t, map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()\nprint('shown')"})
			var full struct {
				Files []struct{ Path, MimeType string } `json:"files"`
			}
			remarshal(t, res.StructuredContent, &full)
			if out.Stdout != "shown\n" || len(full.Files) != 1 || full.Files[0].Path != "figure-1.png" {
				t.Errorf("plt.show(): stdout %q, stderr %q, files %v; want figure-1.png back", out.Stdout, out.Stderr, full.Files)
			}
		})
	}
}

// Under root, concurrent calls have uids of their own, so a call that
// exhausts its per-user kernel limits (inotify instances) leaves another
// its own.
func TestProcessPerUserLimitsNotSharedUnderRoot(t *testing.T) {
	s := startProcessServer(t, processModes[1])
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
		return s.callDir("exhausted") != ""
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

// lastCount is the number after prefix on the last line of out that has
// one: how far a probe that counts its progress got.
func lastCount(out, prefix string) int {
	n := 0
	for _, l := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(l, prefix); ok {
			n, _ = strconv.Atoi(strings.Fields(v + " 0")[0])
		}
	}
	return n
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
