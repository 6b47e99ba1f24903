package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/lua"
)

// spanGrace outlives every test here: a span record lives until its
// sub-window's reset and the grace, by Redis's clock, so the tests' clocks
// start at the real time.
const spanGrace = time.Minute

// nowSubWindows gives a time in p's i-th sub-window from the first
// boundary after the real time.
func nowSubWindows(p limiter.Policy) func(i int) time.Time {
	at := p.WindowAt(time.Now()).ResetAt.Add(time.Second)
	return func(i int) time.Time { return at.Add(time.Duration(i) * p.Window) }
}

// slideOwn reserves as edge-a's holder 1 whose last grant in the
// sub-window said its span record holds (Grant.Own): the record alone.
func (e *env) slideOwn(t *testing.T, p limiter.Policy, k limiter.Key, at time.Time, need, want int64) limiter.Grant {
	t.Helper()
	a := slideArgs(p, at, "edge-a", need, want)
	a.Own = true
	g, err := e.store.Take(context.Background(), k, at, a)
	require.NoError(t, err)
	return g
}

// recordOf is k's span record and whether it is of the sub-window that
// resets at reset.
func recordOf(t *testing.T, e *env, k limiter.Key, reset time.Time) (string, bool) {
	t.Helper()
	v := e.primary.Client().Get(context.Background(), k.SpanRecordKey()).Val()
	return v, strings.HasPrefix(v, fmt.Sprintf("%d:", reset.Unix()))
}

