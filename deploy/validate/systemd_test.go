package validate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

const unitPath = "../systemd/mcp-exec.service"

// need fails the test under CI, where every prerequisite must be present,
// and skips it elsewhere, saying exactly what is missing.
func need(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing (CI=true makes this a failure): "+format, args...)
	}
	t.Skipf("skipping: "+format, args...)
}

func lookPath(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		need(t, "%s not found (apt-get install %s)", name, pkg)
	}
	return p
}

// unitRoot lays out a file system root for systemd-analyze --root: the
// unit, the system's own units it refers to (sysinit.target, ...) and an
// executable at the unit's ExecStart path, which verify checks exists.
func unitRoot(t *testing.T, unit []byte) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"usr/local/bin", "etc/systemd/system", "usr/lib/systemd"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/local/bin/mcp-exec"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/systemd/system/mcp-exec.service"), unit, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copying the system's units: %v: %s", err, out)
	}
	return root
}

func readUnit(t *testing.T) []byte {
	t.Helper()
	unit, err := os.ReadFile(unitPath)
	if err != nil {
		t.Fatal(err)
	}
	return unit
}

// TestSystemdUnitVerifies runs systemd-analyze verify, which exits 0 even
// for unknown keys and unparsable values: any output is a failure.
func TestSystemdUnitVerifies(t *testing.T) {
	analyze := lookPath(t, "systemd-analyze", "systemd")
	unit := readUnit(t)

	verify := func(unit []byte) (string, error) {
		root := unitRoot(t, unit)
		out, err := exec.Command(analyze, "verify", "--root="+root, "mcp-exec.service").CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := verify(unit); err != nil || out != "" {
		t.Errorf("systemd-analyze verify %s: err = %v, output:\n%s\nwant no error and no output", unitPath, err, out)
	}
	// The check itself must be able to fail: a misspelt directive.
	bad := bytes.Replace(unit, []byte("\nProtectSystem=strict"), []byte("\nProtectSytem=strict"), 1)
	if out, _ := verify(bad); !strings.Contains(out, "ProtectSytem") {
		t.Errorf("systemd-analyze verify of a misspelt unit: output %q does not name the misspelt key", out)
	}
}

// TestSystemdUnitSecurity holds the hardening to its rationale (the
// comment at the top of the unit): what it must set, and what it must not
// set because it would break the sandbox.
func TestSystemdUnitSecurity(t *testing.T) {
	analyze := lookPath(t, "systemd-analyze", "systemd")
	root := unitRoot(t, readUnit(t))
	out, err := exec.Command(analyze, "security", "--offline=true", "--root="+root, "--json=short", "mcp-exec.service").Output()
	if err != nil {
		t.Fatalf("systemd-analyze security: %v", err)
	}
	var checks []struct {
		Field string `json:"json_field"`
		Set   *bool  `json:"set"`
	}
	if err := json.Unmarshal(out, &checks); err != nil {
		t.Fatalf("decoding systemd-analyze security --json: %v", err)
	}
	got := map[string]bool{}
	for _, c := range checks {
		got[c.Field] = c.Set != nil && *c.Set
	}
	want := map[string]bool{
		"NoNewPrivileges":                   true,
		"ProtectSystem":                     true,
		"ProtectHome":                       true,
		"PrivateTmp":                        true,
		"ProtectKernelModules":              true,
		"SystemCallArchitectures":           true,
		"LockPersonality":                   true,
		"RestrictRealtime":                  true,
		"RestrictSUIDSGID":                  true,
		"RestrictAddressFamilies_AF_PACKET": true,
		"RestrictAddressFamilies_OTHER":     true,
		"AmbientCapabilities":               true,
		// Capabilities the server never needs.
		"CapabilityBoundingSet_CAP_SYS_MODULE":                      true,
		"CapabilityBoundingSet_CAP_SYS_RAWIO":                       true,
		"CapabilityBoundingSet_CAP_SYS_TIME":                        true,
		"CapabilityBoundingSet_CAP_BPF":                             true,
		"CapabilityBoundingSet_CAP_MKNOD":                           true,
		"CapabilityBoundingSet_CAP_NET_BIND_SERVICE_BROADCAST_RAW)": true,
		// Left out on purpose: each breaks the sandbox (see the unit).
		"ProtectKernelTunables":   false, // mounts over /proc
		"ProtectKernelLogs":       false, // mounts over /proc/kmsg
		"ProtectProc":             false, // a /proc with hidepid=
		"ProcSubset":              false, // a /proc with subset=pid
		"ProtectControlGroups":    false, // per-call cgroups
		"ProtectHostname":         false, // denies sethostname
		"SystemCallFilter_mount":  false, // each sandbox's mounts
		"MemoryDenyWriteExecute":  false, // ctypes, libffi
		"RestrictNamespaces_user": false, // each sandbox's user namespace
		// Needed (see the unit): SYS_PTRACE and CHOWN for each sandbox's
		// user namespace, DAC_OVERRIDE for the cgroups, SETFCAP for runsc.
		"CapabilityBoundingSet_CAP_SYS_PTRACE":           false,
		"CapabilityBoundingSet_CAP_DAC_FOWNER_IPC_OWNER": false,
		"CapabilityBoundingSet_CAP_CHOWN_FSETID_SETFCAP": false,
	}
	for field, w := range want {
		g, ok := got[field]
		if !ok {
			t.Errorf("systemd-analyze security reports no %s", field)
			continue
		}
		if g != w {
			t.Errorf("systemd-analyze security: %s set = %v, want %v", field, g, w)
		}
	}
}

// TestSystemdUnitBoots runs the unit for real: a systemd (this machine's
// own, booted as PID 1 of a systemd-nspawn container over a read-only view
// of this machine's root) starts the unit as shipped, with the binary from
// bin/. Then sandboxed calls go through it over HTTP with both runtimes,
// the token arrives through LoadCredential=, the process has exactly the
// privileges the unit grants, and it stops cleanly.
func TestSystemdUnitBoots(t *testing.T) {
	if testing.Short() {
		t.Skip("boots a container; not in -short")
	}
	if os.Geteuid() != 0 {
		need(t, "root is needed to boot systemd in a container (run as root)")
	}
	nspawn := lookPath(t, "systemd-nspawn", "systemd-container")
	bin, err := filepath.Abs("../../bin/mcp-exec")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		need(t, "%s missing (make build)", bin)
	}
	if help, _ := exec.Command(bin, "serve", "--help").CombinedOutput(); !bytes.Contains(help, []byte("MCP_EXEC_AUTH_TOKEN_FILE")) {
		t.Fatalf("%s has no MCP_EXEC_AUTH_TOKEN_FILE, which the unit uses to read the token from its credential (see docs/deployment.md)", bin)
	}

	dir := t.TempDir()
	// The container's root: this machine's root, bound read-only without its
	// submounts (nspawn brings its own /dev, /proc, /sys, /run; /var is a
	// tmpfs), with two overlays for what the test adds.
	hostRoot := filepath.Join(dir, "root")
	mustMkdir(t, hostRoot)
	mustRun(t, "mount", "--bind", "/", hostRoot)
	t.Cleanup(func() { exec.Command("umount", "-l", hostRoot).Run() })
	mustRun(t, "mount", "-o", "remount,bind,ro", hostRoot)

	token := "test-token-0123456789abcdef"
	port := freePort(t)
	etc := filepath.Join(dir, "etc")
	writeFile(t, filepath.Join(etc, "systemd/system/mcp-exec.service"), readUnit(t), 0o644)
	writeFile(t, filepath.Join(etc, "mcp-exec/auth-token"), []byte(token+"\n"), 0o600)
	writeFile(t, filepath.Join(etc, "mcp-exec/mcp-exec.env"), []byte(fmt.Sprintf("MCP_EXEC_ADDR=127.0.0.1:%d\n", port)), 0o644)
	binDir := filepath.Join(dir, "bin")
	copyFile(t, bin, filepath.Join(binDir, "mcp-exec"), 0o755)
	// On this machine's kind of host (cgroup v1) nspawn mounts the cgroup
	// controllers read-only; on a real host root owns them: make them
	// writable before systemd starts. Boot only the unit and what it needs.
	writeFile(t, filepath.Join(binDir, "mcp-exec-test-init"), []byte(`#!/bin/sh
mount -o remount,bind,rw /sys/fs/cgroup 2>/dev/null
for d in /sys/fs/cgroup/*/; do mount -o remount,bind,rw "$d" 2>/dev/null; done
exec /lib/systemd/systemd --unit=mcp-exec.service
`), 0o755)

	var console bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// --capability=all and the keyring calls: what root has on a host,
	// which nspawn otherwise trims.
	cmd := exec.CommandContext(ctx, nspawn, "--quiet", "--keep-unit", "--register=no", "--link-journal=no",
		"--kill-signal=SIGRTMIN+3", "--capability=all", "--system-call-filter=add_key keyctl request_key",
		"--directory="+hostRoot, "--volatile=state",
		"--overlay=/etc:"+etc+":/etc", "--overlay=/usr/local/bin:"+binDir+":/usr/local/bin",
		"/usr/local/bin/mcp-exec-test-init")
	cmd.Stdout, cmd.Stderr = &console, &console
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting systemd-nspawn: %v", err)
	}
	stopped := false
	stop := func() error {
		if stopped {
			return nil
		}
		stopped = true
		// SIGTERM makes nspawn send SIGRTMIN+3: an orderly shutdown.
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			return err
		case <-time.After(60 * time.Second):
			cmd.Process.Kill()
			<-done
			return fmt.Errorf("the container did not shut down within 60 s")
		}
	}
	defer func() {
		stop()
		if t.Failed() {
			t.Logf("container console:\n%s", console.String())
		}
	}()

	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := waitHealthy(ctx, base+"/readyz", 2*time.Minute); err != nil {
		leader := containerLeader(t, cmd.Process.Pid)
		journal, _ := exec.Command("nsenter", "-t", leader, "-a", "journalctl", "-u", "mcp-exec", "--no-pager", "-n", "30").CombinedOutput()
		t.Fatalf("mcp-exec.service never became healthy: %v\njournal:\n%s", err, journal)
	}
	leader := containerLeader(t, cmd.Process.Pid)
	inside := func(args ...string) (string, error) {
		out, err := exec.Command("nsenter", append([]string{"-t", leader, "-a"}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}

	t.Run("token", func(t *testing.T) {
		resp, err := http.Post(base+"/mcp", "application/json", strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("POST /mcp without the token: status %d, want 401", resp.StatusCode)
		}
	})

	t.Run("sandboxed call", func(t *testing.T) {
		text, err := execCall(base+"/mcp", token, `import os; print("hello", os.getuid())`)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, "hello 65532") {
			t.Errorf("exec through the unit: result %s, want stdout \"hello 65532\"", text)
		}
	})

	t.Run("process", func(t *testing.T) {
		pid, err := inside("systemctl", "show", "--property=MainPID", "--value", "mcp-exec.service")
		if err != nil || pid == "0" {
			t.Fatalf("systemctl show MainPID: %q, %v", pid, err)
		}
		status, err := inside("cat", "/proc/"+pid+"/status")
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"NoNewPrivs": "1",
			// CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL, CAP_SETGID,
			// CAP_SETUID, CAP_SETPCAP, CAP_NET_ADMIN, CAP_SYS_CHROOT,
			// CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_SETFCAP: bits 0, 1, 5, 6,
			// 7, 8, 12, 18, 19, 21, 31.
			"CapBnd": "00000000802c11e3",
			"CapEff": "00000000802c11e3",
			"CapAmb": "0000000000000000",
		}
		for key, w := range want {
			if g := statusField(status, key); g != w {
				t.Errorf("mcp-exec's /proc/PID/status: %s = %q, want %q", key, g, w)
			}
		}
		environ, err := inside("cat", "/proc/"+pid+"/environ")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(environ, token) {
			t.Errorf("the token is in mcp-exec's environment; it must only be in the credential file")
		}
		if !strings.Contains(environ, "MCP_EXEC_AUTH_TOKEN_FILE=/run/credentials/mcp-exec.service/auth-token") {
			t.Errorf("mcp-exec's environment has no MCP_EXEC_AUTH_TOKEN_FILE in its credentials directory: %q", environ)
		}
	})

	t.Run("runsc", func(t *testing.T) {
		if _, err := exec.LookPath("runsc"); err != nil {
			need(t, "runsc not found (apt-get install runsc)")
		}
		env := fmt.Sprintf("MCP_EXEC_ADDR=127.0.0.1:%d\nMCP_EXEC_RUNTIME=runsc\n", port)
		c := exec.Command("nsenter", "-t", leader, "-a", "sh", "-c", "cat > /etc/mcp-exec/mcp-exec.env && systemctl restart mcp-exec.service")
		c.Stdin = strings.NewReader(env)
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("restarting with MCP_EXEC_RUNTIME=runsc: %v %s", err, out)
		}
		if err := waitHealthy(ctx, base+"/readyz", time.Minute); err != nil {
			t.Fatal(err)
		}
		text, err := execCall(base+"/mcp", token, `import os; print("hello", os.getuid(), os.uname().release)`)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(text, "hello 65532") || !strings.Contains(text, `"runtime":"runsc"`) {
			t.Errorf("exec through the unit with runsc: result %s, want stdout \"hello 65532\" from runtime runsc", text)
		}
	})

	t.Run("stop", func(t *testing.T) {
		if out, err := inside("systemctl", "stop", "mcp-exec.service"); err != nil {
			t.Fatalf("systemctl stop: %v %s", err, out)
		}
		if result, _ := inside("systemctl", "show", "--property=Result", "--value", "mcp-exec.service"); result != "success" {
			t.Errorf("mcp-exec.service stopped with Result=%s, want success", result)
		}
	})

	if err := stop(); err != nil {
		t.Errorf("shutting the container down: %v", err)
	}
}

