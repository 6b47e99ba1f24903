package edge

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// CreditConfig tunes how an edge reserves and remembers windows
// (docs/accuracy.md). Zero values take the defaults stated.
type CreditConfig struct {
	// Horizon is how long a reservation aims to last at the key's rate of
	// requests at this edge. Longer means fewer reservations; the units an
	// edge holds show as used on the other edges until it uses or releases
	// them. Near the limit Share caps reservations anyway. Default 5s.
	Horizon time.Duration `yaml:"horizon"`
	// Share: a reservation takes at most 1/Share of what is left in the
	// window, so that near the limit reservations shrink to one request and
	// every edge keeps getting its part. Default 8.
	Share int `yaml:"share"`
	// IdleRelease is how long reserved units may sit unused before the edge
	// gives them back (or three of the key's intervals between requests, if
	// longer). Default 1s.
	IdleRelease time.Duration `yaml:"idle_release"`
	// Keys is the most keys an edge remembers; the least recently used go
	// first (their credit given back). Default 100000.
	Keys int `yaml:"keys"`
	// Recheck is how long after a window was found full it is read again
	// (on a replica) while its requests keep being denied, in case a notice
	// that it has room was lost; the wait doubles after every read that
	// finds it still full, up to 32 times Recheck. Default 1s.
	Recheck time.Duration `yaml:"recheck"`
	// RedisBudget is the longest a request waits for a reservation; past
	// it the edge decides without one (see Options.DenyOnRedisError).
	// Default 100ms.
	RedisBudget time.Duration `yaml:"redis_budget"`
}

func (c CreditConfig) withDefaults() CreditConfig {
	if c.Horizon <= 0 {
		c.Horizon = 5 * time.Second
	}
	if c.Share <= 0 {
		c.Share = 8
	}
	if c.IdleRelease <= 0 {
		c.IdleRelease = time.Second
	}
	if c.Keys <= 0 {
		c.Keys = 100_000
	}
	if c.Recheck <= 0 {
		c.Recheck = time.Second
	}
	if c.RedisBudget <= 0 {
		c.RedisBudget = 100 * time.Millisecond
	}
	return c
}

// Path says how a request was decided.
type Path uint8

const (
	// PathCredit: from units this edge had reserved; no Redis call.
	PathCredit Path = iota + 1
	// PathReserve: after waiting for a reservation on the primary (mode
	// exact always).
	PathReserve
	// PathCache: denied because the window is known to be full; no Redis
	// call.
	PathCache
	// PathBorrow: admitted over credit from what the edge knows of the
	// window, charged by an accounting event (mode async, or Redis slow).
	PathBorrow
	// PathFailOpen: admitted with no knowledge of the window because Redis
	// could not be reached (on_redis_error: allow); charged by an event.
	PathFailOpen
	// PathFinish: a decision-API request finished on the primary by the
	// edge (a 304's charge given back); only in decision records.
	PathFinish
)

var pathNames = [...]string{PathCredit: "credit", PathReserve: "reserve", PathCache: "cache", PathBorrow: "borrow",
	PathFailOpen: "fail-open", PathFinish: "finish"}

func (p Path) String() string {
	if int(p) < len(pathNames) && pathNames[p] != "" {
		return pathNames[p]
	}
	return "unknown"
}

// errUnavailable: Redis could not be reached in time and the edge fails
// closed.
var errUnavailable = errors.New("edge: the rate limiter cannot decide right now")

// verdict is one decision and what its request's finish needs.
type verdict struct {
	decision limiter.Decision
	// decided is false when the request was admitted without knowing its
	// window (fail-open): the response carries no rate-limit headers.
	decided bool
	path    Path
	policy  limiter.Policy
	cost    int64
	key     limiter.Key
	shard   int
	now     time.Time
	reset   int64 // ms: the window the response showed (0 when not decided)
	// How the request was charged when allowed: by a reservation, or by the
	// accounting event chargeSeq (> 0) of producer chargeProducer (the
	// deciding edge).
	chargeSeq      uint64
	chargeProducer string
	// producer is the edge that decided the request; reqNum numbers the
	// request there (its request id is both). holderNum names the table
	// entry that admitted it (holder <producer>.<holderNum base 36>), and n
	// is its number among that entry's admissions in the window: where its
	// finish is marked.
	producer  string
	reqNum    uint64
	holderNum uint64
	n         uint64
	// traceparent is the request's trace context (validated), carried by
	// the events its finish sends.
	traceparent string
}

