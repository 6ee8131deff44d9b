package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/egress"
	"github.com/inhuman/mcp-exec/runtime"
)

func loadEnv(env map[string]string, serverOnly bool) (config, error) {
	getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return loadConfig(fs, nil, getenv, serverOnly)
}

func writeTestFile(t *testing.T, name, data string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// Each egress setting is parsed once, checked with the others, and a
// bad one stops every subcommand with a message naming the variable and
// the element at fault.
func TestEgressConfig(t *testing.T) {
	secrets := writeTestFile(t, "secrets.json", `{"api.example.com": {"Authorization": "Bearer hidden"}}`, 0o600)
	public := writeTestFile(t, "public.json", `{"api.example.com": {"Authorization": "Bearer hidden"}}`, 0o644)
	broken := writeTestFile(t, "broken.json", `{"api.example.com": "Bearer hidden"}`, 0o600)
	withKey := writeTestFile(t, "ca.pem", "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", 0o644)
	for _, tt := range []struct {
		name string
		env  map[string]string
		want string // an error containing it; empty: valid
	}{
		{"none", nil, ""},
		{"full", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org, files.pythonhosted.org,*.example.com:8443,api.example.com,pypi.test:8443",
			"MCP_EXEC_EGRESS_DENY": "bad.example.com", "MCP_EXEC_EGRESS_HOSTS": "pypi.test=127.0.0.1",
			"MCP_EXEC_EGRESS_SECRETS_FILE": secrets, "MCP_EXEC_PIP_INDEX_URL": "https://pypi.test:8443/simple/"}, ""},
		{"bad allow element", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org,*."}, `MCP_EXEC_EGRESS_ALLOW: "*.": a wildcard`},
		{"bad deny port", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org", "MCP_EXEC_EGRESS_DENY": "x.org:0"}, `MCP_EXEC_EGRESS_DENY: "x.org:0": the port`},
		{"bad mapping", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.test", "MCP_EXEC_EGRESS_HOSTS": "pypi.test=nope"}, `MCP_EXEC_EGRESS_HOSTS: "pypi.test=nope"`},
		{"mapping of an unlisted name", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org", "MCP_EXEC_EGRESS_HOSTS": "pypi.test=127.0.0.1"},
			"MCP_EXEC_EGRESS_HOSTS maps pypi.test, which MCP_EXEC_EGRESS_ALLOW does not list"},
		{"private address listed", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "10.0.0.5:3128"},
			"MCP_EXEC_EGRESS_ALLOW lists 10.0.0.5:3128, a private address (RFC 1918), which the proxy never connects to: map a name to it with MCP_EXEC_EGRESS_HOSTS"},
		{"secrets readable by others", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "api.example.com", "MCP_EXEC_EGRESS_SECRETS_FILE": public},
			"MCP_EXEC_EGRESS_SECRETS_FILE " + public + " is open to its group or others (mode 0644)"},
		{"secrets malformed", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "api.example.com", "MCP_EXEC_EGRESS_SECRETS_FILE": broken},
			"MCP_EXEC_EGRESS_SECRETS_FILE " + broken + " is not a JSON object"},
		{"CA file with a key", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org", "MCP_EXEC_EGRESS_CA_FILE": withKey},
			"MCP_EXEC_EGRESS_CA_FILE " + withKey + " holds a PRIVATE KEY block"},
		{"index not allowed", map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org", "MCP_EXEC_PIP_INDEX_URL": "https://mirror.test/simple/"},
			"MCP_EXEC_PIP_INDEX_URL is on mirror.test:443, which MCP_EXEC_EGRESS_ALLOW does not allow"},
		{"settings without an allowlist", map[string]string{"MCP_EXEC_PIP_INDEX_URL": "https://pypi.org/simple/"}, "and MCP_EXEC_EGRESS_ALLOW is empty (no network)"},
	} {
		for _, serverOnly := range []bool{true, false} { // serve; run and doctor
			cfg, err := loadEnv(tt.env, serverOnly)
			if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Errorf("%s (server %v): loadConfig = %v, want %q", tt.name, serverOnly, err, tt.want)
			}
			if err != nil && (strings.Contains(err.Error(), "hidden") || fieldRef.MatchString(err.Error())) {
				t.Errorf("%s: the error shows a secret or an unnamed field: %v", tt.name, err)
			}
			if tt.name == "full" && err == nil {
				if got := egress.FormatRules(cfg.Egress.Allow); got != "pypi.org,files.pythonhosted.org,*.example.com:8443,api.example.com,pypi.test:8443" {
					t.Errorf("full: Allow = %s", got)
				}
			}
		}
	}
}

// With an allowlist set, a runtime that cannot give it (the process
// runtime without namespaces of its own) keeps the server, run and the
// engine from starting, naming the variable and the runtime: an allowlist
// is never silently ignored, nor given with a wider network than it says.
func TestEgressRefusedWhereNoRuntimeGivesIt(t *testing.T) {
	const want = "MCP_EXEC_EGRESS_ALLOW is set, but the process runtime without namespaces of its own cannot give a call the network allowlist"
	cfg := defaultConfig()
	cfg.StateDir = t.TempDir()
	cfg.Runtime, cfg.ProcessNamespaces = runtime.Process, runtime.NamespacesOff
	cfg.Egress.Allow, _ = egress.ParseRules("pypi.org")
	if _, err := newEngine(t.Context(), cfg, nil); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("newEngine with an allowlist on the process runtime without namespaces: %v, want %q", err, want)
	}

	t.Setenv("MCP_EXEC_EGRESS_ALLOW", "pypi.org,files.pythonhosted.org")
	t.Setenv("MCP_EXEC_RUNTIME", "process")
	t.Setenv("MCP_EXEC_PROCESS_NAMESPACES", "false")
	t.Setenv("MCP_EXEC_STATE_DIR", t.TempDir())
	var stderr bytes.Buffer
	if code := serveCmd(t.Context(), nil, strings.NewReader(""), io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("serve with an allowlist: status %d, stderr %q; want 1 and the refusal", code, stderr.String())
	}
	stderr.Reset()
	if code := runCmd(t.Context(), []string{"-c", "print(1)"}, io.Discard, &stderr); code != exitSandboxFailed || !strings.Contains(stderr.String(), want) {
		t.Errorf("run with an allowlist: status %d, stderr %q; want %d and the refusal", code, stderr.String(), exitSandboxFailed)
	}
}

