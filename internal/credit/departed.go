package credit

import (
	"sync"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// departed remembers, approximately, who an evicted entry was in its
// window, so that the key's next entry carries on as the same holder.
//
// A window one holder alone reserved in stays compact (lua/window.lua);
// a reservation by another holder expands it into the full form, which
// costs every later reservation of the key a slower script. Over more keys
// than the table holds, the least recently used entries are evicted and
// their keys come back: without this, each came back as a new holder of
// the same edge and expanded its own window.
//
// Carrying on is exact because the identity is taken whole: the holder,
// what it was told it got in the window and the highest count a reply
// showed (known, mine: so a reply's count beyond them is still a lost
// answer's and nothing else), the requests it numbered (served: finishes
// are marked by number) and what its events sent. Only an entry with
// nothing in hand leaves its identity (no credit, nothing in flight, lost,
// owed or frozen), and it is marked gone under its lock first, so that no
// request goes on using it (Decide takes the table's entry again).
//
// The cache is a ring of slots, two a key the table holds, filled in the
// order entries leave, with an index by digest: an identity is kept until
// as many others have left after it as the ring has slots, and then
// forgotten (its key's next entry is a new holder, as without the cache).
// So a key comes back as its holder whenever fewer than twice the table's
// keys were evicted meanwhile, however the keys' digests fall
// (TestDepartedKeepsIdentitiesForItsCapacity); sets of two slots chosen by
// the digest, with as many slots, kept about three identities in four over
// a stretch of as many evictions as the table holds. The index costs about
// 50 bytes a slot.
type departed struct {
	mu    sync.Mutex
	ring  []departedSlot
	next  int                      // the slot the next identity goes to
	index map[limiter.Digest]int32 // each identity's slot
}

// departedSlots is the ring's slots per key the table holds.
const departedSlots = 2

type departedSlot struct {
	d  limiter.Digest
	id identity
	ok bool
}

// identity is who an entry is in its window, and what it last knew of the
// window (entry's fields of the same names).
// It holds no pointer, so that the cache costs the collector nothing to
// mark.
type identity struct {
	holderNum                 uint64
	shard                     int32
	own                       bool
	reset, start, countsReset instant
	used, known, mine         int64
	served                    uint64
	charged, givenBack        int64
	sentFrom, sentTo          uint64
}

func newDeparted(keys int) *departed {
	n := departedSlots * max(1024, keys)
	return &departed{ring: make([]departedSlot, n), index: make(map[limiter.Digest]int32, n)}
}

// put remembers d's identity as the newest, forgetting the oldest when
// the ring is full (and d's own earlier one, when d is there already).
func (p *departed) put(d limiter.Digest, id identity) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i, ok := p.index[d]; ok {
		p.ring[i] = departedSlot{}
	}
	if old := &p.ring[p.next]; old.ok {
		delete(p.index, old.d)
	}
	p.ring[p.next] = departedSlot{d: d, id: id, ok: true}
	p.index[d] = int32(p.next)
	p.next = (p.next + 1) % len(p.ring)
}

// take returns d's identity and forgets it: one entry at most carries it
// on.
func (p *departed) take(d limiter.Digest) (identity, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, ok := p.index[d]
	if !ok {
		return identity{}, false
	}
	id := p.ring[i].id
	p.ring[i] = departedSlot{}
	delete(p.index, d)
	return id, true
}

// identity is e's identity, to be carried on. Callers hold e.mu.
func (e *entry) identity() identity {
	return identity{holderNum: e.holderNum, shard: e.shard.Load(), own: e.own, reset: e.reset, start: e.start,
		countsReset: e.countsReset, used: e.used, known: e.known, mine: e.mine, served: e.served,
		charged: e.charged, givenBack: e.givenBack, sentFrom: e.sentFrom, sentTo: e.sentTo}
}

// carryOn makes a new entry the holder id was, knowing of its window what
// it knew.
func (e *entry) carryOn(id identity) {
	e.holderNum = id.holderNum
	e.shard.Store(id.shard)
	e.own = id.own
	e.reset, e.start, e.countsReset = id.reset, id.start, id.countsReset
	e.used, e.known, e.mine, e.served = id.used, id.known, id.mine, id.served
	e.charged, e.givenBack, e.sentFrom, e.sentTo = id.charged, id.givenBack, id.sentFrom, id.sentTo
	e.asked = true // a window of the key may be there
}

// leaves reports whether e, evicted, may leave its identity: nothing in
// hand, and a live window it counts for. Callers hold e.mu.
func (e *entry) leaves(now time.Time) bool {
	return e.credit == 0 && e.inflight == 0 && e.refill == nil && e.lost.IsZero() && len(e.debts) == 0 &&
		e.held == 0 && e.frozen == 0 && !e.holding && e.live(now) && e.countsReset == e.reset
}
