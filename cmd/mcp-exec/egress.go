package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/egress"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// Network by allowlist: its settings, the proxy the engine makes of them
// and what each sandbox gets of it, each call's record, and what doctor
// and the tool's description say. The proxy itself is package egress; the
// relay in each sandbox, runtime's.

// egressSettings are the variables of the network allowlist, offered by
// every subcommand that makes sandboxes.
func (c *config) egressSettings() []setting {
	return []setting{
		{"MCP_EXEC_EGRESS_ALLOW", "egress-allow", "hosts sandboxes may reach through the server's proxy (comma-separated: name, *.domain, name:port; no port: 443 and 80); empty: no network", rulesValue(&c.Egress.Allow)},
		{"MCP_EXEC_EGRESS_DENY", "egress-deny", "hosts refused even where MCP_EXEC_EGRESS_ALLOW covers them (same form; no port: every port)", rulesValue(&c.Egress.Deny)},
		{"MCP_EXEC_EGRESS_HOSTS", "egress-hosts", "name=ip,... resolved without DNS, as docker --add-host: the only way an allowed name reaches a loopback or private address", &value[egress.Hosts]{p: &c.Egress.Hosts, parse: egress.ParseHosts}},
		{"MCP_EXEC_EGRESS_SECRETS_FILE", "egress-secrets-file", "JSON file (mode 0600), host → {header: value}: headers the proxy adds for those hosts over TLS it terminates, which the code never sees", str(&c.Egress.SecretsFile)},
		{"MCP_EXEC_EGRESS_CA_FILE", "egress-ca-file", "PEM certificates the proxy trusts upstream besides the system's (a private mirror's CA); sandboxes trust them too", str(&c.Egress.CAFile)},
		{"MCP_EXEC_PIP_INDEX_URL", "pip-index-url", "the index pip uses in sandboxes (a mirror's .../simple/), whose host MCP_EXEC_EGRESS_ALLOW must list; default PyPI (allow pypi.org and files.pythonhosted.org)", str(&c.Egress.PipIndexURL)},
	}
}

func rulesValue(p *[]egress.Rule) *value[[]egress.Rule] {
	return &value[[]egress.Rule]{p: p, parse: egress.ParseRules, format: egress.FormatRules}
}

// egressConfig is the proxy's configuration from the server's: the
// settings, the default bounds, and the server's log. The audit and
// metrics hooks are the caller's to set.
func egressConfig(cfg config, log *slog.Logger) egress.Config {
	return egress.Config{Settings: cfg.Egress, Limits: egress.DefaultLimits(), Logger: log}
}

// egressReport is doctor's account of the network sandboxes get.
type egressReport struct {
	Enabled   bool              `json:"enabled"`
	Reachable string            `json:"reachable"`
	Mapped    map[string]string `json:"mapped,omitempty"`
	// Headers names, for each host with secrets, the headers the proxy
	// adds (never their values).
	Headers  map[string][]string `json:"headers,omitempty"`
	CAFile   string              `json:"ca_file,omitempty"`
	PipIndex string              `json:"pip_index,omitempty"`
	Refused  string              `json:"refused,omitempty"`
	// Error says why the server would not start with these settings.
	Error string `json:"error,omitempty"`
}

func egressReportFor(cfg config) *egressReport {
	s := cfg.Egress
	r := &egressReport{Enabled: s.Enabled(), Reachable: s.Reachable(), CAFile: s.CAFile, PipIndex: s.PipIndexURL}
	if !r.Enabled {
		return r
	}
	r.Refused = "loopback, private (RFC 1918, fc00::/7), link-local and metadata (169.254.169.254, fd00:ec2::254), CGNAT, multicast, broadcast and other special addresses, unless MCP_EXEC_EGRESS_HOSTS maps the name"
	for name, addr := range s.Hosts {
		if r.Mapped == nil {
			r.Mapped = map[string]string{}
		}
		r.Mapped[name] = addr.String()
	}
	if s.SecretsFile != "" {
		if secrets, err := egress.LoadSecrets(s.SecretsFile); err == nil {
			r.Headers = map[string][]string{}
			for host, h := range secrets {
				for name := range h {
					r.Headers[host] = append(r.Headers[host], name)
				}
				slices.Sort(r.Headers[host])
			}
		}
	}
	return r
}

