package credit

import (
	"sync"
	"sync/atomic"
)

// counters are what the core counts, atomically; Stats reads them once.
type counters struct {
	byPath [Paths][2]atomic.Uint64 // [path][allowed]
	// byPolicy counts by policy name, [allowed]: the policies of Deps, and
	// those a request names later (a reload's, the rate-limit service's).
	// policyMu guards the map, and is taken last.
	policyMu                             sync.Mutex
	byPolicy                             map[string]*[2]atomic.Uint64
	takes, takeErrors                    atomic.Uint64
	recovered                            atomic.Uint64 // units of reservations whose answer was lost
	released, absorbed                   atomic.Uint64
	rechecks                             atomic.Uint64
	noticesIn, noticesUp, noticesRefused atomic.Uint64
	unavailable                          atomic.Uint64
	frozen, takenBack, holdErrors        atomic.Uint64
	claims                               atomic.Uint64
}

// Stats is what the core did since it started, read at once (the metrics
// exporter reads it when /metrics is scraped).
type Stats struct {
	// Decisions counts decisions by path and result: [path][0] denied,
	// [path][1] allowed.
	Decisions [Paths][2]uint64
	// Policies counts decisions by policy name: [0] denied, [1] allowed.
	Policies map[string][2]uint64
	// Takes are reservations made (read included); TakeErrors those that
	// failed (the edge decided without them).
	Takes, TakeErrors uint64
	// Recovered are units of reservations whose answer was lost, taken
	// back into credit.
	Recovered uint64
	// Released are units given back unused; Absorbed 304 refunds taken back
	// into the edge's own credit (no event).
	Released, Absorbed uint64
	// Rechecks are reads of windows believed full, and of windows a lost
	// reservation may have changed.
	Rechecks uint64
	// NoticesIn, NoticesSent, NoticesRefused: notices heard, full-window
	// notices sent, notices refused (not signed with the deployment's
	// secret, or replayed).
	NoticesIn, NoticesSent, NoticesRefused uint64
	// Unavailable are requests refused because Redis could not be reached
	// and the edge fails closed.
	Unavailable uint64
	// Holds are reports of frozen credit made (hold.go); HoldErrors those
	// that failed; TakenBack units of this edge's frozen credit another
	// edge took back while its reports did not arrive.
	Holds, HoldErrors, TakenBack uint64
	// Claims are windows this edge re-asserted on a primary that changed
	// (a reseed: claims.go).
	Claims uint64
	// Keys are the keys remembered; Evicted those forgotten to bound
	// memory.
	Keys    int64
	Evicted uint64
}

// Stats reads the core's counters.
func (c *Core) Stats() Stats {
	c.stats.policyMu.Lock()
	defer c.stats.policyMu.Unlock()
	s := Stats{Policies: make(map[string][2]uint64, len(c.stats.byPolicy)), Takes: c.stats.takes.Load(),
		TakeErrors: c.stats.takeErrors.Load(), Recovered: c.stats.recovered.Load(), Released: c.stats.released.Load(),
		Absorbed: c.stats.absorbed.Load(), Rechecks: c.stats.rechecks.Load(), NoticesIn: c.stats.noticesIn.Load(),
		NoticesSent: c.stats.noticesUp.Load(), NoticesRefused: c.stats.noticesRefused.Load(),
		Unavailable: c.stats.unavailable.Load(), Holds: c.stats.frozen.Load(), HoldErrors: c.stats.holdErrors.Load(),
		TakenBack: c.stats.takenBack.Load(), Claims: c.stats.claims.Load(), Keys: max(0, c.table.size.Load()), Evicted: c.table.evicted.Load()}
	for p := range s.Decisions {
		s.Decisions[p] = [2]uint64{c.stats.byPath[p][0].Load(), c.stats.byPath[p][1].Load()}
	}
	for name, n := range c.stats.byPolicy {
		s.Policies[name] = [2]uint64{n[0].Load(), n[1].Load()}
	}
	return s
}

// countsOf is the decision counters of the policy named name.
func (c *Core) countsOf(name string) *[2]atomic.Uint64 {
	c.stats.policyMu.Lock()
	defer c.stats.policyMu.Unlock()
	n, ok := c.stats.byPolicy[name]
	if !ok {
		n = new([2]atomic.Uint64)
		c.stats.byPolicy[name] = n
	}
	return n
}