// decider decides requests from the edge's table of windows.
type decider struct {
	cfg      CreditConfig
	store    Store
	keys     *limiter.KeySpace
	outbox   *outbox
	notify   func(shard int, n events.Notice)
	producer string
	failOpen bool // on a Redis failure without knowledge of the window: allow
	log      *rateLog
	table    *table

	// suspect[i] holds until when (ns) shard i's primary is presumed down:
	// requests then do not wait for reservations. failures[i] counts
	// reservations that failed in a row; probing[i] is set while one
	// request finds out whether a suspected primary is back.
	suspect  []atomic.Int64
	failures []atomic.Int64
	probing  []atomic.Bool

	byPath               [len(pathNames)][2]atomic.Uint64 // [path][allowed]
	byPolicy             map[string]*[2]atomic.Uint64     // [allowed], by policy name; fixed at start
	takes, takeErrors    atomic.Uint64
	recovered            atomic.Uint64 // units of reservations whose answer was lost
	gen                  atomic.Uint64 // entries created: each a holder of its own
	released, absorbed   atomic.Uint64
	rechecks             atomic.Uint64
	noticesIn, noticesUp atomic.Uint64
	noticesRefused       atomic.Uint64 // unsigned, forged, or replayed long after they were sent
	unavailable          atomic.Uint64
	wg                   sync.WaitGroup
}

func newDecider(cfg CreditConfig, store Store, keys *limiter.KeySpace, ob *outbox, producer string, failOpen bool, log *rateLog,
	notify func(int, events.Notice), policies map[string]limiter.Policy) *decider {
	cfg = cfg.withDefaults()
	d := &decider{cfg: cfg, store: store, keys: keys, outbox: ob, notify: notify, producer: producer, failOpen: failOpen,
		log: log, table: newTable(cfg.Keys), suspect: make([]atomic.Int64, store.Shards()),
		failures: make([]atomic.Int64, store.Shards()), probing: make([]atomic.Bool, store.Shards()),
		byPolicy: make(map[string]*[2]atomic.Uint64, len(policies))}
	for name := range policies {
		d.byPolicy[name] = new([2]atomic.Uint64)
	}
	return d
}

// counted counts a decision of e's key by its path and its policy.
func (d *decider) counted(e *entry, path Path, allowed int) {
	d.byPath[path][allowed].Add(1)
	if e.counts != nil {
		e.counts[allowed].Add(1)
	}
}

// entry returns the table entry of a key under policy p.
func (d *decider) entry(dg limiter.Digest, p limiter.Policy) *entry {
	return d.table.get(dg, func() *entry {
		k := d.keys.KeyOf(dg)
		num := d.gen.Add(1)
		return &entry{key: k, shard: d.store.ShardOf(k), policy: p.Name, limit: p.Limit, window: p.Window.Milliseconds(),
			holder: holderOf(d.producer, num), holderNum: num, exact: p.Mode.OrDefault() == limiter.ModeExact,
			counts: d.byPolicy[p.Name]}
	}, d.evicted)
}

