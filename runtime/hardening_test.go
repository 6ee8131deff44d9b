package runtime_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// The init, pid 1, is out of the code's reach: another uid, not dumpable,
// and pid 1, so the code can neither patch its memory (the attack that
// cleared a Python init's parent-death signal), nor read its environment,
// nor signal it.
func TestInitIsOutOfReach(t *testing.T) {
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got map[string]any
		h.probe(`import errno, json, os, signal
out = {}
def try_(name, f):
    try:
        f(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
try_("open /proc/1/mem rw", lambda: open("/proc/1/mem", "r+b"))
try_("open /proc/1/mem r", lambda: open("/proc/1/mem", "rb"))
try_("read /proc/1/environ", lambda: open("/proc/1/environ", "rb").read())
try:
    env = open("/proc/1/environ", "rb").read().split(b"\0")
    own = set(("%s=%s" % kv).encode() for kv in os.environ.items())
    out["environ beyond the code's own"] = [e.decode() for e in env if e and e not in own]
except OSError:
    out["environ beyond the code's own"] = []
try_("kill 1 SIGKILL", lambda: os.kill(1, signal.SIGKILL))
try_("kill 1 SIGTERM", lambda: os.kill(1, signal.SIGTERM))
st = {}
for line in open("/proc/1/status"):
    k, _, v = line.partition(":")
    st[k] = v.split()
out["init uid"] = int(st["Uid"][0])
out["own uid"] = os.getuid()
print(json.dumps(out))`, &got)
		for _, k := range []string{"open /proc/1/mem rw", "open /proc/1/mem r", "read /proc/1/environ", "kill 1 SIGKILL", "kill 1 SIGTERM"} {
			if v, _ := got[k].(float64); v == 0 {
				if k == "read /proc/1/environ" && h.kind == runtime.Runsc {
					// gVisor's /proc lets any process read another's
					// environ; the init's is the code's own allowlist.
					continue
				}
				t.Errorf("%s: succeeded, want a permission error", k)
			}
		}
		if extra, _ := got["environ beyond the code's own"].([]any); len(extra) > 0 {
			t.Errorf("the init's environment holds what the code's does not: %v", extra)
		}
		if got["init uid"] == got["own uid"] {
			t.Errorf("init runs as the code's uid %v", got["own uid"])
		}
	})
}

// mknod makes no device node, even in /tmp (gVisor would allow it there);
// FIFOs work.
func TestNoDeviceNodes(t *testing.T) {
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got map[string]int
		h.probe(`import json, os, stat
out = {}
for name, mode, dev in [("chr", stat.S_IFCHR | 0o666, os.makedev(1, 3)), ("blk", stat.S_IFBLK | 0o666, os.makedev(7, 0)),
                        ("fifo", stat.S_IFIFO | 0o666, 0), ("reg", stat.S_IFREG | 0o644, 0)]:
    try:
        os.mknod("/tmp/" + name, mode, dev); out[name] = 0
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))`, &got)
		if got["chr"] != 1 || got["blk"] != 1 {
			t.Errorf("mknod of devices in /tmp: chr errno %d, blk errno %d; want EPERM (1)", got["chr"], got["blk"])
		}
		if got["fifo"] != 0 || got["reg"] != 0 {
			t.Errorf("mknod of a FIFO and a file: errno %d, %d; want both made", got["fifo"], got["reg"])
		}
	})
}

// What identifies the host is not readable: its kernel command line, its
// boot id, its disks and modules.
func TestHostIdentityHidden(t *testing.T) {
	hostCmdline, _ := os.ReadFile("/proc/cmdline")
	hostBootID, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	forEachRuntime(t, modeFresh, func(t *testing.T, h *harness) {
		var got map[string]string
		h.probe(`import json
out = {}
for p in ["/proc/cmdline", "/proc/sys/kernel/random/boot_id", "/proc/modules", "/proc/partitions", "/proc/diskstats", "/proc/swaps"]:
    try:
        out[p] = open(p).read()
    except OSError as e:
        out[p] = ""
out["mountinfo"] = open("/proc/self/mountinfo").read()
print(json.dumps(out))`, &got)
		if c := strings.TrimSpace(got["/proc/cmdline"]); c != "" && c == strings.TrimSpace(string(hostCmdline)) {
			t.Errorf("/proc/cmdline shows the host's: %q", c)
		}
		if b := strings.TrimSpace(got["/proc/sys/kernel/random/boot_id"]); b != "" && b == strings.TrimSpace(string(hostBootID)) {
			t.Errorf("boot_id is the host's: %q", b)
		}
		for _, p := range []string{"/proc/modules", "/proc/partitions", "/proc/diskstats", "/proc/swaps"} {
			if h.kind == runtime.Libcontainer && got[p] != "" {
				t.Errorf("%s is readable: %.80q", p, got[p])
			}
		}
		// The server's state dir and instance are named in no mount the
		// code sees (the rootfs's cache path is: docs/sandbox.md).
		if inst := runtime.InstanceID(h.rt); strings.Contains(got["mountinfo"], inst) ||
			strings.Contains(got["mountinfo"], filepath.Dir(runtime.InstanceDir(h.rt))) {
			t.Errorf("mountinfo names the server's state dir or instance %s:\n%s", inst, got["mountinfo"])
		}
	})
}

