package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// The host's pathname unix sockets, out of the code's reach: a desktop
// user's session bus (/run/user/UID/bus: his own, 0600 in a 0700 dir),
// his ssh-agent, a docker socket he reaches through a supplementary
// group (root:docker 0660), and the machine's world-writable ones (the
// journal's /dev/log, the system bus). Landlock does not mediate
// connect(2) to a pathname socket, and a socket crosses network
// namespaces: in namespaces of its own the call has a root of its own
// that holds none of them; without, the seccomp filter refuses unix
// sockets but stream and seqpacket pairs (a datagram pair could be
// connected to a path).

// sockGroup is the supplementary group the unprivileged server is in, as
// a desktop user is in docker's.
const sockGroup = 4242

// hostListener is a pathname socket of the host that counts who reached it.
type hostListener struct {
	path    string
	reached atomic.Int64
}

// listen makes a stream listener (or, dgram, a datagram socket) at path,
// owned by uid:gid with mode, until the test ends.
func listen(t *testing.T, path string, dgram bool, uid, gid int, mode os.FileMode) *hostListener {
	t.Helper()
	l := &hostListener{path: path}
	if dgram {
		c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		go func() {
			buf := make([]byte, 1024)
			for {
				if _, _, err := c.ReadFrom(buf); err != nil {
					return
				}
				l.reached.Add(1)
			}
		}()
	} else {
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				l.reached.Add(1)
				c.Close()
			}
		}()
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return l
}

// socketProbe tries each way a process may reach each named path: a
// stream connect, a datagram sent to it, and both through a socketpair
// (a datagram pair can be connected anew, a stream pair cannot). It
// prints {name: {how: errno or 0}}.
const socketProbe = `import json, socket, sys
targets = json.loads(sys.stdin.read())
out = {}
def stream(p):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.settimeout(2); s.connect(p)
def dgram(p):
    socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(b"x", p)
def pair_dgram(p):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.sendto(b"x", p)
def pair_dgram_connect(p):
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM); a.connect(p); a.send(b"x")
def pair_stream(p):
    a, b = socket.socketpair(); a.connect(p)
for name, (path, kind) in targets.items():
    ways = {"stream": [stream, pair_stream], "dgram": [dgram, pair_dgram, pair_dgram_connect]}[kind]
    out[name] = {}
    for f in ways:
        try:
            f(path); out[name][f.__name__] = 0
        except OSError as e:
            out[name][f.__name__] = e.errno
print(json.dumps(out))`

func TestProcessHostSocketsOutOfReach(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testenv.Missing(t, "no /usr/bin/python3 for the control probe")
	}
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			// Short paths: sun_path holds 107 bytes.
			dir, err := os.MkdirTemp("/tmp", "mcp-exec-sock-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			os.Chmod(dir, 0o755)
			user := 0 // the server's uid
			if !m.root {
				user = 65532
			}
			// The user's runtime dir: his alone.
			run := filepath.Join(dir, "run-user")
			if err := os.Mkdir(run, 0o700); err != nil {
				t.Fatal(err)
			}
			os.Chown(run, user, user)
			listeners := map[string]*hostListener{
				"session bus": listen(t, filepath.Join(run, "bus"), false, user, user, 0o600),
				"ssh-agent":   listen(t, filepath.Join(run, "agent"), false, user, user, 0o600),
				"docker":      listen(t, filepath.Join(dir, "docker.sock"), false, 0, sockGroup, 0o660),
				"system bus":  listen(t, filepath.Join(dir, "system_bus_socket"), false, 0, 0, 0o666),
				"journal":     listen(t, filepath.Join(dir, "log"), true, 0, 0, 0o666),
			}
			targets := map[string][2]string{}
			for name, l := range listeners {
				kind := "stream"
				if name == "journal" {
					kind = "dgram"
				}
				targets[name] = [2]string{l.path, kind}
			}
			in, _ := json.Marshal(targets)

			// Control: the server's user, outside any sandbox, reaches
			// each (so that a refusal below is the sandbox's).
			argv := []string{"/usr/bin/python3", "-c", socketProbe}
			if !m.root {
				argv = append([]string{"setpriv", "--reuid=65532", "--regid=65532", fmt.Sprintf("--groups=%d", sockGroup), "--inh-caps=-all"}, argv...)
			}
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Stdin = strings.NewReader(string(in))
			raw, err := cmd.Output()
			if err != nil {
				t.Fatalf("the control probe: %v", err)
			}
			var control map[string]map[string]int
			if err := json.Unmarshal(raw, &control); err != nil {
				t.Fatalf("the control probe printed %q: %v", raw, err)
			}
			for name, l := range listeners {
				way := "stream"
				if name == "journal" {
					way = "dgram"
				}
				if control[name][way] != 0 || l.reached.Load() == 0 {
					t.Fatalf("control: the server's user does not reach the %s (%v): the test proves nothing", name, control[name])
				}
				l.reached.Store(0)
			}

			s := startProcessServerWithGroups(t, m, []int{sockGroup})
			out, _ := s.call(t, map[string]any{"code": socketProbe, "stdin": string(in)})
			var got map[string]map[string]int
			if err := json.Unmarshal([]byte(out.Stdout), &got); err != nil {
				t.Fatalf("probe printed %q (exit %d, stderr %q): %v", out.Stdout, out.ExitCode, out.Stderr, err)
			}
			for name, ways := range got {
				for how, errno := range ways {
					if errno == 0 {
						t.Errorf("the code reached the host's %s (%s) by %s", name, listeners[name].path, how)
					}
				}
			}
			if len(got) != len(listeners) {
				t.Errorf("the probe tried %d sockets, want %d: %v", len(got), len(listeners), got)
			}
			// Nothing came through, whatever the probe believed.
			time.Sleep(100 * time.Millisecond)
			for name, l := range listeners {
				if n := l.reached.Load(); n > 0 {
					t.Errorf("the host's %s was reached %d times from the call", name, n)
				}
			}
			t.Logf("errnos: %v", got)
		})
	}
}

