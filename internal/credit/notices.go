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
			// A window another edge opened: it started its length (its
			// calendar period) before its reset. What this edge reserves
			// there later goes back with that start (an event needs one).
			e.reset, e.start = instantOf(n.ResetAt), instantOf(e.alg().ending(e.policy, n.ResetAt).Start)
		}
		e.full = true
		e.used = max(e.used, n.Used)
		e.doubtful = len(e.debts) > 0
	case !n.Full && e.reset.Equal(n.ResetAt):
		e.full = false
		// The count a notice carries may predate this edge's latest
		// reservation: it holds at least what this edge reserved.
		e.used = max(n.Used, e.credit)
		e.doubtful = len(e.debts) > 0
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
	// What the window counts once this edge's charges in flight are
	// applied: an overdraft makes it more than the limit.
	c.d.Notifier.Notify(e.at(), Notice{Full: true, Key: e.key.Digest(), ResetAt: e.reset.Time(), Used: e.used + e.debtUnits()})
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
			e.doubtful = len(e.debts) > 0
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
// gives a 304's charge back, and a concurrency limit's units whatever the
// status (limiter.Algorithm.GivesBack); every later one changes nothing.
func (c *Core) Finish(ctx context.Context, v Verdict, status int, now time.Time) (limiter.FinishResult, error) {
	return c.finish(ctx, v, status, v.Policy.Algorithm.GivesBack(status, v.Cost), now)
}

// TrueUp finishes a decision-API request whose cost was an estimate, once,
// with its actual cost (0 to the limit): what the estimate charged beyond
// it is given back on the primary; what it cost beyond the estimate is
// charged in full, even past the limit (an overdraft the window carries
// until its reset, recorded as such by the accountant), by an accounting
// event into the request's window. Every later finish changes nothing.
// charged is what was charged beyond the estimate.
func (c *Core) TrueUp(ctx context.Context, v Verdict, status int, actual int64, now time.Time) (res limiter.FinishResult, charged int64, err error) {
	if v.Policy.Algorithm == limiter.Concurrency {
		// Units held in flight have no actual cost: the finish gives them back.
		res, err = c.Finish(ctx, v, status, now)
		return res, 0, err
	}
	res, err = c.finish(ctx, v, status, max(0, v.Cost-actual), now)
	if err != nil {
		return res, 0, err
	}
	switch {
	case res.Outcome == limiter.Finished && actual > v.Cost:
		charged = actual - v.Cost
	case res.Outcome == limiter.FinishPending:
		// The request's charge event was not applied yet and now nets
		// whole: the request's actual cost is charged again.
		charged = actual
	}
	if charged > 0 {
		c.overdraw(v, charged, now)
	}
	return res, charged, nil
}

func (c *Core) finish(ctx context.Context, v Verdict, status int, back int64, now time.Time) (limiter.FinishResult, error) {
	a := limiter.FinishArgs{Start: v.Now, Window: v.Policy.Window, Producer: v.Producer, Holder: v.Holder(),
		N: v.N, Units: v.Cost, ChargeSeq: v.ChargeSeq, Status: status, Back: back, Slices: v.Policy.Slices}
	if v.Decided {
		a.ResetAt = v.Reset
	} else if v.Policy.Slices > 0 {
		a.ResetAt, _ = algorithmOf(v.Policy.Algorithm).blind(v.Policy, v.Now)
	}
	res, err := c.d.Reserver.Finish(ctx, v.Key, now, a)
	if err == nil && res.Outcome == limiter.Finished && res.Amount > 0 {
		c.finished(v, res)
		c.Learn(v.Shard, v.Key.Digest(), res.ResetAt, res.Used)
	}
	return res, err
}

// finished notes in this edge's entry what a finish of one of its own
// requests gave back in its window, for a reseed (claims.go).
func (c *Core) finished(v Verdict, res limiter.FinishResult) {
	if v.Producer != c.d.Producer {
		return
	}
	if e := c.table.lookup(v.Key.Digest()); e != nil {
		e.lock()
		if e.holderNum == v.HolderNum && e.reset.Equal(res.ResetAt) {
			e.sent(false, res.Amount)
		}
		e.mu.Unlock()
	}
}

