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

// A sliding window's policy: its Window is the sub-window, aligned to the
// clock; its span and linger follow from its slices; it is told as its
// span; its sub-windows are keys of their own under the window key's tag.
// A concurrency limit is two sub-windows of its lease; any finish gives a
// request's units back, where a window gives back a 304's only.
func TestConcurrencyPolicy(t *testing.T) {
	p := limiter.Policy{Name: "c", Algorithm: limiter.Concurrency, Limit: 10, Window: 30 * time.Second, Slices: 2, Align: true}
	require.NoError(t, p.Validate())
	require.Equal(t, time.Minute, p.Span(), "a unit whose finish never comes is held for at most two leases")
	require.Equal(t, 30*time.Second, p.Linger())
	require.True(t, p.Algorithm.Sliding())
	for _, status := range []int{200, 304, 500} {
		require.EqualValues(t, 3, p.Algorithm.GivesBack(status, 3), "status %d", status)
	}
	for _, a := range []limiter.Algorithm{"", limiter.FixedWindow, limiter.SlidingWindow} {
		require.EqualValues(t, 3, a.GivesBack(304, 3))
		require.Zero(t, a.GivesBack(200, 3))
		require.Zero(t, a.GivesBack(500, 3))
	}
	for name, mutate := range map[string]func(p *limiter.Policy){
		"three slices": func(p *limiter.Policy) { p.Slices = 3 },
		"no slices":    func(p *limiter.Policy) { p.Slices = 0 },
		"not aligned":  func(p *limiter.Policy) { p.Align = false },
	} {
		t.Run(name, func(t *testing.T) {
			q := p
			mutate(&q)
			require.ErrorIs(t, q.Validate(), limiter.ErrInvalidPolicy)
		})
	}
}

func TestSlidingPolicy(t *testing.T) {
	p := limiter.Policy{Name: "s", Algorithm: limiter.SlidingWindow, Limit: 10, Window: 6 * time.Second, Slices: 10, Align: true}
	require.NoError(t, p.Validate())
	require.Equal(t, time.Minute, p.Span())
	require.Equal(t, 54*time.Second, p.Linger())
	require.Equal(t, time.Minute, p.LengthAt(time.Now()), "a client is told the span")
	require.Equal(t, "1m0s, sliding in 10 sub-windows of 6s", p.Per())
	at := time.Unix(1_800_000_003, 0)
	require.Equal(t, limiter.Span{Start: time.Unix(1_800_000_000, 0), ResetAt: time.Unix(1_800_000_006, 0)}, p.WindowAt(at))
	require.Zero(t, limiter.Policy{Window: time.Minute}.Linger(), "a fixed window ends at its reset")
	for name, mutate := range map[string]func(p *limiter.Policy){
		"one slice":                func(p *limiter.Policy) { p.Slices = 1 },
		"too many slices":          func(p *limiter.Policy) { p.Slices = limiter.MaxSlices + 1 },
		"not aligned":              func(p *limiter.Policy) { p.Align = false },
		"on the calendar":          func(p *limiter.Policy) { p.Calendar, p.Window = limiter.Day, limiter.Day.Longest() },
		"spanning over a year":     func(p *limiter.Policy) { p.Window = limiter.MaxWindow / 5 },
		"slices of a fixed window": func(p *limiter.Policy) { p.Algorithm = limiter.FixedWindow },
	} {
		t.Run(name, func(t *testing.T) {
			q := p
			mutate(&q)
			require.ErrorIs(t, q.Validate(), limiter.ErrInvalidPolicy)
		})
	}
	ks, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	k := ks.Key("s", "alice")
	require.Equal(t, k.String()+":1800000006", k.SliceKey(time.Unix(1_800_000_006, 0)))
	require.Equal(t, k.SliceKey(time.Unix(1_800_000_006, 0)), k.WindowKey(time.Unix(1_800_000_006, 0), 10))
	require.Equal(t, k.String(), k.WindowKey(time.Unix(1_800_000_006, 0), 0))
	// The spans of three sub-windows of 10 s holding the one that resets
	// at r count the two before it and the two after it, nearest first.
	r := time.Unix(1_800_000_010, 0)
	key := func(d time.Duration) string { return k.SliceKey(r.Add(d)) }
	require.Equal(t, []string{"first", key(-10 * time.Second), key(-20 * time.Second), key(10 * time.Second), key(20 * time.Second)},
		k.SpanKeys([]string{"first"}, r, 10*time.Second, 3))
	require.Empty(t, k.SpanKeys(nil, r, 10*time.Second, 0), "a window has no span")
	// A token bucket's: the period before and after, the record, the
	// periods two and three before.
	require.Equal(t, []string{"first", key(-time.Second), key(time.Second), k.BucketKey(), key(-2 * time.Second), key(-3 * time.Second)},
		k.BucketKeys([]string{"first"}, r))
	require.Equal(t, k.String()+":b", k.BucketKey())
}

// A take's holder is its producer or one of the producer's "<producer>.<n>";
// anything else — another producer's, or one whose name only begins with
// the producer's — is refused before a call is sent.
func TestTakeHolderBelongsToProducer(t *testing.T) {
	ks, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	k := ks.Key("api", "client")
	for holder, ok := range map[string]bool{
		"":           true,
		"edge-a":     true,
		"edge-a.1":   true,
		"edge-a.x.2": true,
		"edge-ab.1":  false,
		"edge-b.1":   false,
		"edge-":      false,
		"edge-a.":    true, // the prefix is all Validate asks of it
	} {
		a := limiter.TakeArgs{Window: time.Minute, Limit: 10, Need: 1, Want: 1, Producer: "edge-a", Holder: holder}
		err := a.Validate(k)
		if ok {
			require.NoError(t, err, "holder %q", holder)
		} else {
			require.ErrorIs(t, err, limiter.ErrInvalidArgument, "holder %q", holder)
		}
	}
}
