package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/nettest"
	"github.com/inhuman/mcp-exec/internal/testenv"
)

// The network allowlist through the built binary and a real MCP client,
// on each runtime: the tool's description says what is reachable and how
// to install a package; a call installs two packages from the test's
// index (one a C extension) and imports them, calls an API whose token the
// proxy adds, and is refused a host off the list; the result names each
// destination with its bytes, the text block says so in a line, the audit
// log and the metrics record them; a persistent session keeps what pip
// installed for its next call. Nothing reaches the internet: every host is
// the test's own, on loopback.

// netEnv is a server's network configuration for hosts on loopback, and
// the secret its API wants.
type netEnv struct {
	env       []string
	secret    string
	api, pypi int
	ca        *nettest.CA
}

// newNetEnv starts the hosts; the server reads its files as uid owner.
func newNetEnv(t *testing.T, owner int) netEnv {
	t.Helper()
	b := make([]byte, 16)
	rand.Read(b)
	n := netEnv{secret: "cmd-test-" + hex.EncodeToString(b), ca: nettest.NewCA(t)}
	api := &nettest.BearerAPI{Token: n.secret}
	n.api = nettest.ServeHTTPS(t, n.ca, api, "api.test")
	index := nettest.NewIndex()
	pure, pureName := nettest.PureWheel(t, "mcpx_pure", "1.0", "VALUE = 42\n")
	index.Add("mcpx-pure", pureName, pure)
	ext, extName := nettest.ExtWheel(t, "/usr/bin/python3", "mcpx_ext", "1.0")
	index.Add("mcpx-ext", extName, ext)
	n.pypi = nettest.ServeHTTPS(t, n.ca, index, "pypi.test")
	dir, err := os.MkdirTemp("", "mcp-exec-net-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	secrets, caFile := filepath.Join(dir, "secrets.json"), filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(secrets, fmt.Appendf(nil, `{"api.test": {"Authorization": "Bearer %s"}}`, n.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	os.Chown(secrets, owner, owner)
	if err := os.WriteFile(caFile, n.ca.PEM(), 0o644); err != nil {
		t.Fatal(err)
	}
	n.env = []string{
		fmt.Sprintf("MCP_EXEC_EGRESS_ALLOW=api.test:%d,pypi.test:%d", n.api, n.pypi),
		"MCP_EXEC_EGRESS_HOSTS=api.test=127.0.0.1,pypi.test=127.0.0.1",
		"MCP_EXEC_EGRESS_SECRETS_FILE=" + secrets,
		"MCP_EXEC_EGRESS_CA_FILE=" + caFile,
		fmt.Sprintf("MCP_EXEC_PIP_INDEX_URL=https://pypi.test:%d/simple/", n.pypi),
	}
	return n
}

// netCall is what a model would have the code do: install, import, call
// the API, try a host off the list.
const netCall = `import os, subprocess, sys, urllib.request, urllib.error
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "mcpx-pure", "mcpx-ext"], check=True)
import mcpx_pure, mcpx_ext
print("imported", mcpx_pure.VALUE, mcpx_ext.add(2, 3))
r = urllib.request.urlopen("https://api.test:%d/v1/me", timeout=30)
print("api", r.status, r.read().decode())
try:
    urllib.request.urlopen("https://evil.test/", timeout=30)
except urllib.error.URLError as e:
    print("evil", e.reason)
print("secret in environ:", any(%q in v for v in os.environ.values()))
`

type netOutput struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	Session  string `json:"session"`
	Egress   []struct {
		Host     string `json:"host"`
		Port     int    `json:"port"`
		BytesOut int64  `json:"bytes_out"`
		BytesIn  int64  `json:"bytes_in"`
		Allowed  bool   `json:"allowed"`
		Refused  string `json:"refused"`
	} `json:"egress"`
}

// TestBinaryNetwork: over HTTP, with the container runtimes (fresh and
// forked libcontainer sandboxes, runsc forked and a gVisor sandbox per
// call), the metrics and the audit log too.
func TestBinaryNetwork(t *testing.T) {
	requireSandbox(t)
	n := newNetEnv(t, 0)
	for _, rt := range []struct{ name, runtime, fork string }{{"libcontainer-fork", "libcontainer", "true"},
		{"libcontainer", "libcontainer", "false"}, {"runsc", "runsc", "true"}, {"runsc-fresh", "runsc", "false"}} {
		t.Run(rt.name, func(t *testing.T) {
			if rt.runtime == "runsc" {
				if _, err := os.Stat("/usr/local/bin/runsc"); err != nil {
					testenv.Missing(t, "runsc: %v", err)
				}
			}
			audit := filepath.Join(t.TempDir(), "audit.log")
			p := startServer(t, append([]string{"MCP_EXEC_AUTH_TOKEN=" + testToken, "MCP_EXEC_RUNTIME=" + rt.runtime, "MCP_EXEC_FORK=" + rt.fork,
				"MCP_EXEC_AUDIT_LOG=" + audit}, n.env...), "--transport", "http", "--addr", "127.0.0.1:0")
			base := p.url(t)
			cs := connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: base + "/mcp", HTTPClient: httpClient("Authorization", "Bearer "+testToken, nil)}, nil)
			n.check(t, cs, rt.name == "libcontainer-fork")

			metrics := scrapeText(t, base+"/metrics")
			for _, want := range []string{`mcp_exec_egress_destinations_total{allowed="false"} 1`, `mcp_exec_egress_destinations_total{allowed="true"} 3`} {
				if !strings.Contains(metrics, want) {
					t.Errorf("/metrics lacks %s:\n%s", want, grepLines(metrics, "egress"))
				}
			}
			if strings.Contains(metrics, "evil.test") || strings.Contains(metrics, "pypi.test") {
				t.Errorf("a host is in a metric's label:\n%s", grepLines(metrics, "test"))
			}
			p.stop(t)
			data, _ := os.ReadFile(audit)
			if !strings.Contains(string(data), `"egress":[`) || !strings.Contains(string(data), `"host":"evil.test","port":443`) {
				t.Errorf("the audit log does not record the destinations:\n%s", data)
			}
			if strings.Contains(string(data), n.secret) {
				t.Errorf("the secret is in the audit log")
			}
		})
	}
}

