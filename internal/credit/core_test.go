package credit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

const testLimit = 10

// fast is the configuration of the table tests: a request waits at most
// 250 ms of real time for a slow primary — enough that a busy machine's
// scheduling (the fake answers at once, from a goroutine) decides no test.
var fast = Config{RedisBudget: 250 * time.Millisecond}

func policyOf(m limiter.Mode) limiter.Policy {
	return limiter.Policy{Name: "api", Limit: testLimit, Window: time.Minute, Mode: m}
}

// open puts the harness's key into a live window of which used units are
// counted, credit of them reserved for this edge and unused: the state a
// run of requests and reservations leaves, set directly.
func (h *harness) open(used, credit int64, full bool) {
	e := h.core.entry(h.dg, h.policy)
	start := h.clock.Now()
	reset := start.Add(time.Minute).Truncate(time.Second)
	h.redis.set(h.key, start, reset, used, e.holder, credit)
	e.lock()
	defer e.mu.Unlock()
	e.reset, e.start, e.used, e.credit, e.full = instantOf(reset), instantOf(start), used, credit, full
	e.known, e.mine, e.countsReset = credit, credit, instantOf(reset)
}

// The states of an entry (doc.go), each as a way to reach it.
var states = []struct {
	name string
	// into brings h's key into the state; nil: not a state of the mode.
	into func(h *harness)
	skip limiter.Mode
}{
	{name: "none", into: func(*harness) {}},
	{name: "credit", into: func(h *harness) { h.open(4, 3, false) }, skip: limiter.ModeExact},
	{name: "near", into: func(h *harness) { h.open(testLimit-1, 0, false) }},
	{name: "full", into: func(h *harness) { h.open(testLimit, 0, true) }},
	{name: "reset", into: func(h *harness) {
		h.open(4, 3, false)
		h.clock.Advance(2 * time.Minute)
	}},
}

// The events a request meets, each ending in one decision of cost 1.
var happenings = []struct {
	name string
	run  func(h *harness) (Verdict, error)
}{
	{"request", func(h *harness) (Verdict, error) { return h.decide(1) }},
	{"redis down", func(h *harness) (Verdict, error) {
		h.redis.down = true
		return h.decide(1)
	}},
	{"redis slow", func(h *harness) (Verdict, error) {
		h.redis.slow = make(chan struct{})
		h.reqs++
		v, err := h.core.Decide(context.Background(), h.policy, 1, h.dg, h.clock.Now(), h.reqs)
		h.redis.wake()
		h.core.Wait()
		return v, err
	}},
	{"full notice", func(h *harness) (Verdict, error) {
		h.core.Heard(h.notice(true, testLimit))
		return h.decide(1)
	}},
	{"room notice", func(h *harness) (Verdict, error) {
		// Another edge gave back what it held: the window counts 2.
		h.redis.mu.Lock()
		if w := h.redis.windows[h.dg]; w != nil {
			w.used = 2
		}
		h.redis.mu.Unlock()
		h.core.Heard(h.notice(false, 2))
		return h.decide(1)
	}},
}

// notice is a notice of the window the edge knows (or of one opening now).
func (h *harness) notice(full bool, used int64) Notice {
	reset := h.clock.Now().Add(time.Minute).Truncate(time.Second)
	if e := h.entry(); e != nil {
		e.mu.Lock()
		if !e.reset.IsZero() {
			reset = e.reset.Time()
		}
		e.mu.Unlock()
	}
	return Notice{Full: full, Key: h.dg, ResetAt: reset, Used: used}
}

// outcome is what one decision did: its answer, the Redis calls it made
// (in the background too), what it left to account for, the notices it
// sent.
type outcome struct {
	allowed bool
	path    Path
	calls   int
	entries []limiter.EventKind
	notices int
}

func (o outcome) String() string {
	return fmt.Sprintf("allowed=%v path=%v calls=%d entries=%v notices=%d", o.allowed, o.path, o.calls, o.entries, o.notices)
}

