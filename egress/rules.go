package egress

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Rule is one element of an allow or a deny list: a host pattern and a
// port.
type Rule struct {
	// Pattern is a lower-case host name ("pypi.org"), every name under a
	// domain ("*.example.com": sub.example.com, a.b.example.com, not
	// example.com itself), any name ("*"), or an IP address.
	Pattern string
	// Port is the one port the rule covers; 0 means ports 443 and 80 in
	// an allow rule, every port in a deny rule.
	Port uint16
}

// defaultPorts are what an allow rule without a port covers: HTTPS and
// HTTP, the two a proxy for pip and web APIs carries.
var defaultPorts = []uint16{443, 80}

func (r Rule) String() string {
	if r.Port == 0 {
		return r.Pattern
	}
	return hostPort(r.Pattern, r.Port)
}

// hostPort writes host:port, bracketing an IPv6 address.
func hostPort(host string, port uint16) string {
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}

// matchesHost says whether the rule's pattern names host, a name or
// address as normalizeHost returns it.
func (r Rule) matchesHost(host string) bool {
	switch {
	case r.Pattern == "*":
		return true
	case strings.HasPrefix(r.Pattern, "*."):
		// A domain's names, never an address that happens to end alike
		// (*.0.0.1 and 10.0.0.1).
		return strings.HasSuffix(host, r.Pattern[1:]) && !isDottedQuad(host) && !strings.Contains(host, ":")
	}
	return r.Pattern == host
}

// allows says whether any rule of an allow list covers host:port.
func allows(rules []Rule, host string, port uint16) bool {
	for _, r := range rules {
		if !r.matchesHost(host) {
			continue
		}
		if r.Port == port || r.Port == 0 && (port == defaultPorts[0] || port == defaultPorts[1]) {
			return true
		}
	}
	return false
}

// denied returns the rule of a deny list that covers host:port, if any.
func denied(rules []Rule, host string, port uint16) (Rule, bool) {
	for _, r := range rules {
		if r.matchesHost(host) && (r.Port == 0 || r.Port == port) {
			return r, true
		}
	}
	return Rule{}, false
}

// ParseRules parses a comma-separated list of rules: host, host:port,
// *.domain, *.domain:port, *, an IPv4 address, [IPv6]:port. Blanks around
// elements are dropped; an error names the element at fault.
func ParseRules(s string) ([]Rule, error) {
	var rules []Rule
	for _, elem := range strings.Split(s, ",") {
		if elem = strings.TrimSpace(elem); elem == "" {
			continue
		}
		r, err := parseRule(elem)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", elem, err)
		}
		rules = append(rules, r)
	}
	return rules, nil
}

// FormatRules writes rules back as ParseRules reads them.
func FormatRules(rules []Rule) string {
	s := make([]string, len(rules))
	for i, r := range rules {
		s[i] = r.String()
	}
	return strings.Join(s, ",")
}

func parseRule(elem string) (Rule, error) {
	host, port, err := splitPort(elem)
	if err != nil {
		return Rule{}, err
	}
	switch {
	case host == "*":
		return Rule{Pattern: "*", Port: port}, nil
	case strings.HasPrefix(host, "*."):
		domain, err := normalizeName(host[2:])
		if err != nil {
			return Rule{}, fmt.Errorf("a wildcard is *. and a domain: %w", err)
		}
		return Rule{Pattern: "*." + domain, Port: port}, nil
	case strings.Contains(host, "*"):
		return Rule{}, errors.New("a wildcard is only allowed as the first label, as in *.example.com")
	}
	h, err := normalizeHost(host)
	if err != nil {
		return Rule{}, err
	}
	return Rule{Pattern: h, Port: port}, nil
}

// splitPort splits an optional :port off an element; an IPv6 address
// with a port is bracketed, one without may be bare.
func splitPort(elem string) (string, uint16, error) {
	if strings.Count(elem, ":") > 1 && !strings.HasPrefix(elem, "[") {
		return elem, 0, nil // a bare IPv6 address
	}
	i := strings.LastIndex(elem, ":")
	if i < 0 || strings.HasSuffix(elem, "]") {
		return elem, 0, nil
	}
	port, err := parsePort(elem[i+1:])
	return elem[:i], port, err
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("the port must be a number from 1 to 65535, got %q", s)
	}
	return uint16(n), nil
}

// normalizeHost returns a host as the proxy compares it: a lower-case
// name without its trailing dot, or an IP address in its canonical form
// (an IPv4-mapped IPv6 address as IPv4), brackets removed.
func normalizeHost(h string) (string, error) {
	if strings.HasPrefix(h, "[") && strings.HasSuffix(h, "]") {
		h = h[1 : len(h)-1]
		if !strings.Contains(h, ":") {
			return "", errors.New("brackets are for IPv6 addresses")
		}
	}
	if strings.Contains(h, ":") || isDottedQuad(h) {
		a, err := netip.ParseAddr(h)
		if err != nil {
			return "", fmt.Errorf("not a valid IP address: %w", err)
		}
		if a.Zone() != "" {
			return "", errors.New("an IPv6 zone names an interface of the server's host, not a destination")
		}
		return a.Unmap().String(), nil
	}
	return normalizeName(h)
}

// isDottedQuad says whether h is written like an IPv4 address (all
// digits and dots), so that a malformed one is not taken for a name.
func isDottedQuad(h string) bool {
	return h != "" && strings.Trim(h, "0123456789.") == ""
}

// normalizeName checks a DNS name (ASCII: internationalized names in
// their xn-- form) and lower-cases it.
func normalizeName(name string) (string, error) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" {
		return "", errors.New("the host name is empty")
	}
	if len(name) > 253 {
		return "", fmt.Errorf("the host name is %d characters long, more than DNS allows (253)", len(name))
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("%q has an empty label or one longer than 63 characters", name)
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return "", fmt.Errorf("%q holds %q: a host name has letters, digits, - and _ (an internationalized name in its xn-- form)", name, c)
			}
		}
	}
	return name, nil
}
