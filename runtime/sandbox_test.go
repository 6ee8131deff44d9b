package runtime_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// Every test here runs a probe inside a real container and asserts what it
// saw; each would fail if the property it names were missing.

func TestIdentity(t *testing.T) {
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got struct {
			UID, GID, EUID, EGID int
			Groups               []int
			Status               map[string]string
		}
		h.probe(`import os, json
st = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(json.dumps({"UID": os.getuid(), "GID": os.getgid(), "EUID": os.geteuid(), "EGID": os.getegid(),
  "Groups": os.getgroups(), "Status": {k: st.get(k, "").strip() for k in ("Uid", "Gid", "Groups")}}))`, &got)
		if got.UID != policy.UID || got.EUID != policy.UID || got.GID != policy.GID || got.EGID != policy.GID {
			t.Errorf("ids = uid %d euid %d gid %d egid %d, want all %d", got.UID, got.EUID, got.GID, got.EGID, policy.UID)
		}
		if len(got.Groups) != 0 {
			t.Errorf("supplementary groups = %v, want none", got.Groups)
		}
		want := fmt.Sprintf("%d\t%d\t%d\t%d", policy.UID, policy.UID, policy.UID, policy.UID)
		for _, k := range []string{"Uid", "Gid"} {
			if got.Status[k] != want {
				t.Errorf("/proc/self/status %s = %q, want %q", k, got.Status[k], want)
			}
		}
		if got.Status["Groups"] != "" {
			t.Errorf("/proc/self/status Groups = %q, want empty", got.Status["Groups"])
		}
	})
}

func TestCapabilitiesAndNoNewPrivsAndSeccompMode(t *testing.T) {
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got struct {
			Status   map[string]string
			NNP      int
			Bounding []int // capabilities still in the bounding set
			Ambient  []int // capabilities raised in the ambient set
			LastCap  int
			AmbErrno int
		}
		// The kernel's answer through prctl, and /proc/self/status.
		h.probe(`import ctypes, json
libc = ctypes.CDLL(None, use_errno=True)
st = dict((k, v.strip()) for k, v in (l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l))
bnd, amb, amb_errno = [], [], 0
for c in range(64):
    if libc.prctl(23, c, 0, 0, 0) == 1:   # PR_CAPBSET_READ
        bnd.append(c)
    r = libc.prctl(47, 1, c, 0, 0)        # PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET
    if r == 1:
        amb.append(c)
    elif r < 0 and c == 0:
        amb_errno = ctypes.get_errno()
print(json.dumps({"Status": st, "NNP": libc.prctl(39, 0, 0, 0, 0), "Bounding": bnd, "Ambient": amb, "AmbErrno": amb_errno}))`, &got)
		if got.NNP != 1 {
			t.Errorf("PR_GET_NO_NEW_PRIVS = %d, want 1", got.NNP)
		}
		if len(got.Bounding) != 0 || len(got.Ambient) != 0 {
			t.Errorf("bounding set %v, ambient set %v; want both empty", got.Bounding, got.Ambient)
		}
		keys := []string{"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"}
		if h.kind == runtime.Runsc {
			// gVisor's /proc/self/status has no CapAmb or NoNewPrivs line;
			// prctl above is its authoritative answer.
			keys = keys[:4]
		} else if got.Status["NoNewPrivs"] != "1" {
			t.Errorf("NoNewPrivs = %q, want 1", got.Status["NoNewPrivs"])
		}
		for _, k := range keys {
			if got.Status[k] != "0000000000000000" {
				t.Errorf("%s = %q, want 0000000000000000", k, got.Status[k])
			}
		}
		if got.Status["Seccomp"] != "2" {
			t.Errorf("Seccomp = %q, want 2 (filter mode)", got.Status["Seccomp"])
		}
	})
}

