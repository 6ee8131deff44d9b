package runtime_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/egress"
	"github.com/inhuman/mcp-exec/internal/nettest"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// The network allowlist, in real sandboxes of every runtime: the code's
// connections go through its init's relay to an egress proxy as the
// server makes it (package egress), and reach hosts this test serves on
// the machine's loopback, named as the internet's would be and mapped to
// 127.0.0.1 (MCP_EXEC_EGRESS_HOSTS). The proxy's own checks are tested in
// package egress; here, that the sandbox reaches what it allows and
// nothing else, through the relay only, and holds nothing of the secrets.

// netSecret is the API's token, which the proxy adds and the code must
// never see: made as the test runs, so that the test binary, which is the
// sandbox's init, does not hold it.
var netSecret = func() string {
	b := make([]byte, 16)
	rand.Read(b)
	return "mcp-exec-test-" + hex.EncodeToString(b)
}()

// netHosts is the test's internet: hosts on loopback and the proxy that
// lets sandboxes reach them.
type netHosts struct {
	ca     *nettest.CA
	proxy  *egress.Proxy
	api    *nettest.BearerAPI
	holder *nettest.Holder
	index  *nettest.Index
	// Ports of web.test, plain.test (HTTP), api.test, pypi.test and
	// hold.test.
	web, plain, apiPort, pypi, hold int
	// system is the machine's CA bundle, which the sandbox's extends.
	system []byte
}

var netOnce struct {
	sync.Once
	h   *netHosts
	err error
}

// startNetHosts starts the hosts and the proxy once per test binary: the
// wheels take a compiler's time, and every runtime's sandboxes reach the
// same hosts.
func startNetHosts(t *testing.T) *netHosts {
	t.Helper()
	netOnce.Do(func() {
		h := &netHosts{ca: nettest.NewCA(&onceT{t}), api: &nettest.BearerAPI{Token: netSecret}, index: nettest.NewIndex()}
		tt := &onceT{t}
		h.web = nettest.ServeHTTPS(tt, h.ca, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n, err := strconv.Atoi(r.URL.Query().Get("bytes")); err == nil {
				// n bytes of a pattern the code can check.
				block := bytes.Repeat([]byte("0123456789abcdef"), 4096)
				for ; n > 0; n -= len(block) {
					w.Write(block[:min(n, len(block))])
				}
				return
			}
			if r.Method == http.MethodPost {
				n, _ := io.Copy(io.Discard, r.Body)
				fmt.Fprintf(w, "got %d", n)
				return
			}
			if to := r.URL.Query().Get("to"); to != "" {
				http.Redirect(w, r, to, http.StatusFound)
				return
			}
			io.WriteString(w, "hello from web.test")
		}), "web.test")
		h.plain = nettest.ServeHTTP(tt, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello over http")
		}))
		h.apiPort = nettest.ServeHTTPS(tt, h.ca, h.api, "api.test")
		pure, pureName := nettest.PureWheel(tt, "mcpx_pure", "1.0", "VALUE = 42\n")
		h.index.Add("mcpx-pure", pureName, pure)
		ext, extName := nettest.ExtWheel(tt, "/usr/bin/python3", "mcpx_ext", "1.0")
		h.index.Add("mcpx-ext", extName, ext)
		h.pypi = nettest.ServeHTTPS(tt, h.ca, h.index, "pypi.test")
		h.holder = nettest.ServeHolder(tt)
		h.hold = h.holder.Port()
		secrets := nettest.WriteFile(tt, "secrets.json", fmt.Appendf(nil, `{"api.test": {"Authorization": "Bearer %s"}}`, netSecret), 0o600)
		allow, err := egress.ParseRules(fmt.Sprintf("web.test:%d,plain.test:%d,api.test:%d,pypi.test:%d,hold.test:%d,localhost:%d", h.web, h.plain, h.apiPort, h.pypi, h.hold, h.web))
		if err != nil {
			netOnce.err = err
			return
		}
		hosts, err := egress.ParseHosts("web.test=127.0.0.1,plain.test=127.0.0.1,api.test=127.0.0.1,pypi.test=127.0.0.1,hold.test=127.0.0.1")
		if err != nil {
			netOnce.err = err
			return
		}
		h.proxy, netOnce.err = egress.New(egress.Config{Limits: egress.DefaultLimits(), Settings: egress.Settings{
			Allow: allow, Hosts: hosts, SecretsFile: secrets, CAFile: h.ca.File(tt),
			PipIndexURL: fmt.Sprintf("https://pypi.test:%d/simple/", h.pypi),
		}})
		h.system, _ = os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
		netOnce.h = h
	})
	if netOnce.err != nil {
		t.Fatalf("starting the test's hosts: %v", netOnce.err)
	}
	return netOnce.h
}

