package egress

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/nettest"
)

const testSecret = "Bearer s3cret-0123456789"

// bearerAPI is an HTTPS API that answers 200 only with the secret, and
// records the Authorization and Host headers of each request it got.
type bearerAPI struct {
	mu    sync.Mutex
	auths [][]string
	hosts []string
	calls atomic.Int32
}

func (a *bearerAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.calls.Add(1)
	a.mu.Lock()
	a.auths = append(a.auths, r.Header.Values("Authorization"))
	a.hosts = append(a.hosts, r.Host)
	a.mu.Unlock()
	if r.Header.Get("Authorization") != testSecret {
		http.Error(w, "401: no valid token", http.StatusUnauthorized)
		return
	}
	io.WriteString(w, "hello, authorized "+r.URL.Path)
}

// secretSetup is an HTTPS API on loopback that wants the secret, and a
// proxy configured to add it.
func secretSetup(t *testing.T) (*Proxy, *bearerAPI, *nettest.CA, int) {
	t.Helper()
	ca := nettest.NewCA(t)
	api := &bearerAPI{}
	up := startHTTPS(t, ca, api, "api.test")
	p := newTestProxy(t, Config{Settings: Settings{
		Allow:       rules(t, "api.test:"+port(up)),
		Hosts:       hosts(t, "api.test=127.0.0.1"),
		SecretsFile: secretsFile(t, map[string]map[string]string{"api.test": {"Authorization": testSecret}}),
		CAFile:      ca.File(t),
	}}, nil, nil)
	return p, api, ca, up
}

// The secret is added by the proxy, replacing the code's own header; the
// code trusts only the instance CA's certificate, and sees neither the
// secret nor a key.
func TestSecretInjectedOverTLS(t *testing.T) {
	p, api, ca, up := secretSetup(t)
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(p.CACertPEM()) {
		t.Fatal("CACertPEM holds no certificate")
	}
	client := proxyClient(relayFor(t, p.NewCall("c1")), roots)
	url := "https://api.test:" + port(up) + "/v1/models"

	direct := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool(), ServerName: "api.test"}}}
	if resp, err := direct.Get("https://127.0.0.1:" + port(up) + "/"); err != nil || resp.StatusCode != 401 {
		t.Fatalf("the API without the proxy: %v %v, want 401 (the secret comes from the proxy only)", resp, err)
	}
	api.mu.Lock()
	api.auths, api.hosts = nil, nil
	api.mu.Unlock()
	for i := range 2 { // twice: the second request rides the same tunnel
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer code-chose-this")
		req.Host = "elsewhere.test" // sent as the Host header inside the tunnel
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(body) != "hello, authorized /v1/models" {
			t.Fatalf("request %d: %s %q, want 200", i, resp.Status, body)
		}
		if issuer := resp.TLS.PeerCertificates[0].Issuer.CommonName; !strings.HasPrefix(issuer, "mcp-exec egress CA") {
			t.Errorf("the code was shown a certificate from %q, want the instance CA", issuer)
		}
		var all bytes.Buffer
		resp.Header.Write(&all)
		all.Write(body)
		if strings.Contains(all.String(), "s3cret") {
			t.Errorf("the secret reached the code: %q", all.String())
		}
	}
	api.mu.Lock()
	defer api.mu.Unlock()
	if len(api.auths) != 2 {
		t.Errorf("the API got %d requests through the proxy, want 2", len(api.auths))
	}
	for i, auth := range api.auths {
		if len(auth) != 1 || auth[0] != testSecret {
			t.Errorf("request %d reached the API with Authorization %q, want exactly the secret, replacing the code's", i, auth)
		}
		if api.hosts[i] != "api.test:"+port(up) {
			t.Errorf("request %d reached the API for host %q, want the tunnel's host", i, api.hosts[i])
		}
	}
	for _, pemBytes := range [][]byte{p.CACertPEM(), p.TrustPEM()} {
		if bytes.Contains(pemBytes, []byte("PRIVATE KEY")) || bytes.Contains(pemBytes, []byte("s3cret")) {
			t.Errorf("what the sandbox is given holds a key or the secret:\n%s", pemBytes)
		}
	}
}

// A host with secrets is refused over plain HTTP, saying why.
func TestSecretHostOverPlainHTTPRefused(t *testing.T) {
	p, api, _, up := secretSetup(t)
	resp, err := proxyClient(relayFor(t, p.NewCall("c1")), nil).Get("http://api.test:" + port(up) + "/")
	if err != nil {
		t.Fatal(err)
	}
	if msg := refusedBody(resp); resp.StatusCode != 403 || !strings.Contains(msg, "over https only") || !strings.Contains(msg, "MCP_EXEC_EGRESS_SECRETS_FILE") {
		t.Errorf("http:// to a host with secrets: %s, want 403 saying https only", msg)
	}
	if n := api.calls.Load(); n != 0 {
		t.Errorf("the API got %d requests", n)
	}
}

// The proxy verifies the host's certificate before it answers the
// CONNECT: a host whose certificate no trusted CA signed gets no request,
// and so never the secret.
func TestSecretHostCertificateVerified(t *testing.T) {
	trusted, impostor := nettest.NewCA(t), nettest.NewCA(t)
	api := &bearerAPI{}
	up := startHTTPS(t, impostor, api, "api.test")
	p := newTestProxy(t, Config{Settings: Settings{
		Allow:       rules(t, "api.test:"+port(up)),
		Hosts:       hosts(t, "api.test=127.0.0.1"),
		SecretsFile: secretsFile(t, map[string]map[string]string{"api.test": {"Authorization": testSecret}}),
		CAFile:      trusted.File(t),
	}}, nil, nil)
	relay := relayFor(t, p.NewCall("c1"))
	resp, _ := connectVia(t, relay, "api.test:"+port(up))
	if msg := refusedBody(resp); resp.StatusCode != http.StatusBadGateway || !strings.Contains(msg, "certificate") {
		t.Errorf("CONNECT to a host with an untrusted certificate: %s, want 502 naming the certificate", msg)
	}
	if n := api.calls.Load(); n != 0 {
		t.Errorf("the impostor got %d requests", n)
	}
}

// The instance CA can vouch for the hosts with secrets only: a leaf it
// signed for another name or an address does not verify, so its
// certificate in every sandbox lends no power over other hosts.
func TestCANameConstraints(t *testing.T) {
	a, err := newAuthority([]string{"api.test"}, timeNow)
	if err != nil {
		t.Fatal(err)
	}
	pemBytes, _ := a.certsPEM()
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemBytes)
	is := a.issuers[0]
	if is.cert.PublicKeyAlgorithm != x509.ECDSA || !is.cert.IsCA || !is.cert.MaxPathLenZero {
		t.Errorf("CA: %v, IsCA %v, MaxPathLenZero %v; want ECDSA, a CA, no intermediates", is.cert.PublicKeyAlgorithm, is.cert.IsCA, is.cert.MaxPathLenZero)
	}
	if d := is.cert.NotAfter.Sub(is.cert.NotBefore); d > caValidity+clockSkew {
		t.Errorf("the CA is valid for %v, want at most %v", d, caValidity)
	}
	for _, name := range []string{"api.test", "evil.test", "pypi.org"} {
		leaf, err := is.sign(name, timeNow())
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: roots})
		if ok := err == nil; ok != (name == "api.test") {
			t.Errorf("a leaf for %s verifies: %v (%v); want only api.test", name, ok, err)
		}
	}
}

var timeNow = time.Now
