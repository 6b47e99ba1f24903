package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

const slideGrace = 5 * time.Second

// slidingPolicy admits limit units in any 6 consecutive sub-windows of 10 s.
func slidingPolicy(limit int64) limiter.Policy {
	return limiter.Policy{Name: "slide", Algorithm: limiter.SlidingWindow, Limit: limit, Window: 10 * time.Second, Slices: 6,
		Align: true}
}

// slideArgs are a take of p's sub-window at now for producer's holder 1.
func slideArgs(p limiter.Policy, now time.Time, producer string, need, want int64) limiter.TakeArgs {
	return limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Need: need, Want: want, Producer: producer, Holder: producer + ".1",
		Align: true, Opens: p.WindowAt(now), Slices: p.Slices}
}

// slide reserves in p's sub-window at at (the caller's clock) on the env's
// primary.
func (e *env) slide(t *testing.T, p limiter.Policy, k limiter.Key, at time.Time, producer string, need, want int64) limiter.Grant {
	t.Helper()
	g, err := e.store.Take(context.Background(), k, at, slideArgs(p, at, producer, need, want))
	require.NoError(t, err)
	return g
}

// The first sub-window boundary after t0, so that steps of 10 s stay in
// one sub-window each.
func slideStart(p limiter.Policy) time.Time { return p.WindowAt(t0).ResetAt.Add(time.Second) }

// subWindows gives a time in p's i-th sub-window from slideStart.
func subWindows(p limiter.Policy) func(i int) time.Time {
	at := slideStart(p)
	return func(i int) time.Time { return at.Add(time.Duration(i) * p.Window) }
}

// A reservation in a sliding window never takes any span of Slices
// consecutive sub-windows past the limit, counting the sub-windows before
// it and those after it that an edge ahead of it has opened; a sub-window
// leaves the count when the span moves past it; used is the fullest span.
func TestSlidingWindowSpans(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := slidingPolicy(10)
	k := e.keys.Key("slide", "alice")
	sub := subWindows(p)

	g := e.slide(t, p, k, sub(0), "edge-a", 4, 4)
	require.EqualValues(t, 4, g.Granted)
	require.EqualValues(t, 4, g.Used)
	require.Equal(t, p.WindowAt(sub(0)).ResetAt, g.ResetAt, "credit lives as long as its sub-window")
	require.False(t, g.Own, "a sub-window is never compact")

	g = e.slide(t, p, k, sub(1), "edge-b", 1, 10)
	require.EqualValues(t, 6, g.Granted, "4 of the span are in the sub-window before")
	require.EqualValues(t, 10, g.Used)

	g = e.slide(t, p, k, sub(5), "edge-a", 1, 1)
	require.Zero(t, g.Granted, "sub-windows 0 to 5 hold 10")
	require.EqualValues(t, 10, g.Used)

	g = e.slide(t, p, k, sub(6), "edge-a", 1, 10)
	require.EqualValues(t, 4, g.Granted, "sub-window 0 left the span; 1's 6 still count")
	require.EqualValues(t, 10, g.Used)

	// An edge whose clock is behind reserves in sub-window 5 after sub-window
	// 6 has been opened: the spans ending at 6 to 10 hold 5 as well, and the
	// one ending at 6 holds 10 already.
	g = e.slide(t, p, k, sub(5), "edge-c", 1, 1)
	require.Zero(t, g.Granted)
	require.EqualValues(t, 10, g.Used, "the fullest span, one ending after the caller's sub-window")

	g = e.slide(t, p, k, sub(7), "edge-a", 1, 10)
	require.EqualValues(t, 6, g.Granted, "1 left the span: 6's 4 remain")
	require.EqualValues(t, 10, g.Used)

	// A read (need 0) reports the fullest span and writes nothing.
	g = e.slide(t, p, k, sub(7), "reader", 0, 0)
	require.True(t, g.Live)
	require.EqualValues(t, 10, g.Used)

	// Each sub-window is a key of its own, kept until it leaves every span.
	c := e.primary.Client()
	for i, want := range map[int]int64{6: 4, 7: 6} {
		reset := p.WindowAt(sub(i)).ResetAt
		u, err := c.HGet(context.Background(), k.SliceKey(reset), "u").Int64()
		require.NoError(t, err, "sub-window %d", i)
		require.Equal(t, want, u, "sub-window %d", i)
		exp, err := c.PExpireTime(context.Background(), k.SliceKey(reset)).Result()
		require.NoError(t, err)
		require.Equal(t, reset.Add(p.Linger()+slideGrace).UnixMilli(), exp.Milliseconds(),
			"sub-window %d expires once it is in no span, and grace after", i)
	}
	n, err := c.Exists(context.Background(), k.String()).Result()
	require.NoError(t, err)
	require.Zero(t, n, "the window key itself holds nothing of a sliding window")
}

