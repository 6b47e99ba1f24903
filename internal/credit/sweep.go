package credit

import (
	"context"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// evicted gives back the credit of an entry the table let go, and leaves
// its holder for the key's next entry to carry on as when it has nothing
// in hand (departed.go).
func (c *Core) evicted(e *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := c.d.Clock.Now()
	c.release(e, now)
	if e.leaves(now) {
		e.gone = true
		c.departed.put(e.key.Digest(), e.identity())
	}
}

// release gives e's unused credit back to its window. Callers hold e.mu.
func (c *Core) release(e *entry, now time.Time) {
	c.releaseUnits(e, e.credit, now)
}

// releaseUnits gives units of e's credit back to its window. Callers hold
// e.mu.
func (c *Core) releaseUnits(e *entry, units int64, now time.Time) {
	units = min(units, e.free()) // frozen units go back by a report first
	if units <= 0 {
		return
	}
	if !e.live(now) {
		e.credit = 0
		return
	}
	ev := limiter.Entry{Kind: limiter.Release, Key: e.key, Policy: e.policy, Units: units, ResetAt: e.reset.Time(), Start: e.start.Time(), Time: now}
	if c.record(e, ev) != 0 {
		c.stats.released.Add(uint64(units))
		e.used -= units
		e.credit -= units
		e.noteFree()
	}
}

// trimSpare gives back, for a concurrency limit, the credit e held free
// all through the last IdleRelease or more (spareCredit): units beyond the
// edge's peak of requests in flight in that time, which the key's other
// edges may need. A client that moves to another edge while a few of its
// requests still come here is held below its limit there for two
// IdleRelease at most. Callers hold e.mu.
func (c *Core) trimSpare(e *entry, now time.Time) {
	s := e.spare
	if now.Sub(s.since.Time()) < c.cfg.IdleRelease {
		return
	}
	if s.least > 0 && e.refill == nil {
		c.releaseUnits(e, s.least, now)
	}
	s.least, s.since = e.free(), instantOf(now)
}

// forgetAfter is how long a key with no window and nothing in flight is
// remembered after its last request.
const forgetAfter = time.Minute

// Sweep gives back idle credit, forgets idle windows, and reads windows
// known to be full whose denials go on (in case a room notice was lost),
// and the windows of reservations whose answer was lost. The edge calls it
// every quarter of a second; ctx bounds its reads.
func (c *Core) Sweep(ctx context.Context, now time.Time) {
	c.seen.rotate(now)
	idle := now.Add(-c.cfg.IdleRelease).UnixNano()
	forget := now.Add(-forgetAfter).UnixNano()
	var recheck, lost []*entry
	var holds []pendingHold
	c.table.eachDue(now.UnixNano(), func(e *entry) {
		e.mu.Lock()
		defer e.mu.Unlock()
		last := e.lastUseNano.Load()
		if !e.reset.IsZero() && !now.Before(e.reset.Time()) {
			c.windowEnded(e, now)
		}
		// Credit unused for idle_release, or for three of the key's own
		// intervals between requests if that is longer (a key that comes
		// every two seconds keeps its credit between requests), goes back.
		quiet := last < idle
		if e.rate > 0 {
			quiet = quiet && now.UnixNano()-last > int64(3e9/e.rate)
		}
		if e.credit > 0 && quiet && e.refill == nil {
			c.release(e, now) // what is frozen goes back after the report below
		}
		if e.spare != nil {
			c.trimSpare(e, now)
		}
		if target, due := c.holdTarget(e, quiet, now); due {
			holds = append(holds, pendingHold{e: e, h: c.startHold(e, target, now)})
		}
		if !e.lost.IsZero() && e.inflight == 0 && !c.suspected(e.at(), now) {
			lost = append(lost, e)
		}
		switch {
		case !e.full || e.policy.Algorithm == limiter.TokenBucket:
			// A token bucket is full only until what its next request
			// needs has refilled (entry.refilled), which the edge
			// knows without a read. Any other full entry is read again
			// while its requests are denied: room that comes back by
			// refunds, releases or finishes is told by a notice, and
			// should one be lost (it came while this edge's own
			// reservation was on its way, whose answer then said full)
			// the edge would deny until its window ended — for a
			// sliding window's sub-window, or a concurrency limit's
			// lease, that can be hours.
			e.verified, e.recheck = 0, 0
		case e.verified.IsZero(): // full since the last sweep: read it a Recheck from now
			e.verified, e.recheck = instantOf(now), c.cfg.Recheck
		case e.deniedSince && now.Sub(e.verified.Time()) >= e.recheck:
			e.verified = instantOf(now)
			e.deniedSince = false
			// If this read finds the window still full, wait twice as long
			// for the next: a window full for an hour costs a handful of
			// reads, not one per second.
			e.recheck = min(2*e.recheck, 32*c.cfg.Recheck)
			recheck = append(recheck, e)
		}
		if last < forget && e.reset.IsZero() && e.refill == nil && len(e.debts) == 0 && e.lost.IsZero() {
			c.table.remove(e.key.Digest(), e)
			return
		}
		// An entry with nothing in hand is left alone until its window
		// resets (or, without one, until it is to be forgotten) unless it
		// changes: most of a large table is keys seen once, and a sweep
		// visits only the few that hold credit or are full.
		if e.settled() {
			until := int64(e.reset)
			if until == 0 {
				until = last + int64(forgetAfter)
			}
			e.quiet(until)
		}
	})
	c.reportHolds(ctx, holds, c.cfg.RedisBudget)
	c.resolveLost(ctx, lost, now, c.cfg.RedisBudget)
	for _, e := range recheck {
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, c.cfg.RedisBudget)
		w, err := c.d.Reserver.Check(rctx, e.key)
		cancel()
		c.stats.rechecks.Add(1)
		if err != nil {
			continue
		}
		e.mu.Lock()
		switch {
		case !w.Live:
			// No window where the edge knows one: an operator's reset (a
			// room notice says so too), or a primary that lost it and is
			// being re-seeded from what the edges hold. The edge keeps
			// what it knows, and the next request's reservation says which.
			e.full = false
		case e.reset.Equal(w.ResetAt) && w.Used < e.used:
			e.used = w.Used
			if e.policy.Limit-e.used >= max(1, e.lastCost) {
				e.full = false
			}
		}
		if w.Live && e.reset.Equal(w.ResetAt) && w.Expired > 0 && e.full && e.refill == nil {
			// Credit frozen by an edge that stopped reporting (hold.go):
			// a reservation takes it back.
			c.startTake(e, max(1, e.lastCost), now)
		}
		e.mu.Unlock()
	}
}

