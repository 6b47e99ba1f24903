package limiter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

func TestPolicyValidate(t *testing.T) {
	ok := limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	require.NoError(t, ok.Validate())
	require.EqualValues(t, 1, ok.CostOrDefault())
	named := ok
	named.Algorithm = limiter.FixedWindow
	require.NoError(t, named.Validate())
	require.Equal(t, limiter.FixedWindow, ok.Algorithm.OrDefault())
	bad := map[string]func(p *limiter.Policy){
		"empty name":        func(p *limiter.Policy) { p.Name = "" },
		"name with quote":   func(p *limiter.Policy) { p.Name = `a"b` },
		"name with space":   func(p *limiter.Policy) { p.Name = "a b" },
		"zero limit":        func(p *limiter.Policy) { p.Limit = 0 },
		"huge limit":        func(p *limiter.Policy) { p.Limit = limiter.MaxLimit + 1 },
		"short window":      func(p *limiter.Policy) { p.Window = 500 * time.Millisecond },
		"fractional window": func(p *limiter.Policy) { p.Window = 1500 * time.Millisecond },
		"long window":       func(p *limiter.Policy) { p.Window = limiter.MaxWindow + time.Second },
		"cost over limit":   func(p *limiter.Policy) { p.Cost = 101 },
		"negative cost":     func(p *limiter.Policy) { p.Cost = -1 },
		"unknown mode":      func(p *limiter.Policy) { p.Mode = "fast" },
		"unknown algorithm": func(p *limiter.Policy) { p.Algorithm = "sliding_window" },
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			p := ok
			mutate(&p)
			require.ErrorIs(t, p.Validate(), limiter.ErrInvalidPolicy)
		})
	}
}

func FuzzKeys(f *testing.F) {
	ks, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(f, err)
	f.Add("core", "alice")
	f.Add("core", "alice:exp")
	f.Add("", "{x}")
	f.Fuzz(func(t *testing.T, resource, identity string) {
		k := ks.Key(resource, identity)
		s := k.String()
		if len(s) != len("tally:{}")+32 || !strings.HasPrefix(s, "tally:{") || !strings.HasSuffix(s, "}") {
			t.Fatalf("key %q", s)
		}
		back, err := ks.KeyFromDigest(k.Digest().String())
		if err != nil || back != k {
			t.Fatalf("digest round trip: %v", err)
		}
		if _, err := ks.KeyFromDigest(identity); err == nil && len(identity) != 32 {
			t.Fatalf("accepted digest %q", identity)
		}
	})
}

// An operator names a client as the edge keys it: a header value
// normalised, an address grouped by the edge's prefixes, a decision-API
// identity as given.
func TestNamedIdentity(t *testing.T) {
	for name, want := range map[string]string{
		"Bearer  abc":     "h:bearer abc",
		"ip:192.0.2.7":    "ip:192.0.2.0/24",
		"ip:192.0.2.0/24": "ip:192.0.2.0/24",
		"ip:2001:db8::1":  "ip:2001:db8::/64",
		"api:Bearer  abc": "h:Bearer  abc",
		"  plain-token  ": "h:plain-token",
	} {
		got, err := limiter.NamedIdentity(name, "Authorization", 24, 64)
		require.NoError(t, err, name)
		require.Equal(t, want, got, name)
	}
	for _, bad := range []string{"", "   ", "ip:nope", "api:"} {
		_, err := limiter.NamedIdentity(bad, "Authorization", 24, 64)
		require.Error(t, err, "%q", bad)
	}
}