func printEgress(w io.Writer, r *egressReport) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "network\n")
	if !r.Enabled {
		fmt.Fprintf(w, "  none: MCP_EXEC_EGRESS_ALLOW is empty, and sandboxes have only their own loopback\n")
		return
	}
	fmt.Fprintf(w, "  reachable: %s\n", r.Reachable)
	for _, name := range slices.Sorted(maps.Keys(r.Mapped)) {
		fmt.Fprintf(w, "  mapped:    %s → %s\n", name, r.Mapped[name])
	}
	for _, host := range slices.Sorted(maps.Keys(r.Headers)) {
		fmt.Fprintf(w, "  headers:   %s gets %s from the proxy (TLS terminated there; the code never sees them)\n", host, strings.Join(r.Headers[host], ", "))
	}
	if r.CAFile != "" {
		fmt.Fprintf(w, "  CA file:   %s\n", r.CAFile)
	}
	if r.PipIndex != "" {
		fmt.Fprintf(w, "  pip index: %s\n", r.PipIndex)
	}
	fmt.Fprintf(w, "  refused:   %s\n", r.Refused)
	fmt.Fprintf(w, "  sandboxes: reach these through a relay on their own 127.0.0.1:%d (HTTP_PROXY, HTTPS_PROXY); pip installs into each sandbox's own site dir\n", policy.RelayPort)
	if r.Error != "" {
		fmt.Fprintf(w, "  status:    NOT AVAILABLE with this runtime here: the server refuses to start with it (the verdict says why)\n")
	}
}

// egressWiring is the engine's side of the network allowlist: the proxy,
// and what each sandbox gets of it.
type egressWiring struct {
	proxy *egress.Proxy
	// system is the server's own CA certificates (those Go verifies
	// upstream TLS with), which the sandbox's bundle extends: the
	// default rootfs holds no /etc of the host, and so no CA bundle.
	system []byte
}

// newEgress makes the proxy of cfg's allowlist, or nil without one.
func newEgress(cfg config, log *slog.Logger) (*egressWiring, error) {
	if !cfg.Egress.Enabled() {
		return nil, nil
	}
	p, err := egress.New(egressConfig(cfg, log))
	if err != nil {
		return nil, err
	}
	w := &egressWiring{proxy: p, system: systemCAs()}
	if len(w.system) == 0 {
		log.Warn("no system CA bundle found: sandboxes trust only MCP_EXEC_EGRESS_CA_FILE's certificates (and the proxy's, with secrets)")
	}
	return w, nil
}

// systemCAFiles are where Go looks for the system's CA bundle on Linux
// (crypto/x509's root_linux.go), SSL_CERT_FILE first.
var systemCAFiles = []string{
	"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem",
	"/etc/pki/tls/cacert.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/cert.pem",
}

func systemCAs() []byte {
	files := systemCAFiles
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		files = append([]string{f}, files...)
	}
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && len(b) > 0 {
			if b[len(b)-1] != '\n' {
				b = append(b, '\n')
			}
			return b
		}
	}
	return nil
}

// network is what every sandbox's bundle gets: the relay, the CA bundle
// (asked for each sandbox: the proxy's CA is renewed while it runs), and
// the proxy's variables, less those the bundle sets itself.
func (w *egressWiring) network(bc *bundle.Config) {
	if w == nil {
		return
	}
	bc.Network = &bundle.Network{RelayPort: policy.RelayPort, Trust: func() []byte {
		return append(append([]byte(nil), w.system...), w.proxy.TrustPEM()...)
	}}
	own := map[string]bool{}
	for _, kv := range bundle.NetworkEnv() {
		k, _, _ := strings.Cut(kv, "=")
		own[k] = true
	}
	for _, kv := range w.proxy.SandboxEnv(policy.RelayPort, bundle.CABundlePath) {
		if k, _, _ := strings.Cut(kv, "="); !own[k] {
			bc.Env = append(bc.Env, kv)
		}
	}
}

// call gives req a call of the proxy, and returns what reads its record
// into the result once the runtime closed it (the call is over).
func (w *egressWiring) call(req *runtime.Request) func(res *runtime.Result) {
	if w == nil {
		return func(*runtime.Result) {}
	}
	c := w.proxy.NewCall(uuid.NewString())
	req.Egress = c
	return func(res *runtime.Result) {
		c.Close() // the runtime did; a call that never reached it is closed here
		for _, d := range c.Destinations() {
			res.Egress = append(res.Egress, runtime.EgressDestination{Host: d.Host, Port: d.Port,
				BytesOut: d.BytesOut, BytesIn: d.BytesIn, Allowed: d.Allowed, Refused: d.Refused})
		}
	}
}

func (w *egressWiring) close() {
	if w != nil {
		w.proxy.Close()
	}
}

// egressNote is the tool description's sentence on the network: what is
// reachable and how, and pip when the sandbox has it.
func egressNote(s egress.Settings, pip bool) string {
	n := "Network: only through the server's HTTP proxy, to " + s.Reachable() + "; HTTP clients that honour HTTPS_PROXY " +
		"(urllib, requests, pip) use it, and a host it refuses answers 403 naming why; there is no DNS and no other route out."
	if pip {
		n += " To install a package, run subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", NAME], check=True), then import it: " +
			"it goes to this sandbox's own site dir (counted against its memory), kept for a persistent session."
	}
	return n
}