// The packages dir is read-only, nosuid and nodev all the way down: a
// mount below it on the host comes into the sandbox, read-only too, and
// nothing the code writes there reaches the host.
func TestBindsReadOnlyAllTheWayDown(t *testing.T) {
	for _, v := range variants(t) {
		kind := v.kind
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, policy.DefaultLimits())
			withBatteries(t, h)
			sub := filepath.Join(h.cfg.PackagesDir, "submount")
			if err := os.Mkdir(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
				t.Fatal(err)
			}
			defer syscall.Unmount(sub, syscall.MNT_DETACH)
			if err := os.WriteFile(filepath.Join(sub, "mcp_exec_sub.py"), []byte("VALUE = 7\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			var got map[string]any
			h.probe(fmt.Sprintf(`import json, os, sys
d = %q
sys.path.insert(0, d + "/submount")
import mcp_exec_sub
out = {"imported": mcp_exec_sub.VALUE, "opts": [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4].startswith(d)]}
for name, p in [("top", d + "/planted"), ("below", d + "/submount/planted")]:
    try:
        open(p, "w").write("x"); out[name] = 0
    except OSError as e:
        out[name] = e.errno
print(json.dumps(out))`, h.cfg.PackagesMount), &got)
			if got["imported"] != float64(7) {
				t.Errorf("the submount's module did not import: %v", got)
			}
			for _, k := range []string{"top", "below"} {
				if got[k] == float64(0) {
					t.Errorf("writing in the packages dir (%s): succeeded, want it refused", k)
				}
			}
			if _, err := os.Stat(filepath.Join(sub, "planted")); err == nil {
				t.Errorf("the code wrote a file onto the host through the packages dir's submount")
			}
			if kind == runtime.Libcontainer {
				for _, o := range got["opts"].([]any) {
					for _, want := range []string{"ro", "nosuid", "nodev"} {
						if !slices.Contains(strings.Split(o.(string), ","), want) {
							t.Errorf("a mount of the packages dir has options %q, want %s", o, want)
						}
					}
				}
			}
		})
	}
}

// Two concurrent calls do not share per-user kernel limits: one that
// exhausts its inotify instances and POSIX message queue bytes leaves the
// other both.
func TestPerUserLimitsNotShared(t *testing.T) {
	forEachRuntime(t, modeFresh, func(t *testing.T, h *harness) { perUserLimitsNotShared(t, h, h) })
}

// Nor do two calls of two server instances (each stdio client starts
// one): call slots are claimed host-wide, whatever the state dir, so the
// first slot of one is never the first of the other.
func TestSlotsUniqueOnTheHost(t *testing.T) {
	a := newHarness(t, runtime.Libcontainer, policy.DefaultLimits())
	b := newHarness(t, runtime.Libcontainer, policy.DefaultLimits())
	perUserLimitsNotShared(t, a, b)
}

