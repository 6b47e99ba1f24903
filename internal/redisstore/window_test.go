package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// Invariant 1: every response of one window shows the same reset time, from
// its first request to its last, on every edge, and the reset is stored
// beside the count, never derived from a TTL.
func TestStableReset(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	behind := t0.Add(-700 * time.Millisecond) // a second edge's clock

	// The first request opens the window on the primary; the second edge
	// races it with a clock 700 ms behind and gets the same window.
	g := e.take(t, k, 1000, 1, 1)
	require.True(t, g.Opened)
	wantReset := t0.Truncate(time.Second).Add(minute)
	require.Equal(t, wantReset, g.ResetAt)
	g2, err := e.store.Take(ctx, k, behind, limiter.TakeArgs{Window: minute, Limit: 1000, Need: 1, Want: 5, Producer: "edge-b"})
	require.NoError(t, err)
	require.False(t, g2.Opened)
	require.Equal(t, wantReset, g2.ResetAt)
	require.EqualValues(t, 6, g2.Used)

	// Through the window, to its last millisecond, on both edges and on the
	// replica: the same reset.
	for _, off := range []time.Duration{time.Millisecond, time.Second, 30 * time.Second, 59*time.Second + 699*time.Millisecond} {
		e.clock.Set(t0.Add(off))
		g := e.take(t, k, 1000, 1, 1)
		require.False(t, g.Opened, "at +%v", off)
		require.Equal(t, wantReset, g.ResetAt, "at +%v", off)
		w := e.checkReplica(t, k)
		require.True(t, w.Live)
		require.Equal(t, wantReset, w.ResetAt, "replica at +%v", off)
	}
	// The key's TTL is garbage collection only, a grace past the reset: a
	// different TTL changes nothing anyone reads.
	at, err := e.primary.Client().PExpireTime(ctx, k.String()).Result()
	require.NoError(t, err)
	require.Equal(t, wantReset.Add(60*time.Second).UnixMilli(), at.Milliseconds())
	require.NoError(t, e.primary.Client().PExpire(ctx, k.String(), time.Hour).Err())
	require.Equal(t, wantReset, e.take(t, k, 1000, 1, 1).ResetAt)

	// At the reset the next window opens, with its own stable reset.
	e.clock.Set(wantReset)
	g = e.take(t, k, 1000, 1, 1)
	require.True(t, g.Opened)
	require.EqualValues(t, 1, g.Used)
	require.Equal(t, wantReset.Add(minute), g.ResetAt)
}

// Invariant 2: a window whose reset has passed reads as absent everywhere,
// although Redis still holds it.
func TestStaleWindowReadsAbsent(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	g := e.take(t, k, 100, 5, 5)
	e.replica.WaitSynced(e.primary)
	for _, at := range []time.Time{g.ResetAt, g.ResetAt.Add(time.Second)} {
		e.clock.Set(at)
		n, err := e.primary.Client().Exists(ctx, k.String()).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the key is still present")
		w, err := e.store.Check(ctx, k)
		require.NoError(t, err)
		assert.False(t, w.Live, "replica at %v", at)
		require.Zero(t, e.used(t, k), "primary at %v", at)
	}

	// A replica cut off from its primary keeps the old window; the primary
	// moves on to a new one. The replica's read must not report the old
	// count.
	e.clock.Set(t0.Add(10 * time.Second))
	require.EqualValues(t, 12, e.take(t, k, 100, 7, 7).Used)
	e.replica.WaitSynced(e.primary)
	require.NoError(t, e.replica.Client().Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
	e.clock.Set(g.ResetAt.Add(5 * time.Second))
	g2 := e.take(t, k, 100, 1, 1)
	require.True(t, g2.Opened)
	require.EqualValues(t, 1, g2.Used, "a new window on the primary")
	raw, err := e.replica.Client().HGet(ctx, k.String(), "u").Result()
	require.NoError(t, err)
	require.Equal(t, "12", raw, "the replica still holds the old window")
	w, err := e.store.Check(ctx, k)
	require.NoError(t, err)
	assert.False(t, w.Live, "the lagging replica's old window reads as absent")
}

// Invariant 4: a request of cost c is allowed iff used + c <= limit, by the
// reservation on the primary.
func TestBoundary(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	for _, limit := range []int64{1, 2, 100} {
		for _, used := range []int64{limit - 1, limit, limit + 1} {
			for _, cost := range []int64{1, 2, 3} {
				if cost > limit {
					continue
				}
				name := fmt.Sprintf("limit=%d/used=%d/cost=%d", limit, used, cost)
				t.Run(name, func(t *testing.T) {
					k := e.keys.Key("core", name)
					p := limiter.Policy{Name: "core", Limit: limit, Window: minute, Cost: cost}
					require.NoError(t, p.Validate())
					// Fill the window to used: open it, then charge (a charge
					// may pass the limit; a reservation never does).
					g := e.takeAs(t, "fill", k, limit, 1, 1)
					if used > 1 {
						e.apply(t, charge("fill", fillSeq.Add(1), k, g.ResetAt, t0, used-1))
					}
					if used == 0 {
						e.apply(t, release("fill", fillSeq.Add(1), k, g.ResetAt, 1))
					}
					w := e.checkReplica(t, k)
					require.Equal(t, used, w.Used)

					r := e.take(t, k, limit, cost, cost)
					if used+cost <= limit {
						require.Equal(t, cost, r.Granted)
						require.Equal(t, used+cost, r.Used)
					} else {
						require.Zero(t, r.Granted)
						require.Equal(t, used, r.Used, "a refused reservation changes nothing")
					}
				})
			}
		}
	}
}

// fillSeq numbers the events of the producer that fills windows in tests.
var fillSeq atomic.Uint64

// Reservations grant as much as is left between need and want, and never
// more than the limit, whatever the concurrency: 64 callers wanting random
// amounts from one window of 1,000 get exactly 1,000 between them.
func TestTakeNeverPastLimit(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "hot")

	g := e.take(t, k, 10, 3, 8)
	require.EqualValues(t, 8, g.Granted)
	g = e.take(t, k, 10, 1, 8)
	require.EqualValues(t, 2, g.Granted, "what is left, at least need")
	g = e.take(t, k, 10, 1, 1)
	require.Zero(t, g.Granted)
	require.EqualValues(t, 10, g.Used)

	hot := e.keys.Key("core", "hotter")
	var granted, opened atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := 0; ; j++ {
				need := int64(1 + (i+j)%3)
				g, err := e.store.Take(ctx, hot, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Need: need, Want: need + int64(j%20), Producer: "edge-a"})
				require.NoError(t, err)
				if g.Opened {
					opened.Add(1)
				}
				require.LessOrEqual(t, g.Used, int64(1000))
				if g.Granted == 0 {
					return
				}
				granted.Add(g.Granted)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 1000, granted.Load())
	require.EqualValues(t, 1, opened.Load(), "concurrent first requests open the window once")
	require.EqualValues(t, 1000, e.used(t, hot))
}

