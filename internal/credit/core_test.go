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
// 5ms of real time for a slow primary.
var fast = Config{RedisBudget: 5 * time.Millisecond}

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
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reset, e.start, e.used, e.credit, e.full = reset, start, used, credit, full
	e.known, e.mine, e.countsReset = credit, credit, reset
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
			reset = e.reset
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
func withNotice(o outcome) outcome     { o.notices = 1; return o }

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

// Refunds of 304s: into the edge's own credit when a reservation charged
// the request in the window the edge still holds; otherwise by an event
// naming the charge.
func TestRefunds(t *testing.T) {
	for _, c := range []struct {
		name     string
		mode     limiter.Mode
		state    func(h *harness)
		absorbed bool
		refund   bool // a Refund entry
		chargeOf bool // naming the request's charge event
	}{
		{"credit, auto", limiter.ModeAuto, func(h *harness) { h.open(4, 3, false) }, true, false, false},
		{"reserved, exact", limiter.ModeExact, func(h *harness) {}, false, true, false},
		{"borrowed, async", limiter.ModeAsync, func(h *harness) { h.open(testLimit-1, 0, false) }, false, true, true},
		{"fail open", limiter.ModeAuto, func(h *harness) { h.redis.down = true }, false, true, true},
		{"fail open, charge dropped", limiter.ModeAuto, func(h *harness) {
			h.redis.down = true
			h.ledger.full = true
		}, false, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, policyOf(c.mode), true, fast)
			c.state(h)
			v, err := h.decide(1)
			if err != nil || !v.Allowed() {
				t.Fatalf("%v %v", v.Path, err)
			}
			before, from := v, h.ledger.len()
			creditBefore, _, _ := h.snapshot()
			absorbed := h.core.Refund(v)
			entries := h.ledger.since(from)
			if absorbed != c.absorbed || (len(entries) == 1) != c.refund || len(entries) > 1 {
				t.Fatalf("absorbed %v, entries %+v", absorbed, entries)
			}
			if c.absorbed {
				if cr, _, _ := h.snapshot(); cr != creditBefore+1 {
					t.Fatalf("credit %d, want %d", cr, creditBefore+1)
				}
			}
			if c.refund {
				e := entries[0]
				if e.Kind != limiter.Refund || e.Units != 1 || (e.ChargeSeq != 0) != c.chargeOf || e.ChargeSeq != before.ChargeSeq {
					t.Fatalf("refund %+v of verdict charged by %d", e, before.ChargeSeq)
				}
			}
		})
	}
	t.Run("window reset since", func(t *testing.T) {
		h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
		h.open(4, 3, false)
		v, _ := h.decide(1)
		h.clock.Advance(2 * time.Minute)
		if h.core.Refund(v) {
			t.Fatal("absorbed into a window that has reset")
		}
		if e := h.ledger.since(0); len(e) != 1 || e[0].Kind != limiter.Refund || !e[0].ResetAt.Equal(v.Reset) {
			t.Fatalf("entries %+v", e)
		}
	})
	t.Run("another limit denied the request", func(t *testing.T) {
		h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
		h.open(4, 3, false)
		v, _ := h.decide(1)
		h.core.GiveBack([]Verdict{v, {Decided: true}}) // the second: a denial, nothing to give
		if cr, _, _ := h.snapshot(); cr != 3 {
			t.Fatalf("credit %d after giving back, want 3", cr)
		}
	})
}

