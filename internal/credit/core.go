package credit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// ErrUnavailable is returned by Decide when Redis cannot be reached in
// time, the edge knows nothing of the window, and it fails closed.
var ErrUnavailable = errors.New("credit: the rate limiter cannot decide right now")

// Deps are what a Core works with: its ports, and who it is.
type Deps struct {
	Reserver Reserver
	Ledger   Ledger
	// Notifier, when set, tells the other edges of full windows and of room
	// this edge gave back itself.
	Notifier Notifier
	Keys     *limiter.KeySpace
	// Clock gives every time a decision or a window depends on. Waiting for
	// Redis is bounded by Config.RedisBudget of real time.
	Clock limiter.Clock
	Log   Log
	// Producer is this edge's producer id (holders are named after it).
	Producer string
	// FailOpen admits a request whose window the edge knows nothing of when
	// Redis cannot be reached in time (charged by an event once it is
	// back); otherwise Decide returns ErrUnavailable.
	FailOpen bool
	// Policies are counted by name (Stats.Policies).
	Policies map[string]limiter.Policy
	// Permanent, when set, tells the Reserver's refusals (a key of the
	// wrong type: the call would fail again; redisstore.Permanent) from a
	// primary that could not answer; only the latter count towards
	// suspecting the primary.
	Permanent func(error) bool
	// Healer, when set, holds requests to an operator's temporary limits
	// and blocks, and to progressive backoff (DecideRequest).
	Healer Healer
	// Timed, when set, is told how long each limit of a request took to
	// decide, by the path that decided it (credit to fail-open).
	Timed func(ctx context.Context, p Path, d time.Duration)
}

// Core decides requests from the edge's table of windows. It is safe for
// concurrent use; doc.go describes its model and its lock order.
type Core struct {
	cfg   Config
	d     Deps
	table *table
	seen  *seen // keys reserved in lately, beyond the table
	// departed: who evicted entries were in their windows, for the keys'
	// next entries to carry on as (departed.go).
	departed *departed

	// suspect[i] holds until when (Unix ns of the clock) shard i's primary
	// is presumed down: requests then do not wait for reservations.
	// failures[i] counts reservations that failed in a row; probing[i] is
	// set while one request finds out whether a suspected primary is back.
	suspect  []atomic.Int64
	failures []atomic.Int64
	probing  []atomic.Bool

	gen   atomic.Uint64 // entries created: each a holder of its own
	stats counters
	// waits: when requests waiting for a reservation give up (RedisBudget
	// after they began to wait), a tenth of the budget late at most.
	waits *deadlines
	wg    sync.WaitGroup // background reservations
}

// New returns a Core. Reserver, Ledger, Keys and Producer are required.
func New(cfg Config, d Deps) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Reserver == nil || d.Ledger == nil || d.Keys == nil || !limiter.ValidProducer(d.Producer) {
		return nil, fmt.Errorf("%w: Reserver, Ledger, Keys and a producer id are required", ErrInvalidConfig)
	}
	if d.Clock == nil {
		d.Clock = limiter.SystemClock{}
	}
	if d.Log == nil {
		d.Log = discard{}
	}
	cfg = cfg.WithDefaults()
	n := d.Reserver.Shards()
	c := &Core{cfg: cfg, d: d, table: newTable(cfg.Keys), seen: newSeen(cfg.Keys), departed: newDeparted(cfg.Keys), suspect: make([]atomic.Int64, n),
		failures: make([]atomic.Int64, n), probing: make([]atomic.Bool, n), waits: newDeadlines(cfg.RedisBudget / 10)}
	c.stats.byPolicy = make(map[string]*[2]atomic.Uint64, len(d.Policies))
	for name := range d.Policies {
		c.stats.byPolicy[name] = new([2]atomic.Uint64)
	}
	return c, nil
}

type discard struct{}

func (discard) Info(string, ...any)  {}
func (discard) Warn(string, ...any)  {}
func (discard) Error(string, ...any) {}

// Config is the configuration in effect, defaults applied.
func (c *Core) Config() Config { return c.cfg }