var (
	charge  = limiter.Charge
	release = limiter.Release
)

func allowed(p Path, calls int, entries ...limiter.EventKind) outcome {
	return outcome{allowed: true, path: p, calls: calls, entries: entries}
}

func denied(p Path, calls int) outcome { return outcome{path: p, calls: calls} }

func withNotice(o outcome) outcome { o.notices = 1; return o }

// expected is the outcome of every mode × state × event, by mode (one
// outcome for all three when they agree).
type expected map[limiter.Mode]outcome

func all(o outcome) expected {
	return expected{limiter.ModeAuto: o, limiter.ModeExact: o, limiter.ModeAsync: o}
}

// TestDecisions runs every mode × state × event and checks what the
// decision answered, what it cost in Redis calls, and what it left to
// account for. The doc comment of each row says why.
func TestDecisions(t *testing.T) {
	auto, exact, async := limiter.ModeAuto, limiter.ModeExact, limiter.ModeAsync
	want := map[string]map[string]expected{
		"none": {
			// The window opens with a reservation of exactly the cost.
			"request": all(allowed(PathReserve, 1)),
			// Nothing known: admitted (fail open), charged by an event.
			"redis down": all(allowed(PathFailOpen, 1, charge)),
			// The same when the answer comes too late; the reservation,
			// made after all, is credit (or found and given back later).
			"redis slow": all(allowed(PathFailOpen, 1, charge)),
			// Notices of windows the edge does not know are not kept.
			"full notice": all(allowed(PathReserve, 1)),
			"room notice": all(allowed(PathReserve, 1)),
		},
		"credit": {
			// Credit admits without Redis, whatever Redis does, and a full
			// notice does not take away what this edge reserved.
			"request":     all(allowed(PathCredit, 0)),
			"redis down":  all(allowed(PathCredit, 0)),
			"redis slow":  all(allowed(PathCredit, 0)),
			"full notice": all(allowed(PathCredit, 0)),
			"room notice": all(allowed(PathCredit, 0)),
		},
		"near": {
			// One unit left: the reservation takes it, the window is full
			// and the other edges are told. Mode async admits at once and
			// charges by an event; its reservation, counting the unapplied
			// charge as used, finds no room.
			"request": {auto: withNotice(allowed(PathReserve, 1)), exact: withNotice(allowed(PathReserve, 1)),
				async: allowed(PathBorrow, 1, charge)},
			// Redis down, a window known with room: admitted over credit
			// and charged by an event.
			"redis down": all(allowed(PathBorrow, 1, charge)),
			// Redis slow: the same. In mode auto the late reservation fills
			// the window, and what it got beyond the room the edge's own
			// charge took goes straight back.
			"redis slow": {auto: withNotice(allowed(PathBorrow, 1, charge, release)), exact: allowed(PathBorrow, 1, charge),
				async: allowed(PathBorrow, 1, charge)},
			// A full notice: denied from memory.
			"full notice": all(denied(PathCache, 0)),
			// A room notice: room for more, reserved (or borrowed).
			"room notice": {auto: allowed(PathReserve, 1), exact: allowed(PathReserve, 1), async: allowed(PathBorrow, 1, charge)},
		},
		"full": {
			// Denied from memory whatever Redis does.
			"request":     all(denied(PathCache, 0)),
			"redis down":  all(denied(PathCache, 0)),
			"redis slow":  all(denied(PathCache, 0)),
			"full notice": all(denied(PathCache, 0)),
			// Room again: the edge reserves (or borrows) once more.
			"room notice": {auto: allowed(PathReserve, 1), exact: allowed(PathReserve, 1), async: allowed(PathBorrow, 1, charge)},
		},
		"reset": {
			// A reset window is forgotten (its credit with it: nothing to
			// give back) and the next request opens a new one.
			"request":    all(allowed(PathReserve, 1)),
			"redis down": all(allowed(PathFailOpen, 1, charge)),
			"redis slow": all(allowed(PathFailOpen, 1, charge)),
			// Notices of the old window are stale.
			"full notice": all(allowed(PathReserve, 1)),
			"room notice": all(allowed(PathReserve, 1)),
		},
	}
	n := 0
	for _, st := range states {
		for _, ev := range happenings {
			for _, mode := range []limiter.Mode{auto, exact, async} {
				if st.skip == mode {
					continue
				}
				w, ok := want[st.name][ev.name][mode]
				if !ok {
					t.Fatalf("no expectation for %s / %s / %s", st.name, ev.name, mode)
				}
				n++
				t.Run(st.name+"/"+ev.name+"/"+string(mode), func(t *testing.T) {
					h := newHarness(t, policyOf(mode), true, fast)
					st.into(h)
					calls, entries, notices := h.redis.numCalls(), h.ledger.len(), h.notes.len()
					v, err := ev.run(h)
					if err != nil {
						t.Fatalf("err %v", err)
					}
					got := outcome{allowed: v.Allowed(), path: v.Path, calls: h.redis.numCalls() - calls,
						notices: h.notes.len() - notices}
					for _, e := range h.ledger.since(entries) {
						got.entries = append(got.entries, e.Kind)
					}
					if got.String() != w.String() {
						t.Errorf("got  %v\nwant %v", got, w)
					}
					h.checkInvariant()
				})
			}
		}
	}
	if n != 70 {
		t.Fatalf("%d cases, want 5 states × 5 events × 3 modes less mode exact's credit", n)
	}
}

