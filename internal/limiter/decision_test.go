package limiter_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

func TestHeaders(t *testing.T) {
	now := time.Unix(1_700_000_000, 250_000_000)
	reset := time.Unix(1_700_001_800, 0)
	p := limiter.Policy{Name: "core", Limit: 5000, Window: time.Hour}
	live := limiter.Window{Live: true, Used: 41, Start: reset.Add(-time.Hour), ResetAt: reset}

	h := http.Header{}
	limiter.Decide(p, live, now).SetHeaders(h)
	require.Equal(t, http.Header{
		"X-Ratelimit-Limit":     {"5000"},
		"X-Ratelimit-Remaining": {"4958"},
		"X-Ratelimit-Used":      {"42"},
		"X-Ratelimit-Reset":     {"1700001800"},
		"X-Ratelimit-Resource":  {"core"},
		"Ratelimit-Policy":      {`"core";q=5000;w=3600`},
		"Ratelimit":             {`"core";r=4958;t=1800`},
	}, h)

	full := live
	full.Used = 5000
	h = http.Header{}
	d := limiter.Decide(p, full, now)
	require.False(t, d.Allowed)
	d.SetHeaders(h)
	require.Equal(t, "0", h.Get("X-RateLimit-Remaining"))
	require.Equal(t, "5000", h.Get("X-RateLimit-Used"))
	require.Equal(t, "1800", h.Get("Retry-After"))
	require.Equal(t, `"core";r=0;t=1800`, h.Get("RateLimit"))
}

// Invariant 3 over a grid: a denial never reports Remaining equal to the
// limit, and Retry-After is never earlier than RateLimit's t.
func TestDenialsAreConsistent(t *testing.T) {
	now := time.Unix(1_700_000_000, 999_000_000)
	for _, limit := range []int64{1, 2, 3, 10, 100} {
		for cost := int64(1); cost <= limit; cost++ {
			for used := int64(0); used <= limit+2; used++ {
				for _, left := range []time.Duration{0, time.Millisecond, time.Second, 90 * time.Second} {
					p := limiter.Policy{Name: "x", Limit: limit, Window: time.Minute, Cost: cost}
					w := limiter.Window{Live: true, Used: used, ResetAt: now.Add(left)}
					d := limiter.Decide(p, w, now)
					require.Equal(t, used+cost <= limit, d.Allowed)
					if d.Allowed {
						continue
					}
					h := http.Header{}
					d.SetHeaders(h)
					require.NotEqual(t, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"))
					ra, err := strconv.Atoi(h.Get("Retry-After"))
					require.NoError(t, err)
					_, tPart, _ := strings.Cut(h.Get("RateLimit"), ";t=")
					tv, err := strconv.Atoi(tPart)
					require.NoError(t, err)
					require.GreaterOrEqual(t, ra, tv)
					require.GreaterOrEqual(t, ra, 1)
				}
			}
		}
	}
}

func TestDecideWithoutLiveWindow(t *testing.T) {
	now := time.Unix(1_700_000_000, 300_000_000)
	p := limiter.Policy{Name: "core", Limit: 10, Window: time.Minute, Cost: 2}
	d := limiter.Decide(p, limiter.Window{}, now)
	require.True(t, d.Allowed)
	require.EqualValues(t, 2, d.Used)
	require.EqualValues(t, 8, d.Remaining)
	require.Equal(t, time.Unix(1_700_000_061, 0), d.ResetAt, "what opening a window at now stores")
	require.Equal(t, 60*time.Second, d.ResetIn(), "t never exceeds the window")
	h := http.Header{}
	d.SetHeaders(h)
	require.Equal(t, `"core";r=8;t=60`, h.Get("RateLimit"))
	require.Equal(t, `"core";q=10;w=60`, h.Get("RateLimit-Policy"))
}

func TestPolicyValidate(t *testing.T) {
	ok := limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	require.NoError(t, ok.Validate())
	require.EqualValues(t, 1, ok.CostOrDefault())
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