// entry returns the table entry of a key under policy p: a new one carries
// on as the holder an evicted entry of the key was, when that is
// remembered (departed.go), else is a holder of its own.
func (c *Core) entry(dg limiter.Digest, p limiter.Policy) *entry {
	return c.table.get(dg, func() *entry {
		k := c.d.Keys.KeyOf(dg)
		e := &entry{key: k, policy: p, counts: c.countsOf(p.Name)}
		e.shard.Store(int32(c.d.Reserver.ShardOf(k)))
		if id, ok := c.departed.take(dg); ok {
			e.carryOn(id)
		} else {
			e.holderNum = c.gen.Add(1)
		}
		e.holder = HolderOf(c.d.Producer, e.holderNum)
		return e
	}, c.evicted)
}

// acquire returns the table entry of a key under policy p, locked: never
// one that left the table and whose holder another entry carries on.
func (c *Core) acquire(dg limiter.Digest, p limiter.Policy) *entry {
	for {
		e := c.entry(dg, p)
		e.lock()
		if !e.gone {
			return e
		}
		e.mu.Unlock()
	}
}

// Decide decides one request of cost units under policy p for the key with
// digest dg, at now (the clock read once for this request). It returns
// ErrUnavailable only when Redis cannot be reached in time, the edge knows
// nothing of the window, and it fails closed.
func (c *Core) Decide(ctx context.Context, p limiter.Policy, cost int64, dg limiter.Digest, now time.Time, reqNum uint64) (Verdict, error) {
	e := c.acquire(dg, p)
	defer e.mu.Unlock()
	v := Verdict{Policy: p, Cost: cost, Key: e.key, Shard: e.at(), Now: now, Producer: c.d.Producer, ReqNum: reqNum,
		HolderNum: e.holderNum}
	mode := p.Mode.OrDefault()
	var deadline time.Time // real time: set when the request first has to wait
	e.lastUseNano.Store(now.UnixNano())

	e.adopt(p)
	path := PathCredit // PathReserve once the request has waited for a reservation
	unfroze := false
	for {
		if !e.reset.IsZero() && !now.Before(e.reset.Time()) {
			c.windowEnded(e, now)
		}
		if !unfroze && e.frozen > 0 && e.credit >= cost && e.free() < cost && e.live(now) && !e.holding {
			// Credit frozen for a dead edge's sake: a report lowers it
			// (to what the sweep would leave free, this request's cost
			// more), once per request.
			unfroze = true
			if deadline.IsZero() {
				deadline = time.Now().Add(c.cfg.RedisBudget)
			}
			c.holdNow(ctx, e, max(0, e.credit-e.allowance()-cost), now, deadline)
			continue
		}
		if mode != limiter.ModeExact && e.spendable(cost) {
			e.spend(cost)
			c.prefetch(e, cost, now)
			return c.allow(v, e, path), nil
		}
		if e.full {
			switch {
			case e.room() >= cost:
				e.full = false // a notice or a read found room
			case e.refilled(cost, now):
				e.full = false // a token bucket: refilled since the count
			case e.doubtful && len(e.debts) > 0:
				// The count came from a notice and may hold charges of
				// this edge it still owes: a reservation says.
				e.doubtful = false
			default:
				e.deniedSince, e.lastCost = true, cost
				if path == PathReserve {
					return c.deny(v, e, PathReserve), nil
				}
				return c.deny(v, e, PathCache), nil
			}
		}
		if mode == limiter.ModeAsync && !e.reset.IsZero() {
			if v, ok := c.borrow(v, e, cost); ok {
				if e.refill == nil {
					c.startTake(e, cost, now)
				}
				return v, nil
			}
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(c.cfg.RedisBudget)
		}
		if mode == limiter.ModeExact {
			return c.reserveNow(ctx, v, e, cost, now, deadline)
		}
		if e.refill == nil {
			c.startTake(e, cost, now)
		}
		ch := e.refill
		if c.suspected(e.at(), now) || !c.wait(ctx, e, ch, deadline) {
			return c.fallback(v, e, cost)
		}
		path = PathReserve
		if !e.failed.IsZero() && e.free() < cost && !e.full {
			return c.fallback(v, e, cost)
		}
	}
}

