package edge

import (
	"errors"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"

	"github.com/tallyhq/tally/internal/limiter"
)

// MaxIdentityLen bounds an identity header's value.
const MaxIdentityLen = 4096

var (
	errIdentityTooLong  = errors.New("identity header too long")
	errIdentityRepeated = errors.New("the identity header appears more than once")
)

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
//
// The header's value is normalised first, so that one credential is one
// identity however it is spelled: surrounding whitespace is dropped, and
// for Authorization and Proxy-Authorization the scheme is compared without
// case ("bearer x" is "Bearer x") and the whitespace after it is one space.
// A request that sends the header twice is refused (which one the
// upstream believes is the upstream's choice). A header named in the
// request's Connection header is hop-by-hop: the proxy removes it before
// the upstream, which never sees it, so it is treated as absent here too
// (the request is keyed by its address).
func (id Identifier) Identity(r *http.Request) (string, error) {
	if id.Header != "" && !hopByHop(r.Header, id.Header) {
		vs := r.Header.Values(id.Header)
		if len(vs) > 1 {
			return "", errIdentityRepeated
		}
		if len(vs) == 1 {
			if len(vs[0]) > MaxIdentityLen {
				return "", errIdentityTooLong
			}
			if h := limiter.HeaderIdentity(id.Header, vs[0]); h != "" {
				return h, nil
			}
		}
	}
	return id.Address(r), nil
}

// hopByHop reports whether the Connection header names header: the proxy
// removes such headers before the upstream (RFC 9110, section 7.6.1).
func hopByHop(h http.Header, header string) bool {
	for _, v := range h.Values("Connection") {
		for _, tok := range strings.Split(v, ",") {
			if strings.EqualFold(textproto.TrimString(tok), header) {
				return true
			}
		}
	}
	return false
}

// Address is the request's client address as an identity, grouped by the
// configured prefixes: the same string Identity returns for a request
// without an identity header.
func (id Identifier) Address(r *http.Request) string {
	return limiter.AddressIdentity(limiter.GroupAddress(id.ClientIP(r), id.IPv4Prefix, id.IPv6Prefix))
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
		a, ok := parseHop(strings.TrimSpace(list[i]))
		if !ok {
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

// parseHop reads one X-Forwarded-For entry: an address, or an address
// with a port as some proxies write it (1.2.3.4:80, [2001:db8::1]:443), or
// a bracketed IPv6 address without one.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return a, true
		}
	}
	return netip.Addr{}, false
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