// onceT is the first test's T for what outlives it (the hosts live for
// the test binary): its failures still fail, its cleanups never run.
type onceT struct{ *testing.T }

func (o *onceT) Cleanup(func()) {}
func (o *onceT) TempDir() string {
	d, err := os.MkdirTemp("", "mcp-exec-nettest-")
	if err != nil {
		o.Fatal(err)
	}
	return d
}

// network gives h's sandboxes the network of n's proxy, as the server
// wires it: the relay, the CA bundle, the proxy's variables.
func (n *netHosts) network(h *harness) {
	h.cfg.Network = &bundle.Network{RelayPort: policy.RelayPort, Trust: func() []byte {
		return append(append([]byte(nil), n.system...), n.proxy.TrustPEM()...)
	}}
	h.cfg.Env = append(h.cfg.Env, n.proxy.SandboxEnv(policy.RelayPort, bundle.CABundlePath)...)
}

// pipRootfs is the rootfs with pip (Debian's python3-pip), as the server
// builds it with the allowlist set.
var pipRootfs struct {
	sync.Once
	dir string
	err error
}

// withPip makes h's sandboxes run on a rootfs with pip; the process
// runtime runs the host's interpreter, which has it.
func withPip(t *testing.T, h *harness) {
	t.Helper()
	if h.kind == runtime.Process {
		return
	}
	pipRootfs.Do(func() {
		py, err := rootfs.FindPython(context.Background(), "")
		if err != nil {
			pipRootfs.err = err
			return
		}
		pipRootfs.dir, pipRootfs.err = rootfs.Ensure(context.Background(), py, rootfs.Options{Packages: []string{"pip"}}, rootfs.DefaultCacheDir(), nil)
	})
	if pipRootfs.err != nil {
		need(t, "the rootfs with pip could not be built: %v", pipRootfs.err)
	}
	h.cfg.Rootfs = pipRootfs.dir
}

// netCall is a call's Egress as the server makes one: a call of the
// proxy, whose destinations are read back after the runtime closed it.
func (n *netHosts) call() *egress.Call { return n.proxy.NewCall("test") }

// netProbe is what the code sees of the network: each attempt's outcome
// as it would print it.
const netProbe = `import json, os, socket, urllib.request, urllib.error
out = {}
def get(url, **headers):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30)
        return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "HTTPError: %s" % e
    except urllib.error.URLError as e:
        return "URLError: %s" % e.reason
    except OSError as e:
        return "%s: %s" % (type(e).__name__, e)
def raw(host, port, data=None):
    try:
        s = socket.create_connection((host, port), timeout=5)
        if data:
            s.sendall(data)
            return s.recv(200).decode(errors="replace").split("\r\n")[0]
        s.close()
        return "connected"
    except OSError as e:
        return type(e).__name__
out["web"] = get("https://web.test:%(web)d/")
out["plain"] = get("http://plain.test:%(plain)d/")
out["api"] = get("https://api.test:%(api)d/v1/things", Authorization="Bearer the-code-s-own")
out["unlisted"] = get("https://evil.test/")
out["unlisted_port"] = get("https://web.test:1/")
# localhost is in NO_PROXY (the code's own servers): ask the proxy itself.
out["loopback_name"] = raw("127.0.0.1", %(relay)d, b"CONNECT localhost:%(web)d HTTP/1.1\r\nHost: localhost:%(web)d\r\n\r\n")
out["metadata"] = get("http://169.254.169.254/latest/meta-data/")
out["metadata_tunnel"] = get("https://169.254.169.254/")
out["redirect"] = get("https://web.test:%(web)d/?to=https://evil.test/")
out["direct"] = raw("127.0.0.1", %(web)d)
out["relay_raw"] = raw("127.0.0.1", %(relay)d, b"SSH-2.0-OpenSSH\r\n\r\n")
try:
    socket.getaddrinfo("web.test", 443)
    out["dns"] = "resolved"
except OSError as e:
    out["dns"] = type(e).__name__
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for key, to in (("udp", ("8.8.8.8", 53)), ("udp_host", (%(hostip)s, %(udp)d)), ("udp_lo", ("127.0.0.1", %(udp)d))):
    try:
        u.sendto(b"from the sandbox", to)
        out[key] = "sent"
    except OSError as e:
        out[key] = type(e).__name__
print(json.dumps(out))
`

