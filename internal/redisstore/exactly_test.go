package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// Invariants 5 and 6: charge at start, refund on 304, every event at most
// once whatever is redelivered, republished or retried, with memory that
// does not grow with the number of events.
func TestExactlyOnce(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	var n atomic.Int64
	// producer returns a fresh producer id: each subtest numbers from 1.
	producer := func() string { return fmt.Sprintf("p%d", n.Add(1)) }
	reset := t0.Truncate(time.Second).Add(minute) // what a window opened at t0 shows
	A, D, L, N, P := limiter.Applied, limiter.Duplicate, limiter.Late, limiter.Netted, limiter.Pending

	t.Run("an event applied twice takes effect once", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		r := e.apply(t, charge(p, 1, k, reset, t0, 3))
		require.Equal(t, A, r[0].Outcome)
		require.EqualValues(t, 3, r[0].Amount)
		require.EqualValues(t, 3, r[0].Used)
		require.Equal(t, reset, r[0].ResetAt)
		r = e.apply(t, charge(p, 1, k, reset, t0, 3))
		require.Equal(t, D, r[0].Outcome)
		require.Zero(t, r[0].Amount)
		require.EqualValues(t, 3, e.used(t, k))
	})
	t.Run("a run applied again after a crash between Redis and the ack", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		run := []limiter.Event{charge(p, 1, k, reset, t0, 1), charge(p, 2, k, reset, t0, 1), refund(p, 3, k, reset, t0, 1, p, 1)}
		require.Equal(t, []limiter.Outcome{A, A, A}, outcomes(e.apply(t, run...)))
		run = append(run, charge(p, 4, k, reset, t0, 5))
		require.Equal(t, []limiter.Outcome{D, D, D, A}, outcomes(e.apply(t, run...)))
		require.EqualValues(t, 6, e.used(t, k))
	})
	t.Run("producers are numbered independently", func(t *testing.T) {
		k, p1, p2 := e.keys.Key("core", t.Name()), producer(), producer()
		require.Equal(t, []limiter.Outcome{A, A, D}, outcomes(e.apply(t,
			charge(p1, 1, k, reset, t0, 1), charge(p2, 1, k, reset, t0, 1), charge(p1, 1, k, reset, t0, 1))))
		require.EqualValues(t, 2, e.used(t, k))
	})
	t.Run("events out of order are applied once each", func(t *testing.T) {
		// Batch 3-4 arrives before 1-2 (an edge applied a batch itself while
		// an earlier one waited in the stream): the numbers it skipped are
		// remembered as a gap and still applied when they come.
		k, p := e.keys.Key("core", t.Name()), producer()
		require.Equal(t, []limiter.Outcome{A, A}, outcomes(e.apply(t, charge(p, 3, k, reset, t0, 1), charge(p, 4, k, reset, t0, 1))))
		require.Equal(t, []limiter.Outcome{A, A, D}, outcomes(e.apply(t,
			charge(p, 1, k, reset, t0, 1), charge(p, 2, k, reset, t0, 1), charge(p, 3, k, reset, t0, 1))))
		require.Equal(t, []limiter.Outcome{D, D, D, D, A}, outcomes(e.apply(t,
			charge(p, 1, k, reset, t0, 1), charge(p, 2, k, reset, t0, 1), charge(p, 3, k, reset, t0, 1), charge(p, 4, k, reset, t0, 1),
			charge(p, 5, k, reset, t0, 1))))
		require.EqualValues(t, 5, e.used(t, k))
		// A gap in the middle: 7 and 9 first, then 8 and 6.
		require.Equal(t, []limiter.Outcome{A, A, A, A}, outcomes(e.apply(t,
			charge(p, 7, k, reset, t0, 1), charge(p, 9, k, reset, t0, 1), charge(p, 8, k, reset, t0, 1), charge(p, 6, k, reset, t0, 1))))
		require.Equal(t, []limiter.Outcome{D, D, D, D}, outcomes(e.apply(t,
			charge(p, 6, k, reset, t0, 1), charge(p, 7, k, reset, t0, 1), charge(p, 8, k, reset, t0, 1), charge(p, 9, k, reset, t0, 1))))
		require.EqualValues(t, 9, e.used(t, k))
		g, err := rdb.HGet(ctx, e.keys.ProducerKey(p), "g").Result()
		require.NoError(t, err)
		require.Equal(t, "0", g, "every gap filled and forgotten")
	})
	t.Run("a refund of a charge still in a gap waits for it", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		e.apply(t, charge(p, 2, k, reset, t0, 3)) // 1 is a gap
		require.Equal(t, P, e.apply(t, refund(p, 3, k, reset, t0, 3, p, 1))[0].Outcome)
		require.EqualValues(t, 3, e.used(t, k))
		require.Equal(t, N, e.apply(t, charge(p, 1, k, reset, t0, 3))[0].Outcome)
		require.EqualValues(t, 3, e.used(t, k))
	})
	t.Run("gaps are bounded", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		for i := range uint64(70) { // 70 gaps of one number each
			e.apply(t, charge(p, 2*i+2, k, reset, t0, 1))
		}
		g, err := rdb.HGet(ctx, e.keys.ProducerKey(p), "g").Result()
		require.NoError(t, err)
		require.Equal(t, "64", g)
		// The oldest six were forgotten: their numbers count as applied.
		require.Equal(t, []limiter.Outcome{D, A}, outcomes(e.apply(t, charge(p, 1, k, reset, t0, 1), charge(p, 139, k, reset, t0, 1))))
		n, err := rdb.HLen(ctx, e.keys.ProducerKey(p)).Result()
		require.NoError(t, err)
		require.LessOrEqual(t, n, int64(3+64))
	})
	t.Run("the refund of a reservation: its window only, while live, never below zero", func(t *testing.T) {
		defer e.clock.Set(t0)
		k, p := e.keys.Key("core", t.Name()), producer()
		g := e.takeAs(t, p, k, 100, 5, 5)
		require.Equal(t, reset, g.ResetAt)
		r := e.apply(t, refund(p, 1, k, g.ResetAt, t0, 2, "", 0))
		require.Equal(t, A, r[0].Outcome)
		require.EqualValues(t, 2, r[0].Amount)
		require.EqualValues(t, 3, r[0].Used)
		// An operator lowered the count by hand: a refund stops at zero.
		v, err := rdb.Get(ctx, k.String()).Result()
		require.NoError(t, err, "the producer's refund keeps its window compact")
		require.NoError(t, rdb.Set(ctx, k.String(), "1"+v[strings.IndexByte(v, ':'):], redis.KeepTTL).Err())
		r = e.apply(t, refund(p, 2, k, g.ResetAt, t0, 2, "", 0))
		require.Equal(t, A, r[0].Outcome)
		require.EqualValues(t, 1, r[0].Amount)
		require.Zero(t, e.used(t, k))
		// A refund for a window that has ended, or been replaced, is late.
		e.clock.Set(g.ResetAt)
		require.Equal(t, L, e.apply(t, refund(p, 3, k, g.ResetAt, t0, 1, "", 0))[0].Outcome)
		g2 := e.take(t, k, 100, 4, 4)
		require.True(t, g2.Opened)
		require.Equal(t, L, e.apply(t, refund(p, 4, k, g.ResetAt, t0, 1, "", 0))[0].Outcome)
		require.EqualValues(t, 4, e.used(t, k), "the next window is untouched")
	})
	t.Run("a refund before its charge nets to zero", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		e.apply(t, charge(p, 1, k, reset, t0, 1))
		r := e.apply(t, refund(p, 3, k, reset, t0, 5, p, 2))
		require.Equal(t, P, r[0].Outcome)
		require.EqualValues(t, 1, e.used(t, k), "nothing given back before the charge")
		require.Equal(t, []limiter.Outcome{N, A}, outcomes(e.apply(t,
			charge(p, 2, k, reset, t0, 5), charge(p, 4, k, reset, t0, 1))))
		require.EqualValues(t, 2, e.used(t, k))
		require.Equal(t, []limiter.Outcome{D, D}, outcomes(e.apply(t,
			charge(p, 2, k, reset, t0, 5), refund(p, 3, k, reset, t0, 5, p, 2))))
		require.EqualValues(t, 2, e.used(t, k))
		// The marker is gone once it has netted.
		pk := fmt.Sprint(rdb.Keys(ctx, "tally:producer:*").Val())
		require.NotContains(t, pk, "n:")
	})
	t.Run("a refund of a charge that was applied gives it back", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		e.apply(t, charge(p, 1, k, reset, t0, 3))
		r := e.apply(t, refund(p, 2, k, reset, t0, 3, p, 1))
		require.Equal(t, A, r[0].Outcome)
		require.Zero(t, e.used(t, k))
	})
	t.Run("no refund without a charge", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		e.apply(t, charge(p, 1, k, reset, t0, 4))
		// The refund names charge 9, which never came: it waits, and gives
		// nothing back.
		require.Equal(t, P, e.apply(t, refund(p, 10, k, reset, t0, 4, p, 9))[0].Outcome)
		require.EqualValues(t, 4, e.used(t, k))
	})
	t.Run("a producer gives back only what it holds in the window", func(t *testing.T) {
		// The attack: a producer with no charge in a window sends refunds
		// and releases of "reservations" with the window's reset, to empty
		// it. It holds nothing there, so nothing comes back.
		k, victim, attacker := e.keys.Key("core", t.Name()), producer(), producer()
		g := e.takeAs(t, victim, k, 100, 60, 60)
		e.apply(t, charge(victim, 1, k, g.ResetAt, t0, 30))
		r := e.apply(t, refund(attacker, 1, k, g.ResetAt, t0, 90, "", 0), release(attacker, 2, k, g.ResetAt, 90))
		require.Equal(t, []limiter.Outcome{A, A}, outcomes(r))
		require.Zero(t, r[0].Amount+r[1].Amount, "nothing given back")
		require.EqualValues(t, 90, e.used(t, k))
		// A producer that charged 5 gives back at most 5, however it asks.
		e.apply(t, charge(attacker, 3, k, g.ResetAt, t0, 5))
		r = e.apply(t, refund(attacker, 4, k, g.ResetAt, t0, 5, attacker, 3), refund(attacker, 5, k, g.ResetAt, t0, 5, attacker, 3),
			release(attacker, 6, k, g.ResetAt, 50))
		require.EqualValues(t, []int64{5, 0, 0}, []int64{r[0].Amount, r[1].Amount, r[2].Amount})
		require.EqualValues(t, 90, e.used(t, k))
		// The victim's own release and refund still work.
		r = e.apply(t, release(victim, 2, k, g.ResetAt, 60), refund(victim, 3, k, g.ResetAt, t0, 30, victim, 1))
		require.EqualValues(t, []int64{60, 30}, []int64{r[0].Amount, r[1].Amount})
		require.Zero(t, e.used(t, k))
	})
	t.Run("a refund names an earlier charge of its own producer", func(t *testing.T) {
		k, p, q := e.keys.Key("core", t.Name()), producer(), producer()
		for name, ev := range map[string]limiter.Event{
			"another producer's charge": refund(q, 2, k, reset, t0, 1, p, 1),
			"a later charge":            refund(p, 2, k, reset, t0, 1, p, 3),
			"itself":                    refund(p, 2, k, reset, t0, 1, p, 2),
		} {
			res, err := e.store.Apply(ctx, 0, e.clock.Now(), []limiter.Event{ev})
			require.NoError(t, err)
			require.ErrorIs(t, res.Results[0].Err, limiter.ErrInvalidArgument, name)
		}
	})
	t.Run("a release gives back unused reservations of its window", func(t *testing.T) {
		defer e.clock.Set(t0)
		k, p := e.keys.Key("core", t.Name()), producer()
		g := e.takeAs(t, p, k, 10, 10, 10)
		require.EqualValues(t, 10, g.Granted)
		require.Zero(t, e.takeAs(t, p, k, 10, 1, 1).Granted, "full")
		r := e.apply(t, release(p, 1, k, g.ResetAt, 4))
		require.Equal(t, A, r[0].Outcome)
		require.EqualValues(t, 6, r[0].Used)
		require.EqualValues(t, 4, e.takeAs(t, p, k, 10, 1, 10).Granted, "room again")
		e.clock.Set(g.ResetAt)
		require.Equal(t, L, e.apply(t, release(p, 2, k, g.ResetAt, 4))[0].Outcome)
	})
	t.Run("a charge by reset opens the window its response showed", func(t *testing.T) {
		// The primary lost the window (a restart without persistence): the
		// charge recreates it with the reset the client was shown.
		k, p := e.keys.Key("core", t.Name()), producer()
		r := e.apply(t, charge(p, 1, k, reset, t0, 2))
		require.Equal(t, A, r[0].Outcome)
		require.Equal(t, reset, r[0].ResetAt)
		g := e.take(t, k, 100, 1, 1)
		require.False(t, g.Opened)
		require.Equal(t, reset, g.ResetAt)
		require.EqualValues(t, 3, g.Used)
	})
	t.Run("a charge for a replaced or ended window is late", func(t *testing.T) {
		defer e.clock.Set(t0)
		k, p := e.keys.Key("core", t.Name()), producer()
		g := e.take(t, k, 100, 1, 1)
		e.clock.Set(g.ResetAt.Add(time.Second))
		require.True(t, e.take(t, k, 100, 1, 1).Opened)
		require.Equal(t, []limiter.Outcome{L, L}, outcomes(e.apply(t,
			charge(p, 1, k, g.ResetAt, t0, 1),                           // replaced
			charge(p, 2, k, g.ResetAt.Add(-minute), t0.Add(-minute), 1), // long over
		)))
		require.EqualValues(t, 1, e.used(t, k))
	})
	t.Run("a late event is not charged into the next window", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		r := e.apply(t, charge(producerOf(t), 1, k, time.Time{}, t0, 1))
		require.Equal(t, A, r[0].Outcome)
		e.clock.Set(r[0].ResetAt.Add(time.Second))
		q := producerOf(t) + "b"
		require.Equal(t, []limiter.Outcome{A, L, L}, outcomes(e.apply(t,
			charge(q, 1, k, time.Time{}, e.clock.Now(), 1),
			// started in the first window, reaches the primary now
			charge(q, 2, k, time.Time{}, t0.Add(30*time.Second), 1),
			// before the new window by less than the skew tolerance, but
			// inside the old one: still late
			charge(q, 3, k, time.Time{}, r[0].ResetAt.Add(-500*time.Millisecond), 1),
		)))
		require.EqualValues(t, 1, e.used(t, k))
	})
	t.Run("an old event on an empty key is late", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		e.clock.Set(t0.Add(90 * time.Second))
		// Its window would have ended 30 s ago: nothing to open. A window
		// that held it may have been garbage collected (grace 60 s).
		require.Equal(t, L, e.apply(t, charge(producerOf(t), 1, k, time.Time{}, t0, 1))[0].Outcome)
		n, err := rdb.Exists(ctx, k.String()).Result()
		require.NoError(t, err)
		require.Zero(t, n)
	})
	t.Run("a start from a clock that runs ahead is clamped to now", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		r := e.apply(t, charge(producerOf(t), 1, k, time.Time{}, t0.Add(time.Hour), 1))
		require.Equal(t, A, r[0].Outcome)
		require.Equal(t, reset, r[0].ResetAt)
	})
	t.Run("a start within the skew tolerance before its window counts in it", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producerOf(t)
		g := e.take(t, k, 100, 1, 1)
		require.Equal(t, []limiter.Outcome{A, L}, outcomes(e.apply(t,
			charge(p, 1, k, time.Time{}, g.Start.Add(-1500*time.Millisecond), 1),
			charge(p, 2, k, time.Time{}, g.Start.Add(-2500*time.Millisecond), 1), // beyond the 2 s tolerance
		)))
	})
	t.Run("memory does not grow with events", func(t *testing.T) {
		k, p := e.keys.Key("core", t.Name()), producer()
		var run []limiter.Event
		for i := range uint64(1000) {
			run = append(run, charge(p, i+1, k, reset, t0, 1))
		}
		e.apply(t, run...)
		e.apply(t, run...)
		require.EqualValues(t, 1000, e.used(t, k))
		n, err := rdb.HLen(ctx, k.String()).Result()
		require.NoError(t, err)
		require.EqualValues(t, 5, n, "the window holds u, s, r, p, what its one producer holds, and nothing per event")
		keys, err := rdb.Keys(ctx, "tally:producer:*").Result()
		require.NoError(t, err)
		for _, pk := range keys {
			n, err := rdb.HLen(ctx, pk).Result()
			require.NoError(t, err)
			require.LessOrEqual(t, n, int64(3+64), "a producer hash holds its sequence, its gaps and pending markers")
			ttl, err := rdb.PTTL(ctx, pk).Result()
			require.NoError(t, err)
			require.Greater(t, ttl, 24*time.Hour, "producer hashes expire")
		}
	})
}

