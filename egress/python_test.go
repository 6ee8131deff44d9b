package egress

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/nettest"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// python is the host's interpreter, the one the default rootfs is built
// from: these tests run it as a plain host process, as the sandbox's
// code would run, with only the environment the sandbox would get.
const python = "/usr/bin/python3"

// systemBundle is Debian's CA bundle, which the wiring's bundle extends.
const systemBundle = "/etc/ssl/certs/ca-certificates.crt"

func requirePython(t *testing.T) {
	t.Helper()
	testenv.Real(t)
	if _, err := os.Stat(python); err != nil {
		testenv.Missing(t, "%s: %v (Debian's python3)", python, err)
	}
}

// pythonEnv is what a sandbox's code would have: the proxy's variables
// and a bundle made as the wiring makes it, nothing of the test's own
// environment.
func pythonEnv(t *testing.T, p *Proxy, relay string) []string {
	t.Helper()
	system, _ := os.ReadFile(systemBundle)
	bundle := writeFile(t, "bundle.pem", append(system, p.TrustPEM()...), 0o644)
	_, port, _ := strings.Cut(relay, ":")
	var n int
	fmt.Sscan(port, &n)
	return append(p.SandboxEnv(n, bundle), "PATH=/usr/bin:/bin", "HOME="+t.TempDir(), "PYTHONDONTWRITEBYTECODE=1",
		"PIP_CONFIG_FILE=/dev/null", "PIP_NO_INPUT=1", "PYTHONNOUSERSITE=1")
}

func runPython(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := exec.Command(python, args...)
	cmd.Env = env
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("python3 %s: %v\n%s", strings.Join(args[:min(len(args), 3)], " "), err, out)
	}
	return string(out)
}

// Python's urllib, through the proxy as the sandbox's code would use it:
// an opaque tunnel to a host on a private CA (trusted through the
// bundle), the secret added for the host that has one, and refusals the
// code can read.
func TestPythonURLLibThroughProxy(t *testing.T) {
	requirePython(t)
	ca := nettest.NewCA(t)
	api := &bearerAPI{}
	apiPort := startHTTPS(t, ca, api, "api.test")
	webPort := startHTTPS(t, ca, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if to := r.URL.Query().Get("to"); to != "" {
			http.Redirect(w, r, to, http.StatusFound)
			return
		}
		io.WriteString(w, "hello from web.test")
	}), "web.test")
	dns := &testDNS{}
	dns.set("metadata.test", "169.254.169.254")
	p := newTestProxy(t, Config{Settings: Settings{
		Allow:       rules(t, fmt.Sprintf("web.test:%d,api.test:%d,metadata.test", webPort, apiPort)),
		Hosts:       hosts(t, "web.test=127.0.0.1,api.test=127.0.0.1"),
		SecretsFile: secretsFile(t, map[string]map[string]string{"api.test": {"Authorization": testSecret}}),
		CAFile:      ca.File(t),
	}}, dns, nil)
	call := p.NewCall("py")
	env := pythonEnv(t, p, relayFor(t, call))

	out := runPython(t, env, "-c", fmt.Sprintf(`
import os, urllib.request, urllib.error
def get(url, **headers):
    try:
        return urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60).read().decode()
    except urllib.error.HTTPError as e:
        return "HTTPError: %%s" %% e
    except urllib.error.URLError as e:
        return "URLError: %%s" %% e.reason
print("web:", get("https://web.test:%[1]d/"))
print("api:", get("https://api.test:%[2]d/v1", Authorization="Bearer the-code-s-own"))
print("evil:", get("https://evil.test/"))
print("evil-http:", get("http://evil.test/x"))
print("redirect:", get("https://web.test:%[1]d/?to=http://metadata.test/latest/meta-data/"))
print("env-has-secret:", any("s3cret" in v for v in os.environ.values()))
`, webPort, apiPort))
	for _, want := range []string{
		"web: hello from web.test",
		"api: hello, authorized /v1",
		"evil: URLError: Tunnel connection failed: 403 Forbidden (mcp-exec egress refused evil.test:443: evil.test:443 is not in MCP_EXEC_EGRESS_ALLOW",
		"evil-http: HTTPError: HTTP Error 403: Forbidden (mcp-exec egress refused evil.test:80: evil.test:80 is not in MCP_EXEC_EGRESS_ALLOW",
		"redirect: HTTPError: HTTP Error 403: Forbidden (mcp-exec egress refused metadata.test:80: metadata.test resolves to 169.254.169.254, a link-local address",
		"env-has-secret: False",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("python3 printed:\n%s\nwant a line with %q", out, want)
		}
	}
	if strings.Count(out, "s3cret") > 0 {
		t.Errorf("the secret reached the code:\n%s", out)
	}
	call.Close()
	if d, err := destination(call.Destinations(), "api.test", true); err != nil || d.BytesIn == 0 || d.BytesOut == 0 {
		t.Errorf("destinations %+v: want api.test counted both ways", call.Destinations())
	}
}