// A sliding window's reservation after the second in a sub-window (its
// holder's: the second wrote the record) reads its span record alone, not
// the other sub-windows: one MGET of three keys and one SET on the
// primary, one SET on the replica. Every script that changes
// another sub-window of the window removes the record (a charge, a
// release, a finish, a reservation by an edge whose clock differs, a
// reseed's re-assertion); one that changes the record's own sub-window
// keeps it, and the next reservation counts that sub-window as it is.
func TestSpanRecordKeepsASlidingWindowShort(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: spanGrace, EpochCheck: time.Minute}) // no epoch check between the counts
	ctx := context.Background()
	rdb := e.primary.Client()
	require.NoError(t, e.store.LoadScripts(ctx, 0))
	p := slidingPolicy(100)
	sub := nowSubWindows(p)
	reset := func(i int) time.Time { return p.WindowAt(sub(i)).ResetAt }
	var seq uint64 // edge-a's events
	ev := func(k limiter.Key, kind limiter.EventKind, i int, units int64) limiter.Event {
		seq++
		return limiter.Event{Producer: "edge-a", Seq: seq, Kind: kind, Key: k, ResetAt: reset(i), Start: sub(i), Window: p.Window,
			Units: units, Slices: p.Slices}
	}
	// prime reserves 3 in sub-window 0 and 4 in sub-window 1 as edge-a,
	// twice there: the second writes the record (the first, which opens
	// the sub-window, does not), sub-window 1's, its extra 3.
	prime := func(t *testing.T, k limiter.Key) {
		t.Helper()
		require.EqualValues(t, 3, e.slide(t, p, k, sub(0), "edge-a", 3, 3).Granted)
		g := e.slide(t, p, k, sub(1), "edge-a", 3, 3)
		require.EqualValues(t, 3, g.Granted)
		require.False(t, g.Own, "no record with a sub-window's first take")
		v, _ := recordOf(t, e, k, reset(1))
		require.Empty(t, v)
		g = e.slide(t, p, k, sub(1), "edge-a", 1, 1)
		require.EqualValues(t, 1, g.Granted)
		require.True(t, g.Own, "the record holds: the next take may send it alone")
		v, ok := recordOf(t, e, k, reset(1))
		require.True(t, ok, "the record is sub-window 1's: %q", v)
		require.Contains(t, v, ":3:", "sub-window 0's 3 besides it")
	}

	t.Run("a reservation reads the record alone", func(t *testing.T) {
		k := e.keys.Key("slide", t.Name())
		prime(t, k)
		e.replica.WaitSynced(e.primary)
		require.NoError(t, rdb.ConfigResetStat(ctx).Err())
		require.NoError(t, e.replica.Client().ConfigResetStat(ctx).Err())
		g := e.slideOwn(t, p, k, sub(1), 1, 2)
		require.EqualValues(t, 2, g.Granted)
		require.EqualValues(t, 9, g.Used, "3 + 4 + 2")
		require.EqualValues(t, 6, g.Mine)
		e.replica.WaitSynced(e.primary)
		pc, rc := commandCalls(t, rdb), commandCalls(t, e.replica.Client())
		for _, c := range []string{"evalsha", "mget", "set"} {
			require.EqualValues(t, 1, pc[c], "primary ran %s: %v", c, pc)
		}
		require.EqualValues(t, 1, rc["set"], "replica: %v", rc)
		for _, c := range []string{"exists", "hmget", "hset", "del", "multi"} {
			require.Zero(t, pc[c], "primary ran %s: %v", c, pc)
			require.Zero(t, rc[c], "replica ran %s: %v", c, rc)
		}
	})

	// Each writer changes sub-window 1, then sub-window 0; want is what a
	// reservation of 100 in sub-window 1 is granted after both.
	for _, c := range []struct {
		name  string
		write func(t *testing.T, k limiter.Key, i int)
		want  int64
	}{
		{"a charge", func(t *testing.T, k limiter.Key, i int) {
			require.Equal(t, limiter.Applied, e.apply(t, ev(k, limiter.Charge, i, 5))[0].Outcome)
		}, 100 - 3 - 4 - 10},
		{"a release", func(t *testing.T, k limiter.Key, i int) {
			require.Equal(t, limiter.Applied, e.apply(t, ev(k, limiter.Release, i, 2))[0].Outcome)
		}, 100 - 3 - 4 + 4},
		{"a finish", func(t *testing.T, k limiter.Key, i int) {
			r, err := e.store.Finish(ctx, k, e.clock.Now(), limiter.FinishArgs{ResetAt: reset(i), Start: sub(i), Window: p.Window,
				Producer: "edge-a", Holder: "edge-a.1", N: uint64(i), Units: 1, Status: 304, Back: 1, Slices: p.Slices})
			require.NoError(t, err)
			require.Equal(t, limiter.Finished, r.Outcome)
		}, 100 - 3 - 4 + 2},
		{"this edge's reservation", func(t *testing.T, k limiter.Key, i int) {
			require.EqualValues(t, 2, e.slide(t, p, k, sub(i), "edge-a", 2, 2).Granted)
		}, 100 - 3 - 4 - 4},
		{"this edge's reservation as a key it never reserved", func(t *testing.T, k limiter.Key, i int) {
			a := slideArgs(p, sub(i), "edge-a", 2, 2)
			a.Fresh = true // no record read or written: one of another sub-window is removed
			g, err := e.store.Take(ctx, k, sub(i), a)
			require.NoError(t, err)
			require.EqualValues(t, 2, g.Granted)
		}, 100 - 3 - 4 - 4},
		{"another edge's reservation", func(t *testing.T, k limiter.Key, i int) {
			require.EqualValues(t, 6, e.slide(t, p, k, sub(i), "edge-b", 6, 6).Granted)
		}, 100 - 3 - 4 - 12},
		{"a reseed's re-assertion", func(t *testing.T, k limiter.Key, i int) {
			v, err := rdb.Eval(ctx, lua.Reseed, []string{k.SliceKey(reset(i))}, e.clock.Now().UnixMilli(), "00000000000000bb",
				reset(i).UnixMilli(), sub(i).Add(-time.Second).UnixMilli(), p.Window.Milliseconds(), spanGrace.Milliseconds(),
				"edge-r.1", "edge-r", 7, 0, 0, 0, 0, 0, 0, p.Linger().Milliseconds()).Int64Slice()
			require.NoError(t, err)
			require.EqualValues(t, 7, v[2], "re-asserted")
		}, 100 - 3 - 4 - 14},
	} {
		t.Run(c.name+" in another sub-window removes the record, in its own keeps it", func(t *testing.T) {
			k := e.keys.Key("slide", t.Name())
			e.clock.Set(sub(1))
			prime(t, k)
			c.write(t, k, 1)
			_, ok := recordOf(t, e, k, reset(1))
			require.True(t, ok, "a change to the record's own sub-window keeps it")
			c.write(t, k, 0)
			v, ok := recordOf(t, e, k, reset(1))
			require.False(t, ok, "the record is gone: %q", v)
			g := e.slideOwn(t, p, k, sub(1), 1, 100)
			require.EqualValues(t, c.want, g.Granted, "the grant counts both changes")
			require.EqualValues(t, 100, g.Used)
		})
	}
}

