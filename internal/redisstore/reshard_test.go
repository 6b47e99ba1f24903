package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// Adding a shard moves about a third of the keys of two to it. A key that
// moves keeps the window its previous owner holds until that window
// resets, whoever asks — edges already placing keys by the new placement,
// and edges still on the old one — and then opens its windows on its new
// owner only: no window of a moving key admits more than its limit, at no
// point are two of its windows live, and each shard takes accounting
// events only for the windows it may hold (docs/operations.md,
// Resharding).
func TestResharding(t *testing.T) {
	p0, p1 := redistest.Start(t), redistest.Start(t)
	shards := []shard.Config{{Name: "s0", Primary: node(p0)}, {Name: "s1", Primary: node(p1)}}
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	// before: keys on s0 only (s1 configured, not placed on); during: the
	// move; after: the move done.
	before := newStore(t, shards, keys, redisstore.Options{Placement: []string{"s0"}})
	during := newStore(t, shards, keys, redisstore.Options{PreviousPlacement: []string{"s0"}})
	after := newStore(t, shards, keys, redisstore.Options{})

	var k limiter.Key // a key that moves to s1
	for i := 0; k.IsZero(); i++ {
		if c := keys.Key("api", fmt.Sprintf("h:client-%d", i)); during.ShardOf(c) == 1 {
			k = c
		}
	}
	require.Equal(t, 0, before.ShardOf(k))
	ctx := context.Background()
	const limit, window = 10, 2 * time.Second
	now := time.Now()
	take := func(s *redisstore.Store, want int64) limiter.Grant {
		t.Helper()
		g, err := s.Take(ctx, k, now, limiter.TakeArgs{Window: window, Limit: limit, Need: 1, Want: want, Producer: "edge-a"})
		require.NoError(t, err)
		return g
	}

	// A window opened before the move stays on s0 until it resets, for
	// every edge.
	g := take(before, 6)
	require.Equal(t, int64(6), g.Granted)
	require.Equal(t, 0, g.Shard)
	now = now.Add(100 * time.Millisecond)
	g = take(during, limit)
	require.Equal(t, int64(4), g.Granted, "the rest of the window on s0")
	require.Equal(t, 0, g.Shard)
	require.Zero(t, take(during, 1).Granted, "the window is full")
	w, err := during.Check(ctx, k)
	require.NoError(t, err)
	require.True(t, w.Live)
	require.Equal(t, int64(limit), w.Used)
	reset := g.ResetAt

	// Events for it apply on s0 while the key moves (and on s1, its new
	// owner), nowhere once the move is done.
	ev := limiter.Event{Kind: limiter.Refund, Key: k, Producer: "edge-a", Seq: 1, Units: 1, Window: window,
		ResetAt: reset, Start: now}
	res, err := during.Apply(ctx, 0, now, []limiter.Event{ev})
	require.NoError(t, err)
	require.NoError(t, res.Results[0].Err)
	ev.Seq = 2
	res, err = after.Apply(ctx, 0, now, []limiter.Event{ev})
	require.NoError(t, err)
	require.ErrorIs(t, res.Results[0].Err, limiter.ErrInvalidArgument, "an event for s1's key applied on s0")

	// Once it resets, the next window opens on s1, for the new placement
	// and for the old one alike (s0 sends the old one on), and nothing
	// opens on s0 again.
	now = reset.Add(time.Millisecond)
	g = take(during, 3)
	require.Equal(t, 1, g.Shard)
	require.True(t, g.Opened)
	g = take(before, limit)
	require.Equal(t, 1, g.Shard, "an edge on the old placement follows the key")
	require.Equal(t, int64(limit-3), g.Granted)
	require.Zero(t, take(after, 1).Granted, "the window on s1 is full")
	w, err = before.Check(ctx, k)
	require.NoError(t, err)
	require.False(t, w.Live, "no window on s0 for an edge on the old placement to read")
	w, err = during.Check(ctx, k)
	require.NoError(t, err)
	require.Equal(t, int64(limit), w.Used)
	n, err := p0.Client().HLen(ctx, k.String()).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "s0 keeps only the mark that the key moved")
}
