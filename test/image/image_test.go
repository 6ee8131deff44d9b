//go:build imagetest

// Package image tests the mcp-exec container image the way its users run
// it, with a real MCP client against the real image under podman:
//
//   - the privileged recipe (what `mcp-exec doctor` prints as the fix),
//     once per runtime (libcontainer, runsc), over stdio and over HTTP
//     (healthz, the token gate, both token headers, the HEALTHCHECK);
//   - the mcp-exec 0.5.4 `mcpServers` entry's exact flags over stdio, where
//     the image's `auto` runtime must fall back to the process runtime.
//
// Each call asserts what the code saw from inside, not only that it ran.
//
// test/image/run.sh (make image-test) builds the image and runs this with
// MCP_EXEC_TEST_IMAGE set to it, and MCP_EXEC_TEST_ENGINE_FLAGS to what
// podman needs on the host (OCI runtime, ulimits). The imagetest build tag
// keeps it out of `go test ./...`, which has no image to test.
package image

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// privileged is the recipe `mcp-exec doctor` prints for running the full
// per-call sandbox nested in a container.
var privileged = []string{
	"--user", "0:0",
	"--cap-add", "SYS_ADMIN", "--cap-add", "NET_ADMIN", "--cap-add", "SYS_PTRACE",
	"--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
	"--security-opt", "systempaths=unconfined",
	"--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
}

// seed054 are the flags of mcp-exec 0.5.4's documented mcpServers entry.
var seed054 = []string{
	"--network", "none", "--read-only", "--cap-drop", "ALL",
	"--security-opt", "no-new-privileges", "--user", "65532:65532",
	"--tmpfs", "/tmp:rw,noexec,nosuid,size=64m",
	"--memory", "256m", "--pids-limit", "128", "--cpus", "1",
}

// probe prints what the code sees of its sandbox: uid, gid, hostname, the
// network interfaces, any MCP_EXEC_* variable (the image's ENV must not
// reach it), and what it read from stdin.
const probe = `import os, socket, sys
print("uid", os.getuid(), "gid", os.getgid())
print("hostname", socket.gethostname())
print("ifaces", ",".join(sorted(n for _, n in socket.if_nameindex())))
print("env", ",".join(sorted(k for k in os.environ if k.startswith("MCP_EXEC"))) or "-")
print("stdin", sys.stdin.read())
`

const probeStdin = "from-the-client"

// output is the part of the exec tool's structuredContent checked here.
type output struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	TimedOut bool   `json:"timed_out"`
	Runtime  string `json:"runtime"`
}

// want is what one call must report.
type want struct {
	runtime string
	// stdout lines that must appear exactly.
	lines []string
}

// sandboxed is what every strict per-call sandbox shows its code.
func sandboxed(runtime string) want {
	return want{runtime: runtime, lines: []string{
		"uid 65532 gid 65532",
		"hostname sandbox",
		"ifaces lo",
		"env -",
		"stdin " + probeStdin,
	}}
}

func TestPrivilegedStdio(t *testing.T) {
	for _, rt := range []string{"libcontainer", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			args := append(append([]string{}, privileged...), "-e", "MCP_EXEC_RUNTIME="+rt)
			cs := startStdio(t, args)
			callAndCheck(t, cs, sandboxed(rt))
		})
	}
}

