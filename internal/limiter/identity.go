package limiter

import (
	"fmt"
	"net/netip"
	"strings"
)

// Identities are what a window key's digest is made of, with the policy
// name (KeySpace.Sum). Each source has a namespace of its own, so that no
// source can name another's window (docs/keys.md):
//
//	h:<value>     the identity header's value, normalised; the decision
//	              API's identity field as given
//	ip:<prefix>   the client's address grouped by its prefix
//	d:<counter>   an Envoy rate-limit descriptor
//
// The functions below are the contract's one implementation: the edge
// and the public client package both call them.

// NormaliseCredential is an identity header's value as one identity,
// however the client spelled it: surrounding spaces and tabs dropped; for
// Authorization and Proxy-Authorization (header compared without case) the
// scheme in lower case and one space between every run of words separated
// by spaces or tabs (the scheme is case-insensitive, its separator any
// whitespace).
func NormaliseCredential(header, v string) string {
	v = strings.Trim(v, " \t")
	if !strings.EqualFold(header, "Authorization") && !strings.EqualFold(header, "Proxy-Authorization") {
		return v
	}
	f := strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == '\t' })
	if len(f) == 0 {
		return ""
	}
	f[0] = strings.ToLower(f[0])
	return strings.Join(f, " ")
}

// HeaderIdentity is the identity of a request whose identity header is
// header with value v: "h:" and the normalised value, or "" when nothing
// is left of it (the request is then keyed by its address).
func HeaderIdentity(header, v string) string {
	if v = NormaliseCredential(header, v); v != "" {
		return "h:" + v
	}
	return ""
}

// GroupAddress is a client address masked to its group's prefix: IPv4
// addresses to ipv4Bits, IPv6 addresses to ipv6Bits (an IPv4-mapped IPv6
// address is its IPv4 address). An invalid address is the zero prefix.
func GroupAddress(a netip.Addr, ipv4Bits, ipv6Bits int) netip.Prefix {
	if !a.IsValid() {
		return netip.Prefix{}
	}
	a = a.Unmap()
	bits := ipv4Bits
	if a.Is6() {
		bits = ipv6Bits
	}
	p, _ := a.Prefix(min(bits, a.BitLen()))
	return p
}

// AddressIdentity is the identity of a client address group: "ip:" and the
// prefix in its canonical text form (RFC 5952 for IPv6).
func AddressIdentity(p netip.Prefix) string { return "ip:" + p.String() }

// APIIdentity is the identity of a decision-API check: the identity field
// as given (not normalised), in the namespace of header identities, so that
// a service passing the value an edge reads from the identity header, once
// normalised, counts in the same window.
func APIIdentity(identity string) string { return "h:" + identity }

// DescriptorIdentity is the identity of an Envoy rate-limit descriptor: its
// counter (the domain and each entry's key and value, each preceded by its
// length as a uvarint).
func DescriptorIdentity(counter string) string { return "d:" + counter }

// NamedIdentity is the identity an operator names a client by (the tally
// CLI, an edge's admin API), as the edge would key the client's requests:
//
//	ip:<address or prefix>  an address, grouped as the edge groups it
//	api:<value>             a decision-API check's identity field
//	<value>                 the identity header's value (normalised)
//
// header and the prefix lengths are the edge's (edge.identity).
func NamedIdentity(name, header string, ipv4Bits, ipv6Bits int) (string, error) {
	switch {
	case strings.HasPrefix(name, "ip:"):
		rest := name[3:]
		if p, err := netip.ParsePrefix(rest); err == nil {
			rest = p.Addr().String() // the group the edge keys it in
		}
		a, err := netip.ParseAddr(rest)
		if err != nil {
			return "", fmt.Errorf("identity %q: want ip: and an address or a prefix", name)
		}
		return AddressIdentity(GroupAddress(a, ipv4Bits, ipv6Bits)), nil
	case strings.HasPrefix(name, "api:"):
		if len(name) == 4 {
			return "", fmt.Errorf("identity %q: want api: and the decision API's identity", name)
		}
		return APIIdentity(name[4:]), nil
	}
	if id := HeaderIdentity(header, name); id != "" {
		return id, nil
	}
	return "", fmt.Errorf("identity %q: want the identity header's value, ip:<address> or api:<identity>", name)
}