// x86-64 syscall numbers of the calls the policy denies, with arguments
// that would succeed or fail differently (EFAULT, EBADF, EINVAL) without
// the filter, so that only seccomp yields EPERM.
var deniedProbes = []struct {
	name string
	nr   int
	args []int
}{
	{"mount", 165, []int{0, 0, 0, 0, 0}},
	{"umount2", 166, []int{0, 0}},
	{"pivot_root", 155, []int{0, 0}},
	{"chroot", 161, []int{0}},
	{"ptrace", 101, []int{0, 0, 0, 0}}, // PTRACE_TRACEME succeeds unfiltered
	{"process_vm_readv", 310, []int{-1, 0, 0, 0, 0, 0}},
	{"process_vm_writev", 311, []int{-1, 0, 0, 0, 0, 0}},
	{"bpf", 321, []int{0, 0, 0}},
	{"perf_event_open", 298, []int{0, 0, -1, -1, 0}},
	{"keyctl", 250, []int{0, -3, 0}}, // KEYCTL_GET_KEYRING_ID succeeds unfiltered
	{"add_key", 248, []int{0, 0, 0, 0, 0}},
	{"request_key", 249, []int{0, 0, 0, 0}},
	{"unshare", 272, []int{0x10000000}}, // CLONE_NEWUSER succeeds unfiltered
	{"setns", 308, []int{-1, 0}},
	{"clone_newuser", 56, []int{0x10000000 | 17, 0, 0, 0, 0}},
	// CLONE_PARENT | SIGCHLD: the child would be its maker's sibling, in a
	// forked sandbox a child of the template's interpreter.
	{"clone_parent", 56, []int{0x8000 | 17, 0, 0, 0, 0}},
	{"kexec_load", 246, []int{0, 0, 0, 0}},
	{"kexec_file_load", 320, []int{-1, -1, 0, 0, 0}},
	{"init_module", 175, []int{0, 0, 0}},
	{"finit_module", 313, []int{-1, 0, 0}},
	{"delete_module", 176, []int{0, 0}},
	{"reboot", 169, []int{0, 0, 0, 0}},
	{"swapon", 167, []int{0, 0}},
	{"swapoff", 168, []int{0}},
	{"userfaultfd", 323, []int{0}},
	{"open_by_handle_at", 304, []int{-1, 0, 0}},
	{"io_uring_setup", 425, []int{1, 0}},
	{"io_setup", 206, []int{1, 0}}, // EFAULT unfiltered
	{"acct", 163, []int{0}},
	{"quotactl", 179, []int{0, 0, 0, 0}},
	{"fsopen", 430, []int{0, 0}},
	{"open_tree", 428, []int{-1, 0, 0}},
	{"move_mount", 429, []int{-1, 0, -1, 0, 0}},
	{"personality", 135, []int{0xffffffff}}, // a query; succeeds unfiltered
	{"syslog", 103, []int{10, 0, 0}},        // SYSLOG_ACTION_SIZE_BUFFER
}

func TestSeccompDeniesDangerousSyscalls(t *testing.T) {
	if goruntime.GOARCH != "amd64" {
		testenv.Optional(t, "syscall numbers in this test are for amd64, not %s", goruntime.GOARCH)
	}
	var b strings.Builder
	b.WriteString(`import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    if r == 0 and nr == 56:
        os._exit(0)  # the clone child, should the filter let it through
    return [r, ctypes.get_errno()]
out = {}
`)
	for _, p := range deniedProbes {
		fmt.Fprintf(&b, "out[%q] = call(%d, %s)\n", p.name, p.nr, strings.Trim(strings.Join(strings.Fields(fmt.Sprint(p.args)), ", "), "[]"))
	}
	b.WriteString("out['clone3'] = call(435, 0, 0)\nprint(json.dumps(out))\n")
	forEachRuntimeAndProcess(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got map[string][2]int
		h.probe(b.String(), &got)
		for _, p := range deniedProbes {
			r := got[p.name]
			if r[0] != -1 || r[1] != 1 {
				t.Errorf("%s: returned %d errno %d, want -1 EPERM", p.name, r[0], r[1])
			}
		}
		// clone3 must fail with ENOSYS so that libc falls back to clone,
		// whose namespace flags the filter can see.
		if r := got["clone3"]; r[0] != -1 || r[1] != 38 {
			t.Errorf("clone3: returned %d errno %d, want -1 ENOSYS", r[0], r[1])
		}
	})
}

