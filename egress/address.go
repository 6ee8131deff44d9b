package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// refused lists the address ranges the proxy never connects to unless an
// operator's mapping names the address: each leads to the server's own
// host, its networks or its cloud's services rather than to the internet.
// The first match names the class in the refusal.
var refused = []struct {
	prefix netip.Prefix
	class  string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "an unspecified address (\"this host\": Linux connects it to the server's loopback)"},
	{netip.MustParsePrefix("10.0.0.0/8"), "a private address (RFC 1918)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "a carrier-grade NAT address (RFC 6598)"},
	{netip.MustParsePrefix("127.0.0.0/8"), "a loopback address"},
	{netip.MustParsePrefix("169.254.0.0/16"), "a link-local address (the cloud metadata service lives at 169.254.169.254)"},
	{netip.MustParsePrefix("172.16.0.0/12"), "a private address (RFC 1918)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "an IETF protocol address"},
	{netip.MustParsePrefix("192.0.2.0/24"), "a documentation address"},
	{netip.MustParsePrefix("192.88.99.0/24"), "a 6to4 relay address"},
	{netip.MustParsePrefix("192.168.0.0/16"), "a private address (RFC 1918)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "a benchmarking address"},
	{netip.MustParsePrefix("198.51.100.0/24"), "a documentation address"},
	{netip.MustParsePrefix("203.0.113.0/24"), "a documentation address"},
	{netip.MustParsePrefix("224.0.0.0/4"), "a multicast address"},
	{netip.MustParsePrefix("240.0.0.0/4"), "a reserved or broadcast address"},
	{netip.MustParsePrefix("::/96"), "an unspecified, loopback or IPv4-compatible address"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a local NAT64 address"},
	{netip.MustParsePrefix("100::/64"), "a discard address"},
	{netip.MustParsePrefix("2001::/23"), "an IETF protocol address (Teredo and others)"},
	{netip.MustParsePrefix("2001:db8::/32"), "a documentation address"},
	{netip.MustParsePrefix("fc00::/7"), "a unique local address (private; AWS's metadata service lives at fd00:ec2::254)"},
	{netip.MustParsePrefix("fe80::/10"), "a link-local address"},
	{netip.MustParsePrefix("fec0::/10"), "a site-local address"},
	{netip.MustParsePrefix("ff00::/8"), "a multicast address"},
}

// addressClass names why the proxy refuses to connect to a, or is empty
// when a is an ordinary internet address. An IPv6 address that embeds an
// IPv4 one (mapped, NAT64, 6to4) is judged by the IPv4 address it reaches.
func addressClass(a netip.Addr) string {
	a = a.Unmap()
	if v4, ok := embeddedIPv4(a); ok {
		return addressClass(v4)
	}
	for _, r := range refused {
		if r.prefix.Contains(a) {
			return r.class
		}
	}
	if !a.IsGlobalUnicast() {
		return "not a global unicast address"
	}
	return ""
}

var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// embeddedIPv4 returns the IPv4 address a NAT64 (64:ff9b::/96) or 6to4
// (2002::/16) address leads to: the translator connects there.
func embeddedIPv4(a netip.Addr) (netip.Addr, bool) {
	b := a.As16()
	switch {
	case !a.Is6():
		return netip.Addr{}, false
	case nat64.Contains(a):
		return netip.AddrFrom4([4]byte(b[12:16])), true
	case sixTo4.Contains(a):
		return netip.AddrFrom4([4]byte(b[2:6])), true
	}
	return netip.Addr{}, false
}

// Hosts maps host names to addresses, as docker run --add-host does: the
// proxy connects a mapped name to its address without asking DNS, and
// whatever the address's class. It is the only way a listed name reaches
// a loopback or private address.
type Hosts map[string]netip.Addr

// ParseHosts parses name=ip,name=ip; an error names the element at fault.
func ParseHosts(s string) (Hosts, error) {
	h := Hosts{}
	for _, elem := range strings.Split(s, ",") {
		if elem = strings.TrimSpace(elem); elem == "" {
			continue
		}
		name, addr, err := parseMapping(elem)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", elem, err)
		}
		if _, dup := h[name]; dup {
			return nil, fmt.Errorf("%q: %s is mapped twice", elem, name)
		}
		h[name] = addr
	}
	return h, nil
}

func parseMapping(elem string) (string, netip.Addr, error) {
	name, ip, ok := strings.Cut(elem, "=")
	if !ok {
		return "", netip.Addr{}, errors.New("each element is name=ip")
	}
	n, err := normalizeName(strings.TrimSpace(name))
	if err != nil {
		return "", netip.Addr{}, err
	}
	if isDottedQuad(n) {
		return "", netip.Addr{}, errors.New("the name is an address: map a host name")
	}
	a, err := netip.ParseAddr(strings.Trim(strings.TrimSpace(ip), "[]"))
	if err != nil || a.Zone() != "" {
		return "", netip.Addr{}, fmt.Errorf("%q is not an IP address", ip)
	}
	return n, a.Unmap(), nil
}

func (h Hosts) String() string {
	s := make([]string, 0, len(h))
	for name, a := range h {
		s = append(s, name+"="+a.String())
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// lookupTimeout bounds one name's resolution: a DNS server that does not
// answer must not hold a call's connection for the resolver's own
// minutes of retries.
const lookupTimeout = 10 * time.Second

// resolved is what a host name led to: the addresses the proxy may
// connect to, and the first it refused with why.
type resolved struct {
	addrs   []netip.Addr
	refused netip.Addr
	class   string
}

// resolve turns host (a name or an address, normalized) into the
// addresses the proxy may connect to: a mapped name's address as it is,
// else each address DNS or the literal gives that is not of a refused
// class. The proxy resolves every name itself; the sandbox has no DNS.
func (p *Proxy) resolve(ctx context.Context, host string) (resolved, error) {
	if a, ok := p.hosts[host]; ok {
		return resolved{addrs: []netip.Addr{a}}, nil
	}
	var all []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		all = []netip.Addr{a}
	} else {
		ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		defer cancel()
		if all, err = p.lookup(ctx, host); err != nil {
			return resolved{}, fmt.Errorf("resolving %s: %w", host, err)
		}
	}
	var r resolved
	for _, a := range all {
		a = a.Unmap()
		if class := addressClass(a); class != "" {
			if !r.refused.IsValid() {
				r.refused, r.class = a, class
			}
			continue
		}
		r.addrs = append(r.addrs, a)
	}
	return r, nil
}

// lookupDNS is the resolver the proxy uses outside tests: the server's
// own (its /etc/hosts and resolv.conf).
func lookupDNS(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}