// An operator's reset of a sliding window deletes its span record with its
// sub-windows: the client's next reservation finds its limit whole.
func TestResetDeletesTheSpanRecord(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: spanGrace})
	ctx := context.Background()
	p := slidingPolicy(10)
	sub := nowSubWindows(p)
	k := e.keys.Key("slide", "reset")
	require.NoError(t, e.store.LoadScripts(ctx, 0)) // as an edge does before it is ready
	e.slide(t, p, k, sub(0), "edge-a", 4, 4)
	e.slide(t, p, k, sub(1), "edge-a", 1, 1)
	e.slide(t, p, k, sub(1), "edge-a", 1, 1)
	_, ok := recordOf(t, e, k, p.WindowAt(sub(1)).ResetAt)
	require.True(t, ok)
	existed, err := e.store.Reset(ctx, k, p, sub(1))
	require.NoError(t, err)
	require.True(t, existed)
	require.Zero(t, e.primary.Client().Exists(ctx, k.SpanRecordKey()).Val())
	require.EqualValues(t, 10, e.slide(t, p, k, sub(1), "edge-a", 1, 10).Granted)
}

// A span record is trusted only at the shard's format level: none while
// the format record says "compact" (a process of a version that does not
// keep records may still run), and not one written at an earlier level —
// `tally windows compact` begins a new one. A record of the level is
// trusted whole: whoever can write Redis decides what it says
// (docs/security.md).
func TestSpanRecordsWaitForTheFormatLevel(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: spanGrace, EpochCheck: 20 * time.Millisecond})
	ctx := context.Background()
	rdb := e.primary.Client()
	p := slidingPolicy(10)
	sub := nowSubWindows(p)
	reset := func(i int) time.Time { return p.WindowAt(sub(i)).ResetAt }
	require.NoError(t, e.store.LoadScripts(ctx, 0)) // the store's first connection adopts the deployment
	level := strings.TrimPrefix(rdb.Get(ctx, e.keys.FormatKey()).Val(), "spans:")
	require.Len(t, level, 16, "a new deployment keeps span records")

	// An operator lowers the format to "compact": processes stop trusting
	// and writing records.
	require.NoError(t, rdb.Set(ctx, e.keys.FormatKey(), "compact", 0).Err())
	n := 0
	require.Eventually(t, func() bool {
		n++
		k := e.keys.Key("slide", fmt.Sprintf("lowered-%d", n))
		e.slide(t, p, k, sub(0), "edge-a", 1, 1)
		e.slide(t, p, k, sub(0), "edge-a", 1, 1) // a record would be written here
		return rdb.Exists(ctx, k.SpanRecordKey()).Val() == 0
	}, 5*time.Second, 30*time.Millisecond, "no record written")
	require.True(t, e.store.Compact(0))
	k := e.keys.Key("slide", "lowered")
	e.slide(t, p, k, sub(0), "edge-a", 1, 1)
	require.Zero(t, e.slide(t, p, k, sub(0), "edge-a", 0, 0).Granted)
	require.Zero(t, rdb.Exists(ctx, k.SpanRecordKey()).Val())

	// A record of the old level that says nothing is held: not trusted.
	e.slide(t, p, k, sub(1), "edge-a", 5, 5)
	require.NoError(t, rdb.Set(ctx, k.SpanRecordKey(), fmt.Sprintf("%d:10:6:0:%s", reset(1).Unix(), level), 0).Err())
	was, err := e.store.MakeCompact(ctx)
	require.NoError(t, err)
	require.Equal(t, []bool{false}, was)
	require.EqualValues(t, 4, e.slideOwn(t, p, k, sub(1), 1, 10).Granted, "the sub-windows read: 1 + 5 held")
	v, ok := recordOf(t, e, k, reset(1))
	require.True(t, ok)
	require.Contains(t, v, ":1:", "rewritten at the new level")
	require.NotContains(t, v, level)

	// A record of the level: trusted as it says.
	newLevel := strings.TrimPrefix(rdb.Get(ctx, e.keys.FormatKey()).Val(), "spans:")
	k2 := e.keys.Key("slide", "forged")
	e.slide(t, p, k2, sub(0), "edge-a", 9, 9)
	e.slide(t, p, k2, sub(1), "edge-a", 1, 1)
	require.NoError(t, rdb.Set(ctx, k2.SpanRecordKey(), fmt.Sprintf("%d:10:6:0:%s", reset(1).Unix(), newLevel), 0).Err())
	require.EqualValues(t, 9, e.slideOwn(t, p, k2, sub(1), 1, 10).Granted, "the forged record's word")

	// A record that is not one: read past, and written over.
	for _, bad := range []string{"junk", fmt.Sprintf("%d:10:6:x:%s", reset(1).Unix(), newLevel),
		fmt.Sprintf("%d:10:6:9999999999999999:%s", reset(1).Unix(), newLevel)} {
		k3 := e.keys.Key("slide", "bad-"+bad)
		e.slide(t, p, k3, sub(0), "edge-a", 4, 4)
		e.slide(t, p, k3, sub(1), "edge-a", 1, 1)
		require.NoError(t, rdb.Set(ctx, k3.SpanRecordKey(), bad, 0).Err())
		require.EqualValues(t, 5, e.slideOwn(t, p, k3, sub(1), 1, 10).Granted, "%q", bad)
		_, ok := recordOf(t, e, k3, reset(1))
		require.True(t, ok)
	}
	// A record that is a hash: read past, and written over.
	k4 := e.keys.Key("slide", "hash")
	e.slide(t, p, k4, sub(0), "edge-a", 4, 4)
	e.slide(t, p, k4, sub(1), "edge-a", 1, 1)
	require.NoError(t, rdb.HSet(ctx, k4.SpanRecordKey(), "x", "1").Err())
	require.EqualValues(t, 5, e.slideOwn(t, p, k4, sub(1), 1, 10).Granted)
	_, ok = recordOf(t, e, k4, reset(1))
	require.True(t, ok)
}

