package credit

import (
	"context"
	"math"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Credit an edge holds is counted in its window whether the edge spent it
// or not, and an edge that dies cannot say which: giving its credit back
// could let the window pass its limit by whatever it had spent. So an edge
// promises, while alive, which units it will not spend: on every sweep, for
// each window where it holds more credit than it can spend in about
// holdAllowance, it reports the rest as frozen (lua/hold.lua), and spends
// frozen units only after a later report has lowered them — the next
// sweep's, or one a request makes when the free credit does not cover it.
// A report expires holdTTL after it was made; a reservation short of room
// takes expired shares back (lua/take.lua). A dead edge thus strands at
// most its allowance per window; a live one whose reports fail keeps its
// frozen units unspent, and learns from its next report what was taken.
//
// Only shares worth it are reported: at least holdMin units and a
// hundredth of the limit. Below that, a dead edge strands what it holds.
const (
	holdAllowance = time.Second     // of the key's rate, left free
	holdTTL       = 3 * time.Second // a share's life without a report
	holdRenew     = time.Second     // a share is reported again this often
	holdMin       = 16
)

// allowance is the credit e keeps free: about holdAllowance of its rate,
// and at least one request's cost. Callers hold e.mu.
func (e *entry) allowance() int64 {
	return max(1, e.lastCost) + int64(math.Ceil(e.rate*holdAllowance.Seconds()))
}

// freezeIn asks a reservation for e to freeze, in the same call, what of
// it e will not spend within its allowance: credit just reserved is never
// left unreported for a sweep's time. Callers hold e.mu.
func (c *Core) freezeIn(e *entry, a *limiter.TakeArgs, now time.Time) {
	// A report in flight may change the share first: the freeze then
	// does not happen (its answer says so), and the next sweep reports.
	if e.exact() || e.policy.Linger() > 0 {
		return
	}
	keep := max(0, e.allowance()-e.free())
	if a.Want-keep < max(holdMin, e.policy.Limit/100) {
		return
	}
	a.Freeze, a.Keep, a.Share, a.ShareExpiry = true, keep, e.held, now.Add(holdTTL)
}

type pendingHold struct {
	e *entry
	h limiter.Hold
}

// holdTarget says what e should report as frozen at now, and whether a
// report is due; idle, e reports nothing frozen, so that its credit can go
// back. Callers hold e.mu.
func (c *Core) holdTarget(e *entry, idle bool, now time.Time) (int64, bool) {
	if e.holding || e.exact() || !e.live(now) || e.start.IsZero() || e.policy.Linger() > 0 {
		return 0, false
	}
	target := max(0, e.credit-e.allowance())
	if idle || target < max(holdMin, e.policy.Limit/100) {
		target = 0 // too little to be worth a report: what a dead edge strands
	}
	if target == 0 && e.held == 0 {
		return 0, false
	}
	// Reported again when the free credit runs low, when there is nothing
	// to freeze any more, or to renew the share before it expires: a busy
	// key costs about two reports a second, not one per sweep.
	low := e.free() < e.allowance()/2
	return target, target > e.held || (target == 0) || (low && target < e.held) || now.Sub(e.heldAt.Time()) >= holdRenew
}

// startHold marks e's report of target in flight: target is frozen from
// now on (and what was frozen stays so until the answer). Callers hold
// e.mu.
func (c *Core) startHold(e *entry, target int64, now time.Time) limiter.Hold {
	e.holding = true
	e.frozen = max(e.frozen, target)
	return limiter.Hold{Key: e.key, ResetAt: e.reset.Time(), Holder: e.holder, Producer: c.d.Producer, Expected: e.held,
		Frozen: target, Expiry: now.Add(holdTTL)}
}

// endHold takes a report's answer into e (err: none). Callers hold e.mu.
func (c *Core) endHold(e *entry, h limiter.Hold, r limiter.HoldResult, err error, now time.Time) {
	e.holding = false
	c.stats.frozen.Add(1)
	if err != nil {
		c.stats.holdErrors.Add(1)
	}
	if err != nil || !e.reset.Equal(h.ResetAt) {
		return // what was frozen stays frozen
	}
	switch r.Outcome {
	case limiter.Held:
		e.held, e.frozen, e.heldAt = h.Frozen, h.Frozen, instantOf(now)
	case limiter.HoldMismatch:
		// Less than e knew of: taken back (or a lost report lowered it;
		// giving up those units is safe either way).
		if lost := e.held - r.Have; lost > 0 {
			e.credit = max(0, e.credit-lost)
			e.frozen = max(0, e.frozen-lost)
			c.stats.takenBack.Add(uint64(lost))
		}
		e.held = r.Have
		e.frozen = max(e.frozen, e.held)
	case limiter.HoldGone:
		e.held, e.frozen = 0, 0
	}
}

// holdNow reports target as e's frozen share and waits for the answer
// until deadline, releasing e.mu meanwhile. Callers hold e.mu.
func (c *Core) holdNow(ctx context.Context, e *entry, target int64, now, deadline time.Time) {
	if e.holding {
		return
	}
	h := c.startHold(e, target, now)
	shard := e.at()
	e.mu.Unlock()
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	rs, err := c.d.Reserver.Hold(rctx, shard, []limiter.Hold{h})
	cancel()
	e.lock()
	var r limiter.HoldResult
	if err == nil && len(rs) == 1 {
		r = rs[0]
	} else if err == nil {
		err = context.DeadlineExceeded
	}
	c.endHold(e, h, r, err, c.d.Clock.Now())
}

// reportHolds sends the pending reports, a call per shard, each waiting up
// to budget, and takes in their answers.
func (c *Core) reportHolds(ctx context.Context, pending []pendingHold, budget time.Duration) {
	byShard := map[int][]pendingHold{}
	for _, p := range pending {
		byShard[p.e.at()] = append(byShard[p.e.at()], p)
	}
	for shard, ps := range byShard {
		hs := make([]limiter.Hold, len(ps))
		for i, p := range ps {
			hs[i] = p.h
		}
		rctx, cancel := context.WithTimeout(ctx, budget)
		rs, err := c.d.Reserver.Hold(rctx, shard, hs)
		cancel()
		if err == nil && len(rs) != len(hs) {
			err = context.DeadlineExceeded
		}
		now := c.d.Clock.Now()
		for i, p := range ps {
			var r limiter.HoldResult
			if err == nil {
				r = rs[i]
			}
			p.e.lock()
			c.endHold(p.e, p.h, r, err, now)
			p.e.mu.Unlock()
		}
	}
}
