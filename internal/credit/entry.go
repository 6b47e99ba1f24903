package credit

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// entry is what one edge knows of one key's window: the count the last
// reservation returned, the credit this edge holds in it, whether it is
// full (doc.go has its states). It is guarded by mu; nothing holds mu
// during I/O.
type entry struct {
	mu  sync.Mutex
	key limiter.Key
	// shard holds the window: the key's owner, or its previous owner
	// while shards are added or removed (limiter.Grant.Shard). Read
	// without mu (at); set under it.
	shard  atomic.Int32
	policy limiter.Policy

	// reset and start name the window this knowledge is about (zero: none).
	reset, start instant
	// asked: a reservation of the key has been sent from this entry; until
	// then no window of it is known here (limiter.TakeArgs.Fresh).
	asked bool
	// own: the last reservation found the window this entry's own compact
	// one (limiter.Grant.Own), so the next tries the short way first
	// (limiter.TakeArgs.Own).
	own bool
	// gone: e left the table and a later entry of the key carries on as
	// its holder (departed.go); requests take the table's entry instead.
	gone bool
	// used is the window's count as the last reservation (or a notice, or
	// a read) reported it, every edge's reservations included.
	used int64
	// credit is what this edge reserved in the window and has not used.
	credit int64
	// full: no reservation is possible; requests without credit are denied
	// from memory until the reset, a room notice, or a read that finds room.
	full bool
	// frozen is the credit this edge will not spend until a report lowers
	// it (hold.go): the share other edges may take back once its report
	// expires, were this edge to die. held is the share the window holds
	// for e as far as e knows (frozen ≥ held); holding is set while a
	// report is in flight; heldAt is when the last one was recorded.
	frozen, held int64
	holding      bool
	heldAt       instant
	// doubtful: used was raised by a notice (or a refund applied here)
	// while the edge owed charges (debts). The count may hold some of them
	// already, and room then counts them twice: a request that would be
	// denied makes one reservation instead, whose answer says which of
	// them the primary applied (settle).
	doubtful bool

	// refill is non-nil while a reservation is in flight; it is closed when
	// the reservation's result is in.
	refill chan struct{}
	// failed is when the last reservation failed (zero: it did not).
	failed instant

	// Reservations whose answer was lost: a primary that froze runs them
	// when it wakes, for an edge that has stopped waiting. holder names
	// this entry in the window's count of what was reserved for whom
	// (take.lua); known is what this entry was told it got in the window,
	// mine the highest count a reply showed; inflight counts reservations
	// awaiting their answer; lost is when one failed (zero: none to
	// resolve). mine beyond known, once every answer is in, is credit.
	// countsReset is the window known and mine are about: they outlive
	// expire, because an answer for a window the edge has let go of can
	// still come in (a take sent just before the reset).
	holder      string
	holderNum   uint64
	known       int64
	mine        int64
	countsReset instant
	inflight    int
	lost        instant
	// served numbers the admissions of this entry in its window (a
	// request's finish is marked by its number: lua/finish.lua).
	served uint64
	// What this entry sent for its window, for a reseed (claims.go): the
	// units it charged and gave back by its accounting events numbered
	// sentFrom < seq <= sentTo, and by the finishes of its requests.
	charged, givenBack int64
	sentFrom, sentTo   uint64
	// past, for a sliding window's entry, is the same for the sub-windows
	// before its window that are still in a span (claims.go); nil for other
	// policies.
	past *[]pastWindow
	// spare, for a concurrency limit's entry, is the least credit it held
	// free since the sweep last looked (spareCredit); nil until the entry
	// first spends, and for other policies.
	spare *spareCredit

	counts *[2]atomic.Uint64 // the policy's decisions, by [allowed] (Core.byPolicy)

	// Mode async: units admitted over credit whose charges are not yet known
	// to be in used, by the sequence of their charge event.
	debts []debt
	// The rate of admissions, for sizing reservations.
	admitted int64   // units admitted since lastTake
	lastTake instant // when the last reservation was asked for
	rate     float64 // units per second
	// lastUseNano is when the key last had a request (Unix ns): read
	// without mu when the table chooses what to evict.
	lastUseNano atomic.Int64
	// quietUntil is when the sweep next has something to do for e (Unix
	// ns); 0: at the next sweep. The sweep sets it for an entry with
	// nothing in hand (no credit, not full, nothing in flight, lost or
	// owed) to its window's reset or, with no window, to when the key is
	// forgotten; lock clears it, so that any change makes e due again.
	// home is e's table shard, whose list of due entries holds e while
	// quietUntil is 0 (dueAt is its place there, plus one; 0: not listed;
	// -1: e has left the table and is never listed again).
	quietUntil atomic.Int64
	home       *tableShard
	dueAt      int
	// Convergence reads of full windows.
	deniedSince bool
	verified    instant       // when the window was last found (or believed) full
	recheck     time.Duration // until the next read; doubles while the window stays full
	lastCost    int64
}