// Events of a sliding window name their sub-window by its reset and apply
// to it while it is in a span, after its reset too: a release of credit an
// edge held when its sub-window ended gives the room back to the spans
// still holding it; a charge opens a sub-window the primary lost, to be
// kept as long as it counts; an event for a sub-window no span holds is
// late.
func TestSlidingWindowEvents(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := slidingPolicy(10)
	k := e.keys.Key("slide", "bob")
	sub := subWindows(p)
	reset := func(i int) time.Time { return p.WindowAt(sub(i)).ResetAt }
	ev := func(kind limiter.EventKind, seq uint64, i int, units int64) limiter.Event {
		return limiter.Event{Producer: "edge-a", Seq: seq, Kind: kind, Key: k, ResetAt: reset(i), Start: sub(i), Window: p.Window,
			Units: units, Slices: p.Slices}
	}

	require.EqualValues(t, 8, e.slide(t, p, k, sub(0), "edge-a", 8, 8).Granted)
	e.clock.Set(sub(3))
	// Sub-window 0 has ended; edge-a gives back 5 it did not use.
	res := e.apply(t, ev(limiter.Release, 1, 0, 5))
	require.Equal(t, limiter.Result{Outcome: limiter.Applied, Used: 3, ResetAt: reset(0), Amount: 5}, res[0])
	require.EqualValues(t, 7, e.slide(t, p, k, sub(3), "edge-b", 1, 10).Granted, "3 of sub-window 0 still count")

	// A charge for sub-window 1, which the primary does not hold, opens it.
	res = e.apply(t, ev(limiter.Charge, 2, 1, 2))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	exp, err := e.primary.Client().PExpireTime(context.Background(), k.SliceKey(reset(1))).Result()
	require.NoError(t, err)
	require.Equal(t, reset(1).Add(p.Linger()+slideGrace).UnixMilli(), exp.Milliseconds())
	g := e.slide(t, p, k, sub(3), "edge-b", 0, 0)
	require.EqualValues(t, 12, g.Used, "3 + 2 + 7: the charge made the span overdrawn")

	// Past every span of sub-window 0 (6 sub-windows after it): late.
	e.clock.Set(sub(6))
	res = e.apply(t, ev(limiter.Release, 3, 0, 1))
	require.Equal(t, limiter.Late, res[0].Outcome)
	res = e.apply(t, ev(limiter.Release, 4, 1, 1))
	require.Equal(t, limiter.Applied, res[0].Outcome, "sub-window 1 is still in the span of 1 to 6")

	// A sub-window event needs its reset, at a boundary of its sub-windows.
	bad := ev(limiter.Charge, 5, 6, 1)
	bad.ResetAt = time.Time{}
	require.ErrorIs(t, bad.Validate(), limiter.ErrInvalidArgument)
	bad.ResetAt = reset(6).Add(time.Second)
	require.ErrorIs(t, bad.Validate(), limiter.ErrInvalidArgument)
}

// A primary that restarts empty is re-seeded with every sub-window still in
// a span, not only the current one: the claim of a sub-window that ended
// is re-asserted until it leaves the last span, and counts in the spans
// that hold it afterwards.
func TestSlidingWindowReseeded(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	p := limiter.Policy{Name: "slide", Algorithm: limiter.SlidingWindow, Limit: 10, Window: 2 * time.Second, Slices: 5, Align: true}
	k := f.keys.Key("slide", "carol")
	past := p.WindowAt(time.Now()).Start // the reset of the sub-window before the current one
	f.rec.mu.Lock()
	f.rec.claims["past"] = limiter.Claim{Key: k, Window: p.Window, ResetAt: past, Start: past.Add(-p.Window), Holder: "edge-a.1",
		Producer: "edge-a", Reserved: 4, Slices: p.Slices}
	f.rec.mu.Unlock()

	f.reserve(t, f.keys.Key("core", "warm"), "edge-a", "edge-a.2", 1) // the shard's epoch is set

	f.primary.Restart()
	f.untilReseeded(t)
	st := f.store.ReseedStats()
	require.EqualValues(t, 2, st.Opened, "the warm key's window, and the sub-window that ended, re-opened under its own key")
	require.Zero(t, st.Late)
	now := time.Now()
	g := eventually(t, func() (limiter.Grant, error) {
		return f.store.Take(context.Background(), k, now, slideArgs(p, now, "edge-b", 1, 10))
	})
	require.EqualValues(t, 6, g.Granted, "the re-asserted 4 count in the span")
}