func TestPrivilegedHTTP(t *testing.T) {
	const token = "image-test-token-0123456789"
	for _, rt := range []string{"libcontainer", "runsc"} {
		t.Run(rt, func(t *testing.T) {
			args := append(append([]string{}, privileged...),
				"-e", "MCP_EXEC_RUNTIME="+rt,
				"-e", "MCP_EXEC_TRANSPORT=http",
				"-e", "MCP_EXEC_AUTH_TOKEN="+token,
				"-p", "127.0.0.1::8080")
			name := startDetached(t, args)
			base := "http://" + hostPort(t, name, "8080/tcp")
			waitHealthy(t, name, base)

			t.Logf("GET %s/healthz without a token", base)
			if code, body := get(t, base+"/healthz"); code != http.StatusOK || body != "ok" {
				t.Errorf("GET /healthz: %d %q, want 200 \"ok\"", code, body)
			}
			for _, tc := range []struct {
				name          string
				header, value string
				wantCode      int
			}{
				{"no token", "", "", http.StatusUnauthorized},
				{"wrong bearer", "Authorization", "Bearer wrong-token-0123456789", http.StatusUnauthorized},
				{"wrong X-MCP-AUTH", "X-MCP-AUTH", "wrong-token-0123456789", http.StatusUnauthorized},
			} {
				t.Logf("POST %s/mcp tools/call with %s", base, tc.name)
				if got := postCall(t, base+"/mcp", tc.header, tc.value); got != tc.wantCode {
					t.Errorf("POST /mcp with %s: status %d, want %d", tc.name, got, tc.wantCode)
				}
			}
			for _, auth := range []struct{ header, value string }{
				{"Authorization", "Bearer " + token},
				{"X-MCP-AUTH", token},
			} {
				t.Run(auth.header, func(t *testing.T) {
					t.Logf("MCP client over streamable HTTP at %s/mcp with %s", base, auth.header)
					hc := &http.Client{Transport: headerTransport{auth.header, auth.value, http.DefaultTransport}}
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					cs, err := mcp.NewClient(&mcp.Implementation{Name: "image-test", Version: "1"}, nil).
						Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: hc, MaxRetries: -1}, nil)
					if err != nil {
						t.Fatalf("connecting over HTTP with %s: %v", auth.header, err)
					}
					defer cs.Close()
					callAndCheck(t, cs, sandboxed(rt))
				})
			}
		})
	}
}

// TestSeedDropIn runs the image exactly as mcp-exec 0.5.4's mcpServers
// entry does. No per-call container can be made there (no capabilities,
// no-new-privileges, a read-only root, uid 65532), so `auto` must choose
// the process runtime and say so in the result.
func TestSeedDropIn(t *testing.T) {
	// podman's --read-only also mounts writable tmpfs on /run and /var/tmp;
	// docker's, which the 0.5.4 entry runs, does not: only the --tmpfs /tmp
	// is writable there, and so here.
	args := append(append([]string{}, seed054...), "--read-only-tmpfs=false")
	cs := startStdio(t, args)
	callAndCheck(t, cs, want{runtime: "process", lines: []string{
		"uid 65532 gid 65532",
		"ifaces lo", // --network none
		"env -",
		"stdin " + probeStdin,
	}})
}