// Credit unused for IdleRelease goes back to the window (a Release entry),
// the edge's count of the window lowered with it; busy credit stays.
func TestIdleCreditIsReleased(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	h.open(4, 3, false)
	e := h.entry()
	e.lastUseNano.Store(h.clock.Now().UnixNano())
	h.clock.Advance(500 * time.Millisecond)
	h.core.Sweep(context.Background(), h.clock.Now())
	if n := h.ledger.len(); n != 0 {
		t.Fatalf("%d entries before the credit was idle", n)
	}
	h.clock.Advance(time.Second)
	h.core.Sweep(context.Background(), h.clock.Now())
	got := h.ledger.since(0)
	if len(got) != 1 || got[0].Kind != limiter.Release || got[0].Units != 3 {
		t.Fatalf("entries %+v, want one release of 3", got)
	}
	if cr, used, _ := h.snapshot(); cr != 0 || used != 1 {
		t.Fatalf("credit %d used %d after the release, want 0 and 1", cr, used)
	}
	if h.core.Stats().Released != 3 {
		t.Fatalf("released %d", h.core.Stats().Released)
	}
	// A release the outbox cannot take keeps the credit (spent later, or
	// given back at the next sweep).
	h.open(4, 3, false)
	h.ledger.full = true
	h.clock.Advance(2 * time.Second)
	h.core.Sweep(context.Background(), h.clock.Now())
	if cr, _, _ := h.snapshot(); cr != 3 {
		t.Fatalf("credit %d after a refused release, want 3", cr)
	}
}

// A window believed full whose denials go on is read again after Recheck
// (a room notice may have been lost), and admits again once the read finds
// room; while it stays full, the reads grow rarer.
func TestFullWindowsAreReadAgain(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	h.open(testLimit, 0, true)
	sweep := func() { h.core.Sweep(context.Background(), h.clock.Now()) }
	sweep() // notes when the window was found full
	for i, wait := range []time.Duration{time.Second, 2 * time.Second} {
		h.clock.Advance(wait)
		if v, _ := h.decide(1); v.Allowed() {
			t.Fatal("admitted into a full window")
		}
		calls := h.redis.numCalls()
		sweep()
		if h.redis.numCalls() != calls+1 {
			t.Fatalf("read %d: no read of the full window", i)
		}
	}
	h.clock.Advance(2 * time.Second) // less than the doubled wait (4s)
	h.decide(1)
	calls := h.redis.numCalls()
	sweep()
	if h.redis.numCalls() != calls {
		t.Fatal("read again before the doubled wait")
	}
	// Another edge released 5 units; the notice was lost.
	h.redis.mu.Lock()
	h.redis.windows[h.dg].used = 5
	h.redis.mu.Unlock()
	h.clock.Advance(2 * time.Second)
	sweep()
	if v, _ := h.decide(1); !v.Allowed() {
		t.Fatalf("denied after the read found room: %v", v.Path)
	}
}

// A reservation whose answer was lost (the primary made it, the edge had
// stopped waiting) is found by the sweep: in mode auto its units are the
// edge's credit, in mode exact they go back.
func TestLostReservationsAreFound(t *testing.T) {
	for mode, release := range map[limiter.Mode]bool{limiter.ModeAuto: false, limiter.ModeExact: true} {
		t.Run(string(mode), func(t *testing.T) {
			h := newHarness(t, policyOf(mode), true, fast)
			h.redis.lose = true
			v, err := h.decide(1)
			if err != nil || v.Path != PathFailOpen {
				t.Fatalf("%v %v", v.Path, err)
			}
			h.redis.lose = false
			from := h.ledger.len()
			h.core.Sweep(context.Background(), h.clock.Now())
			if h.core.Stats().Recovered != 1 {
				t.Fatalf("recovered %d units, want 1", h.core.Stats().Recovered)
			}
			got := h.ledger.since(from)
			if release != (len(got) == 1 && got[0].Kind == limiter.Release) {
				t.Fatalf("entries %+v", got)
			}
			if cr, _, _ := h.snapshot(); release == (cr != 0) {
				t.Fatalf("credit %d", cr)
			}
		})
	}
}