// The sandbox reaches the hosts the allowlist names through the relay,
// with the proxy's credentials for the API, and nothing else: not a host
// off the list, a listed name on loopback, the metadata address, a
// redirect away from the list, another port; no raw TCP around the
// relay, no DNS, no UDP. Each refusal reads as the proxy's 403.
func TestNetworkAllowlist(t *testing.T) {
	testenv.Real(t)
	n := startNetHosts(t)
	// A UDP listener on all the machine's addresses: no datagram of a
	// sandbox may reach it.
	udp, err := net.ListenPacket("udp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	udpPort := udp.LocalAddr().(*net.UDPAddr).Port
	var udpGot atomic.Int32
	go func() {
		buf := make([]byte, 100)
		for {
			if _, _, err := udp.ReadFrom(buf); err != nil {
				return
			}
			udpGot.Add(1)
		}
	}()
	hostIP := hostAddress()
	forEachRuntimeAndProcess(t, modePooled|modeSession|modeOldGVisor, func(t *testing.T, h *harness) {
		n.network(h)
		if h.kind == runtime.Process && runtime.NetworkUsable(h.rt) != nil {
			// Without namespaces of its own: refused, naming why.
			_, err := h.run("print(1)")
			if !errors.Is(err, runtime.ErrUnsupported) || !strings.Contains(err.Error(), "{Allow}") {
				t.Errorf("a process runtime without namespaces ran a call with the network: %v", err)
			}
			return
		}
		call := n.call()
		code := strings.ReplaceAll(pyFormat(netProbe, map[string]int{"web": n.web, "plain": n.plain, "api": n.apiPort, "relay": policy.RelayPort,
			"udp": udpPort}), "%(hostip)s", fmt.Sprintf("%q", hostIP))
		var got map[string]string
		res := h.mustRun(code, withEgress(call))
		if res.ExitCode != 0 {
			t.Fatalf("probe exited %d: %s", res.ExitCode, res.Stderr)
		}
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("probe printed %s (%v); stderr %s", res.Stdout, err, res.Stderr)
		}
		for key, want := range map[string]string{
			"web":             "200 hello from web.test",
			"plain":           "200 hello over http",
			"api":             "200 authorized /v1/things",
			"unlisted":        "URLError: Tunnel connection failed: 403 Forbidden (mcp-exec egress refused evil.test:443: evil.test:443 is not in MCP_EXEC_EGRESS_ALLOW",
			"unlisted_port":   "URLError: Tunnel connection failed: 403 Forbidden (mcp-exec egress refused web.test:1: web.test:1 is not in MCP_EXEC_EGRESS_ALLOW",
			"loopback_name":   "HTTP/1.1 403 Forbidden (mcp-exec egress refused localhost:",
			"metadata":        "HTTPError: HTTP Error 403: Forbidden (mcp-exec egress refused 169.254.169.254:80",
			"metadata_tunnel": "URLError: Tunnel connection failed: 403 Forbidden (mcp-exec egress refused 169.254.169.254:443",
			"redirect":        "URLError: Tunnel connection failed: 403 Forbidden (mcp-exec egress refused evil.test:443",
			"relay_raw":       "HTTP/1.1 400 Bad Request",
			"dns":             "gaierror",
		} {
			if !strings.HasPrefix(got[key], want) {
				t.Errorf("%s: the code saw %q, want %q…", key, got[key], want)
			}
		}
		if !strings.Contains(got["loopback_name"], "loopback") {
			t.Errorf("loopback_name: the code saw %q, want the loopback refusal", got["loopback_name"])
		}
		// Around the relay there is nothing: the sandbox's lo has no
		// host's listener (and the process runtime's Landlock domain
		// may connect to the relay's port only), no route, no DNS.
		if got["direct"] != "ConnectionRefusedError" && !(h.kind == runtime.Process && got["direct"] == "PermissionError") {
			t.Errorf("direct: raw TCP around the relay to the host's port: %q, want refused", got["direct"])
		}
		if got["udp"] != "OSError" || got["udp_host"] != "OSError" {
			t.Errorf("udp: a datagram to 8.8.8.8:53: %q, to the machine's %s: %q; want OSError (no route)", got["udp"], hostIP, got["udp_host"])
		}
		if udpGot.Load() != 0 {
			t.Errorf("the machine's UDP listener got %d datagrams from sandboxes", udpGot.Load())
		}
		ds := destinations(call)
		for _, want := range []runtime.EgressDestination{
			{Host: "web.test", Port: n.web, Allowed: true}, {Host: "api.test", Port: n.apiPort, Allowed: true},
			{Host: "evil.test", Port: 443}, {Host: "169.254.169.254", Port: 80}, {Host: "localhost", Port: n.web},
		} {
			d, ok := findDest(ds, want.Host, want.Port, want.Allowed)
			if !ok {
				t.Errorf("destinations %+v: want %s:%d allowed=%v", ds, want.Host, want.Port, want.Allowed)
			} else if want.Allowed && (d.BytesIn == 0 || d.BytesOut == 0) {
				t.Errorf("destination %+v: want bytes counted both ways", d)
			}
		}
	})
}

