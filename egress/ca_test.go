package egress

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// The CA is replaced before it ends, and a sandbox that got its bundle
// within the last days still trusts every leaf it is shown: a new CA joins
// the bundle a week before the old one ends, and signs only once the old
// one has less than a leaf's life left.
func TestCARotation(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a, err := newAuthority([]string{"api.test"}, clock)
	if err != nil {
		t.Fatal(err)
	}
	bundles := map[string][]byte{}
	at := func(name string, d time.Duration) {
		now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(d)
		b, err := a.certsPEM()
		if err != nil {
			t.Fatal(err)
		}
		bundles[name] = b
	}
	at("day 0", 0)
	at("day 7.5", 7*24*time.Hour+12*time.Hour)
	if n := count(bundles["day 0"]); n != 1 {
		t.Errorf("a fresh authority's bundle has %d CAs, want 1", n)
	}
	if n := count(bundles["day 7.5"]); n != 2 {
		t.Errorf("a week in, the bundle has %d CAs, want 2 (the next one joins)", n)
	}
	// A sandbox lives a day at most: a leaf must verify against the
	// bundle of any sandbox made in the last day.
	for _, tt := range []struct {
		leafAt     time.Duration
		bundleFrom string
	}{
		{7*24*time.Hour + 13*time.Hour, "day 0"},
		{8 * 24 * time.Hour, "day 7.5"},
		{13*24*time.Hour + 12*time.Hour, "day 7.5"},
	} {
		now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).Add(tt.leafAt)
		leaf, err := a.leaf("api.test")
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(bundles[tt.bundleFrom])
		if _, err := leaf.Leaf.Verify(x509.VerifyOptions{DNSName: "api.test", Roots: roots, CurrentTime: now}); err != nil {
			t.Errorf("a leaf made at %v against the bundle of %s: %v", tt.leafAt, tt.bundleFrom, err)
		}
	}
	at("day 15", 15*24*time.Hour)
	if bytes.Contains(bundles["day 15"], bundles["day 0"]) || count(bundles["day 15"]) != 2 {
		t.Errorf("after the first CA ended, the bundle has %d CAs, want 2 without the first (the second, and the third joining it)", count(bundles["day 15"]))
	}
}

func count(pemBytes []byte) int {
	n := 0
	for b, rest := pem.Decode(pemBytes); b != nil; b, rest = pem.Decode(rest) {
		n++
	}
	return n
}