// An operator inspects a sliding window as its span (every sub-window of
// it summed, who holds what in them), and a reset empties the whole span:
// the client's next reservation finds its limit whole.
func TestSlidingWindowInspectAndReset(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := slidingPolicy(10)
	k := e.keys.Key("slide", "dave")
	at := slideStart(p)
	next := at.Add(p.Window)
	e.slide(t, p, k, at, "edge-a", 4, 4)
	e.slide(t, p, k, next, "edge-b", 6, 6)
	ctx := context.Background()
	d, err := e.store.Inspect(ctx, k, p, next)
	require.NoError(t, err)
	require.True(t, d.Live)
	require.EqualValues(t, 10, d.Used)
	require.Equal(t, p.WindowAt(at).Start, d.Start, "the span's oldest sub-window with units")
	require.Equal(t, p.WindowAt(next).ResetAt, d.ResetAt)
	require.Equal(t, []redisstore.Holding{{Who: "edge-a", Units: 4}, {Who: "edge-b", Units: 6}}, d.Holders)

	existed, err := e.store.Reset(ctx, k, p, next)
	require.NoError(t, err)
	require.True(t, existed)
	require.EqualValues(t, 10, e.slide(t, p, k, next, "edge-c", 1, 10).Granted)
}

// A sliding window's reservations take the short way (lua/slide.lua) while
// the sub-windows of their spans are compact or missing: one MGET, an
// EXISTS when a key is missing, and one SET, replicated as that SET. The
// decisions are take.lua's; anything slide.lua cannot decide — a full
// sub-window among them, another holder's, a reseed — it hands on
// untouched, and take.lua decides as it always has.
func TestSlidingSubWindowsTakeTheShortWay(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace, EpochCheck: time.Minute}) // no epoch check between the counts
	ctx := context.Background()
	rdb := e.primary.Client()
	p := slidingPolicy(10)
	k := e.keys.Key("slide", "short")
	sub := nowSubWindows(p) // the span record lives until a sub-window's reset by Redis's clock
	reset := func(i int) time.Time { return p.WindowAt(sub(i)).ResetAt }
	require.NoError(t, e.store.LoadScripts(ctx, 0)) // as an edge does before it is ready
	require.True(t, e.store.Compact(0), "a new deployment's windows are compact")
	// takes checks how many takes slide.lua made whole and handed on.
	takes := func(made, handedOn uint64) {
		t.Helper()
		m, h := e.store.ShortTakes()
		require.Equal(t, [2]uint64{made, handedOn}, [2]uint64{m, h}, "short takes made, handed on")
	}

	g := e.slide(t, p, k, sub(0), "edge-a", 1, 3)
	require.Equal(t, limiter.Grant{Granted: 3, Live: true, Used: 3, ResetAt: reset(0), Start: reset(0).Add(-p.Window), Opened: true,
		Mine: 3, Frozen: -1}, g)
	takes(1, 0)
	require.Equal(t, fmt.Sprintf("3:%d:10:edge-a.1", reset(0).Unix()), rdb.Get(ctx, k.SliceKey(reset(0))).Val())
	require.Equal(t, reset(0).Add(slideGrace+5*p.Window).UnixMilli(), rdb.PExpireTime(ctx, k.SliceKey(reset(0))).Val().Milliseconds(),
		"a sub-window lives while a span holds it")

	// The holder's own sub-window grows: what the script ran, on the
	// primary and on the replica. The first growth reads every
	// sub-window, and writes the span record with the sub-window (TestSpanRecordKeepsASlidingWindowShort: the next ones
	// read the record alone).
	e.replica.WaitSynced(e.primary)
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	require.NoError(t, e.replica.Client().ConfigResetStat(ctx).Err())
	g = e.slide(t, p, k, sub(0), "edge-a", 1, 1)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 4, g.Used)
	require.EqualValues(t, 4, g.Mine)
	require.False(t, g.Opened)
	require.True(t, g.Own, "the record written")
	e.replica.WaitSynced(e.primary)
	pc, rc := commandCalls(t, rdb), commandCalls(t, e.replica.Client())
	for c, n := range map[string]int64{"evalsha": 1, "mget": 1, "exists": 1, "set": 2} {
		require.EqualValues(t, n, pc[c], "primary ran %s: %v", c, pc)
	}
	require.EqualValues(t, 2, rc["set"], "replica: %v", rc)
	for _, c := range []string{"hmget", "hset", "pexpireat", "pttl", "del"} {
		require.Zero(t, pc[c], "primary ran %s: %v", c, pc)
		require.Zero(t, rc[c], "replica ran %s: %v", c, rc)
	}

	// Another edge, in the next sub-window: the span counts edge-a's 4.
	g = e.slide(t, p, k, sub(1), "edge-b", 1, 3)
	require.EqualValues(t, 3, g.Granted)
	require.EqualValues(t, 7, g.Used)
	g = e.slide(t, p, k, sub(1), "edge-b", 1, 1)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 8, g.Used)
	takes(4, 0)

	// edge-b in edge-a's sub-window: handed on; take.lua expands it.
	g = e.slide(t, p, k, sub(0), "edge-b", 1, 1)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 9, g.Used)
	takes(4, 1)
	require.Equal(t, "hash", rdb.Type(ctx, k.SliceKey(reset(0))).Val())

	// A full sub-window in the span: handed on, and take.lua counts it.
	g = e.slide(t, p, k, sub(1), "edge-b", 1, 10)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 10, g.Used)
	g = e.slide(t, p, k, sub(5), "edge-a", 1, 1)
	require.Zero(t, g.Granted, "sub-windows 0 to 5 hold 10")
	takes(4, 3)
	// take.lua opened sub-window 5 full, empty: the span of 1 to 6 is
	// take.lua's too.
	require.Equal(t, "hash", rdb.Type(ctx, k.SliceKey(reset(5))).Val())
	g = e.slide(t, p, k, sub(6), "edge-a", 1, 10)
	require.EqualValues(t, 5, g.Granted, "sub-window 1's 5 still count")
	require.EqualValues(t, 10, g.Used)
	takes(4, 4)

	// An edge whose clock lags reserves in sub-window 0 after others
	// reserved in 1 and 2: the short way counts the sub-windows after it.
	k2 := e.keys.Key("slide", "lagging")
	e.slide(t, p, k2, sub(1), "edge-a", 1, 3)
	e.slide(t, p, k2, sub(2), "edge-b", 1, 3)
	g = e.slide(t, p, k2, sub(0), "edge-c", 1, 10)
	require.EqualValues(t, 4, g.Granted, "the span of sub-windows 0 to 5 holds 6")
	require.EqualValues(t, 10, g.Used)
	takes(7, 4)

	// While a reseed lasts, slide.lua reserves nothing: take.lua refuses.
	require.NoError(t, rdb.Set(ctx, e.keys.ReseedKey(), "epoch", time.Minute).Err())
	_, err := e.store.Take(ctx, k2, sub(0), slideArgs(p, sub(0), "edge-c", 1, 1))
	require.ErrorIs(t, err, redisstore.ErrReseeding)
	require.Equal(t, fmt.Sprintf("4:%d:10:edge-c.1", reset(0).Unix()), rdb.Get(ctx, k2.SliceKey(reset(0))).Val(), "nothing written")
	takes(7, 5)
	// A string in the span that is no sub-window (written by anyone who can
	// reach Redis): slide.lua writes nothing and hands on; take.lua refuses
	// it, and nothing is reserved.
	require.NoError(t, rdb.Del(ctx, e.keys.ReseedKey()).Err())
	k3 := e.keys.Key("slide", "forged")
	require.NoError(t, rdb.Set(ctx, k3.SliceKey(reset(0)), "99999999999:1:1:x", time.Minute).Err())
	_, err = e.store.Take(ctx, k3, sub(1), slideArgs(p, sub(1), "edge-a", 1, 1))
	require.ErrorContains(t, err, "unreadable window")
	require.Zero(t, rdb.Exists(ctx, k3.SliceKey(reset(1))).Val(), "nothing written")
	takes(7, 6)
}
