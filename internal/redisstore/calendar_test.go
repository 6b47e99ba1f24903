package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/testutil"
	"github.com/tallyhq/tally/lua"
)

// midnightAfter is the first midnight after the day d begins, in loc.
func midnightAfter(d time.Time, loc *time.Location) time.Time {
	y, m, dd := d.In(loc).Date()
	return time.Date(y, m, dd+1, 0, 0, 0, 0, loc)
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
	loc, now := month.Location, time.Now()
	// Dates ahead of Redis's clock, by which keys expire: the end of next
	// month, the next February's, the next days of 23 and 25 hours.
	m1, m2, m3 := testutil.MonthStart(now, loc, 1), testutil.MonthStart(now, loc, 2), testutil.MonthStart(now, loc, 3)
	feb := testutil.NextFebruary(now.AddDate(0, 0, 1), loc)
	mar, apr := testutil.MonthStart(feb, loc, 1), testutil.MonthStart(feb, loc, 2)
	short, long := testutil.NextDayOf(t, now, loc, 23), testutil.NextDayOf(t, now, loc, 25)
	require.Equal(t, 23*time.Hour, midnightAfter(short, loc).Sub(short))
	require.Equal(t, 25*time.Hour, midnightAfter(long, loc).Sub(long))
	for _, tc := range []struct {
		name               string
		p                  limiter.Policy
		first, then        time.Time // a request in the window, and one in the next
		start, reset, next time.Time // the window's bounds, and the next one's reset
	}{
		{"a month into the next", month, m2.Add(-500 * time.Millisecond), m2.Add(200 * time.Millisecond), m1, m2, m3},
		{"February into March", month, mar.Add(-time.Second), mar.Add(time.Second), feb, mar, apr},
		{"a day of 23 hours", day, short.Add(3 * time.Hour), midnightAfter(short, loc), short, midnightAfter(short, loc), midnightAfter(midnightAfter(short, loc), loc)},
		{"a day of 25 hours", day, long.Add(150 * time.Minute), midnightAfter(long, loc).Add(700 * time.Millisecond), long, midnightAfter(long, loc),
			midnightAfter(midnightAfter(long, loc), loc)},
	} {
		for _, path := range []struct {
			name   string
			holder string
			fresh  bool
		}{{"the edge's SET", "edge-a.1", true}, {"take.lua, compact", "edge-a.1", false}, {"take.lua, full", "edge-a", false}} {
			t.Run(tc.name+"/"+path.name, func(t *testing.T) {
				first, then, start, reset, next := tc.first, tc.then, tc.start, tc.reset, tc.next
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
	// Three months' first midnights, ahead of Redis's clock.
	nov, dec, jan := testutil.MonthStart(time.Now(), p.Location, 1), testutil.MonthStart(time.Now(), p.Location, 2),
		testutil.MonthStart(time.Now(), p.Location, 3)
	k := e.keys.Key("core", "calendar-events")
	ev := func(kind limiter.EventKind, seq uint64, reset, start time.Time) limiter.Event {
		return limiter.Entry{Kind: kind, Key: k, Policy: p, Units: 2, ResetAt: reset, Start: start}.Event("svc", seq)
	}

	e.clock.Set(dec.Add(-time.Hour))
	res := e.apply(t, ev(limiter.Charge, 1, time.Time{}, dec.Add(-2*time.Hour)))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	require.True(t, dec.Equal(res[0].ResetAt))
	w := e.checkReplica(t, k)
	require.True(t, nov.Equal(w.Start), "the first month's window, from its first day: %v", w.Start)
	require.EqualValues(t, 2, w.Used)

	// A charge in December, placed by its start, opens December.
	e.clock.Set(dec.Add(90 * time.Second))
	res = e.apply(t, ev(limiter.Charge, 2, time.Time{}, dec.Add(30*time.Second)))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	require.True(t, jan.Equal(res[0].ResetAt))
	w = e.checkReplica(t, k)
	require.True(t, dec.Equal(w.Start), "the next month's window, from midnight: %v", w.Start)
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
	// A day ahead of Redis's clock, of 24 hours in UTC.
	start := time.Now().UTC().Truncate(24 * time.Hour).Add(48 * time.Hour)
	reset, now := start.Add(24*time.Hour), start.Add(18*time.Hour+30*time.Minute+400*time.Millisecond)
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