// decide decides one request of cost units under policy p for the key with
// digest dg, at now (the clock read once for this request). It returns
// errUnavailable only when Redis cannot be reached in time, the edge knows
// nothing of the window, and it fails closed.
func (d *decider) decide(ctx context.Context, p limiter.Policy, cost int64, dg limiter.Digest, now time.Time, reqNum uint64) (verdict, error) {
	e := d.entry(dg, p)
	v := verdict{policy: p, cost: cost, key: e.key, shard: e.shard, now: now, producer: d.producer, reqNum: reqNum,
		holderNum: e.holderNum}
	mode := p.Mode.OrDefault()
	nowMs, nowNs := now.UnixMilli(), now.UnixNano()
	var deadline time.Time // set when the request first has to wait
	e.lastUse.Store(nowNs)

	e.mu.Lock()
	defer e.mu.Unlock()
	path := PathCredit // PathReserve once the request has waited for a reservation
	for {
		if e.reset != 0 && nowMs >= e.reset {
			e.expire()
		}
		if mode != limiter.ModeExact && e.spendable(cost) {
			e.credit -= cost
			e.admitted += cost
			d.prefetch(e, p, cost, now)
			return d.allow(v, e, path), nil
		}
		if e.full {
			if e.limit-e.used-e.debtUnits()+e.credit < cost {
				e.deniedSince = true
				e.lastCost = cost
				if path == PathReserve {
					return d.deny(v, e, PathReserve), nil
				}
				return d.deny(v, e, PathCache), nil
			}
			e.full = false // a notice or a read found room
		}
		if mode == limiter.ModeAsync && e.reset != 0 {
			if v, ok := d.borrow(v, e, cost, PathBorrow); ok {
				if e.refill == nil {
					d.startTake(e, p, cost, now)
				}
				return v, nil
			}
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(d.cfg.RedisBudget)
		}
		if mode == limiter.ModeExact {
			return d.reserveNow(ctx, v, e, p, cost, now, deadline)
		}
		if e.refill == nil {
			d.startTake(e, p, cost, now)
		}
		ch := e.refill
		if d.suspected(e.shard, nowNs) || !d.wait(ctx, e, ch, deadline) {
			return d.fallback(v, e, cost)
		}
		path = PathReserve
		if e.failed != 0 && e.credit < cost && !e.full {
			return d.fallback(v, e, cost)
		}
	}
}

// peek reports a denial from what the edge knows of the key's window under
// p — full, with less room than cost — without creating an entry or
// calling Redis: a request held to several limits is checked against each
// before any of them reserves.
func (d *decider) peek(p limiter.Policy, cost int64, dg limiter.Digest, now time.Time, reqNum uint64) (verdict, bool) {
	e := d.table.lookup(dg)
	if e == nil {
		return verdict{}, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.full || e.reset == 0 || now.UnixMilli() >= e.reset || e.limit-e.used-e.debtUnits()+e.credit >= cost {
		return verdict{}, false
	}
	e.deniedSince, e.lastCost = true, cost
	v := verdict{policy: p, cost: cost, key: e.key, shard: e.shard, now: now, producer: d.producer, reqNum: reqNum,
		holderNum: e.holderNum}
	return d.deny(v, e, PathCache), true
}

// wait releases e's lock until the reservation in flight (ch) is in, the
// deadline passes or ctx ends; it reports whether the reservation came in.
func (d *decider) wait(ctx context.Context, e *entry, ch chan struct{}, deadline time.Time) bool {
	e.mu.Unlock()
	defer e.mu.Lock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
}

// reserveNow is mode exact: one reservation of exactly cost per request,
// made by the request itself.
func (d *decider) reserveNow(ctx context.Context, v verdict, e *entry, p limiter.Policy, cost int64, now, deadline time.Time) (verdict, error) {
	if d.suspected(e.shard, now.UnixNano()) {
		// One request at a time finds out whether the primary is back; the
		// others do not wait for it.
		if !d.probing[e.shard].CompareAndSwap(false, true) {
			return d.fallback(v, e, cost)
		}
		defer d.probing[e.shard].Store(false)
	}
	e.inflight++
	owed := e.owed()
	e.mu.Unlock()
	c, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	g, err := d.store.Take(c, e.key, now, limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Need: cost, Want: cost,
		Producer: d.producer, Holder: e.holder, Owed: owed})
	cancel()
	e.mu.Lock()
	e.inflight--
	d.takes.Add(1)
	if err != nil {
		d.takeFailed(e, err)
		return d.fallback(v, e, cost)
	}
	d.takeOK(e.shard)
	full := d.grant(e, g, now)
	if g.Granted == 0 {
		e.deniedSince, e.lastCost = true, cost
		v = d.deny(v, e, PathReserve)
	} else {
		e.credit -= cost
		v = d.allow(v, e, PathReserve)
	}
	d.reconcile(e, now)
	if full {
		d.publishFull(e)
	}
	return v, nil
}

