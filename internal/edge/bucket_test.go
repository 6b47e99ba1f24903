package edge_test

import (
	"net"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// bucketPolicy is a token bucket of burst units refilled rate a second.
func bucketPolicy(burst, rate int64, m limiter.Mode) limiter.Policy {
	return limiter.Policy{Name: "core", Mode: m}.Bucket(burst, rate, time.Second)
}

// steps hammers a hot key from four edges at each of the times given (the
// edges' shared clock set to each), and checks every stretch of steps
// against the bucket's guarantee: at most its burst plus its rate times the
// time from the first step of the stretch to the last. It returns what each
// step admitted.
func bucketSteps(t *testing.T, p limiter.Policy, clock *limiter.ManualClock, edges []*edgeUnderTest, at []time.Time) []int64 {
	t.Helper()
	got := make([]int64, len(at))
	for i, ti := range at {
		clock.Set(ti)
		got[i] = hammer(t, edges, "bucket", 8, 8)
	}
	for i := range at {
		var sum int64
		for j := i; j < len(at); j++ {
			sum += got[j]
			bound := float64(p.Limit) + float64(p.Rate)*at[j].Sub(at[i]).Seconds()/p.Every.Seconds()
			require.LessOrEqual(t, float64(sum), bound, "steps %d to %d admitted %v", i, j, got[i:j+1])
		}
	}
	return got
}

// fourEdges starts four edges on one manual clock, set to into a second
// that starts at least a second from now.
func fourEdges(pl *pipeline, into time.Duration) (time.Time, *limiter.ManualClock, []*edgeUnderTest) {
	start := time.Now().Truncate(time.Second).Add(2*time.Second + into)
	clock := limiter.NewManualClock(start)
	var edges []*edgeUnderTest
	for range 4 {
		edges = append(edges, pl.edge(func(o *edge.Options) { patient(o); o.Clock = clock }))
	}
	return start, clock, edges
}

// Four edges race on a hot key under a token bucket, in mode auto (each
// edge spends credit it reserved ahead): the burst at once, then nothing
// while its units are held, then what refilled, and the whole burst once
// it has all refilled. No stretch of time admits more than the burst and
// the rate over it.
func TestTokenBucketFourEdgesNeverOver(t *testing.T) {
	pl := newPipeline(t)
	p := bucketPolicy(40, 20, limiter.ModeAuto)
	pl.policies["core"] = p
	start, clock, edges := fourEdges(pl, 300*time.Millisecond)
	sec := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	at := []time.Time{sec(0), sec(0.5), sec(1), sec(2), sec(4)}
	got := bucketSteps(t, p, clock, edges, at)
	t.Logf("admitted per step: %v", got)
	// Undershoot: a GCRA deciding every request on one node would have
	// admitted the burst and the rate since; units held until the period
	// after theirs ends refill up to two periods late (and the record
	// counts whole units: one more).
	var sum int64
	for j := range at {
		sum += got[j]
		ideal := p.Limit + int64(float64(p.Rate)*at[j].Sub(at[0]).Seconds())
		require.GreaterOrEqual(t, sum, ideal-2*p.Rate-1, "by step %d: %d admitted, a GCRA's %d", j, sum, ideal)
	}
	require.EqualValues(t, 40, got[0], "the burst, from four edges")
	require.Zero(t, got[1]+got[2], "held through the period after theirs")
	// Refilling since the hold ended at 1.7 s: 6 units at 2 s.
	require.EqualValues(t, 6, got[3])
	require.EqualValues(t, 40, got[4], "all refilled")
}

// In mode exact a bucket holds nothing: four edges admit one request every
// tenth of a second from a bucket of one refilled ten a second — a GCRA's
// bound, exact from every edge.
func TestTokenBucketExactFourEdges(t *testing.T) {
	pl := newPipeline(t)
	p := bucketPolicy(1, 10, limiter.ModeExact)
	pl.policies["core"] = p
	start, clock, edges := fourEdges(pl, 50*time.Millisecond)
	var at []time.Time
	for i := range 15 {
		at = append(at, start.Add(time.Duration(i)*100*time.Millisecond))
	}
	for i, n := range bucketSteps(t, p, clock, edges, at) {
		require.EqualValues(t, 1, n, "step %d", i)
	}
}

// Through the proxy: a 304 gives its unit back to the bucket; the answers
// tell the time the burst takes to refill (RateLimit-Policy's w) and the
// time until what the client used is back (RateLimit's t); an edge that
// restarts gives back the credit it held, and the next edge is held to what
// the bucket has left.
func TestTokenBucketRefundAndEdgeRestart(t *testing.T) {
	pl := newPipeline(t)
	p := bucketPolicy(4, 2, limiter.ModeAuto)
	pl.policies["core"] = p
	start := time.Now().Truncate(time.Second).Add(2*time.Second + 100*time.Millisecond)
	clock := limiter.NewManualClock(start)
	withClock := func(o *edge.Options) { patient(o); o.Clock = clock }
	k := pl.keys.Key("core", "h:token-a")

	a := pl.edge(withClock)
	r := get(t, a.proxy.URL, "token-a")
	require.Equal(t, 200, r.StatusCode)
	require.Equal(t, "3", r.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, `"core";q=4;w=2`, r.Header.Get("RateLimit-Policy"), "the burst refills in 2 s")
	require.Equal(t, `"core";r=3;t=1`, r.Header.Get("RateLimit"), "the unit used is back in half a second")
	r = get(t, a.proxy.URL, "token-a", "If-None-Match", `"v1"`)
	require.Equal(t, 304, r.StatusCode)
	require.Equal(t, "2", get(t, a.proxy.URL, "token-a").Header.Get("X-RateLimit-Remaining"), "the 304 was given back")

	a.close(t) // its credit goes back
	testutil.WaitFor(t, "the restarted edge's credit given back", func() bool {
		return pl.span(p, k, clock.Now()) == 2
	})
	b := pl.edge(withClock)
	allowed := 0
	for range 4 {
		if get(t, b.proxy.URL, "token-a").StatusCode == 200 {
			allowed++
		}
	}
	require.Equal(t, 2, allowed, "two of four held")
	r = get(t, b.proxy.URL, "token-a")
	require.Equal(t, 429, r.StatusCode)
	require.Equal(t, "1", r.Header.Get("Retry-After"), "the next unit is back within a second")
}

// Envoy's rate-limit service with a rule in Tally's extension
// rate_limit.token_bucket: a bucket of one refilled ten a second is
// decided in mode exact whatever the domain's mode, and two edges admit
// one request every tenth of a second between them; the status says the
// reference's unit and requests_per_unit.
func TestRLSTokenBucketAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	const file = `
domain: api
descriptors:
  - key: api_key
    rate_limit:
      unit: second
      requests_per_unit: 10
      token_bucket: {burst: 1}
`
	start := time.Now().Truncate(time.Second).Add(2*time.Second + 50*time.Millisecond)
	clock := limiter.NewManualClock(start)
	opts := func(o *edge.Options) { o.Clock = clock }
	_, a := rlsEdge(t, pl, opts, file)
	_, b := rlsEdge(t, pl, opts, file)
	for i := range 12 {
		clock.Set(start.Add(time.Duration(i) * 100 * time.Millisecond))
		allowed := 0
		for j := range 4 {
			resp := ask(t, []rlsv3.RateLimitServiceClient{a, b}[j%2], "api", desc("api_key", "k1"))
			st := resp.Statuses[0]
			require.Equal(t, rlsv3.RateLimitResponse_RateLimit_SECOND, st.CurrentLimit.Unit)
			require.EqualValues(t, 10, st.CurrentLimit.RequestsPerUnit)
			if resp.OverallCode == ok {
				allowed++
			} else {
				require.Equal(t, time.Second, st.DurationUntilReset.AsDuration(), "the next unit within a second")
			}
		}
		require.Equal(t, 1, allowed, "step %d: one a tenth of a second, from two edges", i)
	}
}