func TestReadOnlyRoot(t *testing.T) {
	forEachRuntime(t, modeFresh, func(t *testing.T, h *harness) {
		var got map[string]int
		h.probe(`import errno, json, os
out = {}
for name, f in [("create /usr/lib/x", lambda: open("/usr/lib/x", "w")),
                ("create /etc/x", lambda: open("/etc/x", "w")),
                ("mkdir /newdir", lambda: os.mkdir("/newdir")),
                ("create /.mcp-exec/x", lambda: open("/.mcp-exec/x", "w")),
                ("truncate /usr/bin/python3", lambda: open("/usr/bin/python3", "wb"))]:
    try:
        f(); out[name] = 0
    except OSError as e:
        out[name] = e.errno
out["statvfs ro"] = os.statvfs("/").f_flag & os.ST_RDONLY
out["mountinfo ro"] = int(any(l.split()[4] == "/" and "ro" in l.split()[5].split(",") for l in open("/proc/self/mountinfo")))
print(json.dumps(out))`, &got)
		for k, v := range got {
			switch {
			case k == "mountinfo ro":
				if v == 0 {
					t.Errorf("/ is not mounted read-only")
				}
			case k == "statvfs ro":
				// gVisor's statfs does not report ST_RDONLY.
				if v == 0 && h.kind != runtime.Runsc {
					t.Errorf("statvfs(/) is not read-only")
				}
			case k == "mkdir /newdir" || h.kind != runtime.Runsc:
				if v != 30 { // EROFS: refused by the mount, not merely by file modes
					t.Errorf("%s: errno %d, want EROFS (30)", k, v)
				}
			default:
				// gVisor checks file modes before the mount's read-only
				// flag, so the unprivileged uid sees EACCES first.
				if v != 30 && v != 13 {
					t.Errorf("%s: errno %d, want EROFS (30) or EACCES (13)", k, v)
				}
			}
		}
	})
}

func TestTmpIsSizedNoexecTmpfs(t *testing.T) {
	limits := policy.DefaultLimits()
	limits.TmpfsBytes = 8 << 20
	for _, v := range variants(t) {
		kind := v.kind
		t.Run(v.name, func(t *testing.T) {
			testenv.Parallel(t)
			h := v.harness(t, limits)
			var got struct {
				Cwd     string
				Opts    string
				FsType  string
				Written int
				Errno   int
				Exec    int
			}
			h.probe(`import json, os, shutil, subprocess, sys
out = {"Cwd": os.getcwd()}
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if f[4] == "/tmp":
        out["Opts"] = f[5]; out["FsType"] = f[f.index("-") + 1]
n = 0
try:
    with open("/tmp/fill", "wb") as fh:
        while True:
            fh.write(b"x" * 65536); fh.flush(); n += 65536
except OSError as e:
    out["Errno"] = e.errno
out["Written"] = n
os.unlink("/tmp/fill")
shutil.copy(sys.executable, "/tmp/py")
os.chmod("/tmp/py", 0o755)
try:
    subprocess.run(["/tmp/py", "-c", "pass"]); out["Exec"] = 0
except OSError as e:
    out["Exec"] = e.errno
print(json.dumps(out))`, &got)
			if got.Cwd != "/tmp" {
				t.Errorf("cwd = %q, want /tmp", got.Cwd)
			}
			if got.FsType != "tmpfs" {
				t.Errorf("/tmp fstype = %q, want tmpfs", got.FsType)
			}
			opts := []string{"rw", "nosuid", "nodev", "noexec"}
			if kind == runtime.Runsc {
				// gVisor's mountinfo shows only rw,noexec. What matters is
				// enforced and probed here: noexec (EACCES) and the size
				// (ENOSPC); no device node or setuid file can be made
				// without capabilities in any case.
				opts = []string{"rw", "noexec"}
			}
			for _, o := range opts {
				if !slices.Contains(strings.Split(got.Opts, ","), o) {
					t.Errorf("/tmp mount options %q lack %s", got.Opts, o)
				}
			}
			if got.Errno != 28 {
				t.Errorf("filling /tmp ended with errno %d, want ENOSPC (28)", got.Errno)
			}
			if int64(got.Written) > limits.TmpfsBytes || int64(got.Written) < limits.TmpfsBytes-(1<<20) {
				t.Errorf("wrote %d bytes to /tmp before ENOSPC, want about %d", got.Written, limits.TmpfsBytes)
			}
			if got.Exec != 13 {
				t.Errorf("executing a file in /tmp: errno %d, want EACCES (13)", got.Exec)
			}
		})
	}
}

