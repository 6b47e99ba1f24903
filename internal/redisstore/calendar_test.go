package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/lua"
)

// calendarAt parses an RFC 3339 time, written with the offset in force.
func calendarAt(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}

// ahead skips the test once reset has passed: the calendar dates these
// tests use must lie ahead of Redis's clock, by which keys expire (garbage
// collection, at reset + grace).
func ahead(t *testing.T, reset time.Time) {
	t.Helper()
	if !reset.After(time.Now()) {
		t.Skipf("%v has passed: the test's dates need moving on", reset)
	}
}

func calendarPolicy(t *testing.T, period limiter.Period, zone string) limiter.Policy {
	t.Helper()
	l, err := time.LoadLocation(zone)
	require.NoError(t, err)
	return limiter.Policy{Name: "quota", Limit: 10, Calendar: period, Location: l, Window: period.Longest()}
}

// A calendar window is opened with the bounds the edge's policy gives —
// by the edge's SET, by take.lua in either form — stored with them (a
// replica's read says the same start and reset), keeps its reset while
// live, and the next period opens the next window at that reset: across a
// month's end, February's end, and days of 23 and 25 hours.
func TestCalendarWindowsOnThePrimary(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1) // the shard's windows may be compact from here
	month, day := calendarPolicy(t, limiter.Month, "Europe/Berlin"), calendarPolicy(t, limiter.Day, "Europe/Berlin")
	for _, tc := range []struct {
		name               string
		p                  limiter.Policy
		first, then        string // a request in the window, and one in the next
		start, reset, next string // the window's bounds, and the next one's reset
	}{
		{"November into December", month, "2026-11-30T23:59:59.5+01:00", "2026-12-01T00:00:00.2+01:00",
			"2026-11-01T00:00:00+01:00", "2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00"},
		{"February into March", month, "2027-02-28T23:59:59+01:00", "2027-03-01T00:00:01+01:00",
			"2027-02-01T00:00:00+01:00", "2027-03-01T00:00:00+01:00", "2027-04-01T00:00:00+02:00"},
		{"a day of 23 hours", day, "2027-03-28T03:00:00+02:00", "2027-03-29T00:00:00+02:00",
			"2027-03-28T00:00:00+01:00", "2027-03-29T00:00:00+02:00", "2027-03-30T00:00:00+02:00"},
		{"a day of 25 hours", day, "2027-10-31T02:30:00+01:00", "2027-11-01T00:00:00.7+01:00",
			"2027-10-31T00:00:00+02:00", "2027-11-01T00:00:00+01:00", "2027-11-02T00:00:00+01:00"},
	} {
		for _, path := range []struct {
			name   string
			holder string
			fresh  bool
		}{{"the edge's SET", "edge-a.1", true}, {"take.lua, compact", "edge-a.1", false}, {"take.lua, full", "edge-a", false}} {
			t.Run(tc.name+"/"+path.name, func(t *testing.T) {
				first, then := calendarAt(t, tc.first), calendarAt(t, tc.then)
				start, reset, next := calendarAt(t, tc.start), calendarAt(t, tc.reset), calendarAt(t, tc.next)
				ahead(t, reset)
				k := e.keys.Key("core", "calendar-"+tc.name+"-"+path.name)
				take := func(now time.Time, p limiter.Policy, fresh bool) limiter.Grant {
					t.Helper()
					g, err := e.store.Take(ctx, k, now, limiter.TakeArgs{Window: p.Window, Limit: 10, Need: 1, Want: 1,
						Producer: "edge-a", Holder: path.holder, Fresh: fresh, Opens: p.WindowAt(now)})
					require.NoError(t, err)
					return g
				}
				g := take(first, tc.p, path.fresh)
				require.True(t, g.Opened)
				require.True(t, start.Equal(g.Start), "start %v, want %v", g.Start, start)
				require.True(t, reset.Equal(g.ResetAt), "reset %v, want %v", g.ResetAt, reset)
				w := e.checkReplica(t, k)
				require.True(t, w.Live)
				require.True(t, start.Equal(w.Start) && reset.Equal(w.ResetAt), "stored %v to %v", w.Start, w.ResetAt)

				// Live, it keeps its reset: a take that would open another
				// window (terms changed to windows of a minute) is counted in it.
				g = take(first.Add(200*time.Millisecond), limiter.Policy{Window: time.Minute}, false)
				require.False(t, g.Opened)
				require.True(t, reset.Equal(g.ResetAt))
				require.EqualValues(t, 2, g.Used)

				// The next period opens the next window at the reset.
				g = take(then, tc.p, false)
				require.True(t, g.Opened)
				require.True(t, reset.Equal(g.Start), "next start %v, want %v", g.Start, reset)
				require.True(t, next.Equal(g.ResetAt), "next reset %v, want %v", g.ResetAt, next)
				require.EqualValues(t, 1, g.Used)
			})
		}
	}
}

