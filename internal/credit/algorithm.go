package credit

import (
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// An algorithm is what one kind of limit makes of the plain numbers an
// entry keeps (docs/architecture.md, "The seam an algorithm plugs into"):
// the terms a reservation is asked on, what a decision tells a client, and
// where its spans lie. Decide's loop — spend credit, deny from memory when
// full, reserve, wait within the budget, fail open or closed — is one loop
// for every algorithm, and is what makes each exact from every edge; an
// algorithm says only what its numbers mean. It does no I/O and keeps no
// state of its own: an entry's numbers are the state, and a policy names
// its algorithm (limiter.Policy.Algorithm).
//
// What is left from memory (entry.room: limit − used − debts + credit −
// frozen) and whether an answer leaves nothing (used ≥ limit) are the
// same arithmetic for every algorithm: its script answers in those terms
// (limiter.Grant.Used is the count the algorithm holds against the limit:
// a window's units, a sliding window's span, a bucket's burst less the
// tokens left, the units held in flight), and an edge that judges from an
// answer it has not refreshed judges from an older, larger count, never a
// smaller one.
//
// Its other half is on the primary: the script that reserves in its state
// for a holder, never past its guarantee (limiter.TakeArgs to
// redisstore's scripts), and the one that applies its accounting events.
type algorithm interface {
	// terms are a reservation's terms under p at now, the parts of
	// limiter.TakeArgs the algorithm answers: the limit, and the span a
	// reservation made now opens when none is live (Window, Opens).
	terms(p limiter.Policy, now time.Time) limiter.TakeArgs
	// tell is what a decision of v tells the client, with used the units
	// counted (this edge's unspent credit not among them). Callers hold
	// e.mu.
	tell(v Verdict, e *entry, allowed bool, used int64) limiter.Decision
	// ending is p's span that ends at reset: what a notice naming a reset
	// is about.
	ending(p limiter.Policy, reset time.Time) limiter.Span
	// blind is the reset of the span a charge made at now falls in when no
	// span of the key is known (fail-open): zero when the primary places
	// it by the charge's start. latest is the latest it can be.
	blind(p limiter.Policy, now time.Time) (reset, latest time.Time)
}

// algorithmOf is the unit of algorithm a. Policies are validated, and the fixed
// window ("" or limiter.FixedWindow) is the one this version has: a second
// algorithm adds its case here. The choice is made on the request path, so
// it stays one the compiler resolves (the fixed window's arithmetic is
// inlined where the core calls it).
func algorithmOf(limiter.Algorithm) algorithm { return fixed }

// alg is e's policy's algorithm. Callers hold e.mu.
func (e *entry) alg() algorithm { return algorithmOf(e.policy.Algorithm) }

// fixed is the fixed window: Limit units per window, a window opening at
// a client's first request, at a multiple of its length or on the
// calendar (limiter.Policy.WindowAt), its credit good until its reset.
var fixed fixedWindow

type fixedWindow struct{}

func (fixedWindow) terms(p limiter.Policy, now time.Time) limiter.TakeArgs {
	return limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Opens: p.WindowAt(now)}
}

func (fixedWindow) tell(v Verdict, e *entry, allowed bool, used int64) limiter.Decision {
	reset := e.reset.Time()
	d := limiter.Decision{Allowed: allowed, Resource: v.Policy.Name, Limit: v.Policy.Limit, Cost: v.Cost,
		Used: max(0, used), Window: v.Policy.Ending(reset).Length(), ResetAt: reset, Now: v.Now}
	d.Remaining = max(0, d.Limit-d.Used)
	return d
}

func (fixedWindow) ending(p limiter.Policy, reset time.Time) limiter.Span { return p.Ending(reset) }

func (fixedWindow) blind(p limiter.Policy, now time.Time) (reset, latest time.Time) {
	if p.Fixed() {
		r := p.WindowAt(now).ResetAt
		return r, r
	}
	return time.Time{}, now.Add(p.Window + time.Second)
}