// startTake starts a reservation for e in the background; e.refill is
// closed when its result is in. Callers hold e.mu.
func (d *decider) startTake(e *entry, p limiter.Policy, cost int64, now time.Time) {
	need := max(1, cost-e.credit)
	want := d.want(e, p, need)
	ch := make(chan struct{})
	e.refill = ch
	e.inflight++
	owed := e.owed()
	d.wg.Go(func() {
		// Longer than a request's budget: a late result still serves the
		// next requests.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		g, err := d.store.Take(ctx, e.key, now, limiter.TakeArgs{Window: p.Window, Limit: p.Limit, Need: need, Want: want,
			Producer: d.producer, Holder: e.holder, Owed: owed})
		cancel()
		d.takes.Add(1)
		e.mu.Lock()
		e.inflight--
		if err != nil {
			d.takeFailed(e, err)
		} else {
			e.failed = 0
			d.takeOK(e.shard)
			if d.grant(e, g, now) {
				d.publishFull(e)
			}
			d.reconcile(e, now)
		}
		e.refill = nil
		e.mu.Unlock()
		close(ch)
	})
}

// want sizes a reservation: enough for Horizon at the key's rate here, at
// most 1/Share of what is left, at least need. Callers hold e.mu.
func (d *decider) want(e *entry, p limiter.Policy, need int64) int64 {
	room := p.Limit
	if e.reset != 0 {
		room = p.Limit - e.used - e.debtUnits()
	}
	w := min(int64(e.rate*d.cfg.Horizon.Seconds()), room/int64(d.cfg.Share))
	return min(max(w, need), p.Limit)
}

// prefetch starts a reservation before the credit runs out, when the key
// is busy enough for its credit to be gone within half the horizon.
// Callers hold e.mu.
func (d *decider) prefetch(e *entry, p limiter.Policy, cost int64, now time.Time) {
	if e.refill != nil || e.full || e.rate == 0 || d.suspected(e.shard, now.UnixNano()) {
		return
	}
	if low := max(cost, int64(e.rate*d.cfg.Horizon.Seconds()/2)); e.credit < low {
		d.startTake(e, p, cost, now)
	}
}

// grant takes a reservation's result into e and reports whether the window
// is now full for everyone else. Callers hold e.mu.
func (d *decider) grant(e *entry, g limiter.Grant, now time.Time) bool {
	if !g.Live {
		return false
	}
	if r := g.ResetAt.UnixMilli(); r != e.reset { // a new window, or one another edge opened
		e.expire()
		e.reset, e.start = r, g.Start.UnixMilli()
	}
	e.used = g.Used
	e.credit += g.Granted
	e.count(g)
	e.known += g.Granted
	e.settle(g.Applied)
	if ns := now.UnixNano(); e.lastTake != 0 && ns > e.lastTake {
		inst := float64(e.admitted) / (float64(ns-e.lastTake) / 1e9)
		if e.rate == 0 {
			e.rate = inst
		} else {
			e.rate = 0.5*e.rate + 0.5*inst
		}
	}
	e.admitted, e.lastTake = 0, now.UnixNano()
	// Credit the edge can never spend goes back at once: a reservation made
	// while admissions over credit (mode async) were on their way may hold
	// room they took already (spendable). In mode exact the credit is the
	// request's own reservation, about to be spent by it.
	if surplus := e.credit - max(0, e.limit-e.used-e.debtUnits()+e.credit); surplus > 0 && e.start != 0 && !e.exact {
		d.releaseUnits(e, surplus, now)
	}
	if g.Granted == 0 || g.Used >= e.limit {
		// No reservation is possible: when the credit is gone, deny from
		// memory (and a request held to other limits as well is denied
		// before it reserves on them: peek).
		e.full = true
	}
	return g.Used >= e.limit
}

// takeFailed notes a reservation that failed. After failures in a row on
// a shard, the request path marks its primary down: for a second requests do
// not wait for it, and the first reservation that succeeds (the background
// ones, or one probing request at a time in mode exact) clears the mark.
//
// A reservation Redis refused (a key of the wrong type, a script error)
// says nothing of the primary, which answered: it does not count.
func (d *decider) takeFailed(e *entry, err error) {
	d.takeErrors.Add(1)
	now := time.Now().UnixNano()
	e.failed = now
	e.lost = now // it may have been made all the same
	if redisstore.Permanent(err) {
		d.log.Error("the primary refused a reservation; deciding without it", "shard", d.store.ShardName(e.shard), "err", err)
		return
	}
	if d.failures[e.shard].Add(1) >= suspectAfter {
		d.suspect[e.shard].Store(now + int64(time.Second))
	}
	d.log.Warn("reserving on the primary failed; deciding without it", "shard", d.store.ShardName(e.shard), "err", err)
}