// hostAddress is an address of the machine's other than loopback.
func hostAddress() string {
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
				return ipn.IP.String()
			}
		}
	}
	return "192.0.2.1" // TEST-NET-1 when the host has no other address
}

// pyFormat fills %(name)d in a Python source with values.
func pyFormat(src string, values map[string]int) string {
	for k, v := range values {
		src = strings.ReplaceAll(src, "%("+k+")d", fmt.Sprint(v))
	}
	return src
}

// destinations closes call, as the runtime did already, and reads its
// record.
func destinations(call *egress.Call) []runtime.EgressDestination {
	call.Close()
	var out []runtime.EgressDestination
	for _, d := range call.Destinations() {
		out = append(out, runtime.EgressDestination{Host: d.Host, Port: d.Port, BytesOut: d.BytesOut, BytesIn: d.BytesIn, Allowed: d.Allowed, Refused: d.Refused})
	}
	return out
}

func findDest(ds []runtime.EgressDestination, host string, port int, allowed bool) (runtime.EgressDestination, bool) {
	for _, d := range ds {
		if d.Host == host && d.Port == port && d.Allowed == allowed {
			return d, true
		}
	}
	return runtime.EgressDestination{}, false
}

// pipInstall installs both of the index's packages and imports them: the
// pure one, and the C extension, whose module is mapped executable from
// the site dir (the one place a sandbox with the network has that is not
// noexec: /tmp stays noexec, the root read-only).
const pipInstall = `import json, os, subprocess, sys, time
t0 = time.monotonic()
p = subprocess.run([sys.executable, "-m", "pip", "install", "--progress-bar", "off", "mcpx-pure", "mcpx-ext"], capture_output=True, text=True)
took = time.monotonic() - t0
if p.returncode != 0:
    sys.exit("pip failed: " + p.stdout[-2000:] + p.stderr[-2000:])
import mcpx_pure, mcpx_ext
mounts = {l.split()[4]: l.split()[5] for l in open("/proc/self/mountinfo")}
print(json.dumps({"value": mcpx_pure.VALUE, "sum": mcpx_ext.add(2, 3), "ext": mcpx_ext.__file__, "pip_s": took,
    "tmp": mounts.get("/tmp", ""), "root": mounts.get("/", "")}))
`

