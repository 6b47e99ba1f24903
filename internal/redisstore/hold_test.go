package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// A frozen share (lua/hold.lua) is recorded only over the value its holder
// last saw, and a reservation short of room takes it back once it has
// expired — its units out of the window's count and out of what the
// producer holds — never before.
func TestFrozenSharesComeBack(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "hot")
	take := func(producer string, need int64) limiter.Grant {
		t.Helper()
		g, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Need: need, Want: need,
			Producer: producer, Holder: producer + ".1"})
		require.NoError(t, err)
		return g
	}
	hold := func(expected, frozen int64, reset time.Time) limiter.HoldResult {
		t.Helper()
		rs, err := e.store.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: reset, Holder: "edge-a.1", Producer: "edge-a",
			Expected: expected, Frozen: frozen, Expiry: e.clock.Now().Add(3 * time.Second)}})
		require.NoError(t, err)
		require.Len(t, rs, 1)
		return rs[0]
	}
	g := take("edge-a", 600)
	require.Equal(t, limiter.HoldResult{Outcome: limiter.Held, Have: 500}, hold(0, 500, g.ResetAt))
	require.Equal(t, limiter.HoldResult{Outcome: limiter.HoldMismatch, Have: 500}, hold(0, 100, g.ResetAt), "not over a value it did not see")
	require.Equal(t, limiter.HoldResult{Outcome: limiter.HoldGone}, hold(500, 100, g.ResetAt.Add(time.Second)))

	// Not expired: nothing comes back.
	require.Zero(t, take("edge-b", 500).Granted)
	w, err := e.store.Check(ctx, k)
	require.NoError(t, err)
	require.Zero(t, w.Expired)

	// Expired: a reservation short of room takes it back.
	e.clock.Advance(4 * time.Second)
	e.replica.WaitSynced(e.primary)
	w, err = e.store.Check(ctx, k)
	require.NoError(t, err)
	require.EqualValues(t, 500, w.Expired)
	g = take("edge-b", 500)
	require.EqualValues(t, 500, g.Granted)
	require.EqualValues(t, 600, g.Used, "edge-a's 100 free units and edge-b's 500")
	held, err := e.primary.Client().HGet(ctx, k.String(), "c:edge-a").Int64()
	require.NoError(t, err)
	require.EqualValues(t, 100, held, "what edge-a can still give back")
	// The holder learns it from its next report.
	require.Equal(t, limiter.HoldResult{Outcome: limiter.HoldMismatch, Have: 0}, hold(500, 400, g.ResetAt))

	// A reservation freezes what its caller will not spend, in the same
	// call, over the share the caller saw; not over another.
	g, err = e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Need: 100, Want: 100,
		Producer: "edge-b", Holder: "edge-b.1", Freeze: true, Keep: 30, Share: 0, ShareExpiry: e.clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 70, g.Frozen)
	g, err = e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Need: 100, Want: 100,
		Producer: "edge-b", Holder: "edge-b.1", Freeze: true, Keep: 30, Share: 0, ShareExpiry: e.clock.Now().Add(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 100, g.Granted)
	require.EqualValues(t, -1, g.Frozen, "the share was 70, not 0")
	share, err := e.primary.Client().HGet(ctx, k.String(), "z:edge-b.1").Result()
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(share, "70:"), share)

	// Bad arguments write nothing.
	_, err = e.store.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: g.ResetAt, Holder: "edge-b.1", Producer: "edge-a", Frozen: 1,
		Expiry: e.clock.Now()}})
	require.ErrorIs(t, err, limiter.ErrInvalidArgument)
}