// What the code sees of the host beyond its files (F10 of the red team's
// report): in namespaces of its own its mount table is its own root's
// (not the host's, which names every instance's and test's dirs);
// without, neither its /proc/self/net (the host's TCP table: the
// server's listener and its clients' addresses) nor netlink's sock_diag
// (every socket of the host, unix ones by path).
func TestProcessHostMountsAndSocketsHidden(t *testing.T) {
	var host []string
	for _, l := range strings.Split(string(mustRead(t, "/proc/self/mountinfo")), "\n") {
		if f := strings.Fields(l); len(f) > 4 {
			host = append(host, f[4])
		}
	}
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			s := startProcessServer(t, m)
			var got struct {
				Mounts       []string
				NetTCP, Diag int
			}
			s.probe(t, `import json, socket
out = {"Mounts": [l.split()[4] for l in open("/proc/self/mountinfo")]}
try:
    open("/proc/self/net/tcp").read(); out["NetTCP"] = 0
except OSError as e:
    out["NetTCP"] = e.errno
try:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4).close(); out["Diag"] = 0  # NETLINK_SOCK_DIAG
except OSError as e:
    out["Diag"] = e.errno
print(json.dumps(out))`, &got)
			if m.ns {
				// Its own root: /, the system's trees, /dev's nodes, its
				// /proc and /sys, its own dirs.
				allowed := []string{"/usr", "/etc", "/dev", "/proc", "/sys", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin", s.tmp}
				for _, mp := range got.Mounts {
					if mp != "/" && !slices.ContainsFunc(allowed, func(d string) bool { return mp == d || strings.HasPrefix(mp, d+"/") }) {
						t.Errorf("the call's mount table has %s, not of its own root", mp)
					}
				}
				n := 0
				for _, mp := range host {
					if mp != "/" && slices.Contains(got.Mounts, mp) && !slices.ContainsFunc(allowed, func(d string) bool { return mp == d || strings.HasPrefix(mp, d+"/") }) {
						n++
					}
				}
				if n > 0 {
					t.Errorf("the call's mount table (%d lines) shows %d of the host's mounts", len(got.Mounts), n)
				}
				t.Logf("%d mounts in the call, %d on the host", len(got.Mounts), len(host))
				return
			}
			if got.NetTCP == 0 || got.Diag == 0 {
				t.Errorf("without namespaces: /proc/self/net/tcp errno %d, NETLINK_SOCK_DIAG errno %d; want both refused", got.NetTCP, got.Diag)
			}
		})
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