// pip installs from the index the allowlist names, over TLS the sandbox
// verifies against the CA file's certificate, into the call's own site
// dir, and what it installed imports, C extension included; in a
// session it is there for the next call.
func TestNetworkPipInstall(t *testing.T) {
	testenv.Real(t)
	n := startNetHosts(t)
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		n.network(h)
		if runtime.NetworkUsable(h.rt) != nil {
			return // refused: TestNetworkAllowlist
		}
		withPip(t, h)
		var got struct {
			Value, Sum int
			Ext        string
			PipS       float64 `json:"pip_s"`
			Tmp, Root  string
		}
		res := h.mustRun(pipInstall, withEgress(n.call()), withTimeout(2*time.Minute))
		if res.ExitCode != 0 {
			t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("%v: %s %s", err, res.Stdout, res.Stderr)
		}
		if got.Value != 42 || got.Sum != 5 {
			t.Errorf("after pip install: mcpx_pure.VALUE = %d, mcpx_ext.add(2, 3) = %d; want 42 and 5", got.Value, got.Sum)
		}
		if !strings.Contains(got.Ext, "/site/lib/python3") {
			t.Errorf("the extension was installed at %s, want the call's site dir", got.Ext)
		}
		if h.kind != runtime.Process && (!strings.Contains(got.Tmp, "noexec") || !strings.HasPrefix(got.Root, "ro")) {
			t.Errorf("mount options: /tmp %q (want noexec), / %q (want ro)", got.Tmp, got.Root)
		}
		t.Logf("pip install of two small packages in a call: %.2fs of pip, the call %v, peak memory %d MiB",
			got.PipS, res.Duration.Round(time.Millisecond), res.PeakMemoryBytes>>20)

		// A session keeps what pip installed for its next call.
		sess, end := h.openSession()
		defer end()
		first, err := sess.Run(context.Background(), runtime.Request{Code: []byte(`import subprocess, sys, time
t0 = time.monotonic()
subprocess.run([sys.executable, "-m", "pip", "install", "-q", "mcpx-ext"], check=True)
print(round(time.monotonic() - t0, 2))`), Timeout: 2 * time.Minute, MaxOutputBytes: 1 << 20, Egress: n.call()})
		if err != nil || first.ExitCode != 0 {
			t.Fatalf("a session's pip install: exit %d, %v: %s", first.ExitCode, err, first.Stderr)
		}
		second, err := sess.Run(context.Background(), runtime.Request{Code: []byte("import mcpx_ext\nprint(mcpx_ext.add(40, 2))"),
			Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20, Egress: n.call()})
		if err != nil || strings.TrimSpace(string(second.Stdout)) != "42" {
			t.Errorf("the session's next call: %q, %v, stderr %s; want 42", second.Stdout, err, second.Stderr)
		}
		t.Logf("pip install in a session: %ss of pip, the call %v, peak memory %d MiB", strings.TrimSpace(string(first.Stdout)),
			first.Duration.Round(time.Millisecond), first.PeakMemoryBytes>>20)
	})
}