// reconcile takes into e's credit the units the window holds for e beyond
// what e was told it got: reservations whose answer was lost but which the
// primary made all the same. Only when every answer is in (none in
// flight), and only in a live window. In mode exact, where credit is not
// used, they go back at once. Callers hold e.mu.
func (d *decider) reconcile(e *entry, now time.Time) {
	if e.inflight > 0 || e.mine <= e.known || e.countsReset != e.reset || now.UnixMilli() >= e.reset {
		return
	}
	extra := e.mine - e.known
	e.known = e.mine
	e.credit += extra
	d.recovered.Add(uint64(extra))
	d.log.Info("a reservation whose answer was lost was made: its units are this edge's credit again",
		"shard", d.store.ShardName(e.shard), "units", extra)
	if e.exact {
		d.release(e, now)
	}
}

// lostSettle is how long after a reservation failed the edge keeps reading
// its window to learn whether it was made: a primary that was frozen runs
// what its sockets hold as soon as it wakes.
const lostSettle = 2 * time.Second

// resolveLost reads the windows of entries whose reservations failed and
// takes back what those reservations got (reconcile), until lostSettle
// after the failure.
func (d *decider) resolveLost(ctx context.Context, lost []*entry, now time.Time) {
	for _, e := range lost {
		if ctx.Err() != nil {
			return
		}
		c, cancel := context.WithTimeout(ctx, d.cfg.RedisBudget)
		g, err := d.store.Take(c, e.key, now, limiter.TakeArgs{Window: time.Duration(e.window) * time.Millisecond, Limit: e.limit,
			Producer: d.producer, Holder: e.holder})
		cancel()
		d.rechecks.Add(1)
		if err != nil {
			continue
		}
		e.mu.Lock()
		if g.Live && e.inflight == 0 {
			r := g.ResetAt.UnixMilli()
			if e.reset == 0 { // the lost reservation opened the window
				e.reset, e.start, e.used = r, g.Start.UnixMilli(), g.Used
			}
			if r == e.reset {
				e.count(g)
				d.reconcile(e, now)
			}
		}
		if now.UnixNano()-e.lost > int64(lostSettle) {
			e.lost = 0
		}
		e.mu.Unlock()
	}
}

// suspectAfter is how many reservations in a row must fail before the
// request path stops waiting for a primary.
const suspectAfter = 3

func (d *decider) takeOK(shard int) {
	d.failures[shard].Store(0)
	if d.suspect[shard].Load() != 0 && d.suspect[shard].Swap(0) != 0 {
		d.log.Info("the primary answers again; reservations resume", "shard", d.store.ShardName(shard))
	}
}

func (d *decider) suspected(shard int, nowNs int64) bool {
	return d.suspect[shard].Load() > nowNs
}

// borrow admits a request beyond this edge's credit from what the edge
// knows of the window, charging it with an accounting event. It reports
// false when the edge knows of too little room. Callers hold e.mu.
func (d *decider) borrow(v verdict, e *entry, cost int64, path Path) (verdict, bool) {
	if e.limit-e.used-e.debtUnits()+e.credit < cost {
		return v, false
	}
	units := cost - e.credit // > 0: callers use credit when it suffices
	if units <= 0 || len(e.debts) >= limiter.MaxOwed {
		return v, false
	}
	seq := d.outbox.add(e.shard, events.Accounting{Kind: events.Started, Time: time.Now(), Key: e.key.Digest().String(),
		Policy: v.policy.Name, Limit: v.policy.Limit, WindowSeconds: int64(v.policy.Window / time.Second), Units: units,
		ResetAt: time.UnixMilli(e.reset), StartedAt: v.now, RequestID: d.requestID(v)})
	if seq == 0 {
		return v, false
	}
	e.credit = 0
	e.debts = append(e.debts, debt{seq: seq, units: units})
	e.admitted += cost
	v.chargeSeq, v.chargeProducer = seq, d.producer
	return d.allow(v, e, path), true
}