// Charge applies a cost known only once a request is done (the tokens a
// model answered with: Envoy's apply_on_stream_done) in full, even past the
// limit: an overdraft the window carries until its reset. A window the edge
// does not know is opened or learnt first by one reservation of what of the
// cost it can hold (within RedisBudget); the edge's credit pays what it
// covers, and the rest is charged by an accounting event, remembered as
// owed so that this edge denies the window's next requests as soon as it
// is spent (and tells the other edges when it is full). It never denies;
// with Redis unreachable the whole cost goes by an event placed by the
// request's start.
func (c *Core) Charge(ctx context.Context, p limiter.Policy, cost int64, dg limiter.Digest, now time.Time, reqNum uint64) Verdict {
	e := c.acquire(dg, p)
	defer e.mu.Unlock()
	v := Verdict{Policy: p, Cost: cost, Key: e.key, Shard: e.at(), Now: now, Producer: c.d.Producer, ReqNum: reqNum,
		HolderNum: e.holderNum}
	e.lastUseNano.Store(now.UnixNano())
	e.adopt(p)
	if !e.reset.IsZero() && !now.Before(e.reset.Time()) {
		c.windowEnded(e, now)
	}
	if !e.live(now) && !c.suspected(e.at(), now) {
		args := e.alg().terms(p, now)
		args.Need, args.Want, args.Producer, args.Holder, args.Owed = 1, min(cost, p.Limit), c.d.Producer, e.holder, e.owed()
		if _, full, err := c.takeWaiting(ctx, e, args, now, time.Now().Add(c.cfg.RedisBudget)); err == nil {
			if full {
				c.publishFull(e)
			}
			c.reconcile(e, now)
		}
	}
	if e.live(now) && e.free() >= cost {
		e.spend(cost)
		return c.allow(v, e, PathCredit)
	}
	units := cost
	if e.live(now) {
		units -= e.free()
		e.admitted += e.free()
		e.credit = e.frozen
	}
	v.ChargeSeq = c.overdrawLocked(e, v, units, e.reset.Time(), now)
	if !e.live(now) {
		// Redis unreachable: the event opens or finds the window by the
		// request's start, as a fail-open admission's does.
		v.Path = PathFailOpen
		c.counted(e, PathFailOpen, 1)
		return v
	}
	return c.allow(v, e, PathBorrow)
}

// overdraw charges units of v's request past any limit by an accounting
// event into the request's window.
func (c *Core) overdraw(v Verdict, units int64, now time.Time) {
	e := c.acquire(v.Key.Digest(), v.Policy)
	defer e.mu.Unlock()
	reset := time.Time{}
	if v.Decided {
		reset = v.Reset
	}
	c.overdrawLocked(e, v, units, reset, now)
}

// overdrawLocked records the charge of units into the window that resets at
// reset (zero: placed by the request's start) and returns its sequence
// number (0: dropped). When it is e's window, e remembers it as owed, and a
// window it fills is full for every edge. Callers hold e.mu.
func (c *Core) overdrawLocked(e *entry, v Verdict, units int64, reset, now time.Time) uint64 {
	seq := c.record(e, limiter.Entry{Kind: limiter.Charge, Key: e.key, Policy: v.Policy, Units: units,
		ResetAt: reset, Start: v.Now, Time: now, RequestID: v.RequestID(), TraceParent: v.TraceParent})
	if seq == 0 || reset.IsZero() || !e.reset.Equal(reset) || !e.live(now) {
		return seq
	}
	if len(e.debts) < limiter.MaxOwed {
		e.debts = append(e.debts, debt{seq: seq, units: units})
	} else {
		e.used += units // counted until a reservation's answer says what the primary holds
	}
	if e.room() <= 0 && !e.full {
		e.full = true
		c.publishFull(e)
	}
	return seq
}