func TestNoNetwork(t *testing.T) {
	// A listener on the host's loopback and one on all addresses: the
	// sandbox must reach neither.
	lo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lo.Close()
	all, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer all.Close()
	accepted := make(chan string, 10)
	for _, l := range []net.Listener{lo, all} {
		go func(l net.Listener) {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				accepted <- c.RemoteAddr().String()
				c.Close()
			}
		}(l)
	}
	hostIP := "192.0.2.1" // TEST-NET-1 when the host has no other address
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				hostIP = ipn.IP.String()
				break
			}
		}
	}
	loPort := lo.Addr().(*net.TCPAddr).Port
	allPort := all.Addr().(*net.TCPAddr).Port
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got struct {
			Interfaces []string
			Loopback   string
			HostIP     string
			DNS        string
			Relay      string
			Proxy      string
		}
		h.probe(fmt.Sprintf(`import json, socket
def try_connect(host, port):
    try:
        socket.create_connection((host, port), timeout=3).close()
        return "connected"
    except OSError as e:
        return type(e).__name__ + ":" + str(e.errno)
def try_dns():
    try:
        socket.getaddrinfo("example.com", 80); return "resolved"
    except OSError as e:
        return type(e).__name__
import os
print(json.dumps({"Interfaces": [n for _, n in socket.if_nameindex()],
  "Loopback": try_connect("127.0.0.1", %d), "HostIP": try_connect(%q, %d), "DNS": try_dns(),
  "Relay": try_connect("127.0.0.1", %d), "Proxy": os.environ.get("HTTPS_PROXY", "")}))`,
			loPort, hostIP, allPort, policy.RelayPort), &got)
		if !slices.Equal(got.Interfaces, []string{"lo"}) {
			t.Errorf("interfaces = %v, want [lo]", got.Interfaces)
		}
		if got.Loopback == "connected" || got.HostIP == "connected" || got.DNS == "resolved" {
			t.Errorf("network reachable: loopback %s, host ip %s %s, dns %s", got.Loopback, hostIP, got.HostIP, got.DNS)
		}
		// Without the allowlist nothing listens for it: no relay.
		if got.Relay == "connected" || got.Proxy != "" {
			t.Errorf("without the allowlist: the relay's port %d %s, HTTPS_PROXY %q", policy.RelayPort, got.Relay, got.Proxy)
		}
		select {
		case a := <-accepted:
			t.Errorf("host listener accepted a connection from %s", a)
		default:
		}
	})
}

func TestNamespacesAndHostname(t *testing.T) {
	forEachRuntime(t, modeFresh, func(t *testing.T, h *harness) {
		var got struct {
			Pid      int
			Pids     []int
			Init     string
			Hostname string
			Nodename string
		}
		h.probe(`import json, os, socket
print(json.dumps({"Pid": os.getpid(), "Pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
  "Init": open("/proc/1/cmdline").read().split(chr(0))[0],
  "Hostname": socket.gethostname(), "Nodename": os.uname().nodename}))`, &got)
		// Only the sandbox's init (pid 1) and the code itself exist.
		if !slices.Equal(got.Pids, []int{1, got.Pid}) || got.Pid == 1 {
			t.Errorf("/proc lists pids %v with the code as pid %d, want only [1 %d] (own pid namespace)", got.Pids, got.Pid, got.Pid)
		}
		if got.Init != bundle.InitPath {
			t.Errorf("pid 1 is %q, want the sandbox's init %s", got.Init, bundle.InitPath)
		}
		if got.Hostname != policy.Hostname || got.Nodename != policy.Hostname {
			t.Errorf("hostname = %q / %q, want %q", got.Hostname, got.Nodename, policy.Hostname)
		}
	})
}