// fallback decides when no reservation came in time: from what the edge
// knows of the window when it knows it, else by the on_redis_error rule.
// Callers hold e.mu.
func (d *decider) fallback(v verdict, e *entry, cost int64) (verdict, error) {
	known := e.reset != 0 && v.now.UnixMilli() < e.reset
	if known {
		if e.spendable(cost) && v.policy.Mode.OrDefault() != limiter.ModeExact { // a reservation came in meanwhile
			e.credit -= cost
			e.admitted += cost
			return d.allow(v, e, PathCredit), nil
		}
		if e.limit-e.used-e.debtUnits()+e.credit < cost { // full, as far as anyone knows: no Redis needed
			e.deniedSince, e.lastCost = true, cost
			return d.deny(v, e, PathCache), nil
		}
	}
	if !d.failOpen {
		d.unavailable.Add(1)
		return v, errUnavailable
	}
	if known {
		if v, ok := d.borrow(v, e, cost, PathBorrow); ok {
			return v, nil
		}
	}
	// Nothing known: admit, and charge by the request's start.
	p := v.policy
	seq := d.outbox.add(e.shard, events.Accounting{Kind: events.Started, Time: time.Now(), Key: e.key.Digest().String(),
		Policy: p.Name, Limit: p.Limit, WindowSeconds: int64(p.Window / time.Second), Units: cost, StartedAt: v.now,
		RequestID: d.requestID(v)})
	if seq != 0 {
		v.chargeSeq, v.chargeProducer = seq, d.producer
	}
	v.path = PathFailOpen
	d.counted(e, PathFailOpen, 1)
	return v, nil
}

// requestID is the request id of v's decision records ("" when v has no
// request number): accounting events carry it so that an accountant's
// records join the edge's.
func (d *decider) requestID(v verdict) string { return requestID(v) }

func requestID(v verdict) string {
	if v.reqNum == 0 || v.producer == "" {
		return ""
	}
	return v.producer + "-" + strconv.FormatUint(v.reqNum, 10)
}

// holderOf names an edge's table entry in the windows it reserves in.
func holderOf(producer string, num uint64) string {
	return producer + "." + strconv.FormatUint(num, 36)
}

// allow fills an allowed verdict from e. Callers hold e.mu.
func (d *decider) allow(v verdict, e *entry, path Path) verdict {
	v.path, v.decided, v.reset = path, true, e.reset
	v.n = e.served
	e.served++
	d.counted(e, path, 1)
	used := e.used + e.debtUnits() - e.credit
	v.decision = decision(v, e, true, used)
	return v
}

// deny fills a denied verdict from e. Callers hold e.mu.
func (d *decider) deny(v verdict, e *entry, path Path) verdict {
	v.path, v.decided, v.reset = path, true, e.reset
	d.counted(e, path, 0)
	// Denied: limit - used < cost, so Remaining is below the cost and never
	// the limit.
	v.decision = decision(v, e, false, e.used+e.debtUnits()-e.credit)
	return v
}

func decision(v verdict, e *entry, allowed bool, used int64) limiter.Decision {
	d := limiter.Decision{Allowed: allowed, Resource: v.policy.Name, Limit: v.policy.Limit, Cost: v.cost,
		Used: used, Window: v.policy.Window, ResetAt: time.UnixMilli(e.reset), Now: v.now}
	d.Remaining = max(0, d.Limit-d.Used)
	return d
}

