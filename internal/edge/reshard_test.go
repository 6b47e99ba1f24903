package edge_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// A shard added while clients are served: one edge still places keys on
// s0 only, the other by the new placement with the old one as previous.
// A hot key that moves to s1, hit from both edges over several windows,
// never gets more than its limit in any window, nor two windows at once;
// once only the new placement asks, its windows open on s1.
func TestReshardingUnderLoad(t *testing.T) {
	pl := newPipeline(t)
	s1 := redistest.Start(t)
	pl.shards = append(pl.shards, shard.Config{Name: "s1", Primary: shard.Node{Addr: s1.Addr}})
	const limit = 40
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: limit, Window: 2 * time.Second}
	// The accountant applies events on both owners of a moving key.
	pl.storeOpts = redisstore.Options{PreviousPlacement: []string{"s0"}}
	pl.stopAcc()
	pl.startAccountant()
	during := pl.newStore()
	pl.storeOpts = redisstore.Options{Placement: []string{"s0"}}
	before := pl.edge(patient)
	pl.storeOpts = redisstore.Options{PreviousPlacement: []string{"s0"}}
	after := pl.edge(patient)

	var token string
	for i := 0; token == ""; i++ {
		id := fmt.Sprintf("mover-%d", i)
		if during.ShardOf(pl.keys.Key("core", limiter.HeaderIdentity("Authorization", id))) == 1 {
			token = id
		}
	}
	k := pl.keys.Key("core", limiter.HeaderIdentity("Authorization", token))

	var mu sync.Mutex
	perWindow := map[string]int{}
	var wg sync.WaitGroup
	end := time.Now().Add(5 * time.Second)
	for _, e := range []*edgeUnderTest{before, after, before, after} {
		wg.Go(func() {
			for time.Now().Before(end) {
				resp := get(t, e.proxy.URL, token)
				if resp.StatusCode == 200 {
					mu.Lock()
					perWindow[resp.Header.Get("X-RateLimit-Reset")]++
					mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	t.Logf("allowed per window (by reset): %v", perWindow)
	require.GreaterOrEqual(t, len(perWindow), 2, "the load spans windows: %v", perWindow)
	var resets []int64
	for reset, n := range perWindow {
		require.LessOrEqual(t, n, limit, "window resetting at %s allowed %d: %v", reset, n, perWindow)
		r, err := strconv.ParseInt(reset, 10, 64)
		require.NoError(t, err)
		resets = append(resets, r)
	}
	// One window at a time: never one on each shard.
	slices.Sort(resets)
	for i := 1; i < len(resets); i++ {
		require.GreaterOrEqual(t, resets[i]-resets[i-1], int64(2), "two windows live at once: %v", perWindow)
	}

	// While edges on the old placement open its windows on s0, the key
	// stays there (whichever reaches s0 first after a reset decides);
	// once only edges on the new placement ask, its next window opens on
	// s1, and s0 holds only the mark that it moved.
	time.Sleep(time.Until(time.Unix(resets[len(resets)-1], 0).Add(100 * time.Millisecond)))
	require.Equal(t, 200, get(t, after.proxy.URL, token).StatusCode)
	ctx := context.Background()
	fields, err := pl.primary.Client().HKeys(ctx, k.String()).Result()
	require.NoError(t, err)
	require.Equal(t, []string{"m"}, fields)
	g, err := during.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: 2 * time.Second, Limit: limit, Producer: "test"})
	require.NoError(t, err)
	require.Equal(t, 1, g.Shard)
	require.True(t, g.Live)
}