// Reservations failing in a row mark the primary suspect: requests stop
// waiting for it until one succeeds, or for a second.
func TestSuspectPrimary(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	h.redis.down = true
	for range suspectAfter {
		if h.core.Suspected(0) {
			t.Fatal("suspected before enough failures")
		}
		h.decide(1)
	}
	if !h.core.Suspected(0) {
		t.Fatal("not suspected after failures in a row")
	}
	h.clock.Advance(suspectFor + time.Millisecond)
	if h.core.Suspected(0) {
		t.Fatal("still suspected after suspectFor")
	}
	h.clock.Advance(-suspectFor)
	h.redis.down = false
	if v, _ := h.decide(1); !v.Allowed() {
		t.Fatal(v.Path)
	}
	if h.core.Suspected(0) {
		t.Fatal("suspected after a reservation succeeded")
	}
	// Refusals (invalid arguments) say nothing of the primary.
	h2 := newHarness(t, policyOf(limiter.ModeExact), true, fast)
	for range 2 * suspectAfter {
		h2.core.takeFailed(h2.core.entry(h2.dg, h2.policy), limiter.ErrInvalidArgument)
	}
	if h2.core.Suspected(0) {
		t.Fatal("refusals marked the primary suspect")
	}
}

// Peek denies from what is known of a full window without an entry or a
// Redis call; it reports nothing for keys it does not know as full.
func TestPeek(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	if _, full := h.core.Peek(h.policy, 1, h.dg, h.clock.Now(), 1); full || h.entry() != nil {
		t.Fatal("peek of an unknown key")
	}
	h.open(4, 3, false)
	if _, full := h.core.Peek(h.policy, 1, h.dg, h.clock.Now(), 1); full {
		t.Fatal("peek denied a window with credit")
	}
	h.open(testLimit, 0, true)
	v, full := h.core.Peek(h.policy, 1, h.dg, h.clock.Now(), 1)
	if !full || v.Allowed() || v.Path != PathCache || v.Decision.Remaining != 0 || h.redis.numCalls() != 0 {
		t.Fatalf("peek of a full window: %v %+v", full, v.Decision)
	}
}

// What the edge applies itself (a refund, a release, a finish) lowers its
// count of the window and is told to the other edges as a room notice.
func TestLearnAndFinish(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeExact), true, fast)
	v, err := h.decide(1)
	if err != nil || !v.Allowed() {
		t.Fatal(err)
	}
	h.open(testLimit, 0, true)
	res, err := h.core.Finish(context.Background(), v, 304, h.clock.Now())
	if err != nil || res.Amount != 1 {
		t.Fatalf("%+v %v", res, err)
	}
	if _, used, full := h.snapshot(); full || used != testLimit-1 {
		t.Fatalf("after the finish: used %d full %v", used, full)
	}
	last := h.notes.notices[len(h.notes.notices)-1]
	if last.Full || last.Used != testLimit-1 {
		t.Fatalf("notice %+v", last)
	}
	if v2, _ := h.decide(1); !v2.Allowed() {
		t.Fatal("denied after room was made")
	}
}

// Entries the table lets go give their credit back.
func TestEvictionReleasesCredit(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, Config{Keys: 1, RedisBudget: 5 * time.Millisecond})
	h.open(4, 3, false)
	shard := h.dg.Hash() % tableShards
	for i := 0; ; i++ { // another key in the same table shard
		k := h.keys.Key("api", fmt.Sprint("other", i))
		if k.Digest().Hash()%tableShards == shard {
			h.core.Decide(context.Background(), h.policy, 1, k.Digest(), h.clock.Now(), 99)
			break
		}
	}
	h.core.Wait()
	got := h.ledger.since(0)
	if len(got) != 1 || got[0].Kind != limiter.Release || got[0].Units != 3 || h.core.Stats().Evicted != 1 {
		t.Fatalf("entries %+v, evicted %d", got, h.core.Stats().Evicted)
	}
}

