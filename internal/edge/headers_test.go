package edge

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

// decided is the decision on a request of p's cost in window w at now: what
// the core answers with (used + cost <= limit allows it).
func decided(p limiter.Policy, w limiter.Window, now time.Time) limiter.Decision {
	cost := p.CostOrDefault()
	d := limiter.Decision{Allowed: w.Used+cost <= p.Limit, Resource: p.Name, Limit: p.Limit, Cost: cost, Used: w.Used,
		Window: p.Window, ResetAt: w.ResetAt, Now: now}
	if d.Allowed {
		d.Used += cost
	}
	d.Remaining = max(0, d.Limit-d.Used)
	return d
}

func TestHeaders(t *testing.T) {
	now := time.Unix(1_700_000_000, 250_000_000)
	reset := time.Unix(1_700_001_800, 0)
	p := limiter.Policy{Name: "core", Limit: 5000, Window: time.Hour}
	live := limiter.Window{Live: true, Used: 41, Start: reset.Add(-time.Hour), ResetAt: reset}

	h := http.Header{}
	setHeaders(h, decided(p, live, now))
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
	d := decided(p, full, now)
	require.False(t, d.Allowed)
	setHeaders(h, d)
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
					d := decided(p, w, now)
					require.Equal(t, used+cost <= limit, d.Allowed)
					if d.Allowed {
						continue
					}
					h := http.Header{}
					setHeaders(h, d)
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

// t never exceeds the window: a window that resets at 71 s, opened by an
// edge whose clock runs a second ahead, says 60 at 10.3 s, not 61.
func TestResetInNeverExceedsTheWindow(t *testing.T) {
	now := time.Unix(1_700_000_000, 300_000_000)
	p := limiter.Policy{Name: "core", Limit: 10, Window: time.Minute, Cost: 2}
	d := decided(p, limiter.Window{Live: true, ResetAt: time.Unix(1_700_000_061, 0)}, now)
	require.Equal(t, 60*time.Second, d.ResetIn())
	h := http.Header{}
	setHeaders(h, d)
	require.Equal(t, `"core";r=8;t=60`, h.Get("RateLimit"))
	require.Equal(t, `"core";q=10;w=60`, h.Get("RateLimit-Policy"))
}
