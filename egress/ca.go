package egress

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"slices"
	"sync"
	"time"
)

// The instance's CA lives in memory only, and only as long as it must:
//   - each CA is valid for caValidity; when the newest has less than
//     caRenewBefore left as a sandbox asks for the bundle, a new one is
//     made and the bundle holds both;
//   - a leaf is signed by the oldest CA still valid for a leaf's life, so
//     a sandbox whose bundle is up to caRenewBefore-leafValidity old
//     still trusts what it is shown (sandboxes live a day at most);
//   - name constraints confine every CA to the hosts with secrets: even
//     its certificate, which every sandbox holds, vouches for no other
//     name and no IP address.
const (
	caValidity    = 14 * 24 * time.Hour
	caRenewBefore = 7 * 24 * time.Hour
	leafValidity  = 24 * time.Hour
	// clockSkew backdates certificates for clients whose clock is behind.
	clockSkew = 5 * time.Minute
)

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

type leafCert struct {
	cert *tls.Certificate
	by   *issuer
}

// authority is the instance's CA: the issuers in use, oldest first, and
// the leaves they signed, one per host with secrets.
type authority struct {
	hosts []string
	now   func() time.Time

	mu      sync.Mutex
	issuers []*issuer
	leaves  map[string]leafCert
}

func newAuthority(hosts []string, now func() time.Time) (*authority, error) {
	a := &authority{hosts: slices.Sorted(slices.Values(hosts)), now: now, leaves: map[string]leafCert{}}
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.addIssuer(); err != nil {
		return nil, fmt.Errorf("making the egress CA: %w", err)
	}
	return a, nil
}

// certsPEM returns the certificates a sandbox made now must trust, making
// a new CA when the newest nears its end. A failure to make one keeps
// the current CAs, which stay valid for days.
func (a *authority) certsPEM() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropExpired()
	var err error
	if n := len(a.issuers); n == 0 || a.issuers[n-1].cert.NotAfter.Sub(a.now()) < caRenewBefore {
		_, err = a.addIssuer()
	}
	var out []byte
	for _, is := range a.issuers {
		out = append(out, is.pem...)
	}
	return out, err
}

// leaf returns a certificate for host, signed by the oldest CA that is
// valid for a leaf's whole life (every live sandbox trusts it).
func (a *authority) leaf(host string) (*tls.Certificate, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.dropExpired()
	is, err := a.signer()
	if err != nil {
		return nil, err
	}
	if l, ok := a.leaves[host]; ok && l.by == is && l.cert.Leaf.NotAfter.Sub(a.now()) > time.Hour {
		return l.cert, nil
	}
	cert, err := is.sign(host, a.now())
	if err != nil {
		return nil, fmt.Errorf("signing a certificate for %s: %w", host, err)
	}
	a.leaves[host] = leafCert{cert, is}
	return cert, nil
}

func (a *authority) signer() (*issuer, error) {
	for _, is := range a.issuers {
		if is.cert.NotAfter.Sub(a.now()) >= leafValidity {
			return is, nil
		}
	}
	if n := len(a.issuers); n > 0 {
		return a.issuers[n-1], nil
	}
	// Every CA expired unseen: no live sandbox holds any of them.
	return a.addIssuer()
}

func (a *authority) dropExpired() {
	now := a.now()
	a.issuers = slices.DeleteFunc(a.issuers, func(is *issuer) bool { return !now.Before(is.cert.NotAfter) })
}

// addIssuer makes a CA: ECDSA P-256, valid for caValidity, allowed to
// sign for the hosts with secrets and nothing else, no intermediate.
func (a *authority) addIssuer() (*issuer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := a.now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{Organization: []string{"mcp-exec"}, CommonName: fmt.Sprintf("mcp-exec egress CA %032x", serial)[:27]},
		NotBefore:                   now.Add(-clockSkew),
		NotAfter:                    now.Add(caValidity),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true,
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         a.hosts,
		ExcludedIPRanges:            []*net.IPNet{{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, {IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	is := &issuer{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	a.issuers = append(a.issuers, is)
	return is, nil
}

// sign makes a leaf for host, valid for leafValidity or until the CA
// ends, whichever is first.
func (is *issuer) sign(host string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     earliest(now.Add(leafValidity), is.cert.NotAfter),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, is.cert, &key.PublicKey, is.key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
