package edge_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

func berlin(t *testing.T) *time.Location {
	t.Helper()
	l, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	return l
}

// rateLimitT is RateLimit's t ("core";r=2;t=1234).
func rateLimitT(t *testing.T, resp *http.Response) int64 {
	t.Helper()
	h := resp.Header.Get("RateLimit")
	i := strings.Index(h, ";t=")
	require.GreaterOrEqual(t, i, 0, h)
	v, err := strconv.ParseInt(h[i+3:], 10, 64)
	require.NoError(t, err, h)
	return v
}

// A month on Berlin's calendar, decided by two edges through the decision
// API: the limit exactly, whichever edge a request reaches, and every
// answer's reset is the next month's first midnight in Berlin — in the
// headers, the body, RateLimit's t and a denial's Retry-After.
func TestCalendarMonthFromTwoEdges(t *testing.T) {
	pl := newPipeline(t)
	loc := berlin(t)
	pl.policies = map[string]limiter.Policy{"core": {Name: "core", Limit: 7, Calendar: limiter.Month, Location: loc,
		Window: limiter.Month.Longest()}}
	a, b := pl.edge(nil), pl.edge(nil)

	before := time.Now().In(loc)
	allowed := 0
	var resets []int64
	for i := 0; i < 20; i++ {
		e := []*edgeUnderTest{a, b}[i%2]
		resp, body := check(t, e, "tenant-1")
		now := time.Now()
		reset, err := strconv.ParseInt(resp.Header.Get("X-RateLimit-Reset"), 10, 64)
		require.NoError(t, err)
		resets = append(resets, reset)
		require.EqualValues(t, reset, body["reset"])
		left := time.Unix(reset, 0).Sub(now)
		require.InDelta(t, left.Seconds(), float64(rateLimitT(t, resp)), 2, "RateLimit's t counts down to the reset")
		if resp.StatusCode == http.StatusOK {
			allowed++
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
		retry, err := strconv.ParseInt(resp.Header.Get("Retry-After"), 10, 64)
		require.NoError(t, err)
		require.InDelta(t, left.Seconds(), float64(retry), 2, "Retry-After is the time to the next month")
	}
	require.Equal(t, 7, allowed, "exactly the limit, from two edges")
	after := time.Now().In(loc)
	y, m, _ := before.Date()
	want := time.Date(y, m+1, 1, 0, 0, 0, 0, loc).Unix()
	if y2, m2, _ := after.Date(); m2 != m { // the month turned during the test
		want = time.Date(y2, m2+1, 1, 0, 0, 0, 0, loc).Unix()
	}
	for i, r := range resets {
		require.Equal(t, want, r, "answer %d: the first midnight of next month in Berlin", i)
	}
	require.EqualValues(t, 7, pl.used(pl.keys.Key("core", limiter.APIIdentity("tenant-1"))))
}

// A day of 23 hours, on the edges' manual clock: the next day of 23 hours
// in Berlin (the last Sunday of March) resets at Berlin's midnight (22:00
// UTC, an hour earlier than the day before), the day after opens there,
// and two edges admit the limit exactly in each. The day is the next one
// ahead of now: Redis expires keys by its own clock.
func TestCalendarDayAcrossSummerTime(t *testing.T) {
	loc := berlin(t)
	short := testutil.NextDayOf(t, time.Now(), loc, 23)
	y, m, d := short.Date()
	day0 := time.Date(y, m, d-1, 23, 59, 58, 0, loc) // the Saturday before, CET
	after := time.Date(y, m, d+1, 0, 0, 0, 0, loc)   // the Monday, CEST
	pl := newPipeline(t)
	pl.policies = map[string]limiter.Policy{"core": {Name: "core", Limit: 3, Calendar: limiter.Day, Location: loc,
		Window: limiter.Day.Longest()}}
	clock := limiter.NewManualClock(day0)
	withClock := func(o *edge.Options) { o.Clock = clock }
	a, b := pl.edge(withClock), pl.edge(withClock)

	for _, tc := range []struct {
		at        time.Time
		reset     time.Time
		rateLimit int64
	}{
		{day0, short, 2},
		{short.Add(30 * time.Second), after, 23*3600 - 30},
		{after.Add(-time.Second), after, 1},
		{after, time.Date(y, m, d+2, 0, 0, 0, 0, loc), 24 * 3600},
	} {
		clock.Set(tc.at)
		want := tc.reset
		id := "tenant-" + tc.at.Format("0102150405")
		allowed := 0
		for i := 0; i < 8; i++ {
			resp, _ := check(t, []*edgeUnderTest{a, b}[i%2], id)
			require.Equal(t, strconv.FormatInt(want.Unix(), 10), resp.Header.Get("X-RateLimit-Reset"), "%v", tc.at)
			require.Equal(t, tc.rateLimit, rateLimitT(t, resp), "%v", tc.at)
			if resp.StatusCode == http.StatusOK {
				allowed++
			}
		}
		require.Equal(t, 3, allowed, "%v: exactly the limit, from two edges", tc.at)
	}
}