// checkInvariant checks what every state must keep: the edge's credit is
// never more than the window holds for it, and a window's count never
// exceeds its limit by a reservation.
func (h *harness) checkInvariant() {
	h.t.Helper()
	credit, _, _ := h.snapshot()
	if credit < 0 {
		h.t.Fatalf("credit %d below zero", credit)
	}
	if u := h.redis.used(h.key); u > testLimit {
		h.t.Fatalf("the window holds %d, over its limit %d", u, testLimit)
	}
}

// Fail closed: with nothing known and Redis down, Decide refuses to
// decide (the front door answers 503); a window known full is still
// denied from memory, and known room is not borrowed.
func TestFailClosed(t *testing.T) {
	for _, mode := range []limiter.Mode{limiter.ModeAuto, limiter.ModeExact, limiter.ModeAsync} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, policyOf(mode), false, fast)
			h.redis.down = true
			if _, err := h.decide(1); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("nothing known: err %v, want ErrUnavailable", err)
			}
			h.open(testLimit, 0, true)
			if v, err := h.decide(1); err != nil || v.Allowed() || v.Path != PathCache {
				t.Fatalf("known full: %+v %v", v.Path, err)
			}
			h.open(testLimit-1, 0, false)
			v, err := h.decide(1)
			if mode == limiter.ModeAsync {
				// Mode async borrows before it reserves: it admits over
				// credit from what it knows, whatever Redis does.
				if err != nil || v.Path != PathBorrow {
					t.Fatalf("async, known room: %v %v", v.Path, err)
				}
			} else if !errors.Is(err, ErrUnavailable) {
				t.Fatalf("known room: err %v, want ErrUnavailable", err)
			}
			if h.core.Stats().Unavailable == 0 {
				t.Fatal("unavailable not counted")
			}
		})
	}
}