// TestProcessNetwork: the process runtime, over stdio, as root and as
// uid 65532, in namespaces of its own; without them the server refuses
// to start, naming the variable and why.
func TestProcessNetwork(t *testing.T) {
	testenv.Root(t)
	for _, m := range processModes {
		t.Run(m.name, func(t *testing.T) {
			owner := 0
			if !m.root {
				owner = 65532
			}
			n := newNetEnv(t, owner)
			if !m.ns {
				_, _, err := tryProcessServer(t, m, n.env...)
				if err == nil || !strings.Contains(err.Error(), "MCP_EXEC_EGRESS_ALLOW is set, but the process runtime without namespaces of its own cannot give a call the network allowlist") {
					t.Errorf("the process runtime without namespaces started with the allowlist: %v", err)
				}
				return
			}
			s := startProcessServer(t, m, n.env...)
			n.check(t, s.cs, false)
		})
	}
}

// check runs what a model would through cs, and checks what it sees.
func (n netEnv) check(t *testing.T, cs *mcp.ClientSession, show bool) {
	t.Helper()
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 1 {
		t.Fatalf("tools/list: %v %v", tools, err)
	}
	tool := tools.Tools[0]
	for _, want := range []string{fmt.Sprintf("Network: only through the server's HTTP proxy, to api.test:%d, pypi.test:%d", n.api, n.pypi),
		`subprocess.run([sys.executable, "-m", "pip", "install", NAME]`} {
		if !strings.Contains(tool.Description, want) {
			t.Errorf("the tool's description lacks %q:\n%s", want, tool.Description)
		}
	}
	if strings.Contains(tool.Description, "There is no network access") {
		t.Errorf("the tool's description says there is no network:\n%s", tool.Description)
	}
	if a := tool.Annotations; a == nil || a.OpenWorldHint == nil || !*a.OpenWorldHint {
		t.Errorf("openWorldHint = %v, want true with the allowlist on", a)
	}

	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{
		"code": fmt.Sprintf(netCall, n.api, n.secret), "timeout_s": 120}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %v", res, err)
	}
	var out netOutput
	remarshal(t, res.StructuredContent, &out)
	for _, want := range []string{"imported 42 5\n", "api 200 authorized /v1/me\n",
		"evil Tunnel connection failed: 403 Forbidden (mcp-exec egress refused evil.test:443: evil.test:443 is not in MCP_EXEC_EGRESS_ALLOW",
		"secret in environ: False\n"} {
		if !strings.Contains(out.Stdout, want) {
			t.Errorf("the code printed:\n%s\nstderr %s\nwant %q", out.Stdout, out.Stderr, want)
		}
	}
	seen := map[string]bool{}
	for _, d := range out.Egress {
		seen[fmt.Sprintf("%s:%d %v", d.Host, d.Port, d.Allowed)] = true
		if d.Allowed && (d.BytesIn == 0 || d.BytesOut == 0) {
			t.Errorf("egress %+v: want bytes each way", d)
		}
		if !d.Allowed && d.Refused == "" {
			t.Errorf("egress %+v: want why it was refused", d)
		}
	}
	for _, want := range []string{fmt.Sprintf("pypi.test:%d true", n.pypi), fmt.Sprintf("api.test:%d true", n.api), "evil.test:443 false"} {
		if !seen[want] {
			t.Errorf("egress %+v lacks %s", out.Egress, want)
		}
	}
	txt := text(res)
	if !strings.Contains(txt, "network: reached pypi.test:") || !strings.Contains(txt, "refused evil.test:443 (not in MCP_EXEC_EGRESS_ALLOW)") {
		t.Errorf("the text block does not say what the network did:\n%s", txt)
	}
	if raw, _ := json.Marshal(res); strings.Contains(string(raw), n.secret) {
		t.Errorf("the secret is in the result")
	}
	if show {
		b, _ := json.MarshalIndent(out.Egress, "", "  ")
		t.Logf("egress of a call (pip install of two packages, an API call, a refused host):\n%s\ntext: %s", b, strings.SplitN(txt, "\n", 3)[1])
	}

	// A persistent session keeps what pip installed.
	first, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"session": "new",
		"code": "import subprocess, sys\nsubprocess.run([sys.executable, '-m', 'pip', 'install', '-q', 'mcpx-ext'], check=True)", "timeout_s": 120}})
	if err != nil || first.IsError {
		t.Fatalf("exec in a new session: %v %v", first, err)
	}
	var fo netOutput
	remarshal(t, first.StructuredContent, &fo)
	next, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"session": fo.Session,
		"code": "import mcpx_ext\nprint(mcpx_ext.add(40, 2))", "end_session": true}})
	if err != nil || next.IsError {
		t.Fatalf("the session's next call: %v %v", next, err)
	}
	var no netOutput
	remarshal(t, next.StructuredContent, &no)
	if no.Stdout != "42\n" {
		t.Errorf("the session's next call printed %q (stderr %s), want 42: pip's install kept for the session", no.Stdout, no.Stderr)
	}
}

func scrapeText(t *testing.T, url string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if strings.Contains(sc.Text(), sub) {
			out = append(out, sc.Text())
		}
	}
	return strings.Join(out, "\n")
}