// perUserLimitsNotShared runs the exhausting call on a and the probe on b,
// at the same time.
func perUserLimitsNotShared(t *testing.T, h, other *harness) {
	t.Helper()
	{
		exhaust := `import ctypes, json, os, time
libc = ctypes.CDLL(None, use_errno=True)
n = 0
while n < 10000 and libc.inotify_init1(0) >= 0:
    n += 1
class attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
libc.mq_open.restype = ctypes.c_int
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(attr)]
q = 0
while q < 1000:
    a = attr(0, 10, 8192, 0)
    if libc.mq_open(("/q%d" % q).encode(), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) < 0:
        break
    q += 1
print(json.dumps({"inotify": n, "inotify_errno": ctypes.get_errno(), "mqueues": q}), flush=True)
time.sleep(60)
`
		probe := `import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
ino_err = ctypes.get_errno() if fd < 0 else 0
class attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
libc.mq_open.restype = ctypes.c_int
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(attr)]
a = attr(0, 10, 8192, 0)
mq = libc.mq_open(b"/probe", os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a))
mq_err = ctypes.get_errno() if mq < 0 else 0
print(json.dumps({"inotify_errno": ino_err, "mq_errno": mq_err}))`

		// A exhausts its limits, then holds them.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		aDone := make(chan runtime.Result, 1)
		b, err := bundle.New(runtime.BundleDir(h.rt), h.cfg, uuid.NewString())
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			res, err := runtime.RunBundle(ctx, h.rt, b, runtime.Request{Code: []byte(exhaust), Timeout: 120 * time.Second, MaxOutputBytes: 1 << 20})
			if ctx.Err() == nil {
				t.Errorf("the first call ended before the second ran: %v, exit %d\n%s\n%s", err, res.ExitCode, res.Stdout, res.Stderr)
			}
			aDone <- res
		}()
		// Wait until A holds them: its inotify fds, counted from the host;
		// under gVisor they are its own kernel's, so until A has spun
		// through its loops and sits idle (its cgroup's CPU time stops).
		if h.kind == runtime.Libcontainer {
			testenv.EventuallyWithin(t, 60*time.Second, "the first call to exhaust its inotify instances", func() bool {
				return countInotify(b.ID) >= 100
			})
		} else {
			var last time.Duration
			var still int
			testenv.EventuallyWithin(t, 60*time.Second, "the first call to exhaust its limits and sit idle", func() bool {
				cpu := callCPU(runtime.InstanceID(h.rt), b.ID)
				if cpu > 50*time.Millisecond && cpu-last < time.Millisecond {
					still++
				} else {
					still = 0
				}
				last = cpu
				return still >= 10
			})
		}
		var got struct{ InotifyErrno, MqErrno int }
		res := other.mustRun(probe)
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("probe: %v\n%s\n%s", err, res.Stdout, res.Stderr)
		}
		cancel()
		<-aDone
		if got.InotifyErrno != 0 {
			t.Errorf("inotify_init1 in a second call failed with errno %d while the first held its limit", got.InotifyErrno)
		}
		if got.MqErrno != 0 && !(h.kind == runtime.Runsc && got.MqErrno == 38) {
			t.Errorf("mq_open in a second call failed with errno %d while the first held its limit", got.MqErrno)
		}
	}
}

// countInotify counts the inotify instances held by the processes of a
// call, from the host.
func countInotify(callID string) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(callID)) {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", e.Name(), "fd"))
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", e.Name(), "fd", fd.Name())); err == nil && l == "anon_inode:inotify" {
				n++
			}
		}
	}
	return n
}

// callCPU is a call's CPU time so far, from its cgroup.
func callCPU(instance, callID string) time.Duration {
	data, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct/mcp-exec", instance, callID, "cpuacct.usage"))
	if err != nil {
		data, _ = os.ReadFile(filepath.Join("/sys/fs/cgroup/mcp-exec", instance, callID, "cpu.stat"))
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && k == "usage_usec" {
				n, _ := strconv.ParseInt(v, 10, 64)
				return time.Duration(n) * time.Microsecond
			}
		}
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return time.Duration(n)
}

// Socket buffers count against the call: calls that queue twice their
// memory limit in loopback TCP and UDP sockets have their sends refused or
// are OOM-killed, and the socket memory the kernel charged to each call —
// its own, not a host-wide figure other tests move — stays within its
// bound plus the per-socket minimums, here with eight such calls at once
// and two busy loops beside them.
func TestSocketMemoryIsBounded(t *testing.T) {
	limits := policy.DefaultLimits()
	limits.MemoryBytes = 64 << 20
	for _, v := range variants(t) {
		kind := v.kind
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, limits)
			busy(t, 2)
			protos := []string{"tcp", "udp", "tcp-many", "tcp", "udp", "tcp-many", "tcp", "udp"}
			results := make([]runtime.Result, len(protos))
			errs := make([]error, len(protos))
			var wg sync.WaitGroup
			for i, proto := range protos {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], errs[i] = h.run(fmt.Sprintf(queueCode, proto, limits.MemoryBytes*2), withTimeout(120*time.Second))
				}()
			}
			wg.Wait()
			for i, proto := range protos {
				res, err := results[i], errs[i]
				if err != nil {
					t.Errorf("%s: %v", proto, err)
					continue
				}
				var queued int64
				fmt.Sscan(strings.TrimSpace(string(res.Stdout)), &queued)
				t.Logf("%s: exit %d oom %v, queued %d MiB, the call's socket memory peaked at %d MiB (bound %d MiB), its memory at %d MiB",
					proto, res.ExitCode, res.OOMKilled, queued>>20, res.SocketPeakBytes>>20, limits.SocketBytes()>>20, res.PeakMemoryBytes>>20)
				// What the code got into its sockets, by the kernel's
				// count (sends taken; receive queues): within the bound, or
				// the call was killed. Under gVisor its netstack's buffers
				// are the sandbox's own memory.
				bound := limits.SocketBytes() + limits.SocketBytes()/4
				if kind == runtime.Runsc {
					bound = limits.MemoryBytes
				}
				if !res.OOMKilled && queued > bound {
					t.Errorf("%s: queued %d MiB in its sockets, past their bound of %d MiB, and was not killed", proto, queued>>20, limits.SocketBytes()>>20)
				}
				// The bound, plus what the kernel lets each TCP socket take
				// past it (a segment or two), which the sandbox's small
				// loopback segments keep within twice what the sockets
				// themselves take from the memory limit; the supervision's
				// poll kills the call well before (docs/sandbox.md).
				if res.SocketPeakBytes > limits.SocketBytes()+2*limits.MemoryBytes {
					t.Errorf("%s: the call's socket memory peaked at %d MiB, past its bound of %d MiB plus twice its memory limit",
						proto, res.SocketPeakBytes>>20, limits.SocketBytes()>>20)
				}
				// (The kernel's peak may pass the limit by a charge batch.)
				if res.PeakMemoryBytes > limits.MemoryBytes+limits.MemoryBytes/8 {
					t.Errorf("%s: the call's memory peaked at %d bytes, past its limit of %d", proto, res.PeakMemoryBytes, limits.MemoryBytes)
				}
			}
		})
	}
}