// producerOf names a producer after the test, in the characters producer
// ids allow.
func producerOf(t *testing.T) string {
	out := make([]byte, 0, len(t.Name()))
	for i := 0; i < len(t.Name()) && len(out) < 60; i++ {
		c := t.Name()[i]
		if limiter.ValidProducer(string(c)) {
			out = append(out, c)
		}
	}
	return string(out)
}

// Invariant 6 under concurrency: the same runs applied at once by several
// callers (two accountants, an edge applying directly, go-redis retries)
// take effect once; 16 producers × 500 events give exactly 8,000.
func TestConcurrentApplyIsExactlyOnce(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "hot")
	reset := t0.Truncate(time.Second).Add(minute)
	var applied atomic.Int64
	var wg sync.WaitGroup
	for p := range 16 {
		producer := fmt.Sprintf("edge-%d", p)
		var run []limiter.Event
		for i := range uint64(500) {
			run = append(run, charge(producer, i+1, k, reset, t0, 1))
		}
		for range 3 { // three callers apply every producer's events
			wg.Go(func() {
				for from := 0; from < len(run); from += 50 {
					res, err := e.store.Apply(ctx, 0, e.clock.Now(), run[from:min(from+100, len(run))])
					require.NoError(t, err)
					for _, r := range res.Results {
						if r.Outcome == limiter.Applied {
							applied.Add(r.Amount)
						}
					}
				}
			})
		}
	}
	wg.Wait()
	require.EqualValues(t, 8000, applied.Load())
	require.EqualValues(t, 8000, e.used(t, k))
}

