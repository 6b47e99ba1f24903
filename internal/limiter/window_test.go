package limiter_test

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

// Invariant 1: every response of one window shows the same reset time, from
// its first request to its last, on every edge.
func TestStableReset(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	p := limiter.Policy{Name: "core", Limit: 1000, Window: minute}
	// A second edge whose clock runs 700 ms behind.
	behind := limiter.NewManualClock(t0.Add(-700 * time.Millisecond))
	edge2 := newStore(t, e.config(), limiter.Options{Clock: behind})

	reset := func(w limiter.Window, now time.Time) string {
		h := http.Header{}
		limiter.Decide(p, w, now).SetHeaders(h)
		return h.Get("X-RateLimit-Reset")
	}

	// The first request: the replica has nothing, the edge opens the window.
	w, err := e.store.Check(ctx, k)
	require.NoError(t, err)
	require.False(t, w.Live)
	w, opened, err := e.store.Open(ctx, k, minute)
	require.NoError(t, err)
	require.True(t, opened)
	want := reset(w, e.clock.Now())
	wantTime := t0.Add(minute).Truncate(time.Second).Add(time.Second)
	require.Equal(t, strconv.FormatInt(wantTime.Unix(), 10), want)

	// The second edge raced the first one: its replica has not seen the
	// window yet, its open finds the live window and reports the same reset.
	w2, opened2, err := edge2.Open(ctx, k, minute)
	require.NoError(t, err)
	require.False(t, opened2)
	require.Equal(t, want, reset(w2, behind.Now()))

	// Through the window, at its edges: charges from both edges (the slow
	// edge's starts fall before the window's start, within tolerance), and
	// checks on the replica and on the primary.
	primary := e.primaryOnly(t)
	offsets := []time.Duration{0, time.Millisecond, 699 * time.Millisecond, time.Second,
		30 * time.Second, 59 * time.Second, 59*time.Second + 699*time.Millisecond}
	for i, off := range offsets {
		e.clock.Set(t0.Add(off))
		behind.Set(t0.Add(off - 700*time.Millisecond))
		r := e.charge(t, k, fmt.Sprintf("a%d", i), e.clock.Now(), 1)
		require.Equal(t, limiter.Applied, r.Outcome, "offset %v", off)
		require.Equal(t, want, strconv.FormatInt(r.ResetAt.Unix(), 10))
		r = e.charge(t, k, fmt.Sprintf("b%d", i), behind.Now(), 1)
		require.Equal(t, limiter.Applied, r.Outcome, "slow edge, offset %v", off)
		require.Equal(t, want, reset(e.checkReplica(t, k), e.clock.Now()), "replica, offset %v", off)
		pw, err := primary.Check(ctx, k)
		require.NoError(t, err)
		require.Equal(t, want, reset(pw, e.clock.Now()), "primary, offset %v", off)
		ow, err := edge2.Check(ctx, k)
		require.NoError(t, err)
		require.Equal(t, want, reset(ow, behind.Now()), "second edge, offset %v", off)
	}
	w = e.checkReplica(t, k)
	require.EqualValues(t, 2*len(offsets), w.Used)

	// At the reset, the next window opens with its own reset, equally stable.
	e.clock.Set(wantTime)
	w = e.checkReplica(t, k)
	require.False(t, w.Live)
	w = e.open(t, k)
	next := reset(w, e.clock.Now())
	require.Equal(t, strconv.FormatInt(wantTime.Add(minute).Unix(), 10), next)
	e.clock.Advance(10 * time.Second)
	require.Equal(t, next, reset(e.checkReplica(t, k), e.clock.Now()))
	r := e.charge(t, k, "c", e.clock.Now(), 1)
	require.Equal(t, next, strconv.FormatInt(r.ResetAt.Unix(), 10))
	require.EqualValues(t, 1, r.Used)
}