// busy runs n busy loops until the test ends, as other work on a loaded
// host would.
func busy(t *testing.T, n int) {
	for range n {
		spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := spin.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { spin.Process.Kill(); spin.Wait() })
	}
}

// queueCode fills loopback sockets nobody reads, with non-blocking sends,
// until it has queued the goal or no send is taken any more, and prints
// how much it queued.
//
// tcp-many is the attack on the kernel's per-socket minimums (each socket
// may keep a buffer or two past the cgroup's bound): eight processes, each
// with as many connections as its file limit allows.
const queueCode = `import os, socket, sys, time
proto, goal = %q, %d
queued, socks, chunk = 0, [], b"x" * 65536
def full():
    return queued >= goal
if proto == "tcp-many":
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(4096)
    kids = []
    for k in range(8):
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(480):
                    c = socket.socket(); c.connect(srv.getsockname()); a, _ = srv.accept()
                    c.setblocking(False); socks += [c, a]
                    try:
                        while True:
                            c.send(chunk)
                    except OSError:
                        pass
            finally:
                time.sleep(5)
                os._exit(0)
        kids.append(pid)
    for pid in kids:
        os.waitpid(pid, 0)
elif proto == "tcp":
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1000)
    while not full() and len(socks) < 900:
        c = socket.socket(); c.connect(srv.getsockname()); a, _ = srv.accept()
        c.setblocking(False); socks += [c, a]
        stalled = 0
        while not full():
            try:
                queued += c.send(chunk)
            except BlockingIOError:
                break
            except OSError:
                stalled = 1; break
        if stalled:
            break
else:
    dst = []
    for i in range(450):
        r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(("127.0.0.1", 0)); dst.append(r)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)
    misses = 0
    while not full() and misses < 2000:
        for r in dst:
            try:
                s.sendto(chunk[:60000], r.getsockname())
            except (BlockingIOError, OSError):
                misses += 1
        # What is really queued: the receive queues' sum.
        import fcntl, termios, struct
        total = 0
        for r in dst:
            total += struct.unpack("i", fcntl.ioctl(r, termios.FIONREAD, b"\0\0\0\0"))[0]
        if total <= queued:
            misses += 100
        queued = total
print(queued, flush=True)
time.sleep(1)
`

// A call never runs past its timeout plus a short grace, server alive or
// not: with the supervision's own timer off, as if it had failed, the
// watchdog kills the container.
func TestWatchdogEnforcesDeadline(t *testing.T) {
	runtime.WithoutSupervisionTimer(t)
	forEachRuntime(t, modeSession|modeFresh, func(t *testing.T, h *harness) {
		// The test's own bound, should the watchdog fail too.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		res, err := h.run("import time; time.sleep(600)", withTimeout(time.Second), withContext(ctx))
		if err != nil {
			t.Fatalf("the call outlived its timeout and the watchdog's grace by far: %v", err)
		}
		if res.ExitCode != 137 || res.TimedOut {
			t.Errorf("exit %d, timed out %v; want killed (137) by the watchdog, not by the (disabled) supervision timer", res.ExitCode, res.TimedOut)
		}
		if limit := time.Second + runtime.WatchdogGrace + 2*time.Second; res.Duration > limit {
			t.Errorf("the code ran %v, past its 1 s timeout and the watchdog's grace (%v)", res.Duration, limit)
		}
		t.Logf("a 1 s call whose server timer failed was killed after %v", res.Duration.Round(time.Millisecond))
	})
}