// ReleaseAll gives back every credit: the edge is stopping. Reservations
// whose answer was lost are resolved first (within ctx), so that what they
// got goes back too, and frozen credit is unfrozen. No request waits any
// more: each call may take up to shutdownBudget (a slow primary would
// otherwise keep what the edge froze, or a lost reservation's units, until
// the window resets). Call it after Wait.
func (c *Core) ReleaseAll(ctx context.Context, now time.Time) {
	var lost []*entry
	c.table.each(func(e *entry) {
		e.mu.Lock()
		if !e.lost.IsZero() && e.inflight == 0 {
			lost = append(lost, e)
		}
		e.mu.Unlock()
	})
	c.resolveLost(ctx, lost, now, max(c.cfg.RedisBudget, shutdownBudget))
	// Frozen credit is unfrozen first, so that all of it goes back; what a
	// failed report leaves frozen, others take back once it expires.
	var holds []pendingHold
	c.table.each(func(e *entry) {
		e.mu.Lock()
		if e.held > 0 && !e.holding && e.live(now) {
			holds = append(holds, pendingHold{e: e, h: c.startHold(e, 0, now)})
		}
		e.mu.Unlock()
	})
	c.reportHolds(ctx, holds, max(c.cfg.RedisBudget, shutdownBudget))
	c.table.each(func(e *entry) {
		e.mu.Lock()
		c.release(e, now)
		e.mu.Unlock()
	})
}

// shutdownBudget is how long each of ReleaseAll's calls may wait for its
// primary.
const shutdownBudget = 2 * time.Second

// Wait waits for the reservations in flight in the background.
func (c *Core) Wait() { c.wg.Wait() }
