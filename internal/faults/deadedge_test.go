package faults

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

// An edge dies (SIGKILL) while it holds seconds of a hot key as credit.
// Most of it was frozen — reported to the window as units the edge would
// not spend until a later report (lua/hold.lua) — and comes back: once the
// share has expired, the other edge, short of room, takes it back. The
// window never admits more than its limit, and what stays stranded until
// the reset is the dead edge's free credit, about a second of its rate
// (docs/operations.md).
func TestDeadEdgesCreditComesBack(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the pipeline as processes")
	}
	c := newClusterOf(t, clusterOptions{shards: fixedShards(1)})
	a := c.startEdge(t, "edge-a", nil)
	b := c.startEdge(t, "edge-b", nil)
	const id = "dead-edge-client"
	k := c.keys.Key(hot.Name, limiter.HeaderIdentity("Authorization", id))
	var allowed atomic.Int64 // units
	send := func(e *edge, path string, cost int64) int {
		req, err := http.NewRequest("GET", "http://"+e.proxy+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", id)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			allowed.Add(cost)
		}
		return resp.StatusCode
	}

	// Edge A serves the key at a few hundred requests a second.
	const busy = 3 * time.Second
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for end := time.Now().Add(busy); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
				require.Equal(t, http.StatusOK, send(a, "/hot/items", 1))
			}
		})
	}
	wg.Wait()
	rate := float64(allowed.Load()) / busy.Seconds()
	ctx := context.Background()
	a.Kill()
	killed := time.Now()
	// What A held when it died: every unit it reserved less what it gave
	// back (c:), of which what it froze (z:) and what it admitted; the rest
	// is its free credit, which nobody can take back.
	share, held := frozenShare(t, c, k)
	require.Positive(t, share, "edge A froze nothing of its credit")
	free := held - share - allowed.Load()

	// Edge B takes the rest of the window, 100 units a request, until it
	// is denied; then A's frozen units come back to it.
	denied := false
	for range 400 {
		if send(b, "/hotx/items", 100) == http.StatusTooManyRequests {
			denied = true
			break
		}
	}
	require.True(t, denied, "B never reached the limit")
	var back time.Duration
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if send(b, "/hotx/items", 100) == http.StatusOK {
			back = time.Since(killed)
			break
		}
		require.True(t, time.Now().Before(deadline), "A's frozen credit did not come back in 30 s")
	}
	for range 400 { // what is left, until denied again
		if send(b, "/hotx/items", 100) == http.StatusTooManyRequests {
			break
		}
	}
	c.settle(t, b) // B gives back its credit
	g, err := c.store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: hot.Window, Limit: hot.Limit, Producer: "fault-suite"})
	require.NoError(t, err)
	stranded := g.Used - allowed.Load()
	t.Logf("A served %.0f/s and froze %d units, %d free (%.1f s of its average rate); it was killed; B was given them back %v later; "+
		"%d units allowed of %d; %d stranded until the reset", rate, share, free, float64(free)/rate, back.Round(time.Millisecond),
		allowed.Load(), hot.Limit, stranded)
	require.LessOrEqual(t, allowed.Load(), hot.Limit, "allowed past the limit")
	require.GreaterOrEqual(t, stranded, int64(0))
	// Only A's free credit stays: about a second of the key's rate as A
	// estimated it (the estimate follows bursts, and runs above the
	// average on a loaded machine), up to half as much again between two
	// reports. Every frozen unit came back. Before credit was frozen, all
	// of it stayed: the share and more.
	require.LessOrEqual(t, stranded, free, "frozen credit stayed stranded")
	require.Less(t, stranded, share, "less came back than stayed stranded")
}

// frozenShare is the units the window of k records as frozen by its
// holders (hold.lua's z: fields), and the units its edges hold (c:
// fields, but the suite's own reads').
func frozenShare(t *testing.T, c *cluster, k limiter.Key) (frozen, held int64) {
	fields, err := c.rdb[0].HGetAll(context.Background(), k.String()).Result()
	require.NoError(t, err)
	for f, v := range fields {
		switch {
		case strings.HasPrefix(f, "z:"):
			units, _, _ := strings.Cut(v, ":")
			u, err := strconv.ParseInt(units, 10, 64)
			require.NoError(t, err)
			frozen += u
		case strings.HasPrefix(f, "c:edge."):
			u, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			held += u
		}
	}
	return frozen, held
}
