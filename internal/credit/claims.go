package credit

import (
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// A window's primary can change under the edge and lose the end of what
// was done to the window (a promotion, a restart without persistence):
// the edge then re-asserts, in a reseed, what it holds there
// (redisstore/reseed.go, lua/reseed.lua). What it knows of each window is in
// its entry: what it was given (known, mine), and what it sent for the
// window since the entry learnt it (sent: its charges, refunds and releases,
// and the finishes it made of its own requests there), which a window the
// new primary lost counts in full.

// record hands an accounting entry of e's key to the ledger, noting it in
// e when it is of e's window. Callers hold e.mu.
func (c *Core) record(e *entry, le limiter.Entry) uint64 {
	seq := c.d.Ledger.Record(e.at(), le)
	if seq != 0 && !le.ResetAt.IsZero() && e.reset.Equal(le.ResetAt) {
		if e.sentTo == 0 {
			e.sentFrom = seq - 1
		}
		e.sentTo = max(e.sentTo, seq)
		e.sent(le.Kind == limiter.Charge, le.Units)
	}
	return seq
}

// pastWindow is what an entry reserved and sent in a sub-window of a
// sliding window that has ended (entry.past): it counts in the spans after
// it, so a reseed re-asserts it until it leaves the last one.
type pastWindow struct {
	reset, start       instant
	reserved           int64
	charged, givenBack int64
	from, to           uint64
}

// keepPast remembers what e reserved and sent in its sub-window, which has
// ended, and forgets the sub-windows no span holds any more. Callers hold
// e.mu.
func (e *entry) keepPast(now time.Time) {
	linger := e.policy.Linger()
	if e.past != nil {
		kept := (*e.past)[:0]
		for _, pw := range *e.past {
			if pw.reset.Time().Add(linger).After(now) {
				kept = append(kept, pw)
			}
		}
		*e.past = kept
	}
	var reserved int64
	if e.countsReset == e.reset {
		reserved = max(e.known, e.mine)
	}
	if e.reset.IsZero() || e.start.IsZero() || !e.reset.Time().Add(linger).After(now) ||
		(reserved == 0 && e.charged == 0 && e.givenBack == 0) {
		return
	}
	if e.past == nil {
		e.past = new([]pastWindow)
	}
	*e.past = append(*e.past, pastWindow{reset: e.reset, start: e.start, reserved: reserved, charged: e.charged,
		givenBack: e.givenBack, from: e.sentFrom, to: e.sentTo})
}

// pastClaims appends to out the claims of e's sub-windows that have ended
// and are still in a span at now. Callers hold e.mu.
func (e *entry) pastClaims(out []limiter.Claim, producer string, now time.Time) []limiter.Claim {
	if e.past == nil {
		return out
	}
	for _, pw := range *e.past {
		if !pw.reset.Time().Add(e.policy.Linger()).After(now) {
			continue
		}
		out = append(out, limiter.Claim{Key: e.key, Window: e.policy.Window, ResetAt: pw.reset.Time(), Start: pw.start.Time(),
			Holder: e.holder, Producer: producer, Reserved: pw.reserved, Charged: pw.charged, GivenBack: pw.givenBack,
			From: pw.from, To: pw.to, Slices: e.policy.Slices})
	}
	return out
}

// sent counts units e charged (charge) or gave back in its window.
func (e *entry) sent(charge bool, units int64) {
	if charge {
		e.charged += units
	} else {
		e.givenBack += units
	}
}

// Claims lists what this edge holds in shard's windows live at now: for
// each entry, what it was given in its window and what it sent for it
// (limiter.Claim). It walks the whole table.
func (c *Core) Claims(shard int, now time.Time) []limiter.Claim {
	var out []limiter.Claim
	c.table.each(func(e *entry) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.at() != shard {
			return
		}
		out = e.pastClaims(out, c.d.Producer, now)
		if !e.live(now) || e.start.IsZero() {
			return
		}
		cl := limiter.Claim{Key: e.key, Window: max(e.policy.Window, e.reset.Time().Sub(e.start.Time())), ResetAt: e.reset.Time(), Start: e.start.Time(),
			Holder: e.holder, Producer: c.d.Producer, Charged: e.charged, GivenBack: e.givenBack, From: e.sentFrom, To: e.sentTo,
			Slices: e.policy.Slices}
		if e.countsReset == e.reset {
			cl.Reserved = max(e.known, e.mine)
		}
		if e.held > 0 {
			cl.Frozen, cl.FrozenExpiry = e.held, now.Add(holdTTL)
		}
		if cl.Reserved == 0 && cl.Charged == 0 && cl.GivenBack == 0 && cl.Frozen == 0 {
			return // nothing of this edge's in the window
		}
		out = append(out, cl)
	})
	c.stats.claims.Add(uint64(len(out)))
	return out
}
