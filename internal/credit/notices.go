package credit

import (
	"context"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Heard takes a notice from another edge or an accountant (already
// authenticated by the caller): a window full, or with room again.
func (c *Core) Heard(n Notice) {
	c.stats.noticesIn.Add(1)
	e := c.table.lookup(n.Key)
	if e == nil {
		return
	}
	e.lock()
	defer e.mu.Unlock()
	if !c.d.Clock.Now().Before(n.ResetAt) {
		return
	}
	switch {
	case n.Full && (e.reset.Equal(n.ResetAt) || e.reset.IsZero()):
		if e.reset.IsZero() {
			e.reset = n.ResetAt
		}
		e.full = true
		e.used = max(e.used, n.Used)
	case !n.Full && e.reset.Equal(n.ResetAt):
		e.full = false
		// The count a notice carries may predate this edge's latest
		// reservation: it holds at least what this edge reserved.
		e.used = max(n.Used, e.credit)
	}
}

// Refused counts a notice the caller refused (unsigned, forged, or sent
// long before).
func (c *Core) Refused() { c.stats.noticesRefused.Add(1) }

// publishFull tells the other edges that e's window is full. Callers hold
// e.mu; the Notifier does not wait for the network (a core NATS publish).
func (c *Core) publishFull(e *entry) {
	if e.reset.IsZero() || c.d.Notifier == nil {
		return
	}
	c.stats.noticesUp.Add(1)
	c.d.Notifier.Notify(e.shard, Notice{Full: true, Key: e.key.Digest(), ResetAt: e.reset, Used: e.used})
}

// Learn takes into this edge's entry of a window what a refund or release
// the edge applied on the primary itself left in it, and tells the other
// edges (a room notice), as an accountant does for what it applies: a
// client's 304s that made room are not answered 429 from a stale count.
func (c *Core) Learn(shard int, dg limiter.Digest, reset time.Time, used int64) {
	if reset.IsZero() {
		return
	}
	if e := c.table.lookup(dg); e != nil {
		e.lock()
		if e.reset.Equal(reset) {
			e.used = max(used, e.credit)
			if e.full && e.room() >= max(1, e.lastCost) {
				e.full = false
			}
		}
		e.mu.Unlock()
	}
	if c.d.Notifier != nil {
		c.d.Notifier.Notify(shard, Notice{Key: dg, ResetAt: reset, Used: used})
	}
}

// Finish finishes a decision-API request once on its window's primary
// (the Reserver's Finish): the first finish of its ticket, on any edge,
// gives a 304's charge back; every later one changes nothing.
func (c *Core) Finish(ctx context.Context, v Verdict, status int, now time.Time) (limiter.FinishResult, error) {
	a := limiter.FinishArgs{Start: v.Now, Window: v.Policy.Window, Producer: v.Producer, Holder: v.Holder(),
		N: v.N, Units: v.Cost, ChargeSeq: v.ChargeSeq, Status: status}
	if v.Decided {
		a.ResetAt = v.Reset
	}
	res, err := c.d.Reserver.Finish(ctx, v.Key, now, a)
	if err == nil && res.Outcome == limiter.Finished && res.Amount > 0 {
		c.Learn(v.Shard, v.Key.Digest(), res.ResetAt, res.Used)
	}
	return res, err
}