// Invariant 2: any read treats a window whose reset has passed as absent,
// while its keys are still there and on a replica that has not caught up.
func TestStaleWindowReadsAbsent(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	r := e.charge(t, k, "e1", t0, 5)
	require.Equal(t, limiter.Applied, r.Outcome)
	primary := e.primaryOnly(t)

	e.replica.WaitSynced(e.primary)
	for _, at := range []time.Time{r.ResetAt, r.ResetAt.Add(time.Second)} {
		e.clock.Set(at)
		n, err := e.primary.Client().Exists(ctx, k.String()).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the keys are still present")
		w, err := e.store.Check(ctx, k)
		require.NoError(t, err)
		assert.False(t, w.Live, "replica at %v", at)
		w, err = primary.Check(ctx, k)
		require.NoError(t, err)
		assert.False(t, w.Live, "primary at %v", at)
	}

	// A replica cut off from its primary keeps the old window; the primary
	// moves on to a new one. The replica's read must not report the old count.
	e.clock.Set(t0.Add(10 * time.Second))
	e.charge(t, k, "e2", e.clock.Now(), 7)
	e.replica.WaitSynced(e.primary)
	require.NoError(t, e.replica.Client().Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
	e.clock.Set(r.ResetAt.Add(5 * time.Second))
	r2 := e.charge(t, k, "e3", e.clock.Now(), 1)
	require.Equal(t, limiter.Applied, r2.Outcome)
	require.EqualValues(t, 1, r2.Used, "a new window on the primary")
	raw, err := e.replica.Client().HGet(ctx, k.String(), "u").Result()
	require.NoError(t, err)
	require.Equal(t, "12", raw, "the replica still holds the old window")
	w, err := e.store.Check(ctx, k)
	require.NoError(t, err)
	assert.False(t, w.Live, "the lagging replica's old window reads as absent")
}

// Invariant 4: allowed iff used + cost <= limit, read from real Redis.
func TestBoundary(t *testing.T) {
	e := newEnv(t, limiter.Options{})
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
					var w limiter.Window
					if used == 0 {
						w = e.checkReplica(t, k)
						require.False(t, w.Live)
						w = e.open(t, k)
					} else {
						e.charge(t, k, "fill", e.clock.Now(), used)
						w = e.checkReplica(t, k)
					}
					require.Equal(t, used, w.Used)
					d := limiter.Decide(p, w, e.clock.Now())
					require.Equal(t, used+cost <= limit, d.Allowed)
					h := http.Header{}
					d.SetHeaders(h)
					if d.Allowed {
						require.Equal(t, strconv.FormatInt(limit-used-cost, 10), h.Get("X-RateLimit-Remaining"))
						require.Empty(t, h.Get("Retry-After"))
					} else {
						require.NotEqual(t, h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"))
						require.Equal(t, strconv.FormatInt(max(0, limit-used), 10), h.Get("X-RateLimit-Remaining"))
						require.NotEmpty(t, h.Get("Retry-After"))
					}
				})
			}
		}
	}
}