// Span records change no decision: beside a shard whose windows are never
// compact (take.lua alone), random reservations of three edges (one of
// them most of the time, whose sub-windows stay compact; clocks a
// sub-window apart), charges, releases and finishes over the sub-windows
// of two spans grant the same and leave the same counts after every step.
func TestSpanRecordDecidesAsTakeLua(t *testing.T) {
	ctx := context.Background()
	opts := redisstore.Options{Grace: spanGrace}
	short, long := newEnv(t, opts), fullEnv(t, opts)
	require.NoError(t, short.store.LoadScripts(ctx, 0))
	rnd := rand.New(rand.NewPCG(41, 7))
	alone := 0 // takes sent with the record alone (TakeArgs.Own)
	two := limiter.Policy{Name: "slide", Algorithm: limiter.SlidingWindow, Limit: 300, Window: 10 * time.Second, Slices: 2, Align: true}
	for i, c := range []struct {
		p limiter.Policy
		// others: other edges reserve, and requests finish, now and then
		// (either turns a sub-window into the full form, and take.lua
		// then opens the sub-windows of its spans full: slide.lua hands
		// them on)
		others bool
	}{{slidingPolicy(400), false}, {slidingPolicy(40), false}, {two, false}, {slidingPolicy(40), true}, {slidingPolicy(8), true},
		{two, true}} {
		p := c.p
		k := short.keys.Key("slide", fmt.Sprintf("random-%d", i))
		sub := nowSubWindows(p)
		seq := map[string]uint64{}
		own := map[string]bool{}              // by producer and sub-window: what its last grant there said (Grant.Own)
		granted := map[string]map[int]int64{} // by producer and sub-window: held
		for op := range 120 {
			now := op / 12 // the sub-window the shard's clock is in
			for _, e := range []*env{short, long} {
				e.clock.Set(sub(now))
			}
			producer := "edge-a"
			if r := rnd.IntN(40); r == 0 && c.others {
				producer = "edge-b"
			} else if r == 1 && c.others {
				producer = "edge-c"
			}
			at := now + rnd.IntN(3) - 1 // the producer's clock
			if at < 0 || rnd.IntN(3) > 0 {
				at = now
			}
			held := granted[producer]
			if held == nil {
				held = map[int]int64{}
				granted[producer] = held
			}
			switch r := rnd.IntN(40); {
			case r < 28:
				need := 1 + rnd.Int64N(3)
				want := need + rnd.Int64N(min(10, p.Limit/2))
				a := slideArgs(p, sub(at), producer, need, want)
				mine := fmt.Sprint(producer, at)
				a.Own = own[mine] // as an edge asks: the record alone after a grant that said so
				gs, err := short.store.Take(ctx, k, sub(at), a)
				require.NoError(t, err)
				gl, err := long.store.Take(ctx, k, sub(at), a)
				require.NoError(t, err)
				own[mine] = gs.Own
				if a.Own {
					alone++
				}
				require.False(t, gl.Own, "take.lua keeps no span record")
				gs.Own = false // a hint to the caller, not the decision
				require.Equal(t, gl, gs, "case %d op %d: the grant", i, op)
				held[at] += gs.Granted
			case r < 39:
				kind := []limiter.EventKind{limiter.Charge, limiter.Release, limiter.Refund}[rnd.IntN(3)]
				j := at - rnd.IntN(p.Slices)
				if j < 0 {
					j = at
				}
				if held[j] == 0 {
					continue // (a charge to a sub-window the shard does not hold opens it full)
				}
				units := 1 + rnd.Int64N(4)
				if kind != limiter.Charge {
					units = 1 + rnd.Int64N(held[j])
				}
				seq[producer]++
				ev := limiter.Event{Producer: producer, Seq: seq[producer], Kind: kind, Key: k, ResetAt: p.WindowAt(sub(j)).ResetAt,
					Start: sub(j), Window: p.Window, Units: units, Slices: p.Slices}
				var out [2]limiter.Result
				for n, e := range []*env{short, long} {
					out[n] = e.apply(t, ev)[0]
				}
				require.Equal(t, out[1], out[0], "case %d op %d: the %v", i, op, kind)
				if out[0].Outcome == limiter.Applied {
					if kind == limiter.Charge {
						held[j] += units
					} else {
						held[j] -= out[0].Amount
					}
				}
			default:
				if held[at] == 0 || !c.others {
					continue
				}
				fa := limiter.FinishArgs{ResetAt: p.WindowAt(sub(at)).ResetAt, Start: sub(at), Window: p.Window, Producer: producer,
					Holder: producer + ".1", N: uint64(op), Units: 1, Status: 304, Back: 1, Slices: p.Slices}
				var out [2]limiter.FinishResult
				for n, e := range []*env{short, long} {
					r, err := e.store.Finish(ctx, k, e.clock.Now(), fa)
					require.NoError(t, err)
					out[n] = r
				}
				require.Equal(t, out[1], out[0], "case %d op %d: the finish", i, op)
				held[at] -= out[0].Amount
			}
			// What every span holds, read the same on both, once a
			// sub-window.
			for _, j := range []int{now - 1, now, now + 1} {
				if j < 0 || op%12 != 11 {
					continue
				}
				a := slideArgs(p, sub(j), "reader", 0, 0)
				gs, err := short.store.Take(ctx, k, sub(j), a)
				require.NoError(t, err)
				gl, err := long.store.Take(ctx, k, sub(j), a)
				require.NoError(t, err)
				require.Equal(t, gl.Used, gs.Used, "case %d op %d: the count at sub-window %d", i, op, j)
			}
		}
	}
	made, handedOn := short.store.ShortTakes()
	t.Logf("slide.lua made %d takes and handed %d on; %d sent the record alone", made, handedOn, alone)
	require.Greater(t, alone, int(made)/3, "takes that sent the record alone")
	require.Positive(t, handedOn)
}