// A sequential burst gets exactly the limit, in every mode, with the
// accountant applying each charge before the next request (mode async
// borrows only what it knows is left).
func TestBurstGetsExactlyTheLimit(t *testing.T) {
	for _, mode := range []limiter.Mode{limiter.ModeAuto, limiter.ModeExact, limiter.ModeAsync} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, policyOf(mode), true, fast)
			admitted := 0
			for range 3 * testLimit {
				v, err := h.decide(1)
				if err != nil {
					t.Fatal(err)
				}
				if v.Allowed() {
					admitted++
				}
				h.ledger.apply(h.redis, h.keys, h.ledger.len())
				h.clock.Advance(10 * time.Millisecond)
			}
			if admitted != testLimit {
				t.Fatalf("admitted %d of a burst, want %d", admitted, testLimit)
			}
			if u := h.redis.used(h.key); u != testLimit {
				t.Fatalf("the window counts %d, want %d", u, testLimit)
			}
		})
	}
}

// A busy key's reservations grow with its rate: a run of requests costs
// far fewer Redis calls than requests in modes auto and async; mode exact
// calls once per request.
func TestReservationsFollowTheRate(t *testing.T) {
	for mode, most := range map[limiter.Mode]int{limiter.ModeAuto: 10, limiter.ModeAsync: 10, limiter.ModeExact: 100} {
		t.Run(string(mode), func(t *testing.T) {
			p := policyOf(mode)
			p.Limit = 10_000
			h := newHarness(t, p, true, fast)
			for range 100 {
				if v, err := h.decide(1); err != nil || !v.Allowed() {
					t.Fatalf("%v %v", v.Path, err)
				}
				h.clock.Advance(20 * time.Millisecond)
			}
			if c := h.redis.numCalls(); c > most || (mode == limiter.ModeExact && c != 100) {
				t.Fatalf("%d Redis calls for 100 requests, want at most %d", c, most)
			}
		})
	}
}

// A key seen less often than its reservations would last costs one
// reservation of exactly what it asks for per visit: nothing reserved
// ahead, so nothing left to give back.
func TestQuietKeyReservesOnlyWhatItUses(t *testing.T) {
	p := policyOf(limiter.ModeAuto)
	p.Limit = 1000
	h := newHarness(t, p, true, fast)
	for range 5 {
		calls := h.redis.numCalls()
		if v, err := h.decide(1); err != nil || v.Path != PathReserve {
			t.Fatalf("%v %v", v.Path, err)
		}
		if c := h.redis.numCalls() - calls; c != 1 {
			t.Fatalf("%d Redis calls for a visit, want 1", c)
		}
		if cr, _, _ := h.snapshot(); cr != 0 {
			t.Fatalf("credit %d left after a visit", cr)
		}
		h.clock.Advance(3 * time.Second)
		h.core.Sweep(context.Background(), h.clock.Now())
	}
	if n := h.ledger.len(); n != 0 {
		t.Fatalf("%d entries to account for; want none", n)
	}
}

// The sweep leaves an entry with nothing in hand alone until its window
// resets, then until the key is to be forgotten; any change makes it due
// again. A table of a million keys seen once costs a sweep almost nothing,
// and each still expires, gives back what it gets and is forgotten.
func TestSweepLeavesSettledEntriesAlone(t *testing.T) {
	p := policyOf(limiter.ModeAuto)
	p.Limit = 1000
	h := newHarness(t, p, true, fast)
	if _, err := h.decide(1); err != nil {
		t.Fatal(err)
	}
	e := h.entry()
	sweep := func() { h.core.Sweep(context.Background(), h.clock.Now()) }
	sweep()
	e.mu.Lock()
	reset := e.reset.Time()
	e.mu.Unlock()
	if q := e.quietUntil.Load(); q != reset.UnixNano() {
		t.Fatalf("quiet until %v, want the window's reset %v", time.Unix(0, q).UTC(), reset)
	}
	if n := dueListed(h.core); n != 0 {
		t.Fatalf("%d entries listed for the sweep; want none", n)
	}
	// A change (credit reserved for this edge) makes it due: the idle
	// credit goes back at the next sweeps.
	h.open(5, 3, false)
	if q := e.quietUntil.Load(); q != 0 || dueListed(h.core) != 1 {
		t.Fatalf("quiet until %v after a change, %d listed for the sweep", time.Unix(0, q).UTC(), dueListed(h.core))
	}
	h.clock.Advance(2 * time.Second)
	sweep()
	if got := h.ledger.since(0); len(got) != 1 || got[0].Kind != limiter.Release || got[0].Units != 3 {
		t.Fatalf("entries %+v, want the idle credit released", got)
	}
	// Settled again: quiet until the reset; past it the window is let go,
	// and a minute after the key's last request it is forgotten.
	sweep()
	if q := e.quietUntil.Load(); q != reset.UnixNano() {
		t.Fatalf("quiet until %v, want %v", time.Unix(0, q).UTC(), reset)
	}
	h.clock.Set(reset)
	sweep()
	e.mu.Lock()
	expired := e.reset.IsZero()
	e.mu.Unlock()
	if !expired || h.entry() == nil {
		t.Fatalf("past the reset: expired %v, remembered %v", expired, h.entry() != nil)
	}
	// Forgotten at the first walk of the whole table a minute after the
	// key's last request.
	h.clock.Set(epoch.Add(forgetAfter + quietWalk))
	sweep()
	if h.entry() != nil || dueListed(h.core) != 0 {
		t.Fatalf("a key a minute past its last request: remembered %v, %d listed for the sweep", h.entry() != nil, dueListed(h.core))
	}
}

