package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TakeAsync answers each reservation once, never on its caller's goroutine
// (which may hold what done takes), exactly as Take would; a closed store
// answers every one.
func TestTakeAsync(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1)
	const callers, keys = 64, 8
	var mu sync.Mutex
	answers := make(chan limiter.Grant, callers)
	returned := make(chan struct{})
	go func() {
		mu.Lock() // what a caller holds while it asks (an entry's lock)
		for i := range callers {
			k := e.keys.Key("core", fmt.Sprintf("async-%d", i%keys))
			e.store.TakeAsync(k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 5, Need: 1, Want: 2,
				Producer: fmt.Sprintf("edge-%d", i), Holder: fmt.Sprintf("edge-%d.1", i), Fresh: true},
				func(g limiter.Grant, err error) {
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						t.Error(err)
					}
					answers <- g
				})
		}
		mu.Unlock()
		close(returned)
	}()
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("TakeAsync waited for its answer, or answered on its caller's goroutine")
	}
	got := map[time.Time]int64{}
	for range callers {
		select {
		case g := <-answers:
			got[g.ResetAt] += g.Granted
			require.Equal(t, g.Granted, g.Mine)
		case <-time.After(10 * time.Second):
			t.Fatal("an answer never came")
		}
	}
	for i := range keys {
		require.EqualValues(t, 5, e.used(t, e.keys.Key("core", fmt.Sprintf("async-%d", i))), "key %d: its limit, no more", i)
	}

	require.NoError(t, e.store.Close())
	closed := make(chan error, 1)
	e.store.TakeAsync(e.keys.Key("core", "late"), e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 5, Need: 1, Want: 1,
		Producer: "edge-a", Holder: "edge-a.1"}, func(_ limiter.Grant, err error) { closed <- err })
	select {
	case err := <-closed:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a closed store never answered")
	}
}