// TestSeedDropInIsolates runs, under the 0.5.4 entry's exact flags, the
// attacks an adversarial review made work on the process runtime before
// it confined each call: the code reads the server's environment or
// memory, or signals it; a call's processes outlive it; a call reads or
// plants files in another's dir (its path in hand: the test finds it with
// podman exec); the machine's /tmp is written, or the call's dir grows
// past the /tmp size.
func TestSeedDropInIsolates(t *testing.T) {
	const token = "seed-drop-in-token-0123456789"
	name := containerName()
	args := append(append([]string{}, seed054...), "--read-only-tmpfs=false",
		"-e", "MCP_EXEC_AUTH_TOKEN="+token, "-e", "MCP_EXEC_TMPFS_MB=8", "-e", "MCP_EXEC_MAX_FILE_BYTES=1048576")
	cs := startStdioNamed(t, name, args)
	// call fails the test with Error, not Fatal: one runs in a goroutine.
	call := func(args map[string]any) output {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: args})
		if err != nil || res.IsError {
			t.Errorf("exec: %v %v", err, res)
			return output{}
		}
		raw, _ := json.Marshal(res.StructuredContent)
		var got output
		json.Unmarshal(raw, &got)
		return got
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("tools/list: %v", err)
	}
	t.Logf("the tool's description under the 0.5.4 flags: %s", tools.Tools[0].Description)
	// podman's default seccomp profile refuses an unprivileged user
	// namespace: the confinement without namespaces runs, and says so.
	if d := tools.Tools[0].Description; !strings.Contains(d, "This host lacks:") || !strings.Contains(d, "namespaces of its own") {
		t.Errorf("the tool's description does not say the calls lack namespaces of their own: %s", d)
	}

	// The server is the container's pid 1 (podman runs no init of its
	// own here); the code, which sees no other process's /proc, is told.
	if b, err := exec.Command("podman", "exec", name, "cat", "/proc/1/cmdline").Output(); err != nil || !bytes.Contains(b, []byte("mcp-exec")) {
		t.Fatalf("the container's pid 1 is not the server: %q (%v)", b, err)
	}
	out := call(map[string]any{"stdin": "1", "code": `import os, sys
init = os.getppid(); server = int(sys.stdin.read())
def try_(name, f):
    try:
        f(); print(name, "SUCCEEDED")
    except OSError as e:
        print(name, "refused", e.errno)
try_("environ", lambda: open("/proc/%d/environ" % server, "rb").read())
try_("mem", lambda: open("/proc/%d/mem" % server, "r+b"))
try_("cmdline", lambda: open("/proc/%d/cmdline" % server, "rb").read())
try_("signal-server", lambda: os.kill(server, 0))
try_("signal-init", lambda: os.kill(init, 0))
try_("machine-tmp", lambda: open("/tmp/mcp-exec-planted", "w").write("x"))
print("environ-owner", os.stat("/proc/%d/environ" % server).st_uid)`})
	if strings.Contains(out.Stdout, "SUCCEEDED") || strings.Contains(out.Stdout, token) || !strings.Contains(out.Stdout, "environ-owner 0") {
		t.Errorf("the code reached the server, its init or the machine's /tmp, or the server is dumpable:\n%s%s", out.Stdout, out.Stderr)
	}

	marker := "mcp-exec-seed-orphan-" + uuid.NewString()[:8]
	out = call(map[string]any{"code": fmt.Sprintf(`import os, signal, subprocess, sys, time
init = os.getppid()
if os.fork() == 0:
    os.setsid()
    try:
        os.kill(init, signal.SIGKILL)
    except OSError:
        pass
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)  # %s"], start_new_session=True)
    time.sleep(300)
time.sleep(1)
print("done")`, marker), "timeout_s": 20})
	if out.TimedOut || !strings.Contains(out.Stdout, "done") {
		t.Errorf("the call with a detached grandchild: timed out %v, stdout %q", out.TimedOut, out.Stdout)
	}
	// Looked for from outside: no call sees another's processes.
	left := "?"
	for deadline := time.Now().Add(5 * time.Second); left != "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		b, _ := exec.Command("podman", "exec", "--user", "65532", name, "sh", "-c",
			"grep -l "+strings.Replace(marker, "orphan", "orpha[n]", 1)+" /proc/[0-9]*/cmdline 2>/dev/null").Output()
		left = strings.TrimSpace(string(b))
	}
	if left != "" {
		t.Errorf("a process of an earlier call outlived it: %s", left)
	}

	victim := make(chan output, 1)
	go func() {
		victim <- call(map[string]any{"code": `import os, time
time.sleep(8)
print(sorted(os.listdir("outputs")))`,
			"files": []map[string]any{{"path": "secret.txt", "content": "B-SECRET"}}, "timeout_s": 30})
	}()
	// The victim's dir, as the server's uid sees it (not the code): the one
	// holding its input file.
	var dir string
	for deadline := time.Now().Add(30 * time.Second); dir == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		b, _ := exec.Command("podman", "exec", "--user", "65532", name, "sh", "-c", "ls /tmp/mcp-exec-*/*/work/secret.txt 2>/dev/null").Output()
		if f := strings.Fields(string(b)); len(f) == 1 {
			dir = strings.TrimSuffix(f[0], "/secret.txt")
		}
	}
	if dir == "" {
		t.Fatal("the victim call's dir did not appear")
	}
	out = call(map[string]any{"stdin": dir, "code": `import os, sys
d = sys.stdin.read().strip()
for name, f in [("read", lambda: open(d + "/secret.txt").read()), ("list", lambda: os.listdir(d)),
                ("plant", lambda: open(d + "/outputs/planted.txt", "w").write("A"))]:
    try:
        print(name, "SUCCEEDED", f())
    except OSError as e:
        print(name, "refused", e.errno)`})
	if strings.Contains(out.Stdout, "SUCCEEDED") {
		t.Errorf("a call reached another's dir:\n%s", out.Stdout)
	}
	if v := <-victim; strings.Contains(v.Stdout, "planted") {
		t.Errorf("a file planted by another call came back in the victim's result: %q", v.Stdout)
	}

	out = call(map[string]any{"code": `chunk = b"x" * (1 << 20)
for i in range(8):
    with open("f%d" % i, "wb") as f:
        for _ in range(6):
            f.write(chunk); f.flush()
print("wrote 48 MiB")`, "timeout_s": 30})
	if strings.Contains(out.Stdout, "wrote 48 MiB") || out.ExitCode != 137 {
		t.Errorf("48 MiB under an 8 MiB /tmp: exit %d, stdout %q, stderr %q; want the call killed at the bound", out.ExitCode, out.Stdout, out.Stderr)
	}

	// Files without a name: unlinked while open, and O_TMPFILE.
	out = call(map[string]any{"code": `import os
held = []
for i in range(12):
    if i % 2:
        fd = os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600)
    else:
        fd = os.open("n%d" % i, os.O_CREAT | os.O_WRONLY, 0o600)
        os.unlink("n%d" % i)
    for _ in range(4):
        os.write(fd, b"x" * (1 << 20))
    held.append(fd)
print("kept 48 MiB without a name")`, "timeout_s": 30})
	if strings.Contains(out.Stdout, "kept") || out.ExitCode != 137 || !strings.Contains(out.Stderr, "without a name, went past its size") {
		t.Errorf("48 MiB without a name under an 8 MiB /tmp: exit %d, stdout %q, stderr %q; want the call killed at the bound, saying why", out.ExitCode, out.Stdout, out.Stderr)
	}

	// Another call's subprocess's command line, its pid in hand (the
	// test finds it with podman exec, by a pattern that does not match
	// grep's own command line), and every pid in /proc.
	argvMarker := "mcp-exec-seed-argv-" + uuid.NewString()[:8]
	other := make(chan output, 1)
	go func() {
		other <- call(map[string]any{"code": fmt.Sprintf(`import subprocess, sys, time
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", %q])
time.sleep(8)
p.kill()`, argvMarker), "timeout_s": 30})
	}()
	var pid string
	for deadline := time.Now().Add(30 * time.Second); pid == "" && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		b, _ := exec.Command("podman", "exec", "--user", "65532", name, "sh", "-c", "grep -l "+strings.Replace(argvMarker, "argv", "arg[v]", 1)+" /proc/[0-9]*/cmdline 2>/dev/null").Output()
		if f := strings.Fields(string(b)); len(f) == 1 {
			pid = strings.Split(f[0], "/")[2]
		}
	}
	if pid == "" {
		t.Fatal("the other call's subprocess did not appear")
	}
	out = call(map[string]any{"stdin": pid, "code": fmt.Sprintf(`import os, sys
pid = sys.stdin.read().strip()
try:
    print("cmdline SUCCEEDED", open("/proc/%%s/cmdline" %% pid, "rb").read())
except OSError as e:
    print("cmdline refused", e.errno)
try:
    seen = [p for p in os.listdir("/proc") if p.isdigit() and %q.encode() in open("/proc/%%s/cmdline" %% p, "rb").read()]
    print("listed", len(seen), "with the marker")
except OSError as e:
    print("list refused", e.errno)`, argvMarker)})
	if !strings.Contains(out.Stdout, "cmdline refused") || !strings.Contains(out.Stdout, "list refused") {
		t.Errorf("a call read another's command line or listed /proc:\n%s%s", out.Stdout, out.Stderr)
	}
	<-other
}