// pythonRunning reports whether a process of the call runs the code: under
// libcontainer the interpreter is a host process of the call's cgroup.
func pythonRunning(callID string, kind runtime.Kind) bool {
	if kind == runtime.Runsc {
		return true // gVisor's tasks are not host processes; CPU time says it ran
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(callID)) {
			continue
		}
		if cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); bytes.Contains(cmd, []byte("python3")) {
			return true
		}
	}
	return false
}

// A server killed mid-call takes its containers with it within seconds,
// even when the sandbox's init does not die with it (played here by an
// init told to set no parent-death signal), and with the host under load:
// the watchdog kills them. No new server starts to sweep them. The same
// for a persistent session frozen between its calls ("session-"), whose
// init cannot act on anything until the watchdog thaws what it kills; and,
// its watchdog killed too ("/next-server"), for the sweep of the next
// server to start on the same state dir.
func TestDeadServerBackstop(t *testing.T) {
	if dir := os.Getenv("MCP_EXEC_TEST_BACKSTOP_SERVER"); dir != "" {
		backstopServer(t, dir, runtime.Kind(os.Getenv("MCP_EXEC_TEST_BACKSTOP_KIND")),
			os.Getenv("MCP_EXEC_TEST_BACKSTOP_FORK") != "", os.Getenv("MCP_EXEC_TEST_BACKSTOP_SESSION") != "")
		return
	}
	for _, kind := range runtimeKinds(t) {
		t.Run(string(kind), func(t *testing.T) { killServer(t, variant{string(kind), kind, false}, false, false) })
	}
	for _, v := range variants(t) {
		t.Run("session-"+v.name, func(t *testing.T) { killServer(t, v, true, false) })
		// The next server's sweep of a frozen session: the same on each
		// runtime but for the forks' cgroups, which a template holds too.
		if v.fork || testenv.Full() {
			t.Run("session-"+v.name+"/next-server", func(t *testing.T) { killServer(t, v, true, true) })
		}
	}
}

// killServer starts a server of v's (backstopServer) that runs a call, or
// holds a session frozen after its call, kills it (and its watchdog, when
// asked: then a new runtime on the state dir sweeps), and checks that
// nothing of the call is left.
func killServer(t *testing.T, v variant, session, killWatchdog bool) {
	testRootfs(t)
	if v.kind == runtime.Libcontainer {
		if err := runtime.LibcontainerUsable(); err != nil {
			need(t, "%v", err)
		}
	}
	// Four busy loops alongside, as on a loaded host.
	for range 4 {
		spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := spin.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { spin.Process.Kill(); spin.Wait() }()
	}
	stateDir := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeadServerBackstop$", "-test.v")
	cmd.Env = append(os.Environ(), "MCP_EXEC_TEST_BACKSTOP_SERVER="+stateDir, "MCP_EXEC_TEST_BACKSTOP_KIND="+string(v.kind))
	if v.fork {
		cmd.Env = append(cmd.Env, "MCP_EXEC_TEST_BACKSTOP_FORK=1")
	}
	if session {
		cmd.Env = append(cmd.Env, "MCP_EXEC_TEST_BACKSTOP_SESSION=1")
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var call string
	frozen := !session
	sc := bufio.NewScanner(out)
	var said []string
	for sc.Scan() {
		said = append(said, sc.Text())
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == "CALL" {
			call = f[1]
		}
		if len(f) == 1 && f[0] == "FROZEN" {
			frozen = true
		}
		if call != "" && frozen {
			break
		}
	}
	if call == "" || !frozen {
		t.Fatalf("the server never reported its call (%q) or its frozen session (%v); it said:\n%s", call, frozen, strings.Join(said, "\n"))
	}
	testenv.EventuallyWithin(t, 120*time.Second, "the call's code to run", func() bool { return pythonRunning(call, v.kind) && len(callProcesses(call)) > 0 })
	if killWatchdog {
		entries, _ := os.ReadDir(stateDir)
		if len(entries) != 1 {
			t.Fatalf("the state dir holds %d entries, want the one instance", len(entries))
		}
		watchdog := watchdogOf(entries[0].Name())
		if watchdog == 0 {
			t.Fatal("the instance's watchdog is not running")
		}
		syscall.Kill(watchdog, syscall.SIGKILL)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	killed := time.Now()
	if killWatchdog {
		if v.kind == runtime.Libcontainer && len(callProcesses(call)) == 0 {
			t.Fatal("the call's processes died with the server and its watchdog: the sweep has nothing to prove")
		}
		rt, err := runtime.New(v.kind, runtime.Config{StateDir: stateDir})
		if err != nil {
			t.Fatal(err)
		}
		rt.Close()
	}
	testenv.EventuallyWithin(t, 10*time.Second, "the call's processes to die with their server", func() bool { return len(callProcesses(call)) == 0 })
	t.Logf("the call's processes were gone %v after the server was killed", time.Since(killed).Round(time.Millisecond))
	// The watchdog removes the cgroups once they are empty, and the
	// instance dir's own filesystem.
	testenv.EventuallyWithin(t, 10*time.Second, "the watchdog to remove the call's cgroups", func() bool { return len(callCgroups(call)) == 0 })
	assertNoCgroups(t, call, true)
	testenv.EventuallyWithin(t, 10*time.Second, "the dead instance's mount to be gone", func() bool {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		return !bytes.Contains(mi, []byte(stateDir))
	})
}

// watchdogOf is the pid of an instance's watchdog, or 0.
func watchdogOf(instance string) int {
	want := []byte("mcp-exec-watchdog\x00__mcp_exec_watchdog__\x00" + instance + "\x00")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if bytes.HasPrefix(cmd, want) {
			pid, _ := strconv.Atoi(e.Name())
			return pid
		}
	}
	return 0
}

// callCgroups lists a call's cgroup dirs in every hierarchy.
func callCgroups(callID string) []string {
	matches, _ := filepath.Glob("/sys/fs/cgroup/*/mcp-exec/*/" + callID)
	more, _ := filepath.Glob("/sys/fs/cgroup/mcp-exec/*/" + callID)
	return append(matches, more...)
}

// callProcesses lists the live host processes in a call's cgroups (a
// zombie holds nothing; its parent reaps it).
func callProcesses(callID string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(callID)) {
			continue
		}
		if st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); bytes.Contains(st, []byte(") Z ")) {
			continue
		}
		pids = append(pids, e.Name())
	}
	return pids
}