// execCall makes one stateful streamable-HTTP session and one exec call,
// and returns the call's JSON-RPC response.
func execCall(url, token, code string) (string, error) {
	post := func(session, body string) (*http.Response, string, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if session != "" {
			req.Header.Set("Mcp-Session-Id", session)
			req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		data, err := io.ReadAll(resp.Body)
		return resp, sseData(string(data)), err
	}
	resp, _, err := post("", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"deploy-check","version":"1"}}}`)
	if err != nil {
		return "", fmt.Errorf("initialize: %w", err)
	}
	session := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || session == "" {
		return "", fmt.Errorf("initialize: status %d, session %q", resp.StatusCode, session)
	}
	if _, _, err := post(session, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil {
		return "", fmt.Errorf("initialized: %w", err)
	}
	args, _ := json.Marshal(map[string]any{"name": "exec", "arguments": map[string]any{"code": code}})
	resp, body, err := post(session, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":`+string(args)+`}`)
	if err != nil {
		return "", fmt.Errorf("tools/call: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("tools/call: status %d: %s", resp.StatusCode, body)
	}
	return body, nil
}

// sseData returns the data of the last event of a text/event-stream body,
// or the body itself when it is plain JSON.
func sseData(body string) string {
	last := body
	for _, line := range strings.Split(body, "\n") {
		if d, ok := strings.CutPrefix(line, "data:"); ok {
			last = strings.TrimSpace(d)
		}
	}
	return last
}

func waitHealthy(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			// /healthz says ok, /readyz ready.
			if resp.StatusCode == http.StatusOK && (string(body) == "ok" || string(body) == "ready") {
				return nil
			}
			err = fmt.Errorf("status %d, body %q", resp.StatusCode, body)
		}
		last = err
		time.Sleep(500 * time.Millisecond)
	}
	return fmt.Errorf("GET %s: not healthy after %v: %v", url, timeout, last)
}

// containerLeader is the PID (in this namespace) of the container's init,
// nspawn's child.
func containerLeader(t *testing.T, nspawnPID int) string {
	t.Helper()
	for i := 0; i < 50; i++ {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", nspawnPID, nspawnPID))
		if f := strings.Fields(string(data)); len(f) > 0 {
			return f[0]
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("systemd-nspawn (pid %d) has no child", nspawnPID)
	return ""
}

func statusField(status, key string) string {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, key+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func mustMkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	mustMkdir(t, filepath.Dir(path))
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, dst, data, mode)
}