// TestSeedUnmaskedNamespaces: the 0.5.4 entry's flags and one more,
// --security-opt systempaths=unconfined, which lifts the masks of /proc
// that refuse a fresh one: podman's seccomp profile lets the server make
// a user namespace, so each call gets namespaces of its own (the
// hostname stays the container's: the profile refuses sethostname).
func TestSeedUnmaskedNamespaces(t *testing.T) {
	args := append(append([]string{}, seed054...), "--read-only-tmpfs=false", "--security-opt", "systempaths=unconfined",
		"-e", "MCP_EXEC_TMPFS_MB=8", "-e", "MCP_EXEC_MAX_FILE_BYTES=1048576")
	cs := startStdio(t, args)
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("tools/list: %v", err)
	}
	if d := tools.Tools[0].Description; !strings.Contains(d, "namespaces of its own (it sees only its own processes") || strings.Contains(d, "lacks: namespaces") {
		t.Errorf("the tool's description does not say each call has namespaces of its own: %s", d)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": `import os, socket
procs = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
print("only its own processes", procs == [1, os.getpid()], procs)
print("ifaces", ",".join(n for _, n in socket.if_nameindex()))
held = []
try:
    for _ in range(12):   # each within the file size limit, the /tmp size
        held.append(os.open(".", os.O_TMPFILE | os.O_WRONLY, 0o600))
        for _ in range(4):
            os.write(held[-1], b"x" * (1 << 20))
    print("kept 48 MiB without a name")
except OSError as e:
    print("refused", e.errno)`}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %v", err, res)
	}
	raw, _ := json.Marshal(res.StructuredContent)
	var out output
	json.Unmarshal(raw, &out)
	t.Logf("a call under the 0.5.4 flags with systempaths=unconfined: %q", out.Stdout)
	for _, l := range []string{"only its own processes True", "ifaces lo\n", "refused 28\n"} {
		if !strings.Contains(out.Stdout, l) {
			t.Errorf("the call printed %q, want %q", out.Stdout, l)
		}
	}
}

// TestSeedDoctor is doctor under the 0.5.4 entry's exact flags: auto runs
// the process runtime, without namespaces of its own (podman's seccomp
// profile refuses an unprivileged user namespace), and says what that
// costs and how to get them.
func TestSeedDoctor(t *testing.T) {
	base := append(append([]string{}, seed054...), "--read-only-tmpfs=false")
	run := func(extra ...string) []byte {
		argv := engineArgs(t, containerName(), append(append(base, image(t)), append([]string{"doctor"}, extra...)...))
		out, err := exec.Command("podman", argv...).Output()
		if err != nil && len(out) == 0 {
			t.Fatalf("podman %s: %v", strings.Join(argv, " "), err)
		}
		return out
	}
	var r struct {
		Runtime struct {
			Mode    string `json:"mode"`
			Process *struct {
				Namespaces bool `json:"namespaces"`
				Missing    []struct {
					What string `json:"what"`
					Fix  string `json:"fix"`
				} `json:"missing"`
			} `json:"process"`
		} `json:"runtime"`
	}
	out := run("--json")
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out)
	}
	p := r.Runtime.Process
	if r.Runtime.Mode != "process" || p == nil || p.Namespaces {
		t.Fatalf("doctor under the 0.5.4 flags: mode %q, process %+v; want process without namespaces", r.Runtime.Mode, p)
	}
	found := false
	for _, m := range p.Missing {
		found = found || (m.What == "namespaces of its own" && strings.Contains(m.Fix, "seccomp=unconfined"))
	}
	if !found {
		t.Errorf("doctor does not name the missing namespaces and their fix: %+v", p.Missing)
	}
	t.Logf("doctor under the 0.5.4 flags:\n%s", run())
}

// TestImageConfig checks what the Dockerfile promises operators: not root
// by default, stdio by default with the 0.5.4 package set and the auto
// runtime, the prebuilt rootfs, port 8080, a HEALTHCHECK, OCI labels.
func TestImageConfig(t *testing.T) {
	out, err := exec.Command("podman", "image", "inspect", image(t)).Output()
	if err != nil {
		t.Fatalf("podman image inspect: %v", err)
	}
	var inspect []struct {
		Config struct {
			User         string
			Entrypoint   []string
			Cmd          []string
			Env          []string
			ExposedPorts map[string]struct{}
			Labels       map[string]string
		}
		Healthcheck *struct{ Test []string }
	}
	if err := json.Unmarshal(out, &inspect); err != nil || len(inspect) != 1 {
		t.Fatalf("decoding podman image inspect: %v (%d images)", err, len(inspect))
	}
	c := inspect[0].Config
	env := map[string]bool{}
	for _, e := range c.Env {
		env[e] = true
	}
	_, port := c.ExposedPorts["8080/tcp"]
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"User", c.User, "65532:65532"},
		{"Entrypoint", strings.Join(c.Entrypoint, " "), "mcp-exec"},
		{"Cmd", strings.Join(c.Cmd, " "), "serve"},
		{"ExposedPorts[8080/tcp]", port, true},
		{"Healthcheck", inspect[0].Healthcheck != nil && len(inspect[0].Healthcheck.Test) > 0, true},
		{"Labels[org.opencontainers.image.title]", c.Labels["org.opencontainers.image.title"], "mcp-exec"},
		{"Labels[org.opencontainers.image.source]", c.Labels["org.opencontainers.image.source"], "https://github.com/inhuman/mcp-exec"},
		{"Labels[org.opencontainers.image.version] set", c.Labels["org.opencontainers.image.version"] != "", true},
		{"Env MCP_EXEC_TRANSPORT", env["MCP_EXEC_TRANSPORT=stdio"], true},
		{"Env MCP_EXEC_RUNTIME", env["MCP_EXEC_RUNTIME=auto"], true},
		{"Env MCP_EXEC_PACKAGES", env["MCP_EXEC_PACKAGES=numpy,pandas,matplotlib,pillow,pyyaml,jinja2"], true},
		{"Env MCP_EXEC_SHELL", env["MCP_EXEC_SHELL=true"], true},
		{"Env MCP_EXEC_ROOTFS", env["MCP_EXEC_ROOTFS=/opt/mcp-exec/rootfs"], true},
		{"Env MCP_EXEC_ADDR", env["MCP_EXEC_ADDR=0.0.0.0:8080"], true},
	} {
		if tc.got != tc.want {
			t.Errorf("image config: %s = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// engineArgs returns the podman command line up to the image's arguments:
// run, the host's engine flags, a name, then args.
func engineArgs(t *testing.T, name string, args []string) []string {
	t.Helper()
	a := []string{"run", "--rm", "--name", name}
	a = append(a, strings.Fields(os.Getenv("MCP_EXEC_TEST_ENGINE_FLAGS"))...)
	return append(a, args...)
}

func image(t *testing.T) string {
	t.Helper()
	img := os.Getenv("MCP_EXEC_TEST_IMAGE")
	if img == "" {
		t.Fatal("MCP_EXEC_TEST_IMAGE is not set: run test/image/run.sh (make image-test), which builds the image")
	}
	return img
}

// containerName names a container after MCP_EXEC_TEST_NAME_PREFIX, by
// which run.sh finds what a killed test left.
func containerName() string {
	prefix := os.Getenv("MCP_EXEC_TEST_NAME_PREFIX")
	if prefix == "" {
		prefix = "mcp-exec-image-test-"
	}
	return prefix + uuid.NewString()[:8]
}

// startStdio runs the image as an mcpServers entry does (podman run -i)
// and connects an MCP client to it over its stdin and stdout. The pipes
// are the test's own, so that the server's exit and its last words on
// stderr are waited for before they are judged.
func startStdio(t *testing.T, args []string) *mcp.ClientSession {
	t.Helper()
	return startStdioNamed(t, containerName(), args)
}

// startStdioNamed is startStdio with the container's name given.
func startStdioNamed(t *testing.T, name string, args []string) *mcp.ClientSession {
	t.Helper()
	argv := engineArgs(t, name, append(append([]string{"-i"}, args...), image(t)))
	t.Logf("stdio: podman %s", strings.Join(argv, " "))
	inR, inW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &testenv.SyncBuffer{}
	cmd := exec.Command("podman", argv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting podman: %v", err)
	}
	inR.Close()
	outW.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// stop closes the server's stdin, which ends it, and waits for podman.
	stop := func() error {
		inW.Close()
		select {
		case err := <-exited:
			return err
		case <-time.After(30 * time.Second):
			exec.Command("podman", "rm", "-f", "-t", "0", name).Run()
			cmd.Process.Kill()
			return fmt.Errorf("podman run -i still running 30s after its stdin closed: %v", <-exited)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "image-test", Version: "1"}, nil).
		Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		werr := stop()
		t.Fatalf("connecting over stdio: %v (podman: %v); server stderr:\n%s", err, werr, stderr)
	}
	t.Cleanup(func() {
		cs.Close()
		if err := stop(); err != nil {
			t.Errorf("podman run -i after stdin closed: %v, want exit status 0; server stderr:\n%s", err, stderr)
		} else if t.Failed() {
			t.Logf("server stderr (%s):\n%s", name, stderr)
		}
		outR.Close()
	})
	return cs
}

// startDetached runs the image in the background and returns its name;
// its logs are shown when the test fails.
func startDetached(t *testing.T, args []string) string {
	t.Helper()
	name := containerName()
	argv := engineArgs(t, name, append(append([]string{"-d"}, args...), image(t)))
	t.Logf("http: podman %s", strings.Join(argv, " "))
	if out, err := exec.Command("podman", argv...).CombinedOutput(); err != nil {
		t.Fatalf("podman run -d: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("podman", "logs", name).CombinedOutput()
			t.Logf("server log (%s):\n%s", name, out)
		}
		exec.Command("podman", "rm", "-f", "-t", "5", name).Run()
	})
	return name
}

// hostPort is where the engine published the container's port.
func hostPort(t *testing.T, name, port string) string {
	t.Helper()
	out, err := exec.Command("podman", "port", name, port).Output()
	if err != nil {
		t.Fatalf("podman port %s %s: %v", name, port, err)
	}
	hp := strings.TrimSpace(strings.Split(string(out), "\n")[0])
	if hp == "" {
		t.Fatalf("podman port %s %s: nothing published", name, port)
	}
	return hp
}

// waitHealthy waits for /healthz to answer, then runs the image's own
// HEALTHCHECK, which must pass once the server serves.
func waitHealthy(t *testing.T, name, base string) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s/healthz did not answer 200 within 90s: %v", base, err)
		}
		if out, _ := exec.Command("podman", "inspect", "--format", "{{.State.Running}}", name).Output(); strings.TrimSpace(string(out)) != "true" {
			t.Fatalf("container %s stopped before serving", name)
		}
		time.Sleep(300 * time.Millisecond)
	}
	t.Logf("podman healthcheck run %s (the image's HEALTHCHECK)", name)
	if out, err := exec.Command("podman", "healthcheck", "run", name).CombinedOutput(); err != nil {
		t.Errorf("the image's HEALTHCHECK failed on a serving HTTP server: %v\n%s", err, out)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// postCall POSTs a tools/call as an MCP client would, with one header (or
// none), and returns the status.
func postCall(t *testing.T, url, header, value string) int {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"exec","arguments":{"code":"print(1)"}}}`
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if header != "" {
		req.Header.Set(header, value)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// callAndCheck calls exec with the probe and checks the result.
func callAndCheck(t *testing.T, cs *mcp.ClientSession, w want) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": probe, "stdin": probeStdin}})
	if err != nil {
		t.Fatalf("tools/call exec: %v", err)
	}
	if res.IsError {
		t.Fatalf("tools/call exec: isError: %s", contentText(res))
	}
	raw, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var got output
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("decoding structuredContent %s: %v", raw, err)
	}
	t.Logf("exec result in %v: runtime=%q exit_code=%d stdout=%q stderr=%q",
		time.Since(start).Round(time.Millisecond), got.Runtime, got.ExitCode, got.Stdout, got.Stderr)
	if got.ExitCode != 0 || got.TimedOut {
		t.Errorf("exec: exit_code = %d, timed_out = %v, want 0, false (stderr %q)", got.ExitCode, got.TimedOut, got.Stderr)
	}
	if got.Runtime != w.runtime {
		t.Errorf("exec: runtime = %q, want %q", got.Runtime, w.runtime)
	}
	lines := map[string]bool{}
	sc := bufio.NewScanner(strings.NewReader(got.Stdout))
	for sc.Scan() {
		lines[sc.Text()] = true
	}
	for _, l := range w.lines {
		if !lines[l] {
			t.Errorf("exec: stdout lacks the line %q (stdout %q)", l, got.Stdout)
		}
	}
}

func contentText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// headerTransport adds one header to every request, as a configured
// client does.
type headerTransport struct {
	header, value string
	base          http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(h.header, h.value)
	return h.base.RoundTrip(r)
}