// backstopServer is the child of TestDeadServerBackstop: it starts a call
// whose init sets no parent-death signal, says which, and waits to be
// killed; in a session, the session's first call leaves a process and a
// thread spinning, and the server says so once the call is over and the
// session frozen.
func backstopServer(t *testing.T, stateDir string, kind runtime.Kind, fork, session bool) {
	rt, err := runtime.New(kind, runtime.Config{StateDir: stateDir, Fork: runtime.ForkConfig{Enabled: fork}})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := sharedRootfs()
	if err != nil {
		t.Fatal(err)
	}
	runtime.SubvertInits()
	cfg := testBundleConfig(dir, rt, policy.DefaultLimits())
	ctx := context.Background()
	if !session {
		sb, err := rt.Prepare(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("CALL %s\n", runtime.BundleOf(sb).ID)
		sb.Run(ctx, runtime.Request{Code: []byte("import time; time.sleep(1000)"), Timeout: 10 * time.Minute, MaxOutputBytes: 1 << 20})
		t.Fatal("the call ended before the server was killed")
	}
	sess, err := runtime.NewPool(runtime.PoolConfig{Runtime: rt, Config: cfg}).NewSession(ctx, runtime.SessionConfig{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CALL %s\n", runtime.SessionBundle(sess).ID)
	res, err := sess.Run(ctx, runtime.Request{Code: []byte("import subprocess, sys, threading\n" +
		"subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n" +
		"threading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()"), Timeout: time.Minute, MaxOutputBytes: 1 << 20})
	if err != nil || res.ExitCode != 0 || res.Ended != "" {
		t.Fatalf("the session's call: exit %d, ended %q, %v; stderr %s", res.ExitCode, res.Ended, err, res.Stderr)
	}
	fmt.Println("FROZEN")
	time.Sleep(10 * time.Minute)
	t.Fatal("the session outlived 10 minutes before the server was killed")
}

// A sandbox prepared ahead waits at the lowest CPU weight, so that
// preparing it slows no running call, and has the ordinary weight by the
// time its code runs: the host's cgroup file says so, read while the code
// sleeps.
func TestPreparedSandboxGetsCallWeight(t *testing.T) {
	for _, v := range variants(t) {
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, policy.DefaultLimits())
			cfg := h.cfg
			cfg.Ahead = true
			b, err := bundle.New(runtime.BundleDir(h.rt), cfg, uuid.NewString())
			if err != nil {
				t.Fatal(err)
			}
			sb, err := runtime.PrepareBundle(context.Background(), h.rt, b)
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			weight := func() string {
				for _, pattern := range []string{"/sys/fs/cgroup/cpu/*/*/" + b.ID + "/cpu.shares", "/sys/fs/cgroup/cpu,cpuacct/*/*/" + b.ID + "/cpu.shares",
					"/sys/fs/cgroup/*/*/" + b.ID + "/cpu.weight"} {
					if m, _ := filepath.Glob(pattern); len(m) == 1 {
						data, _ := os.ReadFile(m[0])
						return filepath.Base(m[0]) + "=" + strings.TrimSpace(string(data))
					}
				}
				return "no cgroup"
			}
			if got, want := weight(), fmt.Sprintf("cpu.shares=%d", policy.CPUSharesPreparing); got != want && got != "cpu.weight=1" {
				t.Errorf("prepared ahead, waiting: %s, want %s (or cpu.weight=1)", got, want)
			}
			done := make(chan runtime.Result, 1)
			go func() {
				res, err := sb.Run(context.Background(), runtime.Request{Code: []byte("import time\ntime.sleep(3)\nprint('ran')"),
					Timeout: 60 * time.Second, MaxOutputBytes: 1 << 20})
				if err != nil {
					t.Errorf("Run: %v", err)
				}
				done <- res
			}()
			want := fmt.Sprintf("cpu.shares=%d", policy.CPUSharesCall)
			testenv.EventuallyWithin(t, 20*time.Second, "the running call's cgroup to have the ordinary CPU weight",
				func() bool { w := weight(); return w == want || w == "cpu.weight=100" })
			if res := <-done; string(res.Stdout) != "ran\n" {
				t.Errorf("the call printed %q, want \"ran\\n\"", res.Stdout)
			}
		})
	}
}

