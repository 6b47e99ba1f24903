package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// A decision-API request is finished once: its first finish, on any edge,
// is recorded and gives a 304's charge back; every later finish changes
// nothing. A refund never gives back more than the request was charged,
// more than its producer holds in the window, nor moves the reset.
func TestFinishOnce(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	finish := func(t *testing.T, k limiter.Key, a limiter.FinishArgs) limiter.FinishResult {
		t.Helper()
		r, err := e.store.Finish(ctx, k, e.clock.Now(), a)
		require.NoError(t, err)
		return r
	}
	args := func(g limiter.Grant, producer string, n uint64, status int, units int64) limiter.FinishArgs {
		a := limiter.FinishArgs{ResetAt: g.ResetAt, Start: e.clock.Now(), Window: minute, Producer: producer,
			Holder: producer + ".1", N: n, Units: units, Status: status}
		if status == 304 {
			a.Back = units
		}
		return a
	}

	t.Run("a 304 is refunded once, whoever sends it again", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 10, 10)
		r := finish(t, k, args(g, "edge-a", 0, 304, 1))
		require.Equal(t, limiter.Finished, r.Outcome)
		require.EqualValues(t, 1, r.Amount)
		require.EqualValues(t, 9, r.Used)
		require.Equal(t, g.ResetAt, r.ResetAt, "the reset does not move")
		for range 3 {
			require.Equal(t, limiter.AlreadyFinished, finish(t, k, args(g, "edge-a", 0, 304, 1)).Outcome)
		}
		require.EqualValues(t, 9, e.used(t, k))
		// Another request of the same holder is its own.
		require.Equal(t, limiter.Finished, finish(t, k, args(g, "edge-a", 1, 304, 1)).Outcome)
		require.EqualValues(t, 8, e.used(t, k))
		w := e.checkReplica(t, k)
		require.Equal(t, g.ResetAt, w.ResetAt)
	})
	t.Run("a true-up gives back what an estimate charged beyond the actual cost, once", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 10, 10) // an estimate of 10
		a := args(g, "edge-a", 0, 200, 10)
		a.Back = 7 // the request cost 3
		r := finish(t, k, a)
		require.Equal(t, limiter.Finished, r.Outcome)
		require.EqualValues(t, 7, r.Amount)
		require.EqualValues(t, 3, r.Used)
		require.Equal(t, limiter.AlreadyFinished, finish(t, k, a).Outcome)
		require.EqualValues(t, 3, e.used(t, k))
		a.Back = 11
		_, err := e.store.Finish(ctx, k, e.clock.Now(), a)
		require.ErrorIs(t, err, limiter.ErrInvalidArgument, "never more than the request was charged")
	})
	t.Run("a finish with another status is recorded too", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 10, 10)
		r := finish(t, k, args(g, "edge-a", 0, 200, 1))
		require.Equal(t, limiter.Finished, r.Outcome)
		require.Zero(t, r.Amount)
		require.Equal(t, limiter.AlreadyFinished, finish(t, k, args(g, "edge-a", 0, 304, 1)).Outcome,
			"a request that finished with 200 cannot be refunded later")
		require.EqualValues(t, 10, e.used(t, k))
	})
	t.Run("never more than its producer holds in the window", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 3, 3)
		e.takeAs(t, "edge-b", k, 100, 50, 50)
		r := finish(t, k, args(g, "edge-a", 0, 304, 10))
		require.EqualValues(t, 3, r.Amount, "edge-a holds 3")
		require.EqualValues(t, 50, r.Used)
		require.Zero(t, finish(t, k, args(g, "edge-a", 1, 304, 10)).Amount)
		require.EqualValues(t, 50, e.used(t, k), "edge-b's units stay")
	})
	t.Run("after the reset there is nothing to finish", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 5, 5)
		a := args(g, "edge-a", 0, 304, 1)
		e.clock.Set(g.ResetAt)
		require.Equal(t, limiter.FinishLate, finish(t, k, a).Outcome)
		e.takeAs(t, "edge-a", k, 100, 2, 2) // the next window
		require.Equal(t, limiter.FinishLate, finish(t, k, a).Outcome)
		require.EqualValues(t, 2, e.used(t, k), "the next window is untouched")
	})
	t.Run("its marks expire with the window", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 5, 5)
		finish(t, k, args(g, "edge-a", 1000, 304, 1))
		fk := e.keys.FinishKey(k.Digest(), "edge-a.1", g.ResetAt.UnixMilli())
		at, err := rdb.PExpireTime(ctx, fk).Result()
		require.NoError(t, err)
		require.Equal(t, g.ResetAt.Add(60*time.Second).UnixMilli(), at.Milliseconds())
		n, err := rdb.StrLen(ctx, fk).Result()
		require.NoError(t, err)
		require.EqualValues(t, 126, n, "a bit per request: 1001 bits")
	})
	t.Run("a charge by event not applied yet nets to zero", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-c", k, 100, 1, 1)
		a := args(g, "edge-c", 0, 304, 2)
		a.ChargeSeq = 1
		require.Equal(t, limiter.FinishPending, finish(t, k, a).Outcome)
		require.Equal(t, limiter.AlreadyFinished, finish(t, k, a).Outcome)
		require.Equal(t, limiter.Netted, e.apply(t, charge("edge-c", 1, k, g.ResetAt, t0, 2))[0].Outcome)
		require.EqualValues(t, 1, e.used(t, k))
	})
	t.Run("a charge by event applied is given back", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-d", k, 100, 1, 1)
		e.apply(t, charge("edge-d", 1, k, g.ResetAt, t0, 2))
		a := args(g, "edge-d", 0, 304, 2)
		a.ChargeSeq = 1
		r := finish(t, k, a)
		require.Equal(t, limiter.Finished, r.Outcome)
		require.EqualValues(t, 2, r.Amount)
		require.EqualValues(t, 1, e.used(t, k))
	})
	t.Run("a request admitted without a window is finished once", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		// Admitted while Redis was unreachable, charged by event 1, placed
		// by its start.
		e.apply(t, charge("edge-e", 1, k, time.Time{}, t0, 1))
		e.takeAs(t, "edge-e", k, 100, 4, 4)
		a := limiter.FinishArgs{Start: t0, Window: minute, Producer: "edge-e", Holder: "edge-e.1", Units: 1, ChargeSeq: 1, Status: 304, Back: 1}
		r := finish(t, k, a)
		require.Equal(t, limiter.Finished, r.Outcome)
		require.EqualValues(t, 1, r.Amount)
		require.Equal(t, limiter.AlreadyFinished, finish(t, k, a).Outcome)
		require.EqualValues(t, 4, e.used(t, k))
	})
	t.Run("refused in Go", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		g := e.takeAs(t, "edge-a", k, 100, 1, 1)
		for name, mutate := range map[string]func(*limiter.FinishArgs){
			"another producer's holder": func(a *limiter.FinishArgs) { a.Holder = "edge-b.1" },
			"no status":                 func(a *limiter.FinishArgs) { a.Status = 0 },
			"no units":                  func(a *limiter.FinishArgs) { a.Units = 0 },
			"no window and no charge":   func(a *limiter.FinishArgs) { a.ResetAt = time.Time{} },
			"a reset before the start":  func(a *limiter.FinishArgs) { a.Start = g.ResetAt },
			"a reset far from the start": func(a *limiter.FinishArgs) {
				a.Start = g.ResetAt.Add(-minute - limiter.MaxResetAhead - time.Second)
			},
		} {
			a := args(g, "edge-a", 0, 304, 1)
			mutate(&a)
			_, err := e.store.Finish(ctx, k, e.clock.Now(), a)
			require.ErrorIs(t, err, limiter.ErrInvalidArgument, name)
		}
		require.EqualValues(t, 1, e.used(t, k))
	})
}
