package accountant

import (
	"slices"

	"github.com/tallyhq/tally/internal/limiter"
)

// carry is what a worker that lets its shard go leaves to the next worker
// of this process on the shard (the lease lost while the primary was
// unreachable, and taken back once it answers):
//
//   - applied: the last stream sequence it applied. The messages up to it
//     may still be in the stream (not yet purged); the next worker skips
//     them instead of applying them again and recording their events as
//     duplicates.
//   - lost: a run whose answer was lost and never learnt (the primary may
//     have applied it). The next worker sends those messages again as the
//     same run, so that lua/apply.lua answers what the lost call did, and
//     each event is recorded as what happened to it, not as a duplicate.
//
// Another accountant that takes the shard in between changes nothing here:
// what this process applied stays applied, and a run it sends again that
// another applied since answers its events as duplicates, as any run would.
type carry struct {
	applied uint64
	lost    *lostRun
}

// lostRun is a run whose answer was lost: its number, the stream sequences
// of its messages and how many events it sent.
type lostRun struct {
	run  limiter.Run
	seqs []uint64
	ops  int
}

// leave records what worker w leaves for the next worker of shard i.
func (a *Accountant) leave(i int, c carry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.carried[i] = c
}

// takeOver returns, and forgets, what the last worker of shard i left.
func (a *Accountant) takeOver(i int) carry {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.carried[i]
	a.carried[i] = carry{}
	return c
}

// lostIn returns where in items the lost run's messages are, all of them
// and in order ([from, to)); ok false when they are not all there.
func (l *lostRun) lostIn(items []item) (from, to int, ok bool) {
	from = slices.IndexFunc(items, func(it item) bool { return it.seq == l.seqs[0] })
	if from < 0 || from+len(l.seqs) > len(items) {
		return 0, 0, false
	}
	ops := 0
	for k, seq := range l.seqs {
		it := &items[from+k]
		if it.seq != seq {
			return 0, 0, false
		}
		if it.bad == nil {
			ops += len(it.ops)
		}
	}
	return from, from + len(l.seqs), ops == l.ops
}
