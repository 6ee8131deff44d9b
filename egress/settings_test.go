package egress

import (
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/internal/nettest"
)

func TestParseRules(t *testing.T) {
	for _, tt := range []struct {
		in, want, err string
	}{
		{"pypi.org, files.pythonhosted.org", "pypi.org,files.pythonhosted.org", ""},
		{"PyPI.org.:8443", "pypi.org:8443", ""},
		{"*.example.com,*.example.com:8080,*", "*.example.com,*.example.com:8080,*", ""},
		{"93.184.216.34,[2606:2800::1]:443,2606:2800::2", "93.184.216.34,[2606:2800::1]:443,2606:2800::2", ""},
		{"", "", ""},
		{"pypi.org,*.", "", `"*.": a wildcard is *. and a domain`},
		{"a.*.com", "", `"a.*.com": a wildcard is only allowed as the first label`},
		{"pypi.org:0", "", `"pypi.org:0": the port must be a number from 1 to 65535`},
		{"pypi.org:70000", "", "the port must be"},
		{"bad_ name", "", `"bad_ name"`},
		{"bücher.de", "", "xn-- form"},
		{"1.2.3", "", "not a valid IP address"},
		{"[fe80::1%eth0]:443", "", "zone"},
	} {
		got, err := ParseRules(tt.in)
		if tt.err != "" {
			if err == nil || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("ParseRules(%q): err = %v, want one containing %q", tt.in, err, tt.err)
			}
			continue
		}
		if err != nil || FormatRules(got) != tt.want {
			t.Errorf("ParseRules(%q) = %q, %v; want %q", tt.in, FormatRules(got), err, tt.want)
		}
	}
}

func TestRuleMatching(t *testing.T) {
	allow := []Rule{{"*.svc.test", 0}, {"pypi.org", 0}, {"mirror.test", 8443}, {"*.0.0.1", 0}}
	deny := []Rule{{"bad.svc.test", 0}, {"pypi.org", 80}}
	for _, tt := range []struct {
		host           string
		port           uint16
		allowed, isDen bool
	}{
		{"a.svc.test", 443, true, false}, {"a.b.svc.test", 80, true, false}, {"svc.test", 443, false, false},
		{"xsvc.test", 443, false, false}, {"a.svc.test", 22, false, false},
		{"pypi.org", 443, true, false}, {"pypi.org", 80, true, true}, {"pypi.org", 8080, false, false},
		{"mirror.test", 8443, true, false}, {"mirror.test", 443, false, false},
		{"bad.svc.test", 443, true, true}, {"bad.svc.test", 9999, false, true},
		{"10.0.0.1", 443, false, false}, // a wildcard never covers an address
	} {
		if got := allows(allow, tt.host, tt.port); got != tt.allowed {
			t.Errorf("allows(%s:%d) = %v, want %v", tt.host, tt.port, got, tt.allowed)
		}
		if _, got := denied(deny, tt.host, tt.port); got != tt.isDen {
			t.Errorf("denied(%s:%d) = %v, want %v", tt.host, tt.port, got, tt.isDen)
		}
	}
}

func TestParseHosts(t *testing.T) {
	h, err := ParseHosts("pypi.test=127.0.0.1, Mirror.Corp=[fd00::5],v4mapped.test=::ffff:10.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.String(), "mirror.corp=fd00::5,pypi.test=127.0.0.1,v4mapped.test=10.0.0.1"; got != want {
		t.Errorf("ParseHosts = %s, want %s", got, want)
	}
	for in, want := range map[string]string{
		"pypi.test":                         `"pypi.test": each element is name=ip`,
		"pypi.test=localhost":               `"localhost" is not an IP address`,
		"a.test=1.1.1.1,a.test=2.2.2.2":     "a.test is mapped twice",
		"*.test=1.1.1.1":                    "a host name has letters",
		"1.2.3.4=5.6.7.8":                   "the name is an address",
		"x.test=fe80::1%eth0":               "is not an IP address",
		"ok.test=1.1.1.1,bad name=1.1.1.1 ": `"bad name=1.1.1.1"`,
	} {
		if _, err := ParseHosts(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseHosts(%q): err = %v, want one containing %q", in, err, want)
		}
	}
}