// Forward-auth reaches a token bucket as the other doors do: a bucket of
// two admits two of a client's requests, and a gateway's access-log entry
// of a 304 gives one back, exactly one.
func TestTokenBucketForwardAuth(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core"}.Bucket(2, 1, time.Hour)
	g, fa, logAddr := gatewayEdge(t, pl, "127.0.0.1/32")
	var ids []string
	for range 2 {
		r := askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5")
		require.Equal(t, 200, r.StatusCode)
		ids = append(ids, r.Header.Get(edge.RequestIDHeader))
	}
	require.Equal(t, 403, askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5").StatusCode, "the bucket is empty (nginx is denied with 403)")
	c, err := net.Dial("udp", logAddr)
	require.NoError(t, err)
	_, err = c.Write([]byte("<190>Nov 27 00:00:00 tally: " + ids[0] + " 304"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	testutil.WaitFor(t, "the access log's 304 given back", func() bool {
		return metric(t, g, `tally_edge_access_log_entries_total{outcome="refunded"}`) == 1
	})
	// The unit comes back into the edge's credit while the request's
	// period lasts; once it has ended (a second at most), by an event the
	// accountant applies, whose room notice then tells the edge. A denied
	// request takes nothing, so asking until then admits exactly the unit
	// given back, and the next is denied again.
	testutil.WaitForWithin(t, "the unit given back admits a request", 10*time.Second, func() bool {
		return askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5").StatusCode == 200
	})
	require.Equal(t, 403, askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5").StatusCode, "one unit came back, no more")
}
