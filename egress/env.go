package egress

import (
	"strconv"
	"strings"
)

// NoProxy is what clients in the sandbox reach directly: its own
// loopback, where the code's own servers listen (and the relay itself).
const NoProxy = "localhost,127.0.0.1,::1"

// CACertPEM returns the instance CA's certificates (PEM), which a sandbox
// must trust to talk to hosts with secrets; nil without secrets. Never
// its key. Ask once per sandbox, as it starts: the CA is replaced every
// week, and a sandbox's bundle stays good for six days.
func (p *Proxy) CACertPEM() []byte {
	if p.ca == nil {
		return nil
	}
	pemBytes, err := p.ca.certsPEM()
	if err != nil {
		p.log.Error("egress: renewing the CA failed; the current one stays in use", "err", err)
	}
	return pemBytes
}

// TrustPEM returns what a sandbox's CA bundle must hold beyond its
// rootfs's system bundle: the instance CA (with secrets) and the CA
// file's certificates (the code verifies opaque tunnels itself, to a
// private mirror too). nil: the sandbox's own bundle is enough, and
// SandboxEnv sets no certificate variables.
func (p *Proxy) TrustPEM() []byte {
	ca := p.CACertPEM()
	if ca == nil && p.extra == nil {
		return nil
	}
	return append(append([]byte(nil), ca...), p.extra...)
}

// SandboxEnv is what the wiring adds to a sandbox's environment: its
// HTTP clients (urllib, requests, pip, curl) send everything but loopback
// to the relay on 127.0.0.1:port; with TrustPEM, they verify TLS against
// bundlePath, which the wiring fills with the rootfs's system bundle and
// TrustPEM; pip uses the configured index. No secret is in it.
func (p *Proxy) SandboxEnv(port int, bundlePath string) []string {
	proxy := "http://127.0.0.1:" + strconv.Itoa(port)
	env := []string{
		"HTTP_PROXY=" + proxy, "HTTPS_PROXY=" + proxy, "http_proxy=" + proxy, "https_proxy=" + proxy,
		"NO_PROXY=" + NoProxy, "no_proxy=" + NoProxy,
		// pip would ask PyPI for its own newer version on every install:
		// a request the allowlist may refuse, and a warning in the output.
		"PIP_DISABLE_PIP_VERSION_CHECK=1",
	}
	if p.TrustPEM() != nil {
		env = append(env, "SSL_CERT_FILE="+bundlePath, "REQUESTS_CA_BUNDLE="+bundlePath, "PIP_CERT="+bundlePath)
	}
	if p.pip != nil {
		env = append(env, "PIP_INDEX_URL="+p.pip.String())
		if p.pip.Scheme == "http" {
			// pip refuses a plain-http index unless told the host is trusted.
			env = append(env, "PIP_TRUSTED_HOST="+p.pip.Hostname())
		}
	}
	return env
}

// Reachable describes what the settings let a sandbox reach, for the
// operator (doctor) and the code (the tool's description).
func (s Settings) Reachable() string {
	if !s.Enabled() {
		return "nothing: no network"
	}
	desc := FormatRules(s.Allow)
	if len(s.Deny) > 0 {
		desc += "; except " + FormatRules(s.Deny)
	}
	desc = strings.ReplaceAll(desc, ",", ", ")
	return desc + " (a host without a port: 443 and 80)"
}