// refund gives a 304 response's charge back: into this edge's credit when
// it was charged by a reservation in the window this edge still holds
// (no Redis call; it reports true), else through an accounting event.
func (d *decider) refund(v verdict) (absorbed bool) {
	if v.chargeSeq == 0 && v.policy.Mode.OrDefault() != limiter.ModeExact {
		if e := d.table.lookup(v.key.Digest()); e != nil {
			e.mu.Lock()
			ok := e.reset == v.reset && time.Now().UnixMilli() < e.reset
			if ok {
				e.credit += v.cost
			}
			e.mu.Unlock()
			if ok {
				d.absorbed.Add(1)
				return true
			}
		}
	}
	p := v.policy
	ev := events.Accounting{Kind: events.Finished, Time: time.Now(), Key: v.key.Digest().String(), Policy: p.Name,
		Limit: p.Limit, WindowSeconds: int64(p.Window / time.Second), Units: v.cost, StartedAt: v.now, Status: 304,
		TraceParent: v.traceparent}
	if v.reset != 0 {
		ev.ResetAt = time.UnixMilli(v.reset)
	}
	ev.RequestID = d.requestID(v)
	if v.chargeSeq != 0 {
		ev.ChargeProducer, ev.ChargeSeq = v.chargeProducer, v.chargeSeq
	} else if v.reset == 0 {
		return false // admitted without a window and without a charge: nothing to give back
	}
	d.outbox.add(v.shard, ev)
	return false
}

// expires is when v's request can no longer be finished: its window's
// reset, or, for a request admitted without knowing its window, the latest
// that window can reset.
func (v verdict) expires() time.Time {
	if v.decided {
		return time.UnixMilli(v.reset)
	}
	return v.now.Add(v.policy.Window + time.Second)
}

// finish finishes a decision-API request once on its window's primary
// (redisstore.Store.Finish): the first finish of its ticket, on any edge,
// gives a 304's charge back; every later one changes nothing.
func (d *decider) finish(ctx context.Context, v verdict, status int, now time.Time) (limiter.FinishResult, error) {
	a := limiter.FinishArgs{Start: v.now, Window: v.policy.Window, Producer: v.producer, Holder: holderOf(v.producer, v.holderNum),
		N: v.n, Units: v.cost, ChargeSeq: v.chargeSeq, Status: status}
	if v.decided {
		a.ResetAt = time.UnixMilli(v.reset)
	}
	res, err := d.store.Finish(ctx, v.key, now, a)
	if err == nil && res.Outcome == limiter.Finished && res.Amount > 0 {
		d.learn(v.shard, v.key.Digest(), res.ResetAt, res.Used)
	}
	return res, err
}

// learn takes into this edge's entry of a window what a refund or release
// the edge applied on the primary itself left in it, and tells the other
// edges (a room notice), as an accountant does for what it applies: a
// client's 304s that made room are not answered 429 from a stale count.
func (d *decider) learn(shard int, dg limiter.Digest, reset time.Time, used int64) {
	if reset.IsZero() {
		return
	}
	if e := d.table.lookup(dg); e != nil {
		e.mu.Lock()
		if e.reset == reset.UnixMilli() {
			e.used = used
			if e.full && e.limit-e.used-e.debtUnits()+e.credit >= max(1, e.lastCost) {
				e.full = false
			}
		}
		e.mu.Unlock()
	}
	d.notify(shard, events.Notice{Key: dg.String(), ResetAt: reset, Used: used})
}

// evicted gives back the credit of an entry the table let go.
func (d *decider) evicted(e *entry) {
	e.mu.Lock()
	defer e.mu.Unlock()
	d.release(e, time.Now())
}

// release gives e's unused credit back to its window. Callers hold e.mu.
func (d *decider) release(e *entry, now time.Time) {
	d.releaseUnits(e, e.credit, now)
}

// releaseUnits gives units of e's credit back to its window. Callers hold
// e.mu.
func (d *decider) releaseUnits(e *entry, units int64, now time.Time) {
	units = min(units, e.credit)
	if units <= 0 {
		return
	}
	if e.reset == 0 || now.UnixMilli() >= e.reset {
		e.credit = 0
		return
	}
	ev := events.Accounting{Kind: events.Released, Time: now, Key: e.key.Digest().String(), Policy: e.policy,
		Limit: e.limit, WindowSeconds: e.window / 1000, Units: units, ResetAt: time.UnixMilli(e.reset),
		StartedAt: time.UnixMilli(e.start)}
	if d.outbox.add(e.shard, ev) != 0 {
		d.released.Add(uint64(units))
		e.used -= units
		e.credit -= units
	}
}

