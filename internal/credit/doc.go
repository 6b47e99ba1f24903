// Package credit is the edge's decision core: what one edge knows of each
// key's window, and every decision made from it. It does no I/O of its
// own: it reserves on a primary, records what is left to account for and
// tells other edges of full windows through its ports (ports.go), and
// reads the time from its clock. The front doors (the proxy, forward-auth,
// the decision API, Envoy's rate-limit service) translate a request into
// one call of DecideRequest (request.go) and its Outcome into an answer:
// the core decides the whole request — every limit of it, an operator's
// temporary limits and blocks and progressive backoff (the Healer port),
// and which limit denied it, with the reason (the verdict's Path).
// docs/accuracy.md argues why the decisions are exact. A policy's
// algorithm (algorithm.go) says what a reservation asks, what a decision
// tells the client and where its spans lie; the loop that decides is one
// for every algorithm.
//
// # The model
//
// A Core keeps a table of entries, one per key it has seen (bounded; the
// least recently used are forgotten first, their credit given back). An
// entry holds, for the window its knowledge is about (reset; zero: none):
//
//	used    the window's count as the last reservation, notice or read
//	        reported it, every edge's reservations included
//	credit  units this edge reserved in the window and has not used
//	debts   (mode async) units admitted over credit and charged by events
//	        the primary may not have applied yet
//	full    no reservation is possible: until the window resets, or for
//	        a token bucket until what a request needs has refilled
//	        (entry.refilled)
//	frozen  credit the edge will not spend until a report lowers it: the
//	        share of a busy key's credit other edges take back if this
//	        edge dies (hold.go)
//
// and the room it knows of: room = limit − used − debts + credit − frozen.
// A request of cost c is admitted from credit iff credit − frozen ≥ c and room ≥ c
// (credit is reserved, but credit reserved while debts were on their way
// may be room the debts took: spendable). A reservation (lua/take.lua)
// never takes a window past its limit and counts the edge's unapplied
// debts as used, so what every edge admits from credit stays within it.
//
// # States and transitions
//
//	none      no window known. A request starts a reservation of exactly
//	          its cost (the key has no rate yet) and waits for it, at most
//	          RedisBudget; the answer opens the window (→ credit or full).
//	credit    credit ≥ the cost: admit from memory (PathCredit), no Redis
//	          call; when the credit would be gone within half the
//	          horizon, a reservation sized for the key's rate starts in the
//	          background (prefetch).
//	near      credit < the cost: wait for a reservation (PathReserve);
//	          reservations take at most 1/Share of what is left, so near the
//	          limit each covers one request: atomic per request.
//	full      a reservation found no room, or left the window at its limit
//	          (→ a full notice to the other edges): deny from memory
//	          (PathCache) until the reset, a room notice, or a read that
//	          finds room (rechecks: after Recheck, doubling while full).
//	          Except when the count came from a notice (or a refund applied
//	          here) while the edge owed charges: it may hold some of them,
//	          which room then counts twice, so one request makes a
//	          reservation, whose answer settles the debts (doubtful).
//	reset     now ≥ reset: the entry forgets the window (→ none).
//
// Events that change an entry: a reservation's answer (grant), a refund of
// a 304 the edge answered (into its credit, or an event), a notice (full:
// → full; room: → used lowered, not full), a read (recheck), a refund or
// release the edge applied itself (Learn), the sweep (idle credit given
// back after IdleRelease; a reservation whose answer was lost found and its
// units taken back: reconcile), and Redis slow or down (no answer within
// RedisBudget: decide from what is known — credit, deny if known full,
// borrow in a known window — else FailOpen: admit and charge by an event,
// or ErrUnavailable).
//
// The sweep runs every quarter of a second but visits only the entries
// that hold something: credit, a full window, a reservation in flight or
// lost, debts. An entry with none of these is settled: the sweep marks it
// quiet until its window resets (or, with no window, until the key is to
// be forgotten, a minute after its last request) and takes it off the
// list of due entries it visits; any change to it (entry.lock) lists it
// again. Every five seconds one walk of the whole table finds the quiet
// entries whose time has come. A table of 1,000,000 keys seen once costs
// the sweep nothing between walks, where walking it four times a second
// took 3% of the edge's CPU (make bench, 1M keys).
//
// Modes: auto (the above), exact (one reservation of exactly the request's
// cost per request, made by the request itself), async (like auto, but
// once the window is open a request never waits: over its credit it is
// admitted from what the edge knows — borrow — and charged by an event,
// remembered as a debt until a reservation's answer shows it applied).
//
// # Locks
//
// Each entry has a mutex; nothing holds it during I/O: a request waiting
// for a reservation releases it (wait, reserveNow) and takes it again.
// The order, outermost first: an entry's mutex, then its table shard's
// (tableShard.mu: the map of entries), then the shard's list of due
// entries (tableShard.dueMu). Nothing takes an entry's mutex while holding
// a table shard's: get, lookup and the walks release the table lock
// before they touch an entry, and an evicted entry's credit is given back
// after it. Counters are atomics. Every change to an entry takes its lock
// through entry.lock, which also lists the entry due for the sweep. Ports
// are called without any lock held, except the Ledger and the Notifier,
// which must not block (they queue).
package credit