func TestAddressClasses(t *testing.T) {
	for addr, want := range map[string]string{
		"93.184.216.34": "", "2606:2800:220:1::1": "", "8.8.8.8": "", "64:ff9b::808:808": "",
		"127.0.0.1": "loopback", "::1": "loopback", "0.0.0.0": "unspecified", "::": "unspecified",
		"10.1.2.3": "private", "172.31.0.1": "private", "192.168.0.1": "private", "fd12::1": "unique local",
		"169.254.169.254": "metadata", "fd00:ec2::254": "metadata", "fe80::1": "link-local",
		"100.100.100.200": "carrier-grade NAT", "224.0.0.251": "multicast", "ff02::1": "multicast",
		"255.255.255.255": "broadcast", "::ffff:127.0.0.1": "loopback", "64:ff9b::a00:1": "private",
		"2002:7f00:1::": "loopback", "2001:db8::1": "documentation", "2001::1": "Teredo",
		"198.18.0.1": "benchmarking", "240.0.0.1": "reserved",
	} {
		got := addressClass(netip.MustParseAddr(addr))
		if want == "" && got != "" || want != "" && !strings.Contains(got, want) {
			t.Errorf("addressClass(%s) = %q, want %q", addr, got, want)
		}
	}
}

func TestLoadSecrets(t *testing.T) {
	good := secretsFile(t, map[string]map[string]string{"API.test": {"authorization": "Bearer x", "X-Api-Key": "k"}})
	s, err := LoadSecrets(good)
	if err != nil {
		t.Fatal(err)
	}
	if h := s["api.test"]; h.Get("Authorization") != "Bearer x" || h.Get("X-Api-Key") != "k" {
		t.Errorf("LoadSecrets = %v", s)
	}
	body := func(s string) []byte { return []byte(s) }
	for name, tt := range map[string]struct {
		data []byte
		mode os.FileMode
		want string
	}{
		"group-readable": {body(`{"api.test":{"A":"b"}}`), 0o640, "open to its group or others (mode 0640)"},
		"world-readable": {body(`{"api.test":{"A":"b"}}`), 0o644, "mode 0644"},
		"not JSON":       {body(`api.test: x`), 0o600, "not a JSON object of host"},
		"a list":         {body(`[1]`), 0o600, "not a JSON object of host"},
		"wildcard":       {body(`{"*.test":{"A":"b"}}`), 0o600, `"*.test" is not a host name`},
		"no headers":     {body(`{"api.test":{}}`), 0o600, "api.test has no headers"},
		"framing":        {body(`{"api.test":{"Content-Length":"0"}}`), 0o600, `header "Content-Length": it frames or routes`},
		"bad name":       {body(`{"api.test":{"X Y":"b"}}`), 0o600, "not a header name"},
		"line break":     {body(`{"api.test":{"A":"b\r\nHost: evil"}}`), 0o600, "control characters"},
	} {
		_, err := LoadSecrets(writeFile(t, "s.json", tt.data, tt.mode))
		if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "{SecretsFile}") {
			t.Errorf("%s: LoadSecrets: %v, want an error naming {SecretsFile} and %q", name, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "evil") {
			t.Errorf("%s: the error shows a value: %v", name, err)
		}
	}
}