// The code is not pid 1, so signals behave as outside a container, and
// orphans are reaped.
func TestSignalsAndOrphans(t *testing.T) {
	forEachRuntimeAndProcess(t, modeFresh, func(t *testing.T, h *harness) {
		if res := h.mustRun(`import os, signal; os.kill(os.getpid(), signal.SIGTERM); print("survived")`); res.ExitCode != 128+15 || res.Signal != 15 || len(res.Stdout) != 0 {
			t.Errorf("SIGTERM to itself: exit %d signal %d stdout %q, want 143, 15 and nothing", res.ExitCode, res.Signal, res.Stdout)
		}
		// An exit status of 128+N is no signal.
		if res := h.mustRun(`import sys; sys.exit(139)`); res.ExitCode != 139 || res.Signal != 0 {
			t.Errorf("sys.exit(139): exit %d signal %d, want 139 and no signal", res.ExitCode, res.Signal)
		}
		// Each orphan says its pid; one that is still there after its
		// exit is a zombie no one reaped. (By signal 0, not /proc: the
		// process runtime without a pid namespace shows the code no
		// other process's /proc.)
		var got struct {
			Zombies []int
			Orphans int
		}
		h.probe(`import json, os, time
r, w = os.pipe()
for i in range(20):
    if os.fork() == 0:
        if os.fork() == 0:
            os.write(w, b"%d\n" % os.getpid())
            os._exit(0)   # an orphan once its parent is gone
        os._exit(0)
    os.wait()
os.close(w)
said = b""
while True:   # until every orphan has closed its end
    b = os.read(r, 1 << 16)
    if not b:
        break
    said += b
orphans = [int(p) for p in said.split()]
def zombies():
    z = []
    for p in orphans:
        try:
            os.kill(p, 0)
            z.append(p)
        except ProcessLookupError:
            pass
    return z
deadline = time.time() + 10
while zombies() and time.time() < deadline:
    time.sleep(0.05)
print(json.dumps({"Zombies": zombies(), "Orphans": len(orphans)}))`, &got)
		if got.Orphans != 20 {
			t.Errorf("%d orphans said their pid, want 20", got.Orphans)
		}
		if len(got.Zombies) != 0 {
			t.Errorf("zombie processes %v: orphans are not reaped", got.Zombies)
		}
	})
}

func TestEnvironmentIsAllowlist(t *testing.T) {
	const secret = "s3cret-token-that-must-not-leak"
	t.Setenv("MCP_EXEC_AUTH_TOKEN", secret)
	t.Setenv("SOME_HOST_SECRET", secret)
	forEachRuntimeAndProcess(t, modePooled|modeBatteries|modeFresh, func(t *testing.T, h *harness) {
		res := h.mustRun(`import os, json
print(json.dumps(dict(os.environ, CWD=os.getcwd())))
print(open("/proc/self/environ", "rb").read().decode(errors="replace"))
try:
    # The process runtime without a pid namespace shows none but the code.
    print(open("/proc/%d/cmdline" % os.getppid(), "rb").read().decode(errors="replace"))
except PermissionError:
    pass`)
		if strings.Contains(string(res.Stdout)+string(res.Stderr), secret) {
			t.Fatalf("the server's secret reached the sandbox: %s", res.Stdout)
		}
		var env map[string]string
		if err := json.Unmarshal([]byte(strings.SplitN(string(res.Stdout), "\n", 2)[0]), &env); err != nil {
			t.Fatalf("decoding environ: %v\n%s", err, res.Stdout)
		}
		cwd := env["CWD"]
		delete(env, "CWD")
		var got, want []string
		for k := range env {
			got = append(got, k)
		}
		// The allowlist's, and what the configuration adds (the
		// batteries: MPLBACKEND), which bundle checks against it.
		for _, kv := range append(policy.Env(), h.cfg.Env...) {
			k, _, _ := strings.Cut(kv, "=")
			if !slices.Contains(want, k) {
				want = append(want, k)
			}
		}
		sort.Strings(got)
		sort.Strings(want)
		// gVisor and Python may add nothing; LC_CTYPE is Python's own
		// coercion marker and not the host's.
		got = slices.DeleteFunc(got, func(k string) bool { return k == "LC_CTYPE" })
		if !slices.Equal(got, want) {
			t.Errorf("environment keys = %v, want exactly %v", got, want)
		}
		// /tmp, or the process runtime's call dir that is its /tmp.
		if env["HOME"] != cwd || (h.kind != runtime.Process && cwd != "/tmp") {
			t.Errorf("HOME = %q in %q, want the call's /tmp", env["HOME"], cwd)
		}
	})
}