// Mode async: a charge the primary has not applied counts as used in the
// next reservation (Owed), and is settled once a reservation's answer
// shows it applied.
func TestAsyncDebtsSettle(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAsync), true, fast)
	h.open(testLimit-3, 0, false)
	v, _ := h.decide(1)
	if v.Path != PathBorrow || len(h.entry().debts) != 1 {
		t.Fatalf("%v debts %v", v.Path, h.entry().debts)
	}
	h.ledger.apply(h.redis, h.keys, h.ledger.len())
	h.clock.Advance(time.Second)
	h.entry().credit = 0
	if v, _ := h.decide(1); !v.Allowed() {
		t.Fatal(v.Path)
	}
	if d := h.entry().debts; len(d) != 1 && !slices.ContainsFunc(d, func(d debt) bool { return d.seq == 1 }) {
		t.Fatalf("debts %v", d)
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []Config{{Horizon: -1}, {Share: -1}, {Keys: -1}, {RedisBudget: -time.Second}} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if d := (Config{}).WithDefaults(); d.Share != 8 || d.Horizon != 5*time.Second || d.Keys != 100_000 {
		t.Errorf("defaults %+v", d)
	}
	if _, err := New(Config{}, Deps{}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New without ports: %v", err)
	}
}

// Stopping gives every credit back, the units of reservations whose
// answer was lost included.
func TestReleaseAllGivesEverythingBack(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	h.open(4, 3, false)
	other := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	other.redis.lose = true
	if v, _ := other.decide(1); v.Path != PathFailOpen {
		t.Fatal(v.Path)
	}
	other.redis.lose = false
	for _, x := range []*harness{h, other} {
		from := x.ledger.len()
		x.core.ReleaseAll(context.Background(), x.clock.Now())
		got := x.ledger.since(from)
		if len(got) != 1 || got[0].Kind != limiter.Release {
			t.Fatalf("entries %+v", got)
		}
	}
	if u := h.ledger.since(0)[0].Units; u != 3 {
		t.Fatalf("released %d, want 3", u)
	}
}

// Keys with no window and nothing in flight are forgotten a while after
// their last request.
func TestIdleKeysAreForgotten(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	h.decide(1)
	h.clock.Advance(time.Minute + forgetAfter + time.Second)
	h.core.Sweep(context.Background(), h.clock.Now())
	if k := h.core.Stats().Keys; k != 0 || h.entry() != nil {
		t.Fatalf("%d keys remembered", k)
	}
}

// In mode exact, while the primary is suspect one request at a time
// finds out whether it is back; its success clears the mark.
func TestExactProbesASuspectPrimary(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeExact), true, fast)
	h.redis.down = true
	for range suspectAfter {
		h.decide(1)
	}
	if !h.core.Suspected(0) {
		t.Fatal("not suspected")
	}
	h.redis.down = false
	calls := h.redis.numCalls()
	if v, _ := h.decide(1); v.Path != PathReserve || h.redis.numCalls() != calls+1 || h.core.Suspected(0) {
		t.Fatalf("probe: %v, suspected %v", v.Path, h.core.Suspected(0))
	}
}

func TestVerdict(t *testing.T) {
	v := Verdict{Producer: "edge.a", ReqNum: 7, HolderNum: 36, Now: epoch, Policy: policyOf(limiter.ModeAuto)}
	if v.RequestID() != "edge.a-7" || v.Holder() != "edge.a.10" || (Verdict{}).RequestID() != "" {
		t.Fatalf("%q %q", v.RequestID(), v.Holder())
	}
	if !v.Allowed() || !v.Expires().Equal(epoch.Add(time.Minute+time.Second)) {
		t.Fatal("an admission without a window expires a window and a second after its start")
	}
	v.Decided, v.Reset = true, epoch.Add(time.Minute)
	if v.Allowed() || !v.Expires().Equal(v.Reset) {
		t.Fatal("a decided verdict expires at its reset")
	}
	if PathBorrow.String() != "borrow" || Path(99).String() != "unknown" {
		t.Fatal("path names")
	}
}