func TestLoadCAs(t *testing.T) {
	ca := nettest.NewCA(t)
	certs, pemBytes, err := loadCAs(ca.File(t))
	if err != nil || len(certs) != 1 || string(pemBytes) != string(ca.PEM()) {
		t.Fatalf("loadCAs: %d certs, %v", len(certs), err)
	}
	withKey := append(slices.Clone(ca.PEM()), "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"...)
	for name, data := range map[string][]byte{"a key": withKey, "nothing": []byte("hello"), "garbage cert": []byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")} {
		if _, _, err := loadCAs(writeFile(t, "ca.PEM()", data, 0o644)); err == nil || !strings.Contains(err.Error(), "{CAFile}") {
			t.Errorf("%s: loadCAs: %v, want an error naming {CAFile}", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	secrets := secretsFile(t, map[string]map[string]string{"api.test": {"Authorization": "Bearer x"}})
	for _, tt := range []struct {
		name string
		s    Settings
		want string
	}{
		{"nothing", Settings{}, ""},
		{"allowed", Settings{Allow: rules(t, "pypi.org,files.pythonhosted.org,api.test"), SecretsFile: secrets, PipIndexURL: "https://pypi.org/simple"}, ""},
		{"deny without allow", Settings{Deny: rules(t, "x.test")}, "{Allow} is empty"},
		{"pip without allow", Settings{PipIndexURL: "https://pypi.org/simple"}, "{Allow} is empty"},
		{"a private address listed", Settings{Allow: rules(t, "10.0.0.5:3128")}, "{Allow} lists 10.0.0.5:3128, a private address"},
		{"metadata listed", Settings{Allow: rules(t, "169.254.169.254")}, "link-local"},
		{"mapping unlisted", Settings{Allow: rules(t, "pypi.org"), Hosts: hosts(t, "pypi.test=127.0.0.1")}, "{Hosts} maps pypi.test, which {Allow} does not list"},
		{"secret unlisted", Settings{Allow: rules(t, "pypi.org"), SecretsFile: secrets}, "{SecretsFile} adds headers for api.test, which {Allow} does not list"},
		{"secret denied", Settings{Allow: rules(t, "*.test"), Deny: rules(t, "api.test"), SecretsFile: secrets}, "which {Deny} denies"},
		{"index unlisted", Settings{Allow: rules(t, "pypi.org"), PipIndexURL: "https://mirror.test/simple"}, "the index's host is never allowed implicitly"},
		{"index port", Settings{Allow: rules(t, "mirror.test"), PipIndexURL: "https://mirror.test:8443/simple"}, "mirror.test:8443, which {Allow} does not allow"},
		{"index credentials", Settings{Allow: rules(t, "mirror.test"), PipIndexURL: "https://u:p@mirror.test/simple"}, "holds credentials"},
		{"index scheme", Settings{Allow: rules(t, "mirror.test"), PipIndexURL: "ftp://mirror.test/simple"}, "must be an https://"},
		{"index of a secret host over http", Settings{Allow: rules(t, "api.test"), SecretsFile: secrets, PipIndexURL: "http://api.test/simple"}, "plain http to api.test"},
	} {
		err := tt.s.Validate()
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: Validate() = %v, want %q", tt.name, err, tt.want)
		}
	}
}

// The environment points every client at the relay, keeps loopback
// direct, names the bundle only when there is something to trust, and
// never holds a secret.
func TestSandboxEnv(t *testing.T) {
	plain := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "pypi.org,files.pythonhosted.org")}}, nil, nil)
	env := plain.SandboxEnv(3128, "/etc/mcp-exec/ca.PEM()")
	for _, want := range []string{"HTTPS_PROXY=http://127.0.0.1:3128", "https_proxy=http://127.0.0.1:3128", "HTTP_PROXY=http://127.0.0.1:3128",
		"NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1"} {
		if !slices.Contains(env, want) {
			t.Errorf("SandboxEnv = %v, want %s in it", env, want)
		}
	}
	if plain.TrustPEM() != nil || slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "SSL_CERT_FILE=") }) {
		t.Errorf("without secrets or a CA file, the sandbox keeps its own bundle: TrustPEM %q, env %v", plain.TrustPEM(), env)
	}

	ca := nettest.NewCA(t)
	secret := secretsFile(t, map[string]map[string]string{"api.test": {"Authorization": "Bearer hidden-value"}})
	full := newTestProxy(t, Config{Settings: Settings{Allow: rules(t, "api.test,mirror.test"), SecretsFile: secret, CAFile: ca.File(t),
		PipIndexURL: "http://mirror.test/simple"}}, nil, nil)
	env = full.SandboxEnv(3128, "/etc/mcp-exec/ca.PEM()")
	for _, want := range []string{"SSL_CERT_FILE=/etc/mcp-exec/ca.PEM()", "REQUESTS_CA_BUNDLE=/etc/mcp-exec/ca.PEM()", "PIP_CERT=/etc/mcp-exec/ca.PEM()",
		"PIP_INDEX_URL=http://mirror.test/simple", "PIP_TRUSTED_HOST=mirror.test"} {
		if !slices.Contains(env, want) {
			t.Errorf("SandboxEnv = %v, want %s in it", env, want)
		}
	}
	trust := string(full.TrustPEM())
	if count([]byte(trust)) != 2 || !strings.Contains(trust, string(ca.PEM())) || strings.Contains(strings.Join(env, " ")+trust, "hidden-value") {
		t.Errorf("TrustPEM holds %d certificates (want the instance CA and the CA file's), env %v", count([]byte(trust)), env)
	}
}

func TestReachable(t *testing.T) {
	s := Settings{Allow: rules(t, "pypi.org,*.example.com:8443"), Deny: rules(t, "bad.example.com")}
	if got, want := s.Reachable(), "pypi.org, *.example.com:8443; except bad.example.com (a host without a port: 443 and 80)"; got != want {
		t.Errorf("Reachable() = %q, want %q", got, want)
	}
	if got := (Settings{}).Reachable(); got != "nothing: no network" {
		t.Errorf("Reachable() with no allowlist = %q", got)
	}
}
