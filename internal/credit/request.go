package credit

import (
	"context"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// A request is decided here whole, whichever door it came through: every
// limit it is held to, an operator's temporary limits and blocks, and
// progressive backoff (the Healer port), into one Outcome that names the
// limit that denied it and how. A door turns its protocol into Limits and
// the Outcome into its answer, and decides nothing itself.

// Limit is one limit a request is held to: its policy in the client's
// terms (tier, override), the digest of the window's key, and what the
// request costs there (0: it charges nothing, and is denied only by a
// window past its limit). Quota limits deny a request only all together
// (envoyproxy/ratelimit's quota_mode).
type Limit struct {
	Policy limiter.Policy
	Digest limiter.Digest
	Cost   int64
	Quota  bool
}

// Outcome is a request's decision: a verdict per limit, in the request's
// order, and which limit denied it (-1: none did). A limit left undecided
// because the request was denied first has the zero Verdict; so has a
// limit the request's cost is beyond (Refused), which denies with no window
// to read. What the other limits of a denied request charged was given back.
type Outcome struct {
	Verdicts []Verdict
	Denied   int
}

// Allowed reports whether the request may go on.
func (o Outcome) Allowed() bool { return o.Denied < 0 }

// Refused reports whether the request was denied by a limit its cost is
// beyond (configured so: no window was read).
func (o Outcome) Refused() bool { return o.Denied >= 0 && o.Verdicts[o.Denied].Path == 0 }

// Denial is the verdict of the limit that denied the request.
func (o Outcome) Denial() Verdict { return o.Verdicts[o.Denied] }

// Healer is what the edge knows beyond the windows that can deny a client:
// an operator's temporary limits and blocks (the limits stream), and
// progressive backoff for clients that keep coming back while denied.
type Healer interface {
	// Terms is the temporary limit of dg under the named policy live at
	// now, if any.
	Terms(policy string, dg limiter.Digest, now time.Time) (Temporary, bool)
	// Early reports whether the client came back before the Retry-After
	// it was told under p, and when it may come back, with its strikes
	// (a denial with no window read). Nil when p does not back off.
	Early(p limiter.Policy, dg limiter.Digest, now time.Time) (Backoff, bool)
	// Answered tells the backoff of p how a request of dg was decided by
	// its window: an admission forgets the client, a denial (with the
	// window's reset) remembers it.
	Answered(p limiter.Policy, dg limiter.Digest, now time.Time, d limiter.Decision)
}

// Temporary is an operator's temporary terms for one client under one
// policy: a limit in place of the policy's, or a block, until Until.
type Temporary struct {
	Limit int64
	Until time.Time
	Block bool
}

// Backoff is how long a client that came back too early must wait: until
// Until, its Strikes-th early return in a row; Reset is the window's reset
// its earlier answers showed.
type Backoff struct {
	Until, Reset time.Time
	Strikes      int
}

// DecideRequest decides a request held to every limit of limits, so that
// a denied request consumes nothing: a block, a cost beyond a limit or a
// window the edge knows full denies before any limit reserves; then each
// limit decides in order, and a denial gives back what the others charged.
// A limit in shadow mode never denies (its verdict says what it would have
// done); quota limits deny only when every one of them does. A temporary
// limit that lowers a policy's limit below the request's cost denies it
// until it lifts, as a block does. vs is reused for the verdicts. An error
// (Redis unreachable, failing closed) leaves nothing charged.
func (c *Core) DecideRequest(ctx context.Context, limits []Limit, now time.Time, reqNum uint64, vs []Verdict) (Outcome, error) {
	vs = vs[:0]
	for range limits {
		vs = append(vs, Verdict{})
	}
	// An operator's terms first: each limit in them (limits[i].Policy is
	// left in the terms it is decided by), and the first block denies
	// before anything is read, as does a cost beyond a limit's configured
	// terms (refused) or a window the edge knows full.
	var held [8]heldBy
	terms := held[:0]
	for i := range limits {
		l := &limits[i]
		t := heldBy{refused: l.Cost > l.Policy.Limit}
		if c.d.Healer == nil {
			terms = append(terms, t)
			continue
		}
		if tl, ok := c.d.Healer.Terms(l.Policy.Name, l.Digest, now); ok {
			if !tl.Block {
				l.Policy.Limit = tl.Limit
			}
			if !t.refused && (tl.Block || l.Cost > l.Policy.Limit) {
				t.blocked = tl.Until
			}
		}
		terms = append(terms, t)
	}
	for i, l := range limits {
		if !terms[i].blocked.IsZero() && !l.Policy.Shadow {
			vs[i] = c.blockedVerdict(l, terms[i].blocked, now, reqNum)
			return Outcome{Verdicts: vs, Denied: i}, nil
		}
		if l.Policy.Shadow || l.Quota {
			continue
		}
		if terms[i].refused {
			return Outcome{Verdicts: vs, Denied: i}, nil
		}
		if len(limits) > 1 && l.Cost > 0 {
			if v, full := c.Peek(l.Policy, l.Cost, l.Digest, now, reqNum); full {
				vs[i] = v
				return Outcome{Verdicts: vs, Denied: i}, nil
			}
		}
	}
	quotas, quotaDenied, firstQuota := 0, 0, -1
	for i, l := range limits {
		if l.Quota {
			quotas++
		}
		if !terms[i].blocked.IsZero() {
			// Only a shadow limit gets here: its verdict says what the
			// block would have done, and it denies nothing.
			vs[i] = c.blockedVerdict(l, terms[i].blocked, now, reqNum)
			continue
		}
		denied := terms[i].refused
		if !denied {
			v, err := c.decideOne(ctx, l, now, reqNum)
			if err != nil {
				c.GiveBack(vs[:i])
				return Outcome{Verdicts: vs, Denied: -1}, err
			}
			vs[i] = v
			denied = !v.Allowed()
		}
		switch {
		case !denied || l.Policy.Shadow:
		case l.Quota:
			quotaDenied++
			if firstQuota < 0 {
				firstQuota = i
			}
		default:
			// Denied by one limit: what the others charged goes back.
			c.GiveBack(vs[:i])
			return Outcome{Verdicts: vs, Denied: i}, nil
		}
	}
	if quotaDenied > 0 && quotaDenied == quotas {
		c.GiveBack(vs)
		return Outcome{Verdicts: vs, Denied: firstQuota}, nil
	}
	return Outcome{Verdicts: vs, Denied: -1}, nil
}

// heldBy is what an operator's terms and the configured ones make of one
// limit of a request: blocked until (zero: not), or refused (its cost is
// beyond the limit).
type heldBy struct {
	blocked time.Time
	refused bool
}

// decideOne decides one limit of a request: a look when it charges
// nothing (Look), else a decision (Decide) inside progressive backoff — a
// client that came back too early is denied before its window is read.
func (c *Core) decideOne(ctx context.Context, l Limit, now time.Time, reqNum uint64) (Verdict, error) {
	start := time.Now()
	var v Verdict
	var err error
	h := c.d.Healer
	if l.Cost == 0 {
		v, err = c.Look(ctx, l.Policy, l.Digest, now, reqNum)
	} else {
		if h != nil {
			if b, early := h.Early(l.Policy, l.Digest, now); early {
				return c.backoffVerdict(l, b, now, reqNum), nil
			}
		}
		if v, err = c.Decide(ctx, l.Policy, l.Cost, l.Digest, now, reqNum); h != nil && err == nil && v.Decided {
			h.Answered(l.Policy, l.Digest, now, v.Decision)
		}
	}
	if err == nil && c.d.Timed != nil && v.Path >= PathCredit && v.Path <= PathFailOpen {
		c.d.Timed(ctx, v.Path, time.Since(start))
	}
	return v, err
}

// blockedVerdict is the denial of a request while an operator blocks its
// client (or holds it to a limit below the request's cost): nothing is
// read or charged, its limit is 0, and the client is told to come back
// when the block lifts (Retry-After). The reset shown is the window's,
// when the edge knows the client's window; else, with no window to speak
// of, the block's end.
func (c *Core) blockedVerdict(l Limit, until, now time.Time, reqNum uint64) Verdict {
	p := l.Policy
	p.Limit = 0
	reset, ok := c.Known(l.Digest, now)
	if !ok {
		reset = until
	}
	return c.heldVerdict(p, l, now, reqNum, PathBlocked, limiter.Decision{RetryAt: until, ResetAt: reset})
}

// backoffVerdict is the denial of a request that came back before the
// Retry-After its client was given (a strike): nothing is read or charged.
// Its reset is the window's that denied the client, as its earlier answers
// said; only Retry-After says when to come back.
func (c *Core) backoffVerdict(l Limit, b Backoff, now time.Time, reqNum uint64) Verdict {
	return c.heldVerdict(l.Policy, l, now, reqNum, PathBackoff, limiter.Decision{Used: l.Policy.Limit,
		ResetAt: b.Reset, RetryAt: b.Until, Strikes: b.Strikes})
}

// heldVerdict is a denial decided without the window (path), d's times
// and strikes filled in with p's terms.
func (c *Core) heldVerdict(p limiter.Policy, l Limit, now time.Time, reqNum uint64, path Path, d limiter.Decision) Verdict {
	if !p.Shadow {
		c.stats.byPath[path][0].Add(1)
	}
	k := c.d.Keys.KeyOf(l.Digest)
	d.Resource, d.Limit, d.Cost, d.Window, d.Now = p.Name, p.Limit, l.Cost, p.LengthAt(now), now
	return Verdict{Decision: d, Decided: true, Path: path, Policy: p, Cost: l.Cost, Key: k,
		Shard: c.d.Reserver.ShardOf(k), Now: now, Producer: c.d.Producer, ReqNum: reqNum}
}
