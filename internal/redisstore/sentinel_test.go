package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// A Sentinel shard: every reservation the store answers is on a replica
// first (WAIT), so that the replica Sentinel promotes when the primary dies
// holds every unit an edge was told it reserved, and the store follows the
// promotion with nothing edited (scripts loaded again on the new primary).
// A replica that does not confirm in time costs the reservations their
// durability, not their answer: they are counted, and the store stops
// waiting for a second.
func TestSentinelShard(t *testing.T) {
	p, r := redistest.StartPair(t)
	sentinels := p.StartSentinels(t, "s0", 1, 1, 300*time.Millisecond)
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	// A replica on a busy machine may take longer than the default 20 ms
	// to confirm; the test is about what happens when it does not at all.
	const wait = 400 * time.Millisecond
	store := newStore(t, []shard.Config{{Name: "s0", Sentinel: &shard.Sentinel{Master: "s0", Addrs: sentinels}}}, keys,
		redisstore.Options{ReservationWait: wait})
	ctx := context.Background()
	take := func(k limiter.Key, want int64) (limiter.Grant, error) {
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		return store.Take(tctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: 1000, Need: 1, Want: want,
			Producer: "edge-a"})
	}
	k := keys.Key("api", "h:sentinel")
	var reserved int64
	// Reservations the replica confirms. (On a busy machine a replica
	// just started may not confirm the first in time: the store then
	// stops waiting for a second, and counts them.)
	confirmed := 0
	for deadline := time.Now().Add(10 * time.Second); confirmed < 20; {
		before := store.Unreplicated()
		g, err := take(k, 7)
		require.NoError(t, err)
		reserved += g.Granted
		if store.Unreplicated() == before {
			confirmed++
		} else {
			time.Sleep(100 * time.Millisecond)
		}
		require.True(t, time.Now().Before(deadline), "the replica confirmed %d reservations in 10 s", confirmed)
	}
	unconfirmed := store.Unreplicated()

	// A frozen replica: the reservation is answered (within the WAIT's
	// bound), counted as unconfirmed, and the next ones do not wait.
	r.Pause()
	began := time.Now()
	g, err := take(k, 1)
	require.NoError(t, err)
	reserved += g.Granted
	g, err = take(k, 1)
	require.NoError(t, err)
	reserved += g.Granted
	require.Less(t, time.Since(began), wait+time.Second, "reservations held up by a frozen replica beyond one WAIT")
	require.EqualValues(t, unconfirmed+2, store.Unreplicated())
	r.Resume()
	r.WaitSynced(p)

	// The primary dies; Sentinel promotes the replica, which holds every
	// reservation the store answered.
	p.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for redistest.SentinelPrimary(sentinels[0], "s0") != r.Addr {
		require.True(t, time.Now().Before(deadline), "the replica was not promoted in 30 s")
		time.Sleep(20 * time.Millisecond)
	}
	for {
		g, err = take(k, 1)
		if err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "no reservation on the promoted replica: %v", err)
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, reserved+g.Granted, g.Used, "the promoted replica lost reservations the store answered")
	require.Positive(t, store.ScriptReloads(), "the take script loaded again on the new primary")
}

// Whoever can talk to a sentinel names the shard's primary: sentinels with
// a password, and a store that cannot authenticate with them makes no
// reservation anywhere and fails within its caller's deadline
// (docs/security.md, Who names the primary).
func TestSentinelNeedsItsPassword(t *testing.T) {
	p := redistest.Start(t)
	sentinels := p.StartSentinelsWith(t, "s0", 1, 0, time.Second, "sentinel-secret")
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	k := keys.Key("api", "h:sentinel-auth")
	take := func(password string) error {
		store := newStore(t, []shard.Config{{Name: "s0", Sentinel: &shard.Sentinel{Master: "s0", Addrs: sentinels,
			Password: password}}}, keys, redisstore.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		began := time.Now()
		_, err := store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: 10, Need: 1, Want: 1, Producer: "edge-a"})
		require.Less(t, time.Since(began), 2*time.Second, "held past its deadline")
		return err
	}
	require.Error(t, take(""))
	require.Error(t, take("wrong"))
	require.Zero(t, p.Client().Exists(context.Background(), k.String()).Val(), "a reservation made without the password")
	require.NoError(t, take("sentinel-secret"))
	require.EqualValues(t, 1, p.Client().Exists(context.Background(), k.String()).Val())
}
