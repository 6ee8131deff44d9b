package egress

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strings"
)

// Settings are what an operator configures. The zero value is no network
// at all: without Allow there is no proxy.
type Settings struct {
	// Allow lists what a sandbox may reach; Deny what it may not, even
	// when Allow covers it.
	Allow, Deny []Rule
	// Hosts maps names to addresses without DNS, whatever their class.
	Hosts Hosts
	// SecretsFile is a JSON object, host → {header: value}: the proxy
	// adds the headers to every request to that host, over TLS it
	// terminates itself. It must be readable by its owner only.
	SecretsFile string
	// CAFile holds PEM certificates the proxy trusts for upstream TLS
	// besides the system's (a private mirror's CA). They are given to the
	// sandbox too, which verifies the hosts it reaches through opaque
	// TLS itself.
	CAFile string
	// PipIndexURL is the index pip uses (a mirror's .../simple); empty:
	// PyPI, whose pypi.org and files.pythonhosted.org Allow must list.
	PipIndexURL string
}

// Enabled says whether sandboxes get network at all.
func (s Settings) Enabled() bool { return len(s.Allow) > 0 }

// Validate checks the settings together and reads the files they name.
// Its messages name the settings as {Field}.
func (s Settings) Validate() error {
	if !s.Enabled() {
		if len(s.Deny) > 0 || len(s.Hosts) > 0 || s.SecretsFile != "" || s.CAFile != "" || s.PipIndexURL != "" {
			return errors.New("{Deny}, {Hosts}, {SecretsFile}, {CAFile} and {PipIndexURL} shape the network {Allow} opens, and {Allow} is empty (no network): set it, or unset them")
		}
		return nil
	}
	var errs []error
	for _, r := range s.Allow {
		if a, err := netip.ParseAddr(r.Pattern); err == nil {
			if class := addressClass(a); class != "" {
				errs = append(errs, fmt.Errorf("{Allow} lists %s, %s, which the proxy never connects to: map a name to it with {Hosts} and allow the name", r, class))
			}
		}
	}
	for name := range s.Hosts {
		if !allowsAnyPort(s.Allow, name) {
			errs = append(errs, fmt.Errorf("{Hosts} maps %s, which {Allow} does not list: allow it, or drop the mapping", name))
		}
	}
	if s.SecretsFile != "" {
		if secrets, err := LoadSecrets(s.SecretsFile); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, s.checkSecretHosts(secrets)...)
		}
	}
	if s.CAFile != "" {
		if _, _, err := loadCAs(s.CAFile); err != nil {
			errs = append(errs, err)
		}
	}
	if _, err := s.pipIndex(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (s Settings) checkSecretHosts(secrets map[string]http.Header) []error {
	var errs []error
	for host := range secrets {
		if !allowsAnyPort(s.Allow, host) {
			errs = append(errs, fmt.Errorf("{SecretsFile} adds headers for %s, which {Allow} does not list", host))
		}
		if _, ok := denied(s.Deny, host, 443); ok {
			errs = append(errs, fmt.Errorf("{SecretsFile} adds headers for %s, which {Deny} denies", host))
		}
	}
	if u, _ := s.pipIndex(); u != nil && u.Scheme == "http" && secrets[u.Hostname()] != nil {
		errs = append(errs, fmt.Errorf("{PipIndexURL} is plain http to %s, whose headers ({SecretsFile}) the proxy sends only over https", u.Hostname()))
	}
	return errs
}

// allowsAnyPort says whether some allow rule names host, on any port.
func allowsAnyPort(rules []Rule, host string) bool {
	return slices.ContainsFunc(rules, func(r Rule) bool { return r.matchesHost(host) })
}

// pipIndex parses PipIndexURL: an http or https URL whose host and port
// Allow lets through, with no credentials in it (they would be in the
// sandbox's environment: headers in SecretsFile keep them out).
func (s Settings) pipIndex() (*url.URL, error) {
	if s.PipIndexURL == "" {
		return nil, nil
	}
	u, err := url.Parse(s.PipIndexURL)
	switch {
	case err != nil:
		return nil, fmt.Errorf("{PipIndexURL}: %w", err)
	case u.Scheme != "https" && u.Scheme != "http" || u.Host == "":
		return nil, fmt.Errorf("{PipIndexURL} must be an https:// (or http://) URL with a host, got %q", s.PipIndexURL)
	case u.User != nil:
		return nil, errors.New("{PipIndexURL} holds credentials, which would be in every sandbox's environment: put them in {SecretsFile} as an Authorization header for the index's host")
	}
	t, err := parseTarget(u.Host, defaultPort(u.Scheme))
	if err != nil {
		return nil, fmt.Errorf("{PipIndexURL}: %w", err)
	}
	if !allows(s.Allow, t.host, t.port) {
		return nil, fmt.Errorf("{PipIndexURL} is on %s, which {Allow} does not allow: the index's host is never allowed implicitly; list it", t)
	}
	if r, ok := denied(s.Deny, t.host, t.port); ok {
		return nil, fmt.Errorf("{PipIndexURL} is on %s, which {Deny} denies (%s)", t, r)
	}
	return u, nil
}

func defaultPort(scheme string) uint16 {
	if scheme == "https" {
		return 443
	}
	return 80
}

// maxSecretsBytes bounds the secrets file: a few hosts' headers, not a
// file the server should read whole whatever its size.
const maxSecretsBytes = 1 << 20

// LoadSecrets reads a secrets file: a JSON object, host → {header name:
// value}. A file others may read or write is refused: the headers are
// credentials. Errors name hosts and headers, never a value.
func LoadSecrets(path string) (map[string]http.Header, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("{SecretsFile}: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // of the file opened, not of a path swapped since
	if err != nil {
		return nil, fmt.Errorf("{SecretsFile}: %w", err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("{SecretsFile} %s is open to its group or others (mode %04o): it holds credentials; make it 0600 or 0400", path, perm)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxSecretsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("{SecretsFile}: reading %s: %w", path, err)
	}
	if len(data) > maxSecretsBytes {
		return nil, fmt.Errorf("{SecretsFile} %s is larger than %d bytes", path, maxSecretsBytes)
	}
	var raw map[string]map[string]string
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("{SecretsFile} %s is not a JSON object of host → {header: value}: %w", path, err)
	}
	return parseSecrets(raw)
}

func parseSecrets(raw map[string]map[string]string) (map[string]http.Header, error) {
	secrets := make(map[string]http.Header, len(raw))
	for host, headers := range raw {
		h, err := normalizeName(host)
		if err != nil || isDottedQuad(h) {
			return nil, fmt.Errorf("{SecretsFile}: %q is not a host name (one exact name per entry, no wildcard or address)", host)
		}
		if len(headers) == 0 {
			return nil, fmt.Errorf("{SecretsFile}: %s has no headers", h)
		}
		hdr := http.Header{}
		for name, value := range headers {
			if err := checkSecretHeader(name, value); err != nil {
				return nil, fmt.Errorf("{SecretsFile}: %s: header %q: %w", h, name, err)
			}
			hdr.Set(name, value)
		}
		secrets[h] = hdr
	}
	return secrets, nil
}

// framing are the headers that say how a message is delimited or
// routed: an added one would let a secret file desynchronize the stream
// or the proxy, so none may be set.
var framing = []string{"Connection", "Content-Length", "Host", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func checkSecretHeader(name, value string) error {
	if name == "" || strings.IndexFunc(name, func(c rune) bool { return c <= ' ' || c >= 0x7f || strings.ContainsRune("\"(),/:;<=>?@[\\]{}", c) }) >= 0 {
		return errors.New("not a header name")
	}
	if slices.Contains(framing, http.CanonicalHeaderKey(name)) {
		return errors.New("it frames or routes the message, and cannot be added")
	}
	if value == "" || strings.IndexFunc(value, func(c rune) bool { return c < ' ' && c != '\t' || c == 0x7f }) >= 0 {
		return errors.New("the value is empty or holds control characters (a line break would split the request)")
	}
	return nil
}

// maxCABytes bounds the CA file: a few certificates.
const maxCABytes = 4 << 20

// loadCAs reads the certificates of a CA file, and returns them parsed
// and as PEM. Anything but certificates is refused: the file is also
// given to the sandbox, and a private key there would be the code's.
func loadCAs(path string) ([]*x509.Certificate, []byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("{CAFile}: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCABytes+1))
	if err != nil || len(data) > maxCABytes {
		return nil, nil, fmt.Errorf("{CAFile}: reading %s: %v (at most %d bytes)", path, err, maxCABytes)
	}
	var certs []*x509.Certificate
	var out []byte
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, nil, fmt.Errorf("{CAFile} %s holds a %s block: give certificates only (the file goes into every sandbox's CA bundle)", path, b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("{CAFile} %s: certificate %d: %w", path, len(certs)+1, err)
		}
		certs = append(certs, c)
		out = append(out, pem.EncodeToMemory(b)...)
	}
	if len(certs) == 0 {
		return nil, nil, fmt.Errorf("{CAFile} %s holds no PEM certificate", path)
	}
	return certs, out, nil
}
