package credit

import (
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// An entry of a sliding window: its window is the sub-window, its credit
// good until that ends; a client is told the span as its window and the
// sub-window's end as its reset. When the sub-window ends, the credit left
// in it goes back by an event (the spans after it still count it), and
// what the entry reserved and sent there is claimed in a reseed until it
// leaves the last span. No share is ever frozen.
func TestSlidingWindowEntry(t *testing.T) {
	p := limiter.Policy{Name: "api", Algorithm: limiter.SlidingWindow, Limit: 1000, Window: 10 * time.Second, Slices: 6, Align: true}
	h := newHarness(t, p, false, Config{})
	h.clock.Set(p.WindowAt(epoch).ResetAt.Add(time.Second))
	first := p.WindowAt(h.clock.Now())
	var v Verdict
	for range 200 {
		var err error
		if v, err = h.decide(1); err != nil || !v.Allowed() {
			t.Fatalf("decide: %v, %+v", err, v)
		}
		h.clock.Advance(10 * time.Millisecond)
	}
	if v.Decision.Window != time.Minute || !v.Decision.ResetAt.Equal(first.ResetAt) {
		t.Fatalf("told a window of %v resetting at %v: want the span, 1m, and the sub-window's end %v", v.Decision.Window,
			v.Decision.ResetAt, first.ResetAt)
	}
	if !v.Expires().Equal(first.ResetAt.Add(p.Linger())) {
		t.Fatalf("a request can be finished until %v: want until its sub-window leaves the last span", v.Expires())
	}
	credit, _, _ := h.snapshot()
	if credit == 0 {
		t.Fatal("a busy key holds credit")
	}
	e := h.entry()
	e.mu.Lock()
	reserved := max(e.known, e.mine)
	e.mu.Unlock()

	n := h.ledger.len()
	h.clock.Set(first.ResetAt.Add(time.Second))
	if _, err := h.decide(1); err != nil {
		t.Fatal(err)
	}
	var released *limiter.Entry
	for _, le := range h.ledger.since(n) {
		if le.Kind == limiter.Release && le.ResetAt.Equal(first.ResetAt) {
			released = &le
		}
	}
	if released == nil || released.Units != credit || released.Policy.Slices != p.Slices {
		t.Fatalf("the credit left in the sub-window that ended (%d) goes back to it: %+v", credit, released)
	}
	if ev := released.Event("edge.test", 1); ev.Slices != p.Slices || ev.Validate() != nil {
		t.Fatalf("the release names a sub-window: %+v: %v", ev, ev.Validate())
	}
	claimOf := func(at time.Time) *limiter.Claim {
		for _, cl := range h.core.Claims(0, at) {
			if cl.ResetAt.Equal(first.ResetAt) {
				return &cl
			}
		}
		return nil
	}
	cl := claimOf(h.clock.Now())
	if cl == nil || cl.Reserved != reserved || cl.GivenBack != credit || cl.Slices != p.Slices || cl.Validate() != nil {
		t.Fatalf("the sub-window that ended is claimed with what was reserved (%d) and given back (%d): %+v", reserved, credit, cl)
	}
	if cl := claimOf(first.ResetAt.Add(p.Linger())); cl != nil {
		t.Fatalf("a sub-window no span holds is not claimed: %+v", cl)
	}
	h.core.Sweep(t.Context(), h.clock.Now())
	h.redis.mu.Lock()
	holds := h.redis.holds
	h.redis.mu.Unlock()
	if holds != 0 {
		t.Fatalf("%d reports of frozen shares: a sliding window freezes none", holds)
	}
}