// instant is a time kept in an entry: Unix ns, 0 for none (the zero
// time). An entry keeps its times as instants, not time.Time, which
// carries a pointer to its location: the collector reads every pointer
// slot of every entry on every cycle, and the table holds one entry per
// key the edge remembers (docs/architecture.md, "The table the collector
// reads").
type instant int64

func instantOf(t time.Time) instant {
	if t.IsZero() {
		return 0
	}
	return instant(t.UnixNano())
}

// Time is i as a time.Time (the zero time for 0).
func (i instant) Time() time.Time {
	if i == 0 {
		return time.Time{}
	}
	return time.Unix(0, int64(i))
}

func (i instant) IsZero() bool { return i == 0 }

// Equal reports whether i is t.
func (i instant) Equal(t time.Time) bool { return i == instantOf(t) }

type debt struct {
	seq   uint64
	units int64
}

// at is the shard that holds e's window.
func (e *entry) at() int { return int(e.shard.Load()) }

// lock takes e.mu to change e: the sweep looks at e again next time.
func (e *entry) lock() {
	e.mu.Lock()
	// Only the sweep makes an entry quiet, holding e.mu: a busy entry never
	// is, and pays one load here.
	if e.quietUntil.Load() != 0 {
		e.quietUntil.Store(0)
		e.home.markDue(e)
	}
}

// quiet leaves e out of the sweep's visits until until (Unix ns), unless it
// changes first. Callers hold e.mu.
func (e *entry) quiet(until int64) {
	e.quietUntil.Store(until)
	e.home.unmarkDue(e)
}

// settled reports whether the sweep has nothing to do for e until its
// window resets or the key is to be forgotten. Callers hold e.mu.
func (e *entry) settled() bool {
	return e.credit == 0 && !e.full && !e.deniedSince && e.inflight == 0 && e.refill == nil && e.lost.IsZero() && len(e.debts) == 0 &&
		e.held == 0 && e.frozen == 0 && !e.holding
}

func (e *entry) exact() bool { return e.policy.Mode.OrDefault() == limiter.ModeExact }

// adopt takes p's terms (a limit reloaded with another limit, window or
// mode): the window and the credit held in it stay, and what is left is
// judged by the new limit from now on. Callers hold e.mu.
//
// Another algorithm, or a sliding window cut into other sub-windows,
// counts in other windows: what e knew is forgotten (the credit it held
// stays counted where it was reserved until that window resets).
func (e *entry) adopt(p limiter.Policy) {
	if e.policy != p {
		if e.policy.Algorithm.OrDefault() != p.Algorithm.OrDefault() || e.policy.Slices != p.Slices ||
			(p.Slices > 0 && e.policy.Window != p.Window) {
			e.expire()
			e.past, e.own = nil, false
		}
		e.policy = p
	}
}

// live reports whether e knows a window that has not reset at now.
func (e *entry) live(now time.Time) bool { return !e.reset.IsZero() && now.Before(e.reset.Time()) }

// expire forgets the window: it has reset.
func (e *entry) expire() {
	// A token bucket's periods are read together (lua/bucket.lua): that
	// its last reservation left its period the holder's own says the
	// next one, in another period, may go the short way too.
	own := e.own && e.policy.Algorithm == limiter.TokenBucket
	e.reset, e.start, e.used, e.credit, e.full, e.doubtful, e.own = 0, 0, 0, 0, false, false, own
	e.frozen, e.held = 0, 0 // the share went with the window
	e.served = 0
	e.charged, e.givenBack, e.sentFrom, e.sentTo = 0, 0, 0, 0
	e.debts = e.debts[:0]
	e.deniedSince = false
	e.noteFree()
}

// spareCredit is the credit of a concurrency limit's entry that sat unused
// since a time: the least it held free since then. A finish on the edge
// that admitted the request puts its units back into that edge's credit,
// so an edge would otherwise keep the units of its busiest moment for as
// long as the key stays busy there; what it held free all along is beyond
// its peak of requests in flight, and the sweep gives it back
// (Core.trimSpare), for the key's other edges to use.
type spareCredit struct {
	least int64
	since instant
}