// The window counts every unit reserved for each holder, so that a holder
// whose answer was lost learns from its next call, or a read, what it got.
func TestTakeCountsWhatEachHolderGot(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	k := e.keys.Key("core", "holders")
	take := func(holder string, need, want int64) limiter.Grant {
		t.Helper()
		g, err := e.store.Take(context.Background(), k, e.clock.Now(),
			limiter.TakeArgs{Window: minute, Limit: 100, Need: need, Want: want, Producer: "edge-a", Holder: holder})
		require.NoError(t, err)
		return g
	}
	require.EqualValues(t, 5, take("edge-a.1", 1, 5).Mine)
	require.EqualValues(t, 3, take("edge-a.2", 3, 3).Mine, "each holder its own count")
	require.EqualValues(t, 12, take("edge-a.1", 7, 7).Mine)
	read := take("edge-a.1", 0, 0)
	require.EqualValues(t, 0, read.Granted)
	require.EqualValues(t, 12, read.Mine, "a read tells too")
	require.EqualValues(t, 15, read.Used)
	g, err := e.store.Take(context.Background(), k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 100, Producer: "edge-b", Holder: "edge-b.1"})
	require.NoError(t, err)
	require.EqualValues(t, 0, g.Mine)
	e.clock.Advance(minute + time.Second) // a new window counts from zero
	require.EqualValues(t, 2, take("edge-a.1", 2, 2).Mine)
	for _, holder := range []string{"g x", "edge-b.1", "edge-ab"} { // not an id; another producer's
		_, err = e.store.Take(context.Background(), k, e.clock.Now(),
			limiter.TakeArgs{Window: minute, Limit: 100, Need: 1, Want: 1, Producer: "edge-a", Holder: holder})
		require.ErrorIs(t, err, limiter.ErrInvalidArgument, holder)
	}
}

// A reservation leaves room for what its caller already admitted and
// charged by events the primary has not applied (mode async): those count
// as used until they are applied, and then are in the count itself.
func TestTakeLeavesRoomForWhatIsOwed(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "owed")
	take := func(need, want int64, owed ...limiter.Owed) limiter.Grant {
		t.Helper()
		g, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 5, Need: need, Want: want,
			Producer: "edge-o", Owed: owed})
		require.NoError(t, err)
		return g
	}
	g := take(1, 1)
	owed := []limiter.Owed{{Seq: 1, Units: 2}, {Seq: 2, Units: 1}}
	g = take(1, 5, owed...)
	require.EqualValues(t, 1, g.Granted, "5 - 1 used - 3 owed")
	require.Zero(t, take(1, 1, owed...).Granted, "nothing left")
	// Event 2 is applied first (a gap at 1): only what is beyond the
	// applied prefix counts, so event 2's unit counts twice, never zero times.
	e.apply(t, charge("edge-o", 2, k, g.ResetAt, t0, 1))
	g = take(0, 0, owed...)
	require.Zero(t, g.Applied, "event 1 is still missing")
	e.apply(t, charge("edge-o", 1, k, g.ResetAt, t0, 2))
	g = take(0, 0, owed...)
	require.EqualValues(t, 2, g.Applied)
	require.EqualValues(t, 5, g.Used)
	require.Zero(t, take(1, 1, owed...).Granted, "applied now, and full")
}
