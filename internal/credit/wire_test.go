package credit

import (
	"context"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// Every entry the core leaves to account for can be written on the wire
// (events.AccountingOf, validated as the accountant validates it): an entry
// that cannot is applied on the primary by the edge alone, and logged as a
// batch that could not be encoded. Two ways an edge made such entries:
//   - a window it first heard of in another edge's full notice had no
//     start, and what it reserved there later went back in a release
//     without one;
//   - credit reserved under a limit that was lowered since (an operator's
//     temporary limit, a tier, a reload) went back in a release of more
//     units than the new limit.
func TestEntriesAreValidOnTheWire(t *testing.T) {
	for name, run := range map[string]func(t *testing.T, h *harness){
		"a window heard of in a full notice": func(t *testing.T, h *harness) {
			if v, err := h.decide(1); err != nil || !v.Allowed() {
				t.Fatalf("%v %v", v.Path, err)
			}
			// The window resets; another edge opens the next one and fills
			// it, and this edge hears of it before reserving there.
			h.clock.Advance(time.Minute)
			h.core.Sweep(context.Background(), h.clock.Now())
			other := limiter.TakeArgs{Window: h.policy.Window, Limit: h.policy.Limit, Need: h.policy.Limit,
				Want: h.policy.Limit, Producer: "edge.other", Holder: "edge.other.1"}
			g := h.redis.take(h.key, h.clock.Now(), other)
			h.core.Heard(Notice{Full: true, Key: h.dg, ResetAt: g.ResetAt, Used: g.Used})
			// It gives room back (a release of half), and says so.
			h.redis.mu.Lock()
			h.redis.windows[h.dg].used = h.policy.Limit / 2
			h.redis.mu.Unlock()
			h.core.Heard(Notice{Key: h.dg, ResetAt: g.ResetAt, Used: h.policy.Limit / 2})
			for range 40 { // a busy key: reservations ahead of its requests
				h.clock.Advance(10 * time.Millisecond)
				if _, err := h.decide(1); err != nil {
					t.Fatal(err)
				}
			}
			if e := h.entry(); e.start.IsZero() {
				t.Error("the window heard of has no start")
			}
		},
		"credit held when the limit is lowered": func(t *testing.T, h *harness) {
			for range 40 {
				h.clock.Advance(10 * time.Millisecond)
				if _, err := h.decide(1); err != nil {
					t.Fatal(err)
				}
			}
			if cr, _, _ := h.snapshot(); cr <= 3 {
				t.Fatalf("credit %d: the scenario needs more than the lowered limit", cr)
			}
			lowered := h.policy
			lowered.Limit = 3 // an operator's temporary limit, say
			h.reqs++
			if _, err := h.core.Decide(context.Background(), lowered, 1, h.dg, h.clock.Now(), h.reqs); err != nil {
				t.Fatal(err)
			}
			h.core.Wait()
		},
	} {
		t.Run(name, func(t *testing.T) {
			p := policyOf(limiter.ModeAuto)
			p.Limit = 1000
			h := newHarness(t, p, true, fast)
			run(t, h)
			h.core.ReleaseAll(context.Background(), h.clock.Now())
			released := 0
			for i, e := range h.ledger.since(0) {
				if e.Kind == limiter.Release {
					released++
				}
				a := events.AccountingOf(e, "edge.test", uint64(i+1), "edge-checker", h.keys.KeyID())
				if err := a.Validate(); err != nil {
					t.Errorf("entry %d (%v of %d units, limit %d): %v", i+1, e.Kind, e.Units, e.Policy.Limit, err)
				}
			}
			if released == 0 {
				t.Fatal("no release: the scenario gave nothing back")
			}
		})
	}
}
