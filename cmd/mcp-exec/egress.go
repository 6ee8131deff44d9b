package main

import (
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/inhuman/mcp-exec/egress"
)

// Network by allowlist: its settings, what doctor says of them, and the
// refusal to start while no runtime relays a sandbox's connections to the
// egress proxy. The proxy itself is package egress.

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

// egressUnavailable refuses to start sandboxes with an allowlist set: no
// runtime relays a sandbox's connections to the proxy yet, and a server
// that ignored the setting would run with another network than its
// operator configured. It fails closed until the wiring lands.
func egressUnavailable(cfg config) error {
	if !cfg.Egress.Enabled() {
		return nil
	}
	return fmt.Errorf("MCP_EXEC_EGRESS_ALLOW is set (%s), but network egress is not available in this build yet: "+
		"no runtime relays a sandbox's connections to the egress proxy, and the server will not ignore the allowlist; "+
		"unset MCP_EXEC_EGRESS_ALLOW (and the other MCP_EXEC_EGRESS_* settings) to run sandboxes with no network", egress.FormatRules(cfg.Egress.Allow))
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
	if err := egressUnavailable(cfg); err != nil {
		r.Error = err.Error()
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
	if r.Error != "" {
		fmt.Fprintf(w, "  status:    NOT AVAILABLE in this build yet: the server refuses to start with it (the verdict says why)\n")
	}
}