func TestHostInvisible(t *testing.T) {
	marker := filepath.Join("/var/tmp", "mcp-exec-marker-"+fmt.Sprint(time.Now().UnixNano()))
	if err := os.WriteFile(marker, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(marker)
	forEachRuntime(t, modeBatteries|modeFresh, func(t *testing.T, h *harness) {
		var got map[string]bool
		h.probe(fmt.Sprintf(`import json, os
paths = [%q, "/root", "/home", "/var", "/work", "/run", "/srv", "/opt", "/etc/shadow", "/etc/ssh",
         "/usr/bin/bash", "/bin/sh", "/usr/local/go", "/sys/class/net/eth0", "/proc/1/root/etc/shadow"]
out = {p: os.path.exists(p) for p in paths}
# No /sys is mounted; gVisor brings its own synthetic one, whose cgroup
# dir must be empty: nothing of the host's sysfs.
for d in ["/sys/fs/cgroup", "/sys/firmware"]:
    out["non-empty " + d] = os.path.isdir(d) and len(os.listdir(d)) > 0
print(json.dumps(out))`, marker), &got)
		for p, exists := range got {
			// With the shell, /bin/sh is the rootfs's busybox, not the
			// host's (TestBatteriesTypicalAnalysis runs it).
			if exists && !(p == "/bin/sh" && h.cfg.Rootfs == batteries.rootfs) {
				t.Errorf("%s is visible inside the sandbox", p)
			}
		}
	})
}

func TestMaskedProc(t *testing.T) {
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got struct {
			Contents map[string]int
			SysWrite int
			SysRO    bool
		}
		h.probe(`import json, os
c = {}
for p in ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/sysrq-trigger", "/proc/kallsyms"]:
    try:
        c[p] = len(open(p, "rb").read(4096))
    except OSError as e:
        c[p] = -e.errno
w = 0
try:
    open("/proc/sys/kernel/hostname", "w").write("x")
except OSError as e:
    w = e.errno
ro = False
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if f[4] == "/proc/sys":
        ro = "ro" in f[5].split(",")
print(json.dumps({"Contents": c, "SysWrite": w, "SysRO": ro}))`, &got)
		for p, n := range got.Contents {
			if n > 0 {
				t.Errorf("%s: read %d bytes, want it masked (empty or unreadable)", p, n)
			}
		}
		if got.SysWrite == 0 {
			t.Errorf("writing /proc/sys/kernel/hostname succeeded")
		}
		if h.kind == "libcontainer" && !got.SysRO {
			t.Errorf("/proc/sys is not mounted read-only")
		}
	})
}

func TestDevContents(t *testing.T) {
	forEachRuntime(t, modeOldGVisor|modeFresh, func(t *testing.T, h *harness) {
		var got struct {
			Chars []string
			Other []string
			Links map[string]string
			Shm   string
		}
		h.probe(`import json, os, stat
chars, other, links = [], [], {}
for n in sorted(os.listdir("/dev")):
    st = os.lstat("/dev/" + n)
    (chars if stat.S_ISCHR(st.st_mode) else other).append(n)
if os.path.isdir("/dev/char"):
    for n in os.listdir("/dev/char"):
        p = "/dev/char/" + n
        links[n] = os.readlink(p) if os.path.islink(p) else "not a link"
shm = ""
for l in open("/proc/self/mountinfo"):
    f = l.split()
    if f[4] == "/dev/shm":
        shm = f[f.index("-") + 1]
print(json.dumps({"Chars": chars, "Other": other, "Links": links, "Shm": shm}))`, &got)
		want := []string{"full", "null", "random", "tty", "urandom", "zero"}
		allowed := []string{"shm", "fd", "stdin", "stdout", "stderr", "core", "ptmx", "pts", "mqueue"}
		if h.kind == runtime.Runsc {
			// gVisor emulates /dev/fuse and /dev/net/tun itself; neither
			// reaches a host device, and both need capabilities to use.
			want = []string{"full", "fuse", "null", "random", "tty", "urandom", "zero"}
			allowed = append(allowed, "net")
			// A current gVisor adds udev's /dev/char/<major>:<minor>
			// links; each must name one of the devices above.
			allowed = append(allowed, "char")
			for n, l := range got.Links {
				if !slices.Contains(want, strings.TrimPrefix(l, "../")) && l != "../net/tun" {
					t.Errorf("/dev/char/%s → %q, want a link to one of %v", n, l, want)
				}
			}
		} else if len(got.Links) > 0 {
			t.Errorf("/dev/char has %v, want no such directory", got.Links)
		}
		if !slices.Equal(got.Chars, want) {
			t.Errorf("character devices in /dev = %v, want %v", got.Chars, want)
		}
		// Besides the devices: /dev/shm, and the runtimes' standard links
		// into /proc/self/fd (and pts/ptmx on gVisor).
		for _, n := range got.Other {
			if !slices.Contains(allowed, n) {
				t.Errorf("unexpected /dev entry %q", n)
			}
		}
		if got.Shm != "tmpfs" {
			t.Errorf("/dev/shm fstype = %q, want tmpfs", got.Shm)
		}
	})
}