// Invariants 5 and 6: charge at start, refund on 304, each exactly once.
func TestExactlyOnce(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	used := func(t *testing.T, k limiter.Key) int64 {
		t.Helper()
		w, err := e.primaryOnly(t).Check(ctx, k)
		require.NoError(t, err)
		return w.Used
	}

	t.Run("charge twice charges once", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		first := e.charge(t, k, "e1", t0, 3)
		require.Equal(t, limiter.Applied, first.Outcome)
		require.EqualValues(t, 3, first.Amount)
		e.charge(t, k, "other", t0, 1)
		again := e.charge(t, k, "e1", t0, 3)
		require.Equal(t, limiter.Duplicate, again.Outcome)
		require.EqualValues(t, 3, again.Used, "a repeat returns the first result")
		require.Zero(t, again.Amount)
		require.EqualValues(t, 4, used(t, k))
	})
	t.Run("refund twice refunds once", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		e.charge(t, k, "e1", t0, 2)
		e.charge(t, k, "e2", t0, 2)
		r := e.refund(t, k, "e1", t0)
		require.Equal(t, limiter.Applied, r.Outcome)
		require.EqualValues(t, 2, r.Amount)
		r = e.refund(t, k, "e1", t0)
		require.Equal(t, limiter.Duplicate, r.Outcome)
		require.EqualValues(t, 2, used(t, k))
		r2 := e.charge(t, k, "e1", t0, 2)
		require.Equal(t, limiter.Duplicate, r2.Outcome, "a charge after its refund stays refunded")
		require.EqualValues(t, 2, used(t, k))
	})
	t.Run("refund before charge nets to zero", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		e.charge(t, k, "x", t0, 1)
		r := e.refund(t, k, "e1", t0)
		require.Equal(t, limiter.Pending, r.Outcome)
		require.EqualValues(t, 1, used(t, k))
		c := e.charge(t, k, "e1", t0, 5)
		require.Equal(t, limiter.Netted, c.Outcome)
		require.EqualValues(t, 1, used(t, k))
		c = e.charge(t, k, "e1", t0, 5)
		require.Equal(t, limiter.Duplicate, c.Outcome)
		r = e.refund(t, k, "e1", t0)
		require.Equal(t, limiter.Duplicate, r.Outcome)
		require.EqualValues(t, 1, used(t, k))
	})
	t.Run("refund before charge on an empty key", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		require.Equal(t, limiter.Pending, e.refund(t, k, "e1", t0).Outcome)
		require.Equal(t, limiter.Netted, e.charge(t, k, "e1", t0, 1).Outcome)
		require.Zero(t, used(t, k))
	})
	t.Run("refund after the window rolled over", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		c := e.charge(t, k, "e1", t0, 4)
		e.clock.Set(c.ResetAt.Add(time.Second))
		n := e.charge(t, k, "e2", e.clock.Now(), 1)
		require.Equal(t, limiter.Applied, n.Outcome)
		require.True(t, n.ResetAt.After(c.ResetAt))
		r := e.refund(t, k, "e1", t0)
		require.Equal(t, limiter.Late, r.Outcome)
		require.EqualValues(t, 1, used(t, k))
	})
	t.Run("refund after the window closed, before a new one", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		c := e.charge(t, k, "e1", t0, 4)
		e.clock.Set(c.ResetAt)
		require.Equal(t, limiter.Late, e.refund(t, k, "e1", t0).Outcome)
	})
	t.Run("never below zero", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		e.charge(t, k, "e1", t0, 5)
		// An operator lowered the count by hand.
		require.NoError(t, e.primary.Client().HSet(ctx, k.String(), "u", 2).Err())
		r := e.refund(t, k, "e1", t0)
		require.Equal(t, limiter.Applied, r.Outcome)
		require.EqualValues(t, 2, r.Amount)
		require.Zero(t, r.Used)
		require.Zero(t, used(t, k))
	})
	t.Run("late event is not charged into the next window", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		c := e.charge(t, k, "e1", t0, 1)
		e.clock.Set(c.ResetAt.Add(time.Second))
		require.Equal(t, limiter.Applied, e.charge(t, k, "e2", e.clock.Now(), 1).Outcome)
		// e3 started in the first window but reaches the primary now.
		late := e.charge(t, k, "e3", t0.Add(30*time.Second), 1)
		require.Equal(t, limiter.Late, late.Outcome)
		// e4's start lies before the new window by less than the skew
		// tolerance, but inside the old window: still late.
		late = e.charge(t, k, "e4", c.ResetAt.Add(-500*time.Millisecond), 1)
		require.Equal(t, limiter.Late, late.Outcome)
		// A redelivery of e1 is late too.
		require.Equal(t, limiter.Late, e.charge(t, k, "e1", t0, 1).Outcome)
		require.EqualValues(t, 1, used(t, k))
	})
	t.Run("late event on an empty key older than the grace", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		e.clock.Set(t0.Add(90 * time.Second))
		// Its window would have ended 30s ago: nothing to open.
		require.Equal(t, limiter.Late, e.charge(t, k, "e1", t0, 1).Outcome)
		n, err := e.primary.Client().Exists(ctx, k.String()).Result()
		require.NoError(t, err)
		require.Zero(t, n)
	})
	t.Run("old event on an empty key whose window would still be live", func(t *testing.T) {
		defer e.clock.Set(t0)
		k := e.keys.Key("core", t.Name())
		e.clock.Set(t0.Add(90 * time.Second))
		// A 10-minute window opened at t0 would still be live, but a window
		// that held t0 may have been garbage collected (grace is 60s): the
		// event cannot be placed, and opening a window at t0 would hand the
		// client a window that never existed.
		r, err := e.store.Charge(ctx, k, "e1", t0, 1, 10*minute)
		require.NoError(t, err)
		require.Equal(t, limiter.Late, r.Outcome)
		r, err = e.store.Charge(ctx, k, "e2", e.clock.Now().Add(-59*time.Second), 1, 10*minute)
		require.NoError(t, err)
		require.Equal(t, limiter.Applied, r.Outcome, "within the grace it opens the window")
	})
	t.Run("event from a clock that runs ahead is clamped to now", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		r := e.charge(t, k, "e1", t0.Add(time.Hour), 1)
		require.Equal(t, limiter.Applied, r.Outcome)
		require.Equal(t, t0.UnixMilli(), r.Start.UnixMilli())
	})
	t.Run("gap event within the skew tolerance counts", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		w := e.open(t, k)
		r := e.charge(t, k, "e1", w.Start.Add(-1500*time.Millisecond), 1)
		require.Equal(t, limiter.Applied, r.Outcome)
		r = e.charge(t, k, "e2", w.Start.Add(-2500*time.Millisecond), 1)
		require.Equal(t, limiter.Late, r.Outcome, "beyond the 2s tolerance")
	})
	t.Run("keys expire a grace after the reset", func(t *testing.T) {
		k := e.keys.Key("core", t.Name())
		c := e.charge(t, k, "e1", t0, 1)
		at, err := e.primary.Client().PExpireTime(ctx, k.String()).Result()
		require.NoError(t, err)
		require.Equal(t, c.ResetAt.Add(60*time.Second).UnixMilli(), at.Milliseconds())
	})
}