// sweep gives back idle credit, forgets idle windows, and reads windows
// known to be full whose denials go on (in case a room notice was lost).
func (d *decider) sweep(ctx context.Context, now time.Time) {
	idle := now.Add(-d.cfg.IdleRelease).UnixNano()
	forget := now.Add(-time.Minute).UnixNano()
	var recheck, lost []*entry
	d.table.each(func(e *entry) {
		e.mu.Lock()
		defer e.mu.Unlock()
		last := e.lastUse.Load()
		if e.reset != 0 && now.UnixMilli() >= e.reset {
			e.expire()
		}
		// Credit unused for idle_release, or for three of the key's own
		// intervals between requests if that is longer (a key that comes
		// every two seconds keeps its credit between requests), goes back.
		quiet := last < idle
		if e.rate > 0 {
			quiet = quiet && now.UnixNano()-last > int64(3e9/e.rate)
		}
		if e.credit > 0 && quiet && e.refill == nil {
			d.release(e, now)
		}
		if e.lost != 0 && e.inflight == 0 && !d.suspected(e.shard, now.UnixNano()) {
			lost = append(lost, e)
		}
		switch {
		case !e.full:
			e.verified, e.recheck = 0, 0
		case e.verified == 0: // full since the last sweep: read it a Recheck from now
			e.verified, e.recheck = now.UnixNano(), int64(d.cfg.Recheck)
		case e.deniedSince && now.UnixNano()-e.verified >= e.recheck:
			e.verified = now.UnixNano()
			e.deniedSince = false
			// If this read finds the window still full, wait twice as long
			// for the next: a window full for an hour costs a handful of
			// reads, not one per second.
			e.recheck = min(2*e.recheck, 32*int64(d.cfg.Recheck))
			recheck = append(recheck, e)
		}
		if last < forget && e.reset == 0 && e.refill == nil && len(e.debts) == 0 && e.lost == 0 {
			d.table.remove(e.key.Digest(), e)
		}
	})
	d.resolveLost(ctx, lost, now)
	for _, e := range recheck {
		if ctx.Err() != nil {
			return
		}
		c, cancel := context.WithTimeout(ctx, d.cfg.RedisBudget)
		w, err := d.store.Check(c, e.key)
		cancel()
		d.rechecks.Add(1)
		if err != nil {
			continue
		}
		e.mu.Lock()
		switch {
		case !w.Live:
			e.expire()
		case w.ResetAt.UnixMilli() == e.reset && w.Used < e.used:
			e.used = w.Used
			if e.limit-e.used >= max(1, e.lastCost) {
				e.full = false
			}
		}
		e.mu.Unlock()
	}
}

// notice takes a notice from another edge or an accountant.
func (d *decider) notice(n events.Notice) {
	d.noticesIn.Add(1)
	dg, err := limiter.ParseDigest(n.Key)
	if err != nil {
		return
	}
	e := d.table.lookup(dg)
	if e == nil {
		return
	}
	r := n.ResetAt.UnixMilli()
	e.mu.Lock()
	defer e.mu.Unlock()
	if time.Now().UnixMilli() >= r {
		return
	}
	switch {
	case n.Full && (e.reset == r || e.reset == 0):
		if e.reset == 0 {
			e.reset = r
		}
		e.full = true
		e.used = max(e.used, n.Used)
	case !n.Full && e.reset == r:
		e.full = false
		e.used = n.Used
	}
}

// publishFull tells the other edges that e's window is full. Callers hold
// e.mu; notify does not wait for the network (a core NATS publish).
func (d *decider) publishFull(e *entry) {
	if e.reset == 0 {
		return
	}
	d.noticesUp.Add(1)
	d.notify(e.shard, events.Notice{Full: true, Key: e.key.Digest().String(), ResetAt: time.UnixMilli(e.reset), Used: e.used})
}

// releaseAll gives back every credit: the edge is stopping. Reservations
// whose answer was lost are resolved first (within ctx), so that what they
// got goes back too.
func (d *decider) releaseAll(ctx context.Context, now time.Time) {
	var lost []*entry
	d.table.each(func(e *entry) {
		e.mu.Lock()
		if e.lost != 0 && e.inflight == 0 {
			lost = append(lost, e)
		}
		e.mu.Unlock()
	})
	d.resolveLost(ctx, lost, now)
	d.table.each(func(e *entry) {
		e.mu.Lock()
		d.release(e, now)
		e.mu.Unlock()
	})
}
