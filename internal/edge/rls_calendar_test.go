package edge_test

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// rlsResetHeader is the RateLimit-Reset the answer gives Envoy to add.
func rlsResetHeader(t *testing.T, resp *rlsv3.RateLimitResponse) int64 {
	t.Helper()
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "RateLimit-Reset" {
			v, err := strconv.ParseInt(h.Value, 10, 64)
			require.NoError(t, err)
			return v
		}
	}
	t.Fatalf("no RateLimit-Reset in %v", resp.ResponseHeadersToAdd)
	return 0
}

// A rule of Tally's calendar extension, a month of Berlin's calendar,
// answered by two edges whose domain is aligned to the clock (which a
// calendar rule ignores): the limit exactly, whichever edge a request
// reaches, and every duration_until_reset and RateLimit-Reset is the time
// to the next first-of-month midnight in Berlin, not to the end of the
// reference's 30 days from the Unix epoch.
func TestRLSCalendarMonthAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	loc := berlin(t)
	const file = `
domain: api
descriptors:
  - key: api_key
    rate_limit:
      unit: month
      requests_per_unit: 5
      calendar: {time_zone: Europe/Berlin}
  - key: closed
    rate_limit: {unit: month, requests_per_unit: 0, calendar: {}}
`
	opts := func(o *edge.Options) { o.RLS.ClockWindows, o.RLS.ResponseHeaders = map[string]bool{"*": true}, true }
	_, a := rlsEdge(t, pl, opts, file)
	_, b := rlsEdge(t, pl, opts, file)

	allowed := 0
	for i := range 12 {
		c := []rlsv3.RateLimitServiceClient{a, b}[i%2]
		before := time.Now()
		resp := ask(t, c, "api", desc("api_key", "k1"))
		if resp.OverallCode == ok {
			allowed++
		} else {
			require.Equal(t, over, resp.Statuses[0].Code, "request %d", i)
			require.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, "request %d", i)
		}
		st := resp.Statuses[0]
		require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MONTH, st.CurrentLimit.Unit)
		left := testutil.MonthStart(before, loc, 1).Sub(before)
		got := st.DurationUntilReset.AsDuration()
		require.InDelta(t, left.Seconds(), got.Seconds(), 2, "request %d: duration_until_reset %v, want the time to Berlin's next month, %v", i, got, left)
		require.InDelta(t, left.Seconds(), float64(rlsResetHeader(t, resp)), 2, "request %d: RateLimit-Reset", i)
	}
	require.Equal(t, 5, allowed, "exactly the limit, from two edges")

	// A rule of 0 requests denies without a window: its status still
	// tells the next period's midnight of its zone (UTC: calendar: {}).
	before := time.Now()
	resp := ask(t, a, "api", desc("closed", "x"))
	require.Equal(t, over, resp.OverallCode)
	left := testutil.MonthStart(before, time.UTC, 1).Sub(before)
	require.InDelta(t, left.Seconds(), resp.Statuses[0].DurationUntilReset.AsDuration().Seconds(), 2, "a closed rule's reset")
}

// A day rule of Berlin's calendar on the edges' manual clock, across the
// next day of 23 hours (clocks move forward): the day before resets at
// that day's midnight, the short day lasts 23 hours and resets at the next
// local midnight (22:00 UTC), and the day after opens there; two edges
// admit the limit exactly in each day, and a client the short day filled
// stays denied to its last second. The day is the next one ahead of now:
// Redis expires keys by its own clock.
func TestRLSCalendarDayAcrossSummerTime(t *testing.T) {
	loc := berlin(t)
	short := testutil.NextDayOf(t, time.Now(), loc, 23)
	y, m, d := short.Date()
	day0 := time.Date(y, m, d-1, 23, 59, 58, 0, loc)
	after := time.Date(y, m, d+1, 0, 0, 0, 0, loc)
	require.Equal(t, 23*time.Hour, after.Sub(short))

	pl := newPipeline(t)
	clock := limiter.NewManualClock(day0)
	opts := func(o *edge.Options) {
		o.Clock, o.RLS.ClockWindows, o.RLS.ResponseHeaders = clock, map[string]bool{"*": true}, true
	}
	const file = `
domain: api
descriptors:
  - key: client
    rate_limit: {unit: day, requests_per_unit: 3, calendar: {time_zone: Europe/Berlin}}
`
	_, a := rlsEdge(t, pl, opts, file)
	_, b := rlsEdge(t, pl, opts, file)

	try := func(client string, at time.Time, want time.Duration) int {
		t.Helper()
		clock.Set(at)
		allowed := 0
		for i := range 8 {
			resp := ask(t, []rlsv3.RateLimitServiceClient{a, b}[i%2], "api", desc("client", client))
			what := fmt.Sprintf("%s at %v, request %d", client, at, i)
			require.Equal(t, want, resp.Statuses[0].DurationUntilReset.AsDuration(), what)
			require.Equal(t, int64(want/time.Second), rlsResetHeader(t, resp), what)
			if resp.OverallCode == ok {
				allowed++
			}
		}
		return allowed
	}
	require.Equal(t, 3, try("c0", day0, 2*time.Second), "the day before: its limit, from two edges")
	require.Equal(t, 3, try("c1", short.Add(30*time.Second), 23*time.Hour-30*time.Second), "the short day")
	require.Equal(t, 0, try("c1", after.Add(-time.Second), time.Second), "the short day's last second: still full")
	require.Equal(t, 3, try("c2", after.Add(-time.Second), time.Second), "a client first seen in the short day's last second")
	require.Equal(t, 3, try("c1", after, 24*time.Hour), "the day after opens at Berlin's midnight")
}