// A named run sent again is told what each of its script calls did, also
// when the first answer was lost: the primary froze past the read timeout
// and then ran the call. The events still take effect once; a run number
// reused for other events is refused, and nothing runs.
func TestRunSentAgainIsToldWhatItDid(t *testing.T) {
	e := newEnv(t, redisstore.Options{ScriptEvents: 2, ReadTimeout: 200 * time.Millisecond})
	ctx := context.Background()
	reset := t0.Truncate(time.Second).Add(minute)
	k := e.keys.Key("core", "lost")
	A, D, N, P := limiter.Applied, limiter.Duplicate, limiter.Netted, limiter.Pending
	e.apply(t, charge("edge-a", 1, k, reset, t0, 5))
	evs := []limiter.Event{ // two script calls of two events
		refund("edge-a", 2, k, reset, t0, 1, "edge-a", 1), charge("edge-a", 3, k, reset, t0, 2),
		refund("edge-a", 6, k, reset, t0, 1, "edge-a", 5), // before its charge
		charge("edge-a", 5, k, reset, t0, 1),
	}
	run := limiter.Run{Caller: "accountant-1", Seq: 41}

	e.primary.Pause()
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err := e.store.ApplyRun(short, 0, e.clock.Now(), run, evs)
	cancel()
	require.Error(t, err, "the primary is frozen")
	e.primary.Resume()
	// The frozen primary ran the first call when it woke (its socket held
	// it): 5 - 1 + 2.
	require.Eventually(t, func() bool { return e.used(t, k) == 6 }, 5*time.Second, 20*time.Millisecond)
	// The run sent again learns what that call did, and runs the rest.
	res, err := e.store.ApplyRun(ctx, 0, e.clock.Now(), run, evs)
	require.NoError(t, err)
	require.Equal(t, []limiter.Outcome{A, A, P, N}, outcomes(res.Results))
	require.EqualValues(t, []int64{4, 6, 0, 0}, []int64{res.Results[0].Used, res.Results[1].Used, res.Results[2].Used, res.Results[3].Used})
	require.EqualValues(t, 6, e.used(t, k))

	// Sent again once more: the same answer, nothing applied twice.
	again, err := e.store.ApplyRun(ctx, 0, e.clock.Now(), run, evs)
	require.NoError(t, err)
	require.Equal(t, res.Results, again.Results)
	require.EqualValues(t, 6, e.used(t, k))

	// Without a run (or as another run), the same events are duplicates.
	require.Equal(t, []limiter.Outcome{D, D, D, D}, outcomes(e.apply(t, evs...)))
	other, err := e.store.ApplyRun(ctx, 0, e.clock.Now(), limiter.Run{Caller: "accountant-1", Seq: 42}, evs)
	require.NoError(t, err)
	require.Equal(t, []limiter.Outcome{D, D, D, D}, outcomes(other.Results))

	// Run 42's number reused for events of another count: refused, nothing
	// changes.
	_, err = e.store.ApplyRun(ctx, 0, e.clock.Now(), limiter.Run{Caller: "accountant-1", Seq: 42},
		[]limiter.Event{charge("edge-a", 7, k, reset, t0, 1)})
	require.ErrorIs(t, err, limiter.ErrInvalidArgument)
	require.EqualValues(t, 6, e.used(t, k))

	_, err = e.store.ApplyRun(ctx, 0, e.clock.Now(), limiter.Run{Caller: "a b", Seq: 1}, evs)
	require.ErrorIs(t, err, limiter.ErrInvalidArgument, "a caller id that cannot name a key")
}