// secretScan looks for the API's token everywhere the code can read: its
// environment, every file (the /proc files of every process it sees
// included: environ, cmdline, and memory where it may read it), and what
// the API answered it. It prints where it found it, and what it could not
// read of other processes' memory.
const secretScan = `import json, os, urllib.request
needle = bytes.fromhex(%q)
found = []
r = urllib.request.urlopen(urllib.request.Request("https://api.test:%d/v1", headers={"Authorization": "Bearer mine"}), timeout=30)
body = r.read()
if needle in body or any(needle in v.encode() for v in r.headers.values()):
    found.append("the API's answer")
for k, v in os.environ.items():
    if needle in (k + "=" + v).encode():
        found.append("environ " + k)
def scan(path, limit=256 << 20):
    try:
        with open(path, "rb") as f:
            tail, n = b"", 0
            while n < limit:
                chunk = f.read(1 << 20)
                if not chunk:
                    return
                if needle in tail + chunk:
                    found.append(path)
                    return
                tail, n = chunk[-64:], n + len(chunk)
    except OSError:
        pass
if os.getcwd() == "/tmp":
    tops = ["/" + d for d in os.listdir("/") if d not in ("proc", "sys", "dev")]
else:  # the process runtime: the machine's files, of which the call's own dirs and /etc are its to see
    import sys
    tops = [os.getcwd(), os.path.dirname(os.path.abspath(sys.argv[0])), os.environ["PYTHONUSERBASE"],
        os.path.dirname(os.environ["SSL_CERT_FILE"]), "/etc"]
for top in tops:
    for root, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                scan(p)
me, others = os.getpid(), []
for pid in filter(str.isdigit, os.listdir("/proc")):
    for f in ("environ", "cmdline"):
        scan("/proc/%%s/%%s" %% (pid, f))
    if int(pid) == me:
        continue  # this probe holds the needle itself
    try:
        maps = open("/proc/%%s/maps" %% pid).read().splitlines()
        mem = open("/proc/%%s/mem" %% pid, "rb")
    except OSError:
        continue
    others.append(pid)
    for line in maps:
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        try:
            mem.seek(lo)
            if needle in mem.read(hi - lo):
                found.append("memory of " + pid)
        except (OSError, ValueError, OverflowError):
            pass
print(json.dumps({"status": r.status, "found": found, "readable_memory": others}))
`

// The secret the proxy adds for the API never enters the sandbox, while
// the API answers the code as it would its owner; a connection the code
// keeps open ends with its call (in a session, whose code lives on), and
// the code sees it ended at its next call.
func TestNetworkSecretsAndLifetime(t *testing.T) {
	testenv.Real(t)
	n := startNetHosts(t)
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		n.network(h)
		if runtime.NetworkUsable(h.rt) != nil {
			return // refused: TestNetworkAllowlist
		}
		served := n.api.Served.Load()
		var got struct {
			Status   int
			Found    []string
			Readable []string `json:"readable_memory"`
		}
		res := h.mustRun(fmt.Sprintf(secretScan, fmt.Sprintf("%x", netSecret), n.apiPort), withEgress(n.call()), withTimeout(2*time.Minute))
		if res.ExitCode != 0 {
			t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("%v: %s %s", err, res.Stdout, res.Stderr)
		}
		if got.Status != 200 || n.api.Served.Load() == served {
			t.Errorf("the API answered the code %d (served %d before, %d after): want 200 with the secret added",
				got.Status, served, n.api.Served.Load())
		}
		if len(got.Found) > 0 {
			t.Errorf("the secret is in the sandbox: %v", got.Found)
		}
		if len(got.Readable) > 0 {
			t.Errorf("the code reads the memory of processes %v", got.Readable)
		}

		sess, end := h.openSession()
		defer end()
		id := fmt.Sprintf("held-%d", time.Now().UnixNano())
		first, err := sess.Run(context.Background(), runtime.Request{Code: []byte(fmt.Sprintf(`import http.client
c = http.client.HTTPConnection("127.0.0.1", %d, timeout=30)
c.set_tunnel("hold.test", %d)
c.connect()
held = c.sock
held.sendall(b"%s\n")
print(held.recv(5))`, policy.RelayPort, n.hold, id)), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20, Egress: n.call()})
		if err != nil || first.ExitCode != 0 || strings.TrimSpace(string(first.Stdout)) != "b'held\\n'" {
			t.Fatalf("a session's call opening a connection: exit %d, %v: %s %s", first.ExitCode, err, first.Stdout, first.Stderr)
		}
		if !n.holder.Opened(id) {
			t.Fatalf("the held connection %q never reached its host", id)
		}
		testenv.EventuallyWithin(t, 10*time.Second, "the connection the session's code keeps to end with its call", func() bool {
			return n.holder.Closed(id)
		})
		second, err := sess.Run(context.Background(), runtime.Request{Code: []byte(`try:
    held.sendall(b"more")
    print(repr(held.recv(10)))
except OSError as e:
    print(type(e).__name__)`), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20, Egress: n.call()})
		if out := strings.TrimSpace(string(second.Stdout)); err != nil || (out != "b''" && !strings.HasSuffix(out, "Error")) {
			t.Errorf("the session's next call on the connection it kept: %q, %v, %s; want it ended", out, err, second.Stderr)
		}
	})
}

