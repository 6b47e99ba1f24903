package edge_test

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// span reads the fullest span of k's sliding window under p that holds the
// sub-window of at, on the primary.
func (pl *pipeline) span(p limiter.Policy, k limiter.Key, at time.Time) int64 {
	pl.t.Helper()
	g, err := pl.store.Take(context.Background(), k, at, limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Producer: "reader",
		Align: true, Opens: p.WindowAt(at), Slices: p.Slices})
	require.NoError(pl.t, err)
	return g.Used
}

// Four edges race on a hot key under a sliding window of six sub-windows:
// the span never holds more than the limit, so a sub-window inside the span
// of a full one admits nothing, and the limit comes back whole once the
// full sub-window has left the span. The edges share one clock, moved by
// the test.
func TestSlidingWindowFourEdgesNeverOver(t *testing.T) {
	pl := newPipeline(t)
	p := limiter.Policy{Name: "core", Algorithm: limiter.SlidingWindow, Limit: 200, Window: 10 * time.Second, Slices: 6, Align: true}
	pl.policies["core"] = p
	start := p.WindowAt(time.Now()).ResetAt.Add(time.Second)
	sub := func(i int) time.Time { return start.Add(time.Duration(i) * p.Window) }
	clock := limiter.NewManualClock(start)
	var edges []*edgeUnderTest
	for range 4 {
		edges = append(edges, pl.edge(func(o *edge.Options) { patient(o); o.Clock = clock }))
	}
	k := pl.keys.Key("core", "h:slide")
	span := func(at time.Time) int64 { return pl.span(p, k, at) }

	require.EqualValues(t, 200, hammer(t, edges, "slide", 8, 12), "sub-window 0: exactly the limit")
	require.EqualValues(t, 200, span(sub(0)))

	clock.Set(sub(3))
	require.Zero(t, hammer(t, edges, "slide", 4, 4), "sub-window 3 is in the span of 0")

	clock.Set(sub(6))
	require.EqualValues(t, 200, hammer(t, edges, "slide", 8, 12), "sub-window 0 left the span")
	require.EqualValues(t, 200, span(sub(6)), "the fullest span holding sub-window 6")
}

// Envoy's rate-limit service with a rule in Tally's extension
// rate_limit.sliding: two edges hold a client to its requests_per_unit in
// any six consecutive sub-windows of ten seconds; the status says the
// reference's unit, and the time to the end of the sub-window as the reset.
func TestRLSSlidingAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	const file = `
domain: api
descriptors:
  - key: api_key
    rate_limit:
      unit: minute
      requests_per_unit: 5
      sliding: {slices: 6}
`
	sub := 10 * time.Second
	start := time.Now().Truncate(sub).Add(sub + time.Second)
	clock := limiter.NewManualClock(start)
	opts := func(o *edge.Options) { o.Clock = clock }
	_, a := rlsEdge(t, pl, opts, file)
	_, b := rlsEdge(t, pl, opts, file)
	allowedIn := func(i int) int {
		clock.Set(start.Add(time.Duration(i) * sub))
		allowed := 0
		for j := range 8 {
			resp := ask(t, []rlsv3.RateLimitServiceClient{a, b}[j%2], "api", desc("api_key", "k1"))
			st := resp.Statuses[0]
			require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, st.CurrentLimit.Unit)
			require.Equal(t, 9*time.Second, st.DurationUntilReset.AsDuration(), "to the end of the sub-window")
			if resp.OverallCode == ok {
				allowed++
			}
		}
		return allowed
	}
	require.Equal(t, 5, allowedIn(0), "exactly the limit, from two edges")
	require.Zero(t, allowedIn(3), "sub-window 3 is in the span of 0")
	require.Equal(t, 5, allowedIn(6), "sub-window 0 left the span")
}

// Through the proxy, a sliding window: a 304 is given back to its
// sub-window; an edge that restarts gives back the credit it held, and the
// edge that serves the client next is held to what the span has left; the
// answers say the span (RateLimit-Policy's w) and the time to the
// sub-window's end (RateLimit's t).
func TestSlidingWindowRefundAndEdgeRestart(t *testing.T) {
	pl := newPipeline(t)
	p := limiter.Policy{Name: "core", Algorithm: limiter.SlidingWindow, Limit: 4, Window: 10 * time.Second, Slices: 6, Align: true}
	pl.policies["core"] = p
	start := p.WindowAt(time.Now()).ResetAt.Add(time.Second)
	clock := limiter.NewManualClock(start)
	withClock := func(o *edge.Options) { patient(o); o.Clock = clock }
	k := pl.keys.Key("core", "h:token-a")
	span := func(at time.Time) int64 { return pl.span(p, k, at) }

	a := pl.edge(withClock)
	r := get(t, a.proxy.URL, "token-a")
	require.Equal(t, 200, r.StatusCode)
	require.Equal(t, "3", r.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, `"core";q=4;w=60`, r.Header.Get("RateLimit-Policy"), "the window a client is told is the span")
	require.Equal(t, `"core";r=3;t=9`, r.Header.Get("RateLimit"), "room comes back when the sub-window ends")
	r = get(t, a.proxy.URL, "token-a", "If-None-Match", `"v1"`)
	require.Equal(t, 304, r.StatusCode)
	require.Equal(t, "2", get(t, a.proxy.URL, "token-a").Header.Get("X-RateLimit-Remaining"), "the 304 was given back")

	// The next sub-window: the span still holds the two charges.
	clock.Set(start.Add(p.Window))
	require.Equal(t, 200, get(t, a.proxy.URL, "token-a").StatusCode)
	a.close(t) // its credit goes back
	testutil.WaitFor(t, "the restarted edge's credit given back", func() bool { return span(clock.Now()) == 3 })

	b := pl.edge(withClock)
	allowed := 0
	for range 4 {
		if get(t, b.proxy.URL, "token-a").StatusCode == 200 {
			allowed++
		}
	}
	require.Equal(t, 1, allowed, "three of four in the span")
	clock.Set(start.Add(6 * p.Window))
	require.Equal(t, 200, get(t, b.proxy.URL, "token-a").StatusCode, "sub-window 0 left the span: its two went with it")
	require.Equal(t, 200, get(t, b.proxy.URL, "token-a").StatusCode)
	require.Equal(t, 429, get(t, b.proxy.URL, "token-a").StatusCode, "sub-windows 1 and 6 hold four")
}
