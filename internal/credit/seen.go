package credit

import (
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// seen remembers, approximately, the keys this edge reserved in lately,
// beyond the table (which forgets quiet keys and evicts the least recently
// used): a key it reserved in may still have a window that outlived its
// entry. A reservation of a key it knows no window of opens one with a
// single SET ... NX (limiter.TakeArgs.Fresh), which fails when a window is
// there after all and costs a second round trip; so a key seen here goes
// straight to the script. Two generations of a bit set, each of bitsPerKey
// bits per key the table holds, one hash bit per key; the older one is
// emptied every seenFor. A false "seen" costs a script instead of a SET, a
// missed one a second round trip: neither changes what is counted.
type seen struct {
	gens [2][]atomic.Uint64
	cur  atomic.Int32
	next atomic.Int64 // Unix ns of the next rotation
}

const (
	bitsPerKey = 64
	seenFor    = 10 * time.Minute
)

func newSeen(keys int) *seen {
	words := max(1<<14, keys*bitsPerKey/64)
	s := &seen{}
	for i := range s.gens {
		s.gens[i] = make([]atomic.Uint64, words)
	}
	return s
}

func (s *seen) bit(d limiter.Digest) (int, uint64) {
	h := uint64(d[8])<<56 | uint64(d[9])<<48 | uint64(d[10])<<40 | uint64(d[11])<<32 |
		uint64(d[12])<<24 | uint64(d[13])<<16 | uint64(d[14])<<8 | uint64(d[15])
	n := uint64(len(s.gens[0])) * 64
	b := h % n
	return int(b / 64), 1 << (b % 64)
}

// add records that the edge reserved in d's window.
func (s *seen) add(d limiter.Digest) {
	w, m := s.bit(d)
	g := &s.gens[s.cur.Load()][w]
	if g.Load()&m == 0 {
		g.Or(m)
	}
}

// has reports whether d was recorded in either generation.
func (s *seen) has(d limiter.Digest) bool {
	w, m := s.bit(d)
	return s.gens[0][w].Load()&m != 0 || s.gens[1][w].Load()&m != 0
}

// rotate empties the older generation and makes it the one added to, once
// every seenFor.
func (s *seen) rotate(now time.Time) {
	next := s.next.Load()
	if next == 0 {
		s.next.CompareAndSwap(0, now.Add(seenFor).UnixNano())
		return
	}
	if now.UnixNano() < next || !s.next.CompareAndSwap(next, now.Add(seenFor).UnixNano()) {
		return
	}
	old := 1 - s.cur.Load()
	for i := range s.gens[old] {
		s.gens[old][i].Store(0)
	}
	s.cur.Store(old)
}
