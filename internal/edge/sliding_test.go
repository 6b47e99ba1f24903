package edge_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
)

// Four edges race on a hot key under a sliding window of six sub-windows:
// the span never holds more than the limit, so a sub-window inside the span
// of a full one admits nothing, and the limit comes back whole once the
// full sub-window has left the span. The edges share one clock, moved by
// the test.
func TestSlidingWindowFourEdgesNeverOver(t *testing.T) {
	pl := newPipeline(t)
	p := limiter.Policy{Name: "core", Algorithm: limiter.SlidingWindow, Limit: 200, Window: 10 * time.Second, Slices: 6, Align: true}
	pl.policies["core"] = p
	start := p.WindowAt(time.Now()).ResetAt.Add(time.Second)
	sub := func(i int) time.Time { return start.Add(time.Duration(i) * p.Window) }
	clock := limiter.NewManualClock(start)
	var edges []*edgeUnderTest
	for range 4 {
		edges = append(edges, pl.edge(func(o *edge.Options) { patient(o); o.Clock = clock }))
	}
	k := pl.keys.Key("core", "h:slide")
	span := func(at time.Time) int64 {
		t.Helper()
		g, err := pl.store.Take(context.Background(), k, at, limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Producer: "reader",
			Align: true, Opens: p.WindowAt(at), Slices: p.Slices})
		require.NoError(t, err)
		return g.Used
	}

	require.EqualValues(t, 200, hammer(t, edges, "slide", 8, 12), "sub-window 0: exactly the limit")
	require.EqualValues(t, 200, span(sub(0)))

	clock.Set(sub(3))
	require.Zero(t, hammer(t, edges, "slide", 4, 4), "sub-window 3 is in the span of 0")

	clock.Set(sub(6))
	require.EqualValues(t, 200, hammer(t, edges, "slide", 8, 12), "sub-window 0 left the span")
	require.EqualValues(t, 200, span(sub(6)), "the fullest span holding sub-window 6")
}
