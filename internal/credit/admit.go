package credit

import (
	"github.com/tallyhq/tally/internal/limiter"
)

// borrow admits a request beyond this edge's credit from what the edge
// knows of the window, charging it with an accounting event. It reports
// false when the edge knows of too little room. Callers hold e.mu.
func (c *Core) borrow(v Verdict, e *entry, cost int64) (Verdict, bool) {
	if e.room() < cost {
		return v, false
	}
	units := cost - e.free() // > 0: callers use credit when it suffices
	if units <= 0 || len(e.debts) >= limiter.MaxOwed {
		return v, false
	}
	seq := c.record(e, limiter.Entry{Kind: limiter.Charge, Key: e.key, Policy: v.Policy, Units: units,
		ResetAt: e.reset.Time(), Start: v.Now, Time: c.d.Clock.Now(), RequestID: v.RequestID()})
	if seq == 0 {
		return v, false
	}
	e.credit = e.frozen
	e.debts = append(e.debts, debt{seq: seq, units: units})
	e.admitted += cost
	v.ChargeSeq = seq
	return c.allow(v, e, PathBorrow), true
}

// fallback decides when no reservation came in time: from what the edge
// knows of the window when it knows it, else by the FailOpen rule.
// Callers hold e.mu.
func (c *Core) fallback(v Verdict, e *entry, cost int64) (Verdict, error) {
	known := e.live(v.Now)
	if known {
		if e.spendable(cost) && !e.exact() { // a reservation came in meanwhile
			e.spend(cost)
			return c.allow(v, e, PathCredit), nil
		}
		if e.room() < cost && !e.refilled(cost, v.Now) { // full, as far as anyone knows: no Redis needed
			e.deniedSince, e.lastCost = true, cost
			return c.deny(v, e, PathCache), nil
		}
	}
	if !c.d.FailOpen {
		c.stats.unavailable.Add(1)
		return v, ErrUnavailable
	}
	if known {
		if v, ok := c.borrow(v, e, cost); ok {
			return v, nil
		}
	}
	// Nothing known: admit, and charge by the request's start (a window
	// aligned to the clock or on the calendar is known by it: charged
	// there, so that the charge opens no other window).
	charge := limiter.Entry{Kind: limiter.Charge, Key: e.key, Policy: v.Policy, Units: cost, Start: v.Now,
		Time: c.d.Clock.Now(), RequestID: v.RequestID()}
	charge.ResetAt, _ = algorithmOf(v.Policy.Algorithm).blind(v.Policy, v.Now)
	if seq := c.d.Ledger.Record(e.at(), charge); seq != 0 {
		v.ChargeSeq = seq
	}
	v.Path = PathFailOpen
	c.counted(e, PathFailOpen, 1)
	return v, nil
}

// allow fills an allowed verdict from e. Callers hold e.mu.
func (c *Core) allow(v Verdict, e *entry, path Path) Verdict {
	v.Path, v.Decided, v.Reset, v.Shard = path, true, e.reset.Time(), e.at()
	v.N = e.served
	e.served++
	c.counted(e, path, 1)
	c.decision(&v, e, true)
	return v
}

// deny fills a denied verdict from e. Callers hold e.mu.
func (c *Core) deny(v Verdict, e *entry, path Path) Verdict {
	v.Path, v.Decided, v.Reset, v.Shard = path, true, e.reset.Time(), e.at()
	c.counted(e, path, 0)
	// Denied: room < cost, so Remaining is below the cost and never the
	// limit.
	c.decision(&v, e, false)
	return v
}

// decision fills what v tells the client: the units counted (this edge's
// unspent credit not among them) against the limit, of the window its
// algorithm names. Callers hold e.mu.
func (c *Core) decision(v *Verdict, e *entry, allowed bool) {
	used := max(0, e.used+e.debtUnits()-e.credit)
	wait := used
	if !allowed {
		wait = used + v.Cost - v.Policy.Limit
	}
	window, reset := e.alg().told(v.Policy, e.reset.Time(), wait, e.lastTake.Time(), v.Now)
	v.Decision = limiter.Decision{Allowed: allowed, Resource: v.Policy.Name, Limit: v.Policy.Limit, Cost: v.Cost,
		Used: used, Remaining: max(0, v.Policy.Limit-used), Window: window, ResetAt: reset, Now: v.Now}
}

// counted counts a decision of e's key by its path and its policy.
func (c *Core) counted(e *entry, path Path, allowed int) {
	c.stats.byPath[path][allowed].Add(1)
	if e.counts != nil {
		e.counts[allowed].Add(1)
	}
}

// Refund gives a proxied 304 response's charge back: into this edge's
// credit when it was charged by a reservation in the window this edge
// still holds (no Redis call; it reports true), else through an
// accounting event. A request the edge answered is finished here once,
// inside the edge: nothing outside can send its finish again.
func (c *Core) Refund(v Verdict) (absorbed bool) {
	now := c.d.Clock.Now()
	if v.ChargeSeq == 0 && v.Reset.IsZero() {
		return false // admitted without a window and without a charge: nothing to give back
	}
	ev := limiter.Entry{Kind: limiter.Refund, Key: v.Key, Policy: v.Policy, Units: v.Cost, ResetAt: v.Reset,
		Start: v.Now, Time: now, RequestID: v.RequestID(), TraceParent: v.TraceParent, ChargeSeq: v.ChargeSeq}
	if e := c.table.lookup(v.Key.Digest()); e != nil {
		e.lock()
		mine := e.reset.Equal(v.Reset) && e.live(now)
		if mine && v.ChargeSeq == 0 && v.Policy.Mode.OrDefault() != limiter.ModeExact {
			e.credit += v.Cost
			// The request took nothing in the end: the key's rate, which
			// sizes its reservations, counts what it consumes.
			e.admitted = max(0, e.admitted-v.Cost)
			e.mu.Unlock()
			c.stats.absorbed.Add(1)
			return true
		}
		if mine {
			c.record(e, ev) // the entry's window: noted for a reseed
			e.mu.Unlock()
			return false
		}
		e.mu.Unlock()
	}
	c.d.Ledger.Record(v.Shard, ev)
	return false
}

// GiveBack gives back what the allowed verdicts vs charged for a request
// another of its limits denied (the request was not served).
func (c *Core) GiveBack(vs []Verdict) {
	for _, v := range vs {
		if v.Allowed() && v.Cost > 0 && v.Path != 0 { // decided, and charged something
			c.Refund(v)
		}
	}
}
