package edge

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// MaxIdentityLen bounds an identity header's value.
const MaxIdentityLen = 4096

var errIdentityTooLong = errors.New("identity header too long")

// Identifier derives whose window a request counts against.
type Identifier struct {
	// Header, when set and present, is the identity (hashed into the key,
	// never stored). Requests without it are keyed by client IP.
	Header     string
	Trusted    []netip.Prefix
	IPv4Prefix int
	IPv6Prefix int
}

// Identity returns the request's identity string. Header identities and IP
// identities live in separate namespaces ("h:" and "ip:"), so a header
// value can never impersonate an address.
func (id Identifier) Identity(r *http.Request) (string, error) {
	if id.Header != "" {
		if v := r.Header.Get(id.Header); v != "" {
			if len(v) > MaxIdentityLen {
				return "", errIdentityTooLong
			}
			return "h:" + v, nil
		}
	}
	return id.Address(r), nil
}

// Address is the request's client address as an identity, grouped by the
// configured prefixes: the same string Identity returns for a request
// without an identity header.
func (id Identifier) Address(r *http.Request) string {
	return "ip:" + id.group(id.ClientIP(r)).String()
}

// ClientIP is the address of the client: the peer, unless the peer is a
// trusted proxy, in which case X-Forwarded-For is read from the right,
// skipping trusted proxies, and the first untrusted hop is the client.
// Entries left of it were written by the client and are ignored.
func (id Identifier) ClientIP(r *http.Request) netip.Addr {
	peer := parseAddr(r.RemoteAddr)
	if !id.trusted(peer) {
		return peer
	}
	hops := r.Header.Values("X-Forwarded-For")
	var list []string
	for _, h := range hops {
		list = append(list, strings.Split(h, ",")...)
	}
	client := peer
	for i := len(list) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(list[i]))
		if err != nil {
			return client // garbage: the last hop we could believe
		}
		client = a.Unmap()
		if !id.trusted(client) {
			return client
		}
	}
	return client
}

func (id Identifier) trusted(a netip.Addr) bool {
	for _, p := range id.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// group masks an address to its configured prefix, so that a client
// rotating through its IPv6 /64 does not mint fresh windows.
func (id Identifier) group(a netip.Addr) netip.Prefix {
	bits := id.IPv4Prefix
	if a.Is6() {
		bits = id.IPv6Prefix
	}
	if !a.IsValid() {
		return netip.Prefix{}
	}
	p, _ := a.Prefix(min(bits, a.BitLen()))
	return p
}

func parseAddr(hostport string) netip.Addr {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap()
}