// spend takes cost units of e's credit for a request it admits. Callers
// hold e.mu.
func (e *entry) spend(cost int64) {
	e.credit -= cost
	e.admitted += cost
	if e.spare == nil && e.policy.Algorithm == limiter.Concurrency {
		e.spare = &spareCredit{least: e.free(), since: instant(e.lastUseNano.Load())}
	}
	e.noteFree()
}

// noteFree lowers the least credit e held free to what it holds now.
// Callers hold e.mu.
func (e *entry) noteFree() {
	if e.spare != nil {
		e.spare.least = min(e.spare.least, e.free())
	}
}

// count takes a take's answer (or a read's) into the counts of what was
// reserved for e, starting them again for a window they are not about.
func (e *entry) count(g limiter.Grant) {
	if !e.countsReset.Equal(g.ResetAt) {
		e.known, e.mine, e.countsReset = 0, 0, instantOf(g.ResetAt)
	}
	e.mine = max(e.mine, g.Mine)
}

// debtUnits are the units charged through events that the window's count
// does not show yet.
func (e *entry) debtUnits() int64 {
	var n int64
	for _, d := range e.debts {
		n += d.units
	}
	return n
}

// room is what e knows is left in its window for requests of this edge:
// the limit, less every unit the count shows and what the edge owes, plus
// the credit the edge holds and may spend (counted in used, but this
// edge's to spend; frozen credit is not, until a report lowers it). The
// same for every algorithm (algorithm.go).
func (e *entry) room() int64 { return e.policy.Limit - e.used - e.debtUnits() + e.credit - e.frozen }

// refilled reports whether, under a token bucket, what a request of cost
// needs beyond the room e knows of has refilled at the bucket's rate since
// e learnt its count (the last reservation's answer): a bucket is full
// only until then, and the next request asks the primary again. Always
// false for a window, which is full until its reset. Callers hold e.mu.
func (e *entry) refilled(cost int64, now time.Time) bool {
	return e.policy.Rate > 0 && !e.lastTake.IsZero() && now.Sub(e.lastTake.Time()) >= e.policy.Refill(cost-e.room())
}

// free is the credit e may spend now.
func (e *entry) free() int64 { return max(0, e.credit-e.frozen) }

// spendable reports whether cost units of e's credit may be spent. Credit
// is reserved on the primary, so as long as the window holds no more than
// its limit and the edge owes nothing, it always may. But with debts (mode
// async's admissions over credit, charged by events the primary may not
// have applied yet), or once such charges took the window past its limit,
// a reservation made while they grew may hold room those admissions took
// already: credit is spent only while what the edge knows of the window
// leaves room for it (what is left unspent is given back).
func (e *entry) spendable(cost int64) bool { return e.free() >= cost && e.room() >= cost }

// owed lists the debts for a reservation (limiter.TakeArgs.Owed): what
// the primary has not applied of them counts as used.
func (e *entry) owed() []limiter.Owed {
	if len(e.debts) == 0 {
		return nil
	}
	out := make([]limiter.Owed, len(e.debts))
	for i, d := range e.debts {
		out[i] = limiter.Owed{Seq: d.seq, Units: d.units}
	}
	return out
}

// settle drops the debts whose charges the primary has applied (sequence
// at most applied): the count includes them now.
func (e *entry) settle(applied uint64) {
	k := 0
	for _, d := range e.debts {
		if d.seq > applied {
			e.debts[k] = d
			k++
		}
	}
	e.debts = e.debts[:k]
}

const tableShards = 256

// quietWalk is how often the sweep walks the whole table for the quiet
// entries whose time has come (a window reset, a key to forget); between
// walks it visits only the due ones. What it does for those (let a window
// go, forget a key) has no effect outside the edge, so it may come late.
const quietWalk = 5 * time.Second

// table holds the entries of the keys an edge has seen, bounded in size.
// It is sharded by key hash so that lookups rarely contend.
type table struct {
	shards   [tableShards]tableShard
	perShard int
	evicted  atomic.Uint64
	size     atomic.Int64
	nextWalk atomic.Int64 // Unix ns of the next walk of every entry
}

// tableShard is a slice of the table. Lock order: an entry's mu, then mu,
// then dueMu; dueMu guards due and every entry's dueAt, and is taken last.
type tableShard struct {
	mu sync.Mutex
	m  map[limiter.Digest]*entry

	dueMu sync.Mutex
	due   []*entry // the entries not quiet: what the sweep visits
}

