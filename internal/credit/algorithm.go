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
	// told is the window a decision under p at now tells the client of,
	// and when it resets, when the entry's window resets at reset and wait
	// units are to come back (counted beyond the limit: all that is used,
	// for a request admitted; what the request's cost needs beyond what
	// is left, for one denied) counting from learnt, when the entry learnt
	// its count (its last reservation; zero when none). It answers plain
	// values only: the core builds the decision itself, so that no verdict
	// is copied through the interface on the request path.
	told(p limiter.Policy, reset time.Time, wait int64, learnt, now time.Time) (time.Duration, time.Time)
	// ending is p's span that ends at reset: what a notice naming a reset
	// is about.
	ending(p limiter.Policy, reset time.Time) limiter.Span
	// quiet reports, when ok, whether a reservation at now of an entry
	// whose last one was at learnt (zero: none) finds in Redis nothing
	// that entry wrote near now, so that its store may try the short way
	// (limiter.TakeArgs.Fresh); ok false leaves that to whether the key
	// was seen at all (Core.fresh).
	quiet(learnt, now time.Time) (fresh, ok bool)
	// blind is the reset of the span a charge made at now falls in when no
	// span of the key is known (fail-open): zero when the primary places
	// it by the charge's start. latest is the latest it can be.
	blind(p limiter.Policy, now time.Time) (reset, latest time.Time)
}

// algorithmOf is the unit of algorithm a. Policies are validated: a
// concurrency limit is counted as a sliding window of two sub-windows of
// its lease (what differs, that any finish gives a request's units back, is
// limiter.Algorithm.GivesBack, asked where a request finishes); anything
// else is the fixed window, as "" is.
func algorithmOf(a limiter.Algorithm) algorithm {
	if a == limiter.TokenBucket {
		return bucket
	}
	if a.Sliding() {
		return sliding
	}
	return fixed
}

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

func (fixedWindow) told(p limiter.Policy, reset time.Time, _ int64, _, _ time.Time) (time.Duration, time.Time) {
	return p.Ending(reset).Length(), reset
}

func (fixedWindow) ending(p limiter.Policy, reset time.Time) limiter.Span { return p.Ending(reset) }

func (fixedWindow) quiet(_, _ time.Time) (bool, bool) { return false, false }

func (fixedWindow) blind(p limiter.Policy, now time.Time) (reset, latest time.Time) {
	if p.Fixed() {
		r := p.WindowAt(now).ResetAt
		return r, r
	}
	return time.Time{}, now.Add(p.Window + time.Second)
}

// sliding is the sliding window: at most Limit units in any Slices
// consecutive sub-windows of Window, aligned to the clock. Each sub-window
// is a window of the fixed kind under its own key, whose script counts the
// other sub-windows of its spans (Grant.Used is the fullest span): an
// entry's window is its sub-window, its credit good until that ends, and
// what is left from memory is the same arithmetic as a fixed window's. A
// sub-window goes on counting in the spans after it: the credit an edge
// holds when it ends goes back by an event, and what the edge reserved and
// sent for it is re-asserted in a reseed until it leaves the last span
// (Core.windowEnded).
var sliding slidingWindow

type slidingWindow struct{}

func (slidingWindow) terms(p limiter.Policy, now time.Time) limiter.TakeArgs {
	return limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Opens: p.WindowAt(now), Align: true, Slices: p.Slices}
}

// told: the window a client is told of is the span; its reset is when the
// sub-window ends, the next time room can come back.
func (slidingWindow) told(p limiter.Policy, reset time.Time, _ int64, _, _ time.Time) (time.Duration, time.Time) {
	return p.Span(), reset
}

func (slidingWindow) ending(p limiter.Policy, reset time.Time) limiter.Span {
	return limiter.Span{Start: reset.Add(-p.Window), ResetAt: reset}
}

func (slidingWindow) quiet(_, _ time.Time) (bool, bool) { return false, false }

func (slidingWindow) blind(p limiter.Policy, now time.Time) (reset, latest time.Time) {
	r := p.WindowAt(now).ResetAt
	return r, r
}

// bucket is the token bucket: at most Limit (the burst) + Rate × t / Every
// units in any interval t. Its periods are a sliding window's sub-windows
// of BucketPeriod, two to a span: credit reserved in a period is spent in
// it, and what is left goes back by an event when it ends. Its script also
// counts what was spent and has not refilled yet (Grant.Used holds it), so
// what is left from memory is the same arithmetic as a window's. A client
// is told the time the whole burst takes to refill as the window, and as
// the reset when the units it waits for are back: the whole burst for a
// request admitted, its cost for one denied — by the count the entry last
// learnt, which other edges' use can only make later.
var bucket tokenBucket

type tokenBucket struct{ slidingWindow }

func (tokenBucket) terms(p limiter.Policy, now time.Time) limiter.TakeArgs {
	a := sliding.terms(p, now)
	a.Rate, a.Every, a.Spent = p.Rate, p.Every, p.Mode == limiter.ModeExact
	return a
}

// told: the units waited for refill at the rate from when the count was
// learnt — when entry.refilled turns true and the edge asks again — and
// never before now.
func (tokenBucket) told(p limiter.Policy, _ time.Time, wait int64, learnt, now time.Time) (time.Duration, time.Time) {
	from := now
	if !learnt.IsZero() && learnt.Before(now) {
		from = learnt
	}
	at := from.Add(p.Refill(wait))
	if at.Before(now) {
		at = now
	}
	return p.Refill(p.Limit), at
}

// quiet: a reservation reads the period it reserves in, the one after it
// and the three before it (lua/bucket.lua); one quietPeriods periods after
// this entry's last finds none of them from that one.
func (tokenBucket) quiet(learnt, now time.Time) (bool, bool) {
	return learnt.IsZero() || now.Sub(learnt) >= quietPeriods*limiter.BucketPeriod, true
}

// quietPeriods: see tokenBucket.quiet.
const quietPeriods = 4