// The operator's data dir is at /data in every sandbox, readable, and
// read-only all the way down (a mount below it on the host too): nothing
// can be written there, run from there, or honoured as setuid. A forked
// sandbox has it from its template. The process runtime gives it only in
// namespaces of its own (in the call's own root); without, it refuses
// the call, naming the setting, rather than run without it.
func TestDataDir(t *testing.T) {
	forEachRuntimeAndProcess(t, modePooled|modeSession, func(t *testing.T, h *harness) {
		dir := filepath.Join(t.TempDir(), "data")
		sub := filepath.Join(dir, "sub")
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		// The dir writable by all and the csv the sandbox's own: only the
		// mount's read-only flag stands between the code and them.
		os.Chmod(filepath.Dir(dir), 0o755)
		os.Chmod(dir, 0o777)
		if err := os.WriteFile(filepath.Join(dir, "sales.csv"), []byte("day,amount\n1,3\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(dir, "sales.csv"), policy.UID, policy.GID); err != nil {
			t.Fatal(err)
		}
		// /dev/null's device, which every sandbox's device rules allow:
		// only nodev keeps the code from opening a device node in /data.
		if err := syscall.Mknod(filepath.Join(dir, "null"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		// /dev/port's, which no sandbox has: a host device, unreachable.
		if err := syscall.Mknod(filepath.Join(dir, "port"), syscall.S_IFCHR|0o666, int(unix.Mkdev(1, 4))); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, "null"), 0o666)
		os.Chmod(filepath.Join(dir, "port"), 0o666)
		// Links to a host file outside the data dir, by absolute and by
		// relative path: in the sandbox they resolve in its own root.
		secret := filepath.Join(filepath.Dir(dir), "secret.txt")
		if err := os.WriteFile(secret, []byte("host secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		for name, target := range map[string]string{"abs": secret, "rel": "../secret.txt"} {
			if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "run.py"), []byte("#!/usr/bin/python3\nprint('ran')\n"), 0o4755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, "run.py"), 0o755|os.ModeSetuid); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, "size=1m,mode=0777"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Unmount(sub, syscall.MNT_DETACH) })
		if err := os.WriteFile(filepath.Join(sub, "below.txt"), []byte("below"), 0o644); err != nil {
			t.Fatal(err)
		}
		// A call before, without it: a template made for that is not the
		// one for a sandbox with the data dir.
		h.mustRun("print(1)")
		h.cfg.DataDir = dir

		if p, ok := h.rt.(*runtime.ProcessRuntime); ok && !p.Isolation().Namespaces {
			h.pooled, h.session = false, false // a pool or a session would fail the harness first
			_, err := h.run("print(1)")
			if !errors.Is(err, runtime.ErrUnsupported) || !strings.Contains(err.Error(), "{DataDir}") {
				t.Errorf("the process runtime without namespaces: %v; want it refused, naming {DataDir}", err)
			}
			return
		}
		var got map[string]any
		h.probe(`import ctypes, json, os, stat, subprocess
out = {"csv": open("/data/sales.csv").read(), "below": open("/data/sub/below.txt").read(),
       "opts": [l.split()[5] for l in open("/proc/self/mountinfo") if l.split()[4] == "/data" or l.split()[4].startswith("/data/")]}
def attempt(name, f):
    try:
        f(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
libc = ctypes.CDLL(None, use_errno=True)
def mount(src, target, fstype, flags):
    if libc.mount(src, target, fstype, ctypes.c_ulong(flags), None) != 0:
        raise OSError(ctypes.get_errno(), "mount")
def unshare(flags):
    if libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), "unshare")
# A hostile call: write, chmod its own file, make a fifo, open a device,
# mount over /data or remount it writable, in a user namespace of its own
# too; then read the host through links out of /data.
attempt("write top", lambda: open("/data/planted", "w").write("x"))
attempt("write below", lambda: open("/data/sub/planted", "w").write("x"))
attempt("chmod", lambda: os.chmod("/data/sales.csv", 0o666))
attempt("mkfifo", lambda: os.mknod("/data/fifo", stat.S_IFIFO | 0o666))
attempt("device", lambda: open("/data/null", "w").write("x"))
attempt("host device", lambda: open("/data/port", "rb").read(1))
attempt("mount over", lambda: mount(b"tmpfs", b"/data", b"tmpfs", 0))
attempt("remount", lambda: mount(None, b"/data", None, 0x20 | 0x1000))  # MS_REMOUNT|MS_BIND, no MS_RDONLY
attempt("unshare", lambda: unshare(0x10000000 | 0x20000))  # CLONE_NEWUSER|CLONE_NEWNS
attempt("remount after unshare", lambda: mount(None, b"/data", None, 0x20 | 0x1000))
attempt("write after", lambda: open("/data/planted", "w").write("x"))
for name in ["abs", "rel"]:
    try:
        out["link " + name] = open("/data/" + name).read()
    except OSError as e:
        out["link " + name] = e.errno
try:
    out["ran"] = subprocess.run(["/data/run.py"], capture_output=True, text=True).stdout
except OSError as e:
    out["ran"] = e.errno
out["setuid"] = bool(os.stat("/data/run.py").st_mode & 0o4000)
print(json.dumps(out))`, &got)
		if got["csv"] != "day,amount\n1,3\n" || got["below"] != "below" {
			t.Errorf("reading /data: %v", got)
		}
		// EROFS exactly: the dir is writable by all, the csv is the
		// code's own; only the read-only mount refuses them.
		for _, k := range []string{"write top", "write below", "chmod", "mkfifo", "write after"} {
			if got[k] != float64(syscall.EROFS) {
				t.Errorf("%s in /data: %v, want EROFS (30)", k, got[k])
			}
		}
		// gVisor opens a device node as a device of its own kernel, never
		// the host's (its gofer serves no device files): its /dev/null is
		// harmless, and nodev is not checked on its gofer mounts.
		if h.kind != runtime.Runsc && got["device"] != float64(syscall.EACCES) {
			t.Errorf("opening the device node /data/null: %v, want EACCES, from a nodev mount", got["device"])
		}
		if got["host device"] == float64(0) {
			t.Errorf("reading the host's /dev/port through a node in /data: succeeded, want it refused")
		}
		for _, k := range []string{"mount over", "remount", "remount after unshare"} {
			if got[k] == float64(0) {
				t.Errorf("%s of /data: succeeded, want it refused", k)
			}
		}
		if _, err := os.Stat(filepath.Join(dir, "planted")); err == nil {
			t.Errorf("the code wrote a file onto the host through /data")
		}
		// In a container the sandbox's root has no such file; the process
		// runtime's root is the host's, where Landlock refuses what the
		// code may not read (EACCES) as it would the file's own path.
		for _, k := range []string{"link abs", "link rel"} {
			if _, proc := h.rt.(*runtime.ProcessRuntime); got[k] != float64(syscall.ENOENT) && !(proc && got[k] == float64(syscall.EACCES)) {
				t.Errorf("%s (a link out of /data to a host file): %v, want ENOENT (EACCES on the process runtime)", k, got[k])
			}
		}
		if _, err := os.Stat(filepath.Join(sub, "planted")); err == nil {
			t.Errorf("the code wrote a file onto the host through /data's submount")
		}
		if got["ran"] != float64(syscall.EACCES) || got["setuid"] != true {
			t.Errorf("running the setuid /data/run.py: %v (setuid bit seen %v); want EACCES, from a noexec mount", got["ran"], got["setuid"])
		}
		if h.kind != runtime.Runsc {
			opts, _ := got["opts"].([]any)
			if len(opts) < 2 {
				t.Errorf("mounts at /data: %v, want the dir and its submount", opts)
			}
			for _, o := range opts {
				for _, want := range []string{"ro", "nosuid", "nodev", "noexec"} {
					if !slices.Contains(strings.Split(o.(string), ","), want) {
						t.Errorf("a mount of /data has options %q, want %s", o, want)
					}
				}
			}
		}
	})
}