// heldEgress is an Egress that keeps every connection it is handed and
// closes none of them itself, so that what ends them is the runtime's
// doing alone; it counts its Close.
type heldEgress struct {
	mu     sync.Mutex
	conns  []net.Conn
	closes int
	got    chan string // the first line of each connection
}

func (e *heldEgress) Serve(ctx context.Context, conn net.Conn) {
	e.mu.Lock()
	e.conns = append(e.conns, conn)
	e.mu.Unlock()
	buf := make([]byte, 64)
	n, _ := conn.Read(buf)
	e.got <- string(buf[:n])
	conn.Write([]byte("held\n"))
}

func (e *heldEgress) Close() {
	e.mu.Lock()
	e.closes++
	e.mu.Unlock()
}

// ended says whether every connection it was handed is closed on the
// sandbox's side: a read returns at once with EOF or an error.
func (e *heldEgress) ended() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.conns {
		c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return false
		}
	}
	return len(e.conns) > 0
}

// The runtime ends every connection of a call with the call, whatever its
// Egress does, and closes the Egress: in a session, whose code lives on
// with the connection it opened, the connection is closed as the call
// ends, and the code sees it closed at its next call.
func TestRelayEndsWithTheCall(t *testing.T) {
	testenv.Real(t)
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		h.cfg.Network = &bundle.Network{RelayPort: policy.RelayPort, Trust: func() []byte { return nil }}
		if runtime.NetworkUsable(h.rt) != nil {
			return // refused: TestNetworkAllowlist
		}
		sess, end := h.openSession()
		defer end()
		eg := &heldEgress{got: make(chan string, 4)}
		first, err := sess.Run(context.Background(), runtime.Request{Code: []byte(fmt.Sprintf(`import socket
held = socket.create_connection(("127.0.0.1", %d), timeout=30)
held.sendall(b"hello relay")
print(held.recv(5))`, policy.RelayPort)), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20, Egress: eg})
		if err != nil || strings.TrimSpace(string(first.Stdout)) != "b'held\\n'" {
			t.Fatalf("a call through the relay: %q, %v, %s", first.Stdout, err, first.Stderr)
		}
		if got := <-eg.got; got != "hello relay" {
			t.Errorf("the Egress got %q, want what the code sent", got)
		}
		testenv.EventuallyWithin(t, 10*time.Second, "the call's connection to end with the call", eg.ended)
		eg.mu.Lock()
		closes := eg.closes
		eg.mu.Unlock()
		if closes != 1 {
			t.Errorf("the call's Egress was closed %d times, want once, as the call ended", closes)
		}
		second, err := sess.Run(context.Background(), runtime.Request{Code: []byte(`try:
    held.sendall(b"more")
    print(repr(held.recv(10)))
except OSError as e:
    print(type(e).__name__)`), Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
		if out := strings.TrimSpace(string(second.Stdout)); err != nil || (out != "b''" && !strings.HasSuffix(out, "Error")) {
			t.Errorf("the next call on the connection the code kept: %q, %v, %s; want it closed", out, err, second.Stderr)
		}
	})
}