// dueListed counts the entries the sweep visits between walks.
func dueListed(c *Core) int {
	n := 0
	for i := range c.table.shards {
		s := &c.table.shards[i]
		s.dueMu.Lock()
		n += len(s.due)
		s.dueMu.Unlock()
	}
	return n
}

// Mode async: a full notice whose count holds a charge this edge still
// remembers as owed (an accountant applied it and announced the window
// full) does not make the edge count that charge twice: the edge's last
// credit is still spent, and the window admits exactly its limit.
func TestFullNoticeDoesNotCountDebtsTwice(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAsync), true, fast)
	// The window counts limit-1, one unit of it this edge's credit, and
	// the edge owes one more unit: a charge for a request it admitted
	// while the reservation that gave it the credit was on its way.
	h.open(testLimit-1, 1, false)
	seq := h.ledger.Record(0, limiter.Entry{Kind: limiter.Charge, Key: h.key, Policy: h.policy, Units: 1})
	e := h.entry()
	e.mu.Lock()
	e.debts = append(e.debts, debt{seq: seq, units: 1})
	e.mu.Unlock()
	// The accountant applies the charge and announces the window full.
	h.ledger.apply(h.redis, h.keys, h.ledger.len())
	h.core.Heard(h.notice(true, h.redis.used(h.key)))

	if v, err := h.decide(1); err != nil || !v.Allowed() {
		t.Fatalf("the edge's credit was not spent: %v %v", v.Path, err)
	}
	if v, err := h.decide(1); err != nil || v.Allowed() || v.Path != PathCache {
		t.Fatalf("past the limit: %v %v", v.Path, err)
	}
	if used := h.redis.used(h.key); used != testLimit {
		t.Fatalf("the window counts %d: not its limit", used)
	}
	if d := h.entry().debts; len(d) != 0 {
		t.Fatalf("debts %v after a reservation showed them applied", d)
	}
}

// exactDecider is a harness of a policy in mode exact (a reservation per
// request) far from its limit, and a decision of one unit on it.
func exactDecider(t *testing.T) (*harness, func()) {
	t.Helper()
	p := limiter.Policy{Name: "api", Limit: 100, Window: time.Hour, Mode: limiter.ModeExact}
	h := newHarness(t, p, true, Config{})
	return h, func() {
		t.Helper()
		if _, err := h.decide(1); err != nil {
			t.Fatal(err)
		}
	}
}