// Events of a calendar policy name their window by its reset and its true
// length (limiter.Entry.Placed): a charge placed by its start opens the
// period it started in, from the period's first midnight — not a window
// from its own second — and a release of the period before is late once it
// is over.
func TestCalendarEventsOpenTheirPeriod(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	p := calendarPolicy(t, limiter.Month, "Europe/Berlin")
	nov, dec, jan := calendarAt(t, "2026-11-01T00:00:00+01:00"), calendarAt(t, "2026-12-01T00:00:00+01:00"),
		calendarAt(t, "2027-01-01T00:00:00+01:00")
	ahead(t, dec)
	k := e.keys.Key("core", "calendar-events")
	ev := func(kind limiter.EventKind, seq uint64, reset, start time.Time) limiter.Event {
		return limiter.Entry{Kind: kind, Key: k, Policy: p, Units: 2, ResetAt: reset, Start: start}.Event("svc", seq)
	}

	e.clock.Set(dec.Add(-time.Hour))
	res := e.apply(t, ev(limiter.Charge, 1, time.Time{}, dec.Add(-2*time.Hour)))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	require.True(t, dec.Equal(res[0].ResetAt))
	w := e.checkReplica(t, k)
	require.True(t, nov.Equal(w.Start), "November's window, from its first day: %v", w.Start)
	require.EqualValues(t, 2, w.Used)

	// A charge in December, placed by its start, opens December.
	e.clock.Set(dec.Add(90 * time.Second))
	res = e.apply(t, ev(limiter.Charge, 2, time.Time{}, dec.Add(30*time.Second)))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	require.True(t, jan.Equal(res[0].ResetAt))
	w = e.checkReplica(t, k)
	require.True(t, dec.Equal(w.Start), "December's window, from midnight: %v", w.Start)
	require.EqualValues(t, 2, w.Used)

	// November is over: what was reserved there is not given back in
	// December.
	res = e.apply(t, ev(limiter.Release, 3, dec, nov))
	require.Equal(t, limiter.Late, res[0].Outcome)
	require.EqualValues(t, 2, e.used(t, k))

	// A primary that lost December's window opens it again from the
	// reset an event names, with December's length.
	require.NoError(t, e.primary.Client().Del(context.Background(), k.String()).Err())
	res = e.apply(t, ev(limiter.Charge, 4, jan, dec.Add(time.Minute)))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	w = e.checkReplica(t, k)
	require.True(t, dec.Equal(w.Start) && jan.Equal(w.ResetAt), "%v to %v", w.Start, w.ResetAt)
}

// take.lua understands an edge of the previous version, which names no
// window (15 arguments): it opens at the whole second of now, its length
// long. Bounds that do not hold now, or disagree with the length, are
// refused before anything is written.
func TestTakeNamesItsWindow(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	now := calendarAt(t, "2026-12-24T18:30:00.4+01:00")
	start, reset := calendarAt(t, "2026-12-24T00:00:00+01:00"), calendarAt(t, "2026-12-25T00:00:00+01:00")
	ahead(t, now)
	keys := func(k limiter.Key) []string {
		return []string{k.String(), e.keys.ProducerKey("edge-a"), e.keys.ReseedKey()}
	}
	args := func(length time.Duration, extra ...any) []any {
		return append([]any{now.UnixMilli(), length.Milliseconds(), 10, 1, 1, 60000, "edge-a", "edge-a", "", "", "", "", "", "", ""},
			extra...)
	}
	old := e.keys.Key("core", "old-edge")
	v, err := rdb.Eval(ctx, lua.Take, keys(old), args(time.Hour)...).Int64Slice()
	require.NoError(t, err)
	require.Equal(t, now.Truncate(time.Second).UnixMilli(), v[3], "the old edge's window opens at its second")
	require.Equal(t, now.Truncate(time.Second).Add(time.Hour).UnixMilli(), v[2])

	k := e.keys.Key("core", "named")
	v, err = rdb.Eval(ctx, lua.Take, keys(k), args(24*time.Hour, start.UnixMilli(), reset.UnixMilli())...).Int64Slice()
	require.NoError(t, err)
	require.Equal(t, []int64{start.UnixMilli(), reset.UnixMilli()}, []int64{v[3], v[2]})

	bad := e.keys.Key("core", "refused")
	for name, extra := range map[string][]any{
		"a window in the future":        {reset.UnixMilli(), reset.Add(24 * time.Hour).UnixMilli()},
		"a window that has passed":      {start.Add(-24 * time.Hour).UnixMilli(), start.UnixMilli()},
		"bounds and length disagree":    {start.UnixMilli(), reset.Add(time.Hour).UnixMilli()},
		"a start without a reset":       {start.UnixMilli(), ""},
		"a reset without a start":       {"", reset.UnixMilli()},
		"a start between seconds":       {start.UnixMilli() + 1, reset.UnixMilli() + 1},
		"not a number":                  {"midnight", reset.UnixMilli()},
		"a reset at now, not after now": {now.Add(-24 * time.Hour).UnixMilli(), now.UnixMilli()},
	} {
		err := rdb.Eval(ctx, lua.Take, keys(bad), args(24*time.Hour, extra...)...).Err()
		require.ErrorContains(t, err, "tally: invalid window", name)
		require.Zero(t, rdb.Exists(ctx, bad.String()).Val(), name)
	}

	// The store refuses them first.
	_, err = e.store.Take(ctx, bad, now, limiter.TakeArgs{Window: time.Hour, Limit: 10, Need: 1, Want: 1, Producer: "edge-a",
		Opens: limiter.Span{Start: reset, ResetAt: reset.Add(time.Hour)}})
	require.ErrorIs(t, err, limiter.ErrInvalidArgument)
	require.Zero(t, rdb.Exists(ctx, bad.String()).Val())
}