// Peek reports a denial from what the edge knows of the key's window under
// p — full, with less room than cost — without creating an entry or
// calling Redis: a request held to several limits is checked against each
// before any of them reserves.
func (c *Core) Peek(p limiter.Policy, cost int64, dg limiter.Digest, now time.Time, reqNum uint64) (Verdict, bool) {
	e := c.table.lookup(dg)
	if e == nil {
		return Verdict{}, false
	}
	e.lock()
	defer e.mu.Unlock()
	e.adopt(p) // the request's terms: a reload may have raised the limit
	if !e.full || !e.live(now) || e.room() >= cost || (e.doubtful && len(e.debts) > 0) || e.refilled(cost, now) {
		return Verdict{}, false
	}
	e.deniedSince, e.lastCost = true, cost
	v := Verdict{Policy: p, Cost: cost, Key: e.key, Shard: e.at(), Now: now, Producer: c.d.Producer, ReqNum: reqNum,
		HolderNum: e.holderNum}
	return c.deny(v, e, PathCache), true
}

// Known returns the reset of the key's window when the edge knows a live
// one at now, without creating an entry or calling Redis: the window's
// reset for an answer decided before the core is asked (an operator's
// block).
func (c *Core) Known(dg limiter.Digest, now time.Time) (time.Time, bool) {
	e := c.table.lookup(dg)
	if e == nil {
		return time.Time{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.live(now) {
		return time.Time{}, false
	}
	return e.reset.Time(), true
}

// Look decides a request that charges nothing (cost 0: a check made before
// a cost known only at the end, as Envoy's hits_addend 0 asks): allowed
// unless the window is past its limit (charges applied over it, an
// overdraft), which is how envoyproxy/ratelimit answers it too. It answers
// from what the edge knows of a live window; otherwise it reads the window
// on the primary (a reservation of nothing, within RedisBudget) and, Redis
// slow or down, follows FailOpen. It reserves nothing.
func (c *Core) Look(ctx context.Context, p limiter.Policy, dg limiter.Digest, now time.Time, reqNum uint64) (Verdict, error) {
	e := c.acquire(dg, p)
	defer e.mu.Unlock()
	v := Verdict{Policy: p, Key: e.key, Shard: e.at(), Now: now, Producer: c.d.Producer, ReqNum: reqNum, HolderNum: e.holderNum}
	e.lastUseNano.Store(now.UnixNano())
	e.adopt(p)
	if !e.reset.IsZero() && !now.Before(e.reset.Time()) {
		c.windowEnded(e, now)
	}
	path := PathCredit
	if !e.live(now) {
		if c.suspected(e.at(), now) {
			return c.lookFailed(v, e)
		}
		args := algorithmOf(p.Algorithm).terms(p, now)
		args.Producer, args.Holder = c.d.Producer, e.holder
		e.mu.Unlock()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.RedisBudget)
		g, err := c.d.Reserver.Take(rctx, e.key, now, args)
		cancel()
		e.lock()
		c.stats.rechecks.Add(1)
		if err != nil {
			c.primaryFailed(e.at(), err, c.d.Clock.Now())
			if !e.live(now) { // another request may have learnt it meanwhile
				return c.lookFailed(v, e)
			}
		} else {
			c.takeOK(e.at())
			if g.Live && !e.live(now) {
				e.reset, e.start, e.used = instantOf(g.ResetAt), instantOf(g.Start), g.Used
				e.shard.Store(int32(g.Shard))
				e.count(g)
			}
		}
		path = PathReserve
	}
	if e.room()+e.frozen < 0 { // past the limit, frozen credit or not
		return c.deny(v, e, path), nil
	}
	return c.allow(v, e, path), nil
}

// lookFailed is Look's answer when the window could not be read.
func (c *Core) lookFailed(v Verdict, e *entry) (Verdict, error) {
	if !c.d.FailOpen {
		c.stats.unavailable.Add(1)
		return v, ErrUnavailable
	}
	v.Path = PathFailOpen
	c.counted(e, PathFailOpen, 1)
	return v, nil
}

// wait releases e's lock until the reservation in flight (ch) is in, the
// deadline passes (within a tenth of the budget: c.waits, no timer of its
// own) or ctx ends; it reports whether the reservation came in.
func (c *Core) wait(ctx context.Context, e *entry, ch chan struct{}, deadline time.Time) bool {
	e.mu.Unlock()
	defer e.lock()
	select {
	case <-ch:
		return true
	case <-c.waits.after(deadline):
	case <-ctx.Done():
	}
	return false
}

// reserveNow is mode exact: one reservation of exactly cost per request,
// made by the request itself. Callers hold e.mu; it is released during the
// call.
func (c *Core) reserveNow(ctx context.Context, v Verdict, e *entry, cost int64, now, deadline time.Time) (Verdict, error) {
	if c.suspected(e.at(), now) {
		// One request at a time finds out whether the primary is back; the
		// others do not wait for it.
		if !c.probing[e.at()].CompareAndSwap(false, true) {
			return c.fallback(v, e, cost)
		}
		defer c.probing[e.at()].Store(false)
	}
	args := e.alg().terms(e.policy, now)
	args.Need, args.Want, args.Producer, args.Holder = cost, cost, c.d.Producer, e.holder
	args.Owed, args.Fresh, args.Own = e.owed(), c.fresh(e, now), e.own
	g, full, err := c.takeWaiting(ctx, e, args, now, deadline)
	if err != nil {
		return c.fallback(v, e, cost)
	}
	if g.Granted == 0 {
		e.deniedSince, e.lastCost = true, cost
		v = c.deny(v, e, PathReserve)
	} else {
		e.credit -= cost
		v = c.allow(v, e, PathReserve)
	}
	c.reconcile(e, now)
	if full {
		c.publishFull(e)
	}
	return v, nil
}

// takeWaiting makes a reservation for e and waits for its answer until
// deadline, releasing e.mu meanwhile, and takes the answer into e: it
// reports the grant and whether the window is now full for everyone, or
// the error (the reservation may have been made all the same: takeFailed).
// Callers hold e.mu.
func (c *Core) takeWaiting(ctx context.Context, e *entry, args limiter.TakeArgs, now, deadline time.Time) (limiter.Grant, bool, error) {
	c.asked(e)
	e.inflight++
	e.mu.Unlock()
	rctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	g, err := c.d.Reserver.Take(rctx, e.key, now, args)
	cancel()
	e.lock()
	e.inflight--
	c.stats.takes.Add(1)
	if err != nil {
		c.takeFailed(e, err)
		return g, false, err
	}
	c.takeOK(e.at())
	return g, c.grant(e, g, now), nil
}

// startTake starts a reservation for e in the background; e.refill is
// closed when its result is in. Callers hold e.mu.
func (c *Core) startTake(e *entry, cost int64, now time.Time) {
	need := max(1, cost-e.free())
	args := e.alg().terms(e.policy, now)
	args.Need, args.Want, args.Producer, args.Holder = need, c.want(e, need), c.d.Producer, e.holder
	args.Owed, args.Fresh, args.Own = e.owed(), c.fresh(e, now), e.own
	c.asked(e)
	c.freezeIn(e, &args, now)
	ch := make(chan struct{})
	e.refill = ch
	e.inflight++
	c.wg.Add(1)
	// No goroutine and no timer of its own: the answer is taken in where
	// the shard's reservations are sent, however late it comes (a late
	// result still serves the next requests); the store's timeouts bound it.
	c.d.Reserver.TakeAsync(e.key, now, args, func(g limiter.Grant, err error) {
		defer c.wg.Done()
		c.stats.takes.Add(1)
		e.lock()
		e.inflight--
		if err != nil {
			c.takeFailed(e, err)
		} else {
			e.failed = 0
			c.takeOK(e.at())
			if c.grant(e, g, now) {
				c.publishFull(e)
			}
			c.reconcile(e, now)
		}
		e.refill = nil
		e.mu.Unlock()
		close(ch)
	})
}

// windowEnded forgets e's window, which has reset at now. A sliding
// window's sub-window goes on counting in the spans after it: the credit e
// holds there goes back by an event, for those spans to use, and what e
// reserved and sent there is kept for a reseed until it leaves the last
// span (entry.keepPast). Callers hold e.mu.
func (c *Core) windowEnded(e *entry, now time.Time) {
	if e.policy.Linger() > 0 && !e.start.IsZero() {
		if units := e.free(); units > 0 {
			ev := limiter.Entry{Kind: limiter.Release, Key: e.key, Policy: e.policy, Units: units, ResetAt: e.reset.Time(),
				Start: e.start.Time(), Time: now}
			if c.record(e, ev) != 0 {
				c.stats.released.Add(uint64(units))
			}
		}
		e.keepPast(now)
	}
	e.expire()
}

// fresh reports whether no window of e's key can be known to this edge
// (limiter.TakeArgs.Fresh): as its algorithm says (a token bucket quiet
// near now), or else e never reserved and the key was not seen lately
// (seen). Callers hold e.mu.
func (c *Core) fresh(e *entry, now time.Time) bool {
	if fresh, ok := e.alg().quiet(e.lastTake.Time(), now); ok {
		return fresh
	}
	return !e.asked && !c.seen.has(e.key.Digest())
}

// asked records that a reservation of e's key is sent. Callers hold e.mu.
func (c *Core) asked(e *entry) {
	if !e.asked {
		e.asked = true
		c.seen.add(e.key.Digest())
	}
}

// want sizes a reservation: enough for Horizon at the key's rate here, at
// most 1/Share of what is left, at least need. Callers hold e.mu.
func (c *Core) want(e *entry, need int64) int64 {
	room := e.policy.Limit
	if !e.reset.IsZero() {
		room = e.policy.Limit - e.used - e.debtUnits()
	}
	w := min(int64(e.rate*c.cfg.Horizon.Seconds()), room/int64(c.cfg.Share))
	return min(max(w, need), e.policy.Limit)
}

// prefetch starts a reservation before the credit runs out, when the key
// is busy enough to need more than it holds within half the horizon. A key
// that comes less often than that reserves when it comes: what it would
// reserve ahead would sit unused, and go back by an event. Callers hold
// e.mu.
func (c *Core) prefetch(e *entry, cost int64, now time.Time) {
	if e.refill != nil || e.full || e.rate == 0 || c.suspected(e.at(), now) {
		return
	}
	soon := e.rate * c.cfg.Horizon.Seconds() / 2 // units the key is expected to ask for within half the horizon
	if soon >= float64(cost) && float64(e.credit) < soon {
		c.startTake(e, cost, now)
	}
}

// grant takes a reservation's result into e and reports whether the window
// is now full for everyone else. Callers hold e.mu.
func (c *Core) grant(e *entry, g limiter.Grant, now time.Time) bool {
	if !g.Live {
		return false
	}
	if !e.reset.Equal(g.ResetAt) || e.start.IsZero() { // a new window, or one another edge opened
		if !e.reset.Equal(g.ResetAt) {
			if !e.reset.IsZero() && !now.Before(e.reset.Time()) {
				c.windowEnded(e, now)
			} else {
				e.expire()
			}
		}
		e.reset, e.start = instantOf(g.ResetAt), instantOf(g.Start)
	}
	e.shard.Store(int32(g.Shard)) // where the window is: it moves with a new window only
	e.used, e.doubtful, e.own = g.Used, false, g.Own
	e.credit += g.Granted
	if g.Frozen > 0 && g.Frozen >= e.held { // the reservation froze part of itself (hold.go)
		e.frozen += g.Frozen - e.held
		e.held, e.heldAt = g.Frozen, instantOf(now)
	}
	e.count(g)
	e.known += g.Granted
	e.settle(g.Applied)
	if !e.lastTake.IsZero() && now.After(e.lastTake.Time()) {
		inst := float64(e.admitted) / now.Sub(e.lastTake.Time()).Seconds()
		if e.rate == 0 {
			e.rate = inst
		} else {
			e.rate = 0.5*e.rate + 0.5*inst
		}
	}
	e.admitted, e.lastTake = 0, instantOf(now)
	// Credit the edge can never spend goes back at once: a reservation made
	// while admissions over credit (mode async) were on their way may hold
	// room they took already (spendable). In mode exact the credit is the
	// request's own reservation, about to be spent by it.
	if surplus := e.free() - max(0, e.room()); surplus > 0 && !e.start.IsZero() && !e.exact() {
		c.releaseUnits(e, surplus, now)
	}
	if g.Granted == 0 || g.Used >= e.policy.Limit {
		// No reservation is possible: when the credit is gone, deny from
		// memory (and a request held to other limits as well is denied
		// before it reserves on them: Peek).
		e.full = true
	}
	return g.Used >= e.policy.Limit
}

// suspectAfter is how many reservations in a row must fail before the
// request path stops waiting for a primary; suspectFor is for how long.
const (
	suspectAfter = 3
	suspectFor   = time.Second
)

// takeFailed notes a reservation that failed. After failures in a row on
// a shard, the request path marks its primary down: for a second requests do
// not wait for it, and the first reservation that succeeds (the background
// ones, or one probing request at a time in mode exact) clears the mark.
//
// A reservation Redis refused (a key of the wrong type, a script error)
// says nothing of the primary, which answered: it does not count.
func (c *Core) takeFailed(e *entry, err error) {
	now := c.d.Clock.Now()
	e.failed = instantOf(now)
	e.lost = instantOf(now) // it may have been made all the same
	c.primaryFailed(e.at(), err, now)
}

// primaryFailed counts a call to shard's primary that failed: after
// suspectAfter in a row (refusals aside) the request path stops waiting for
// it for suspectFor.
func (c *Core) primaryFailed(shard int, err error, now time.Time) {
	c.stats.takeErrors.Add(1)
	if errors.Is(err, limiter.ErrInvalidArgument) || (c.d.Permanent != nil && c.d.Permanent(err)) {
		c.d.Log.Error("the primary refused a reservation; deciding without it", "shard", c.d.Reserver.ShardName(shard), "err", err)
		return
	}
	if c.failures[shard].Add(1) >= suspectAfter {
		c.suspect[shard].Store(now.Add(suspectFor).UnixNano())
	}
	c.d.Log.Warn("reserving on the primary failed; deciding without it", "shard", c.d.Reserver.ShardName(shard), "err", err)
}

func (c *Core) takeOK(shard int) {
	c.failures[shard].Store(0)
	if c.suspect[shard].Load() != 0 && c.suspect[shard].Swap(0) != 0 {
		c.d.Log.Info("the primary answers again; reservations resume", "shard", c.d.Reserver.ShardName(shard))
	}
}

func (c *Core) suspected(shard int, now time.Time) bool {
	return c.suspect[shard].Load() > now.UnixNano()
}

// Suspected reports whether the request path has stopped waiting for
// shard i's primary (reservations failed in a row).
func (c *Core) Suspected(i int) bool { return c.suspected(i, c.d.Clock.Now()) }

// reconcile takes into e's credit the units the window holds for e beyond
// what e was told it got: reservations whose answer was lost but which the
// primary made all the same. Only when every answer is in (none in
// flight), and only in a live window. In mode exact, where credit is not
// used, they go back at once. Callers hold e.mu.
func (c *Core) reconcile(e *entry, now time.Time) {
	if e.inflight > 0 || e.mine <= e.known || e.countsReset != e.reset || !e.live(now) {
		return
	}
	extra := e.mine - e.known
	e.known = e.mine
	e.credit += extra
	c.stats.recovered.Add(uint64(extra))
	c.d.Log.Info("a reservation whose answer was lost was made: its units are this edge's credit again",
		"shard", c.d.Reserver.ShardName(e.at()), "units", extra)
	if e.exact() {
		c.release(e, now)
	}
}

// lostSettle is how long after a reservation failed the edge keeps reading
// its window to learn whether it was made: a primary that was frozen runs
// what its sockets hold as soon as it wakes.
const lostSettle = 2 * time.Second

// resolveLost reads the windows of entries whose reservations failed and
// takes back what those reservations got (reconcile), until lostSettle
// after the failure; each read waits up to budget.
func (c *Core) resolveLost(ctx context.Context, lost []*entry, now time.Time, budget time.Duration) {
	for _, e := range lost {
		if ctx.Err() != nil {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, budget)
		args := e.alg().terms(e.policy, now)
		args.Producer, args.Holder = c.d.Producer, e.holder
		g, err := c.d.Reserver.Take(rctx, e.key, now, args)
		cancel()
		c.stats.rechecks.Add(1)
		if err != nil {
			continue
		}
		e.lock()
		if g.Live && e.inflight == 0 {
			if e.reset.IsZero() { // the lost reservation opened the window
				e.reset, e.start, e.used = instantOf(g.ResetAt), instantOf(g.Start), g.Used
				e.shard.Store(int32(g.Shard))
			}
			if e.reset.Equal(g.ResetAt) {
				e.count(g)
				c.reconcile(e, now)
			}
		}
		if now.Sub(e.lost.Time()) > lostSettle {
			e.lost = 0
		}
		e.mu.Unlock()
	}
}