// pip installs from an index over HTTPS through the proxy: a public-like
// index it reaches through an opaque tunnel, and a private mirror that
// wants a token, which the proxy adds and pip never sees.
func TestPipInstallThroughProxy(t *testing.T) {
	requirePython(t)
	if out, err := exec.Command(python, "-m", "pip", "--version").CombinedOutput(); err != nil {
		testenv.Missing(t, "pip for %s: %v %s (Debian's python3-pip)", python, err, out)
	}
	ca := nettest.NewCA(t)
	wheel, whlName := buildWheel(t, "demo_pkg", "0.1", "VALUE = 42\n")
	index := packageIndex("demo-pkg", whlName, wheel, "")
	pypiPort := startHTTPS(t, ca, index, "pypi.test")
	mirror := packageIndex("demo-pkg", whlName, wheel, testSecret)
	mirrorPort := startHTTPS(t, ca, mirror, "mirror.test")
	p := newTestProxy(t, Config{Settings: Settings{
		Allow:       rules(t, fmt.Sprintf("pypi.test:%d,mirror.test:%d", pypiPort, mirrorPort)),
		Hosts:       hosts(t, "pypi.test=127.0.0.1,mirror.test=127.0.0.1"),
		SecretsFile: secretsFile(t, map[string]map[string]string{"mirror.test": {"Authorization": testSecret}}),
		CAFile:      ca.File(t),
		PipIndexURL: fmt.Sprintf("https://pypi.test:%d/simple/", pypiPort),
	}}, nil, nil)

	for _, tt := range []struct{ name, index string }{
		{"index through a tunnel", ""}, // PIP_INDEX_URL, from SandboxEnv
		{"private mirror with a token", fmt.Sprintf("https://mirror.test:%d/simple/", mirrorPort)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			call := p.NewCall("pip")
			env := pythonEnv(t, p, relayFor(t, call))
			target := t.TempDir()
			args := []string{"-m", "pip", "install", "--no-cache-dir", "--target", target, "demo-pkg"}
			if tt.index != "" {
				args = append(args, "--index-url", tt.index)
			}
			start := time.Now()
			out := runPython(t, env, args...)
			took := time.Since(start)
			if got := runPython(t, append(env, "PYTHONPATH="+target), "-c", "import demo_pkg; print(demo_pkg.VALUE)"); got != "42\n" {
				t.Errorf("import demo_pkg after pip install printed %q\npip said:\n%s", got, out)
			}
			call.Close()
			t.Logf("pip install through the proxy: %v; egress %+v", took, call.Destinations())
		})
	}
	if mirror.unauthorized.Load() != 0 || mirror.served.Load() == 0 {
		t.Errorf("the mirror answered %d requests and refused %d: want all with the token", mirror.served.Load(), mirror.unauthorized.Load())
	}
}

// index is a PEP 503 simple index holding one wheel of one project;
// with a token it answers only requests that carry it.
type index struct {
	project, file string
	wheel         []byte
	token         string
	served        atomic.Int32
	unauthorized  atomic.Int32
}

func packageIndex(project, file string, wheel []byte, token string) *index {
	return &index{project: project, file: file, wheel: wheel, token: token}
}

func (ix *index) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if ix.token != "" && r.Header.Get("Authorization") != ix.token {
		ix.unauthorized.Add(1)
		http.Error(w, "token required", http.StatusUnauthorized)
		return
	}
	ix.served.Add(1)
	sum := sha256.Sum256(ix.wheel)
	switch r.URL.Path {
	case "/simple/" + ix.project + "/":
		w.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/%s#sha256=%s">%s</a></body></html>`, ix.file, hex.EncodeToString(sum[:]), ix.file)
	case "/files/" + ix.file:
		w.Write(ix.wheel)
	default:
		http.NotFound(w, r)
	}
}

// buildWheel makes a pure-Python wheel of one module.
func buildWheel(t *testing.T, name, version, source string) ([]byte, string) {
	t.Helper()
	distInfo := fmt.Sprintf("%s-%s.dist-info", name, version)
	files := []struct{ path, body string }{
		{name + "/__init__.py", source},
		{distInfo + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", strings.ReplaceAll(name, "_", "-"), version)},
		{distInfo + "/WHEEL", "Wheel-Version: 1.0\nGenerator: mcp-exec-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.path)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, f.body)
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.path, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", distInfo)
	w, _ := zw.Create(distInfo + "/RECORD")
	io.WriteString(w, record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), fmt.Sprintf("%s-%s-py3-none-any.whl", name, version)
}