// A reservation goes the short way (Own: lua/own.lua) when the entry's last
// one found the window its own compact one; not after another holder
// reserved in it, nor in a window that ended; and an evicted entry's key
// carries it on.
func TestOwnAfterTheWindowWasOwn(t *testing.T) {
	h, decide := exactDecider(t)
	decide() // opens: not own yet
	decide() // own
	e := h.entry()
	h.core.evicted(e) // leaves its identity
	h.core.table.remove(h.dg, e)
	decide() // carried on: own
	// Another edge's reservation: the window is no longer this holder's alone.
	if _, err := h.redis.Take(context.Background(), h.entry().key, h.clock.Now(), limiter.TakeArgs{Window: time.Hour, Limit: 100,
		Need: 1, Want: 1, Producer: "edge-other", Holder: "edge-other.1"}); err != nil {
		t.Fatal(err)
	}
	decide() // own, and learns it is not
	decide() // not own
	h.clock.Advance(time.Hour)
	decide() // a new window: not own until a reply says so
	decide() // own again: this edge alone holds the new window
	h.redis.mu.Lock()
	defer h.redis.mu.Unlock()
	// (the fourth is the other edge's)
	if want := []bool{false, true, true, false, true, false, false, true}; !slices.Equal(h.redis.own, want) {
		t.Fatalf("Own of each reservation: %v, want %v", h.redis.own, want)
	}
}

// A token bucket's reservation is Fresh (the store may send lua/bucket.lua)
// when this edge reserved in none of the periods it reads: its first, and
// each that comes quietPeriods periods or more after the last — whatever
// the table or the keys seen remember; not one sooner. It is Own (the
// store sends lua/bucket.lua first as well) after a reservation that left
// its period the holder's own, in a period since.
func TestFreshBucketAfterQuietPeriods(t *testing.T) {
	p := limiter.Policy{Name: "api", Mode: limiter.ModeExact}.Bucket(100, 100, time.Second)
	h := newHarness(t, p, true, Config{})
	decide := func(after time.Duration) {
		t.Helper()
		h.clock.Advance(after)
		if _, err := h.decide(1); err != nil {
			t.Fatal(err)
		}
	}
	decide(0)
	decide(time.Second)
	decide(quietPeriods*limiter.BucketPeriod - time.Millisecond)
	decide(quietPeriods * limiter.BucketPeriod)
	h.core.table.remove(h.dg, h.entry()) // a new entry: nothing reserved here that it knows of
	decide(0)
	h.redis.mu.Lock()
	defer h.redis.mu.Unlock()
	if want := []bool{true, false, false, true, true}; !slices.Equal(h.redis.fresh, want) {
		t.Fatalf("Fresh of each reservation: %v, want %v", h.redis.fresh, want)
	}
	// Own: the last reservation left its period the holder's own (the fake
	// says so of a window one holder alone reserved in), whatever period
	// the next one is in; a new entry knows of none.
	if want := []bool{false, true, true, true, false}; !slices.Equal(h.redis.own, want) {
		t.Fatalf("Own of each reservation: %v, want %v", h.redis.own, want)
	}
}

// A reservation is Fresh (the store may open the window with one SET ... NX)
// only for a key this edge knows no window of: not for an entry that
// reserved before, nor for a key whose entry the table let go while its
// window may live on, until the key has not been seen for two rotations.
func TestFreshOnlyForKeysNotSeen(t *testing.T) {
	h, decide := exactDecider(t)
	decide()
	decide()
	h.core.table.remove(h.dg, h.entry()) // evicted, its window still live
	decide()
	for range 3 { // the first sweep starts the clock of rotations
		h.clock.Advance(seenFor + time.Second)
		h.core.Sweep(context.Background(), h.clock.Now())
	}
	h.core.table.remove(h.dg, h.entry())
	decide()
	h.redis.mu.Lock()
	defer h.redis.mu.Unlock()
	if want := []bool{true, false, false, true}; !slices.Equal(h.redis.fresh, want) {
		t.Fatalf("Fresh of each reservation: %v, want %v", h.redis.fresh, want)
	}
}
