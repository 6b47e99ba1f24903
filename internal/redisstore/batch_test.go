package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// Concurrent takes of many keys share round trips (pipelines) and still
// each take exactly what the script grants: no key past its limit, every
// unit granted to exactly one caller, the holder's count right.
func TestConcurrentTakesAreExact(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	const keys, callers, limit = 40, 400, 3
	var granted atomic.Int64
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			k := e.keys.Key("core", fmt.Sprint("batch-", i%keys))
			g, err := e.store.Take(context.Background(), k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: limit,
				Need: 1, Want: 1, Producer: "edge-b"})
			if err == nil {
				granted.Add(g.Granted)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, keys*limit, granted.Load())
	for i := range keys {
		g, err := e.store.Take(context.Background(), e.keys.Key("core", fmt.Sprint("batch-", i)), e.clock.Now(),
			limiter.TakeArgs{Window: minute, Limit: limit, Producer: "edge-b"})
		require.NoError(t, err)
		require.EqualValues(t, limit, g.Used)
		require.EqualValues(t, limit, g.Mine, "what the holder was given, counted once")
	}
}

// A take whose caller stopped waiting before it was sent is not sent.
func TestTakeOfAGoneCallerIsNotSent(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	k := e.keys.Key("core", "gone")
	_, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 3, Need: 1, Want: 1, Producer: "edge-b"})
	require.ErrorIs(t, err, context.Canceled)
	g, err := e.store.Take(context.Background(), k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 3, Producer: "edge-b"})
	require.NoError(t, err)
	require.False(t, g.Live, "no window was opened")
}

// Closing a store twice is harmless, and a take after Close fails at once.
func TestTakeAfterClose(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	require.NoError(t, e.store.Close())
	_ = e.store.Close()
	_, err := e.store.Take(context.Background(), e.keys.Key("core", "closed"), e.clock.Now(),
		limiter.TakeArgs{Window: minute, Limit: 3, Need: 1, Want: 1, Producer: "edge-b"})
	require.Error(t, err)
}