// The configuration cmd builds makes a working proxy: what the wiring will
// hand each sandbox's connections to.
func TestEgressConfigMakesProxy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(conn, conn); conn.Close() }()
		}
	}()
	up := ln.Addr().(*net.TCPAddr).Port
	cfg, err := loadEnv(map[string]string{"MCP_EXEC_EGRESS_ALLOW": fmt.Sprintf("echo.test:%d", up), "MCP_EXEC_EGRESS_HOSTS": "echo.test=127.0.0.1"}, true)
	if err != nil {
		t.Fatal(err)
	}
	p, err := egress.New(egressConfig(cfg, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	call := p.NewCall("c")
	client, server := net.Pipe()
	go call.Serve(context.Background(), server)
	defer call.Close()
	fmt.Fprintf(client, "CONNECT echo.test:%d HTTP/1.1\r\nHost: x\r\n\r\n", up)
	br := bufio.NewReader(client)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT through the configured proxy: %v %v", resp, err)
	}
	go fmt.Fprint(client, "ping")
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Errorf("through the tunnel: %q %v", buf, err)
	}
}

// doctor lists what is reachable, which headers the proxy adds (never
// their values), and where the runtime cannot give the allowlist, says
// the server would refuse to start.
func TestEgressDoctor(t *testing.T) {
	requireSandbox(t)
	secrets := writeTestFile(t, "secrets.json", `{"api.example.com": {"Authorization": "Bearer hidden", "X-Team": "t"}}`, 0o600)
	t.Setenv("MCP_EXEC_EGRESS_ALLOW", "pypi.org,files.pythonhosted.org,api.example.com,pypi.test:8443")
	t.Setenv("MCP_EXEC_EGRESS_HOSTS", "pypi.test=127.0.0.1")
	t.Setenv("MCP_EXEC_EGRESS_SECRETS_FILE", secrets)
	t.Setenv("MCP_EXEC_STATE_DIR", filepath.Join(t.TempDir(), "state"))
	var out, errOut bytes.Buffer
	if code := doctorCmd(t.Context(), []string{"--json"}, &out, &errOut); code != 0 {
		t.Fatalf("doctor --json: status %d, want 0 (libcontainer gives the allowlist)\n%s\n%s", code, out.String(), errOut.String())
	}
	var r report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("doctor --json: %v\n%s", err, out.String())
	}
	e := r.Egress
	if e == nil || !e.Enabled || !r.OK || !strings.Contains(e.Reachable, "files.pythonhosted.org") || e.Mapped["pypi.test"] != "127.0.0.1" ||
		strings.Join(e.Headers["api.example.com"], ",") != "Authorization,X-Team" || e.Error != "" || !slices.Contains(r.Rootfs.Modules, "pip") {
		t.Errorf("doctor --json egress = %+v, ok %v, modules %v; want what is reachable, mapped, the header names, and pip in the rootfs", e, r.OK, r.Rootfs.Modules)
	}
	out.Reset()
	doctorCmd(t.Context(), nil, &out, &errOut)
	text := out.String()
	for _, want := range []string{"network\n  reachable: pypi.org, files.pythonhosted.org, api.example.com, pypi.test:8443",
		"mapped:    pypi.test → 127.0.0.1", "headers:   api.example.com gets Authorization, X-Team",
		"sandboxes: reach these through a relay on their own 127.0.0.1:3128", "verdict: OK"} {
		if !strings.Contains(text, want) {
			t.Errorf("doctor printed:\n%s\nwant %q in it", text, want)
		}
	}
	if strings.Contains(text+out.String(), "hidden") {
		t.Errorf("doctor shows a secret's value:\n%s", text)
	}

	t.Setenv("MCP_EXEC_RUNTIME", "process")
	t.Setenv("MCP_EXEC_PROCESS_NAMESPACES", "false")
	out.Reset()
	if code := doctorCmd(t.Context(), nil, &out, &errOut); code != 1 ||
		!strings.Contains(out.String(), "verdict: NOT OK — the server would refuse to start: the sandbox cannot start: MCP_EXEC_EGRESS_ALLOW is set, but the process runtime without namespaces") {
		t.Errorf("doctor with the process runtime without namespaces: status %d\n%s", code, out.String())
	}
}

// The allowlist puts pip in the rootfs built here, and leaves an
// operator's rootfs or image as its maker made it (the start-up proof
// imports what the options name: pip there would refuse a rootfs without).
func TestEgressPipInRootfs(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want bool
	}{
		{map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org"}, true},
		{map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org", "MCP_EXEC_PACKAGES": "numpy"}, true},
		{map[string]string{}, false},
		{map[string]string{"MCP_EXEC_EGRESS_ALLOW": "pypi.org", "MCP_EXEC_ROOTFS": t.TempDir()}, false},
	} {
		cfg, err := loadEnv(tc.env, true)
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Contains(cfg.rootfsOptions().Packages, "pip"); got != tc.want {
			t.Errorf("%v: pip in the rootfs's packages = %v, want %v", tc.env, got, tc.want)
		}
	}
}
