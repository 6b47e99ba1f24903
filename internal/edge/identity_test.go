package edge

import (
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestClientIP(t *testing.T) {
	id := Identifier{
		Trusted:    []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.1/32")},
		IPv4Prefix: 32, IPv6Prefix: 64,
	}
	cases := []struct {
		name, remote string
		xff          []string
		want         string
	}{
		{"direct client", "203.0.113.7:5000", nil, "203.0.113.7"},
		{"untrusted peer's XFF is ignored", "203.0.113.7:5000", []string{"1.2.3.4"}, "203.0.113.7"},
		{"trusted proxy", "10.0.0.2:80", []string{"198.51.100.9"}, "198.51.100.9"},
		{"right-most untrusted hop wins", "10.0.0.2:80", []string{"6.6.6.6, 198.51.100.9, 10.0.0.3"}, "198.51.100.9"},
		{"spoofed left entries ignored", "127.0.0.1:80", []string{"1.1.1.1", "198.51.100.9"}, "198.51.100.9"},
		{"all trusted", "10.0.0.2:80", []string{"10.0.0.9"}, "10.0.0.9"},
		{"garbage stops the walk", "10.0.0.2:80", []string{"198.51.100.9, nonsense"}, "10.0.0.2"},
		{"mapped IPv4", "[::ffff:203.0.113.7]:5000", nil, "203.0.113.7"},
		{"an entry with a port", "10.0.0.2:80", []string{"198.51.100.9:4711"}, "198.51.100.9"},
		{"an IPv6 entry with a port", "10.0.0.2:80", []string{"[2001:db8::9]:443"}, "2001:db8::9"},
		{"a bracketed IPv6 entry", "10.0.0.2:80", []string{"[2001:db8::9]"}, "2001:db8::9"},
		{"a trusted hop with a port is skipped", "10.0.0.2:80", []string{"198.51.100.9, 10.0.0.3:80"}, "198.51.100.9"},
		{"a bracketed IPv4 is garbage", "10.0.0.2:80", []string{"[198.51.100.9]"}, "10.0.0.2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = c.remote
			for _, v := range c.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			require.Equal(t, c.want, id.ClientIP(r).String())
		})
	}
}

func TestIdentityGroupsIPv6AndSeparatesNamespaces(t *testing.T) {
	id := Identifier{Header: "Authorization", IPv4Prefix: 32, IPv6Prefix: 64}
	ident := func(remote, auth string) string {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = remote
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		s, err := id.Identity(r)
		require.NoError(t, err)
		return s
	}
	a := ident("[2001:db8:1:2:aaaa::1]:443", "")
	b := ident("[2001:db8:1:2:bbbb::9]:443", "")
	c := ident("[2001:db8:1:3::1]:443", "")
	require.Equal(t, a, b, "one /64, one window")
	require.NotEqual(t, a, c)
	require.Equal(t, "ip:2001:db8:1:2::/64", a)
	require.Equal(t, "h:token", ident("203.0.113.7:1", "token"))
	require.NotEqual(t, ident("203.0.113.7:1", "ip:203.0.113.7/32"), ident("203.0.113.7:1", ""),
		"a header value cannot impersonate an address")

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", strings.Repeat("x", MaxIdentityLen+1))
	_, err := id.Identity(r)
	require.Error(t, err)
}