func newTable(capacity int) *table {
	t := &table{perShard: max(1, capacity/tableShards)}
	for i := range t.shards {
		t.shards[i].m = make(map[limiter.Digest]*entry)
	}
	return t
}

// markDue lists e among the entries the sweep visits.
func (s *tableShard) markDue(e *entry) {
	if s == nil {
		return
	}
	s.dueMu.Lock()
	if e.dueAt == 0 {
		s.due = append(s.due, e)
		e.dueAt = len(s.due)
	}
	s.dueMu.Unlock()
}

// unmarkDue takes e off the list of entries the sweep visits.
func (s *tableShard) unmarkDue(e *entry) { s.unlist(e, 0) }

// drop takes e off the list for good: it has left the table (a request
// that still holds it may change it, but the sweep is done with it).
func (s *tableShard) drop(e *entry) { s.unlist(e, -1) }

func (s *tableShard) unlist(e *entry, then int) {
	if s == nil {
		return
	}
	s.dueMu.Lock()
	if i := e.dueAt - 1; i >= 0 {
		last := s.due[len(s.due)-1]
		s.due[i], last.dueAt = last, i+1
		s.due[len(s.due)-1] = nil
		s.due = s.due[:len(s.due)-1]
	}
	if e.dueAt >= 0 {
		e.dueAt = then
	}
	s.dueMu.Unlock()
}

// get returns d's entry, creating it with newEntry when absent. When the
// table shard is full, the least recently used of a few sampled entries is
// evicted first and handed to evict (outside the table's lock).
func (t *table) get(d limiter.Digest, newEntry func() *entry, evict func(*entry)) *entry {
	s := &t.shards[d.Hash()%tableShards]
	s.mu.Lock()
	if e, ok := s.m[d]; ok {
		s.mu.Unlock()
		return e
	}
	var victim *entry
	if len(s.m) >= t.perShard {
		var vd limiter.Digest
		n := 0
		for k, e := range s.m { // map iteration order is random: a sample
			if victim == nil || e.lastUseNano.Load() < victim.lastUseNano.Load() {
				victim, vd = e, k
			}
			if n++; n == 8 {
				break
			}
		}
		delete(s.m, vd)
		s.drop(victim)
		t.evicted.Add(1)
		t.size.Add(-1)
	}
	e := newEntry()
	e.home = s
	s.m[d] = e
	s.markDue(e)
	t.size.Add(1)
	s.mu.Unlock()
	if victim != nil && evict != nil {
		evict(victim)
	}
	return e
}

// lookup returns d's entry, or nil.
func (t *table) lookup(d limiter.Digest) *entry {
	s := &t.shards[d.Hash()%tableShards]
	s.mu.Lock()
	e := s.m[d]
	s.mu.Unlock()
	return e
}

// each calls f for every entry, one table shard at a time (f must not call
// back into the table).
func (t *table) each(f func(*entry)) { t.walk(0, f) }

// eachDue calls f, outside the table's locks, for every entry not quiet at
// now (Unix ns): those listed due, and every quietWalk those whose quiet
// time has come.
func (t *table) eachDue(now int64, f func(*entry)) {
	if now >= t.nextWalk.Load() {
		t.nextWalk.Store(now + int64(quietWalk))
		t.walk(now, f)
		return
	}
	var buf []*entry
	for i := range t.shards {
		s := &t.shards[i]
		s.dueMu.Lock()
		buf = append(buf[:0], s.due...)
		s.dueMu.Unlock()
		for _, e := range buf {
			f(e)
		}
	}
}

// walk calls f for every entry not quiet at now (0: every entry).
func (t *table) walk(now int64, f func(*entry)) {
	var buf []*entry
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		buf = buf[:0]
		for _, e := range s.m {
			if q := e.quietUntil.Load(); now == 0 || q == 0 || now >= q {
				buf = append(buf, e)
			}
		}
		s.mu.Unlock()
		for _, e := range buf {
			f(e)
		}
	}
}

// remove deletes d's entry if it is e.
func (t *table) remove(d limiter.Digest, e *entry) {
	s := &t.shards[d.Hash()%tableShards]
	s.mu.Lock()
	if s.m[d] == e {
		delete(s.m, d)
		t.size.Add(-1)
	}
	s.drop(e)
	s.mu.Unlock()
}