// bulkProbe moves megabytes each way through the relay, while a
// connection that reads nothing holds a download open, and then opens
// more connections at once than the relay and the proxy take: the
// windows keep each connection to itself, and past the bounds a
// connection is refused or closed, never hung, and the relay serves on.
const bulkProbe = `import hashlib, json, socket, ssl, time, urllib.request
out = {}
def get(url, data=None):
    return urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60).read()
# A download nobody reads: its window fills, and it must stall alone.
stalled = urllib.request.urlopen("https://web.test:%(web)d/?bytes=%(big)d", timeout=60)
t0 = time.monotonic()
body = get("https://web.test:%(web)d/?bytes=%(big)d")
out["down"] = [len(body), hashlib.sha256(body).hexdigest(), round(time.monotonic() - t0, 2)]
t0 = time.monotonic()
out["up"] = [get("https://web.test:%(web)d/", data=b"x" * %(big)d).decode(), round(time.monotonic() - t0, 2)]
out["stalled_read"] = len(stalled.read())
# More connections at once than the relay (64) and the proxy (32) hold.
socks, answers = [], {}
for i in range(100):
    s = socket.create_connection(("127.0.0.1", %(relay)d), timeout=30)
    s.sendall(b"CONNECT web.test:%(web)d HTTP/1.1\r\nHost: web.test\r\n\r\n")
    socks.append(s)
for s in socks:
    try:
        line = s.recv(100).split(b"\r\n")[0].decode() or "closed"
    except OSError as e:
        line = type(e).__name__
    answers[line] = answers.get(line, 0) + 1
for s in socks:
    s.close()
out["many"] = answers
# The proxy counts a connection closed once the relay has carried its
# close: a new one may be refused (429) until then, never for long.
import time
for attempt in range(300):
    try:
        out["after"] = get("https://web.test:%(web)d/").decode()
        break
    except OSError as e:
        if "429" not in str(e) or attempt == 299:
            raise
        time.sleep(0.1)
print(json.dumps(out))
`

func TestNetworkBulkAndManyConnections(t *testing.T) {
	testenv.Real(t)
	n := startNetHosts(t)
	const big = 24 << 20
	block := bytes.Repeat([]byte("0123456789abcdef"), 4096)
	sum := sha256.New()
	for left := big; left > 0; left -= len(block) {
		sum.Write(block[:min(left, len(block))])
	}
	want := hex.EncodeToString(sum.Sum(nil))
	forEachRuntimeAndProcess(t, modeNone, func(t *testing.T, h *harness) {
		n.network(h)
		if runtime.NetworkUsable(h.rt) != nil {
			return // refused: TestNetworkAllowlist
		}
		var got struct {
			Down        []any
			Up          []any
			StalledRead int `json:"stalled_read"`
			Many        map[string]int
			After       string
		}
		call := n.call()
		res := h.mustRun(pyFormat(bulkProbe, map[string]int{"web": n.web, "relay": policy.RelayPort, "big": big}), withEgress(call), withTimeout(2*time.Minute))
		if res.ExitCode != 0 {
			t.Fatalf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		if err := json.Unmarshal(res.Stdout, &got); err != nil {
			t.Fatalf("%v: %s %s", err, res.Stdout, res.Stderr)
		}
		if len(got.Down) != 3 || got.Down[0] != float64(big) || got.Down[1] != want {
			t.Errorf("the download through the relay: %v, want %d bytes of sha256 %s", got.Down, big, want)
		}
		if len(got.Up) != 2 || got.Up[0] != fmt.Sprintf("got %d", big) {
			t.Errorf("the upload through the relay: %v, want the host to get %d bytes", got.Up, big)
		}
		if got.StalledRead != big {
			t.Errorf("the stalled download read %d bytes once read, want %d", got.StalledRead, big)
		}
		if got.Many["HTTP/1.1 200 Connection established"] == 0 || got.After != "hello from web.test" {
			t.Errorf("100 connections at once: %v; then %q; want some through, the rest refused or closed, and the relay serving on", got.Many, got.After)
		}
		t.Logf("%d MiB down in %vs, up in %vs; 100 connections at once: %v; the call's peak memory %d MiB",
			big>>20, got.Down[2], got.Up[1], got.Many, res.PeakMemoryBytes>>20)
	})
}
