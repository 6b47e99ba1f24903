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
// The cache is a fixed array of sets of two slots, the set chosen by the
// digest; a set keeps the two identities put last, so an identity is
// forgotten once two later ones land in its set, and the key's next entry
// is then a new holder, as without the cache. Two slots a set, and a set
// per key the table holds (256 bytes a key), keep about three identities in
// four over a stretch in which as many other keys leave the table as it
// holds, where one slot a key kept one in three
// (TestDepartedKeepsMostIdentities).
type departed struct {
	sets  [][departedWays]departedSlot
	locks [64]sync.Mutex
}

// departedWays is the number of slots of a set.
const departedWays = 2

type departedSlot struct {
	d  limiter.Digest
	id identity
	ok bool
}

// identity is who an entry is in its window, and what it last knew of the
// window (entry's fields of the same names; times in Unix ns, 0 for none).
// It holds no pointer, so that the cache costs the collector nothing to
// mark.
type identity struct {
	holderNum                 uint64
	shard                     int32
	own                       bool
	reset, start, countsReset int64
	used, known, mine         int64
	served                    uint64
	charged, givenBack        int64
	sentFrom, sentTo          uint64
}

// unixNano is t in Unix ns, 0 for the zero time; timeOf is its inverse.
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func timeOf(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func newDeparted(keys int) *departed {
	return &departed{sets: make([][departedWays]departedSlot, max(1024, keys))}
}

func (p *departed) set(d limiter.Digest) (*[departedWays]departedSlot, *sync.Mutex) {
	h := d.Hash()
	return &p.sets[h%uint64(len(p.sets))], &p.locks[h%uint64(len(p.locks))]
}

// put remembers d's identity, in place of the older of its set's two (or
// of d's own, when d is there already).
func (p *departed) put(d limiter.Digest, id identity) {
	set, mu := p.set(d)
	mu.Lock()
	defer mu.Unlock()
	if !(set[0].ok && set[0].d == d) {
		set[1] = set[0]
	}
	set[0] = departedSlot{d: d, id: id, ok: true}
}

// take returns d's identity and forgets it: one entry at most carries it
// on.
func (p *departed) take(d limiter.Digest) (identity, bool) {
	set, mu := p.set(d)
	mu.Lock()
	defer mu.Unlock()
	for i := range set {
		if s := &set[i]; s.ok && s.d == d {
			id := s.id
			*s = departedSlot{}
			return id, true
		}
	}
	return identity{}, false
}

// identity is e's identity, to be carried on. Callers hold e.mu.
func (e *entry) identity() identity {
	return identity{holderNum: e.holderNum, shard: e.shard.Load(), own: e.own, reset: int64(e.reset), start: int64(e.start),
		countsReset: int64(e.countsReset), used: e.used, known: e.known, mine: e.mine, served: e.served,
		charged: e.charged, givenBack: e.givenBack, sentFrom: e.sentFrom, sentTo: e.sentTo}
}

// carryOn makes a new entry the holder id was, knowing of its window what
// it knew.
func (e *entry) carryOn(id identity) {
	e.holderNum = id.holderNum
	e.shard.Store(id.shard)
	e.own = id.own
	e.reset, e.start, e.countsReset = instant(id.reset), instant(id.start), instant(id.countsReset)
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
