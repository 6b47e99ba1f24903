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
	h := newHarness(t, policyOf(limiter.ModeAuto), true, Config{Keys: 1, RedisBudget: fast.RedisBudget})
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

// A room notice older than this edge's latest reservation (its count
// lower than what this edge holds) never makes a decision say it used less
// than nothing, nor more room than the window has.
func TestStaleRoomNoticeKeepsCountsSane(t *testing.T) {
	p := policyOf(limiter.ModeAuto)
	h := newHarness(t, p, true, fast)
	h.open(6, 5, false) // 5 of the 6 counted are this edge's credit
	h.core.Heard(h.notice(false, 0))
	v, err := h.decide(1)
	if err != nil || !v.Allowed() {
		t.Fatal(v.Path, err)
	}
	if d := v.Decision; d.Used < 0 || d.Remaining > testLimit-1 {
		t.Fatalf("used %d, remaining %d after a stale notice", d.Used, d.Remaining)
	}
	if _, used, _ := h.snapshot(); used < 4 {
		t.Fatalf("the edge counts %d, below the credit it holds", used)
	}
}

// Look charges nothing and denies only a window past its limit (an
// overdraft), as envoyproxy/ratelimit answers a hits_addend of 0: from
// memory when the edge knows the window, else after one read.
func TestLook(t *testing.T) {
	cases := []struct {
		name      string
		into      func(h *harness)
		down      bool
		failOpen  bool
		allowed   bool
		decided   bool
		remaining int64
		calls     int
		err       error
	}{
		{name: "no window: read, the whole limit left", into: func(*harness) {}, failOpen: true, allowed: true, decided: true, remaining: testLimit, calls: 1},
		{name: "another edge's window: read", into: func(h *harness) {
			h.redis.set(h.key, h.clock.Now(), h.clock.Now().Add(time.Minute).Truncate(time.Second), 6, "edge.other.1", 6)
		}, failOpen: true, allowed: true, decided: true, remaining: testLimit - 6, calls: 1},
		{name: "credit: from memory", into: func(h *harness) { h.open(4, 3, false) }, failOpen: true, allowed: true, decided: true, remaining: testLimit - 1},
		{name: "at the limit: allowed, nothing left", into: func(h *harness) { h.open(testLimit, 0, true) }, failOpen: true, allowed: true, decided: true},
		{name: "past the limit: denied", into: func(h *harness) { h.open(testLimit+3, 0, true) }, failOpen: true, decided: true},
		{name: "redis down, nothing known, fail open", into: func(*harness) {}, down: true, failOpen: true, allowed: true, calls: 1},
		{name: "redis down, nothing known, fail closed", into: func(*harness) {}, down: true, calls: 1, err: ErrUnavailable},
		{name: "redis down, window known", into: func(h *harness) { h.open(4, 0, false) }, down: true, failOpen: true, allowed: true, decided: true, remaining: testLimit - 4},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, policyOf(limiter.ModeAuto), tc.failOpen, fast)
			tc.into(h)
			h.redis.down = tc.down
			before := h.redis.numCalls()
			v, err := h.core.Look(context.Background(), h.policy, h.dg, h.clock.Now(), 1)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			if tc.err != nil {
				return
			}
			if v.Allowed() != tc.allowed || v.Decided != tc.decided || (v.Decided && v.Decision.Remaining != tc.remaining) {
				t.Fatalf("allowed %v decided %v remaining %d; want %v %v %d", v.Allowed(), v.Decided, v.Decision.Remaining, tc.allowed, tc.decided, tc.remaining)
			}
			if n := h.redis.numCalls() - before; n != tc.calls {
				t.Fatalf("%d Redis calls, want %d", n, tc.calls)
			}
			if n := h.ledger.len(); n != 0 {
				t.Fatalf("%d entries to account for; a look charges nothing", n)
			}
		})
	}
}

// A limit reloaded with new terms keeps its window and what it counts;
// what is left is judged by the new limit at once, the credit in hand
// spent while the new limit leaves room for it and given back when not.
func TestReloadedLimitKeepsItsWindow(t *testing.T) {
	h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
	h.open(6, 2, false) // 4 admitted, 2 in hand
	decide := func(limit int64) Verdict {
		p := h.policy
		p.Limit = limit
		h.reqs++
		v, err := h.core.Decide(context.Background(), p, 1, h.dg, h.clock.Now(), h.reqs)
		h.core.Wait()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	if v := decide(5); !v.Allowed() || v.Decision.Limit != 5 || v.Decision.Remaining != 0 {
		t.Fatalf("allowed %v limit %d remaining %d: the 5th of a new limit of 5 is admitted from credit", v.Allowed(), v.Decision.Limit, v.Decision.Remaining)
	}
	if v := decide(5); v.Allowed() {
		t.Fatal("a 6th admitted under a limit of 5")
	}
	// The credit the new limit leaves no room for went back: the window
	// counts the 5 admitted.
	if c, used, _ := h.snapshot(); c != 0 || used != 5 {
		t.Fatalf("credit %d used %d, want 0 and 5", c, used)
	}
	// The accountant applies the release.
	h.redis.mu.Lock()
	h.redis.windows[h.dg].used = 5
	h.redis.mu.Unlock()
	if v := decide(20); !v.Allowed() || v.Decision.Limit != 20 || v.Decision.Remaining != 14 {
		t.Fatalf("allowed %v limit %d remaining %d: 6 admitted of a new limit of 20", v.Allowed(), v.Decision.Limit, v.Decision.Remaining)
	}
}

// A cost known only at the end is charged in full, even past the limit:
// from credit when it covers it, else by an event into the window, owed
// until applied, the window then full for this edge and announced to the
// others; with no window known, by an event placed by the request's start.
func TestChargeAtTheEnd(t *testing.T) {
	cases := []struct {
		name     string
		into     func(h *harness)
		cost     int64
		path     Path
		event    int64 // units charged by an event (0: none)
		reset    bool  // the event names the window
		full     bool
		notices  int
		calls    int
		remained int64
	}{
		{name: "covered by credit", into: func(h *harness) { h.open(5, 4, false) }, cost: 3, path: PathCredit, remained: testLimit - 4},
		{name: "past the limit", into: func(h *harness) { h.open(8, 1, false) }, cost: 6, path: PathBorrow, event: 5, reset: true,
			full: true, notices: 1},
		{name: "within the limit, beyond credit", into: func(h *harness) { h.open(2, 0, false) }, cost: 3, path: PathBorrow, event: 3,
			reset: true, remained: testLimit - 5},
		{name: "no window yet: opened by a reservation of what it holds, the rest by an event", into: func(*harness) {}, cost: 12,
			path: PathBorrow, event: 2, reset: true, full: true, notices: 1, calls: 1},
		{name: "redis down, no window known: all by an event placed by the start", into: func(h *harness) { h.redis.down = true },
			cost: 12, path: PathFailOpen, event: 12, calls: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, policyOf(limiter.ModeAuto), true, fast)
			tc.into(h)
			calls := h.redis.numCalls()
			v := h.core.Charge(context.Background(), h.policy, tc.cost, h.dg, h.clock.Now(), 1)
			h.core.Wait()
			if !v.Allowed() || v.Path != tc.path {
				t.Fatalf("allowed %v path %v, want allowed by %v", v.Allowed(), v.Path, tc.path)
			}
			if n := h.redis.numCalls() - calls; n != tc.calls {
				t.Fatalf("%d Redis calls, want %d", n, tc.calls)
			}
			got := h.ledger.since(0)
			switch {
			case tc.event == 0 && len(got) != 0:
				t.Fatalf("entries %+v, want none", got)
			case tc.event > 0 && (len(got) != 1 || got[0].Kind != limiter.Charge || got[0].Units != tc.event ||
				got[0].ResetAt.IsZero() == tc.reset):
				t.Fatalf("entries %+v, want one charge of %d (naming the window: %v)", got, tc.event, tc.reset)
			}
			if _, _, full := h.snapshot(); full != tc.full {
				t.Fatalf("full %v, want %v", full, tc.full)
			}
			if n := h.notes.len(); n != tc.notices {
				t.Fatalf("%d notices, want %d", n, tc.notices)
			}
			if v.Decided && v.Decision.Remaining != tc.remained {
				t.Fatalf("remaining %d, want %d", v.Decision.Remaining, tc.remained)
			}
			if tc.full {
				if v, err := h.decide(1); err != nil || v.Allowed() || v.Path != PathCache {
					t.Fatalf("the next request: allowed %v by %v (%v); want denied from memory", v.Allowed(), v.Path, err)
				}
			}
		})
	}
}

// A decision-API request charged an estimate is trued up once with its
// actual cost: the excess given back on the primary, a shortfall charged
// by an event into the request's window, past the limit if need be.
func TestTrueUp(t *testing.T) {
	for _, tc := range []struct {
		name             string
		estimate, actual int64
		back, charged    int64
	}{
		{"cost less than the estimate", 5, 2, 3, 0},
		{"cost as estimated", 5, 5, 0, 0},
		{"cost more than the estimate", 5, 9, 0, 4},
		{"nothing after all", 5, 0, 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := policyOf(limiter.ModeExact)
			h := newHarness(t, p, true, fast)
			h.reqs++
			v, err := h.core.Decide(context.Background(), p, tc.estimate, h.dg, h.clock.Now(), h.reqs)
			if err != nil || !v.Allowed() {
				t.Fatalf("the estimate was not admitted: %v", err)
			}
			res, charged, err := h.core.TrueUp(context.Background(), v, 200, tc.actual, h.clock.Now())
			if err != nil || res.Outcome != limiter.Finished || res.Amount != tc.back || charged != tc.charged {
				t.Fatalf("outcome %v back %d charged %d (%v); want finished, %d back, %d charged", res.Outcome, res.Amount, charged, err,
					tc.back, tc.charged)
			}
			events := h.ledger.since(0)
			if tc.charged > 0 && (len(events) != 1 || events[0].Units != tc.charged || !events[0].ResetAt.Equal(v.Reset) ||
				events[0].RequestID != v.RequestID()) {
				t.Fatalf("events %+v, want the shortfall charged into the request's window", events)
			}
		})
	}
}

// evictHarnessKey decides one request of another key of the harness's
// table shard: with Config.Keys 1, the harness's entry is evicted.
func evictHarnessKey(t *testing.T, h *harness) {
	t.Helper()
	shard := h.dg.Hash() % tableShards
	for i := 0; ; i++ {
		k := h.keys.Key("api", fmt.Sprint("other", i))
		if k.Digest().Hash()%tableShards == shard {
			if _, err := h.core.Decide(context.Background(), h.policy, 1, k.Digest(), h.clock.Now(), 99); err != nil {
				t.Fatal(err)
			}
			h.core.Wait()
			return
		}
	}
}

// An evicted entry with nothing in hand leaves its holder to the key's next
// entry: the window sees one holder (a compact window stays compact), the
// new entry knows what the old one was given (no reply's count reads as a
// lost answer's credit), and goes on numbering its requests. An entry
// evicted with something in hand, or whose window ended, leaves none.
func TestEvictedEntryCarriesOn(t *testing.T) {
	p := limiter.Policy{Name: "api", Limit: 100, Window: time.Hour}
	h := newHarness(t, p, true, Config{Keys: 1, RedisBudget: fast.RedisBudget})
	for range 2 {
		if v, err := h.decide(1); err != nil || !v.Allowed() {
			t.Fatal(v, err)
		}
	}
	first := h.entry()
	holder, served := first.holder, first.served
	evictHarnessKey(t, h)
	if h.entry() != nil || !first.gone {
		t.Fatal("the entry was not evicted, or not marked gone")
	}
	if v, err := h.decide(1); err != nil || !v.Allowed() {
		t.Fatal(v, err)
	}
	e := h.entry()
	if e == first || e.holder != holder || e.served != served+1 {
		t.Fatalf("holder %q (was %q), served %d (was %d)", e.holder, holder, e.served, served)
	}
	h.redis.mu.Lock()
	mine := h.redis.windows[h.dg].mine
	h.redis.mu.Unlock()
	if len(mine) != 1 || mine[holder] != 3 {
		t.Fatalf("the window's holders: %v, want %s alone with 3", mine, holder)
	}
	if e.credit != 0 || h.core.Stats().Recovered != 0 {
		t.Fatalf("credit %d, recovered %d: a carried-on holder's own units read as lost", e.credit, h.core.Stats().Recovered)
	}

	// With an answer lost to resolve, the entry's holder goes with it.
	e.mu.Lock()
	e.lost = instantOf(h.clock.Now())
	e.mu.Unlock()
	evictHarnessKey(t, h)
	if _, err := h.decide(1); err != nil {
		t.Fatal(err)
	}
	if got := h.entry().holder; got == holder {
		t.Fatal("an entry evicted with a lost answer to resolve left its holder")
	}

	// A window that ended: the next entry is a holder of its own.
	holder = h.entry().holder
	h.clock.Advance(time.Hour)
	evictHarnessKey(t, h)
	if _, err := h.decide(1); err != nil {
		t.Fatal(err)
	}
	if got := h.entry().holder; got == holder {
		t.Fatal("an entry whose window ended left its holder")
	}
}

// A finish gives back what the request's algorithm says: a window a 304's
// charge only, a concurrency limit the request's units whatever the status,
// and no reported cost (it holds units, it spends none). The primary's
// answer is the fake's: what it was asked to give back.
func TestFinishGivesBackByAlgorithm(t *testing.T) {
	inflight := limiter.Policy{Name: "api", Algorithm: limiter.Concurrency, Limit: testLimit, Window: 30 * time.Second, Slices: 2,
		Align: true, Mode: limiter.ModeExact}
	for _, c := range []struct {
		policy limiter.Policy
		status int
		cost   *int64
		back   int64
	}{
		{policyOf(limiter.ModeExact), 200, nil, 0},
		{policyOf(limiter.ModeExact), 500, nil, 0},
		{policyOf(limiter.ModeExact), 304, nil, 2},
		{inflight, 200, nil, 2},
		{inflight, 304, nil, 2},
		{inflight, 503, nil, 2},
		{inflight, 200, new(int64(7)), 2},
		{bucketOf(limiter.ModeExact), 200, nil, 0},
		{bucketOf(limiter.ModeExact), 304, nil, 2},
	} {
		h := newHarness(t, c.policy, true, fast)
		h.open(testLimit, 0, true)
		reset := h.entry().reset.Time()
		v := Verdict{Policy: c.policy, Cost: 2, Key: h.key, Decided: true, Reset: reset, Now: h.clock.Now(), Producer: "edge.test"}
		var res limiter.FinishResult
		var charged int64
		var err error
		if c.cost != nil {
			res, charged, err = h.core.TrueUp(context.Background(), v, c.status, *c.cost, h.clock.Now())
		} else {
			res, err = h.core.Finish(context.Background(), v, c.status, h.clock.Now())
		}
		if err != nil || res.Amount != c.back || charged != 0 {
			t.Errorf("%s, status %d: gave back %d (want %d), charged %d: %v", c.policy.Algorithm.OrDefault(), c.status, res.Amount,
				c.back, charged, err)
		}
	}
}

// A finish on the edge that admitted a request puts its units back into
// that edge's credit. Under a concurrency limit, credit the edge held free
// all through idle_release — beyond its peak of requests in flight — goes
// back while the key stays busy there, for the key's other edges; a
// window's credit, spent for good, is not trimmed so.
func TestSpareCreditGoesBack(t *testing.T) {
	inflight := limiter.Policy{Name: "api", Algorithm: limiter.Concurrency, Limit: testLimit, Window: 30 * time.Second, Slices: 2,
		Align: true}
	for _, c := range []struct {
		policy  limiter.Policy
		status  int
		trimmed bool
	}{
		{inflight, 200, true},
		{policyOf(limiter.ModeAuto), 304, false},
	} {
		h := newHarness(t, c.policy, true, fast)
		h.open(testLimit, 4, false) // the edge holds 4 of the limit, after a burst of 4 at once
		from := h.ledger.len()
		// One request in flight at a time, a new one every 200 ms: the key
		// is never quiet here, and 3 units are never needed.
		for range 10 {
			v, err := h.decide(1)
			if err != nil || !v.Allowed() {
				t.Fatalf("%s: a request within the credit: %v, %v", c.policy.Algorithm.OrDefault(), v.Allowed(), err)
			}
			h.clock.Advance(200 * time.Millisecond)
			h.core.Sweep(context.Background(), h.clock.Now())
			if c.policy.Algorithm.GivesBack(c.status, v.Cost) > 0 {
				h.core.Refund(v)
			}
		}
		credit, _, _ := h.snapshot()
		var released int64
		for _, ev := range h.ledger.since(from) {
			if ev.Kind == limiter.Release {
				released += ev.Units
			}
		}
		if c.trimmed && (released != 3 || credit != 1) {
			t.Errorf("concurrency: released %d and holds %d, want the 3 never used released and 1 held", released, credit)
		}
		if !c.trimmed && (released != 0 || credit != 4) {
			t.Errorf("window: released %d and holds %d, want its credit kept", released, credit)
		}
	}
}

// bucketOf is a token bucket of testLimit units refilled 5 a second.
func bucketOf(m limiter.Mode) limiter.Policy {
	return limiter.Policy{Name: "api", Mode: m}.Bucket(testLimit, 5, time.Second)
}

// What a token bucket's decision tells: the time its whole burst takes to
// refill as the window, and as the reset when what the client waits for is
// back — all it used, admitted; what its cost needs, denied. A window
// tells its own window and reset.
func TestBucketTells(t *testing.T) {
	now := epoch.Add(300 * time.Millisecond)
	for _, c := range []struct {
		policy  limiter.Policy
		used    int64 // the entry's count, its credit spent
		allowed bool
		window  time.Duration
		reset   time.Time
		learnt  time.Duration // how long before now the entry learnt its count (0: never)
	}{
		{bucketOf(limiter.ModeAuto), 4, true, 2 * time.Second, now.Add(800 * time.Millisecond), 0},
		{bucketOf(limiter.ModeAuto), 10, false, 2 * time.Second, now.Add(600 * time.Millisecond), 0}, // cost 3: 3 units back in 0.6 s
		{bucketOf(limiter.ModeAuto), 0, true, 2 * time.Second, now, 0},
		{policyOf(limiter.ModeAuto), 4, true, time.Minute, epoch.Add(time.Minute), 0},
		// Counted from when the count was learnt: 0.4 s of the 0.6 s have
		// refilled by now, and the edge asks again at that time.
		{bucketOf(limiter.ModeAuto), 10, false, 2 * time.Second, now.Add(200 * time.Millisecond), 400 * time.Millisecond},
		{bucketOf(limiter.ModeAuto), 4, true, 2 * time.Second, now, time.Second}, // refilled already: now, never before
		{policyOf(limiter.ModeAuto), 4, true, time.Minute, epoch.Add(time.Minute), time.Second},
	} {
		h := newHarness(t, c.policy, true, fast)
		h.open(c.used, 0, !c.allowed)
		e := h.entry()
		e.lock()
		e.lastTake = 0
		if c.learnt > 0 {
			e.lastTake = instantOf(now.Add(-c.learnt))
		}
		v := Verdict{Policy: c.policy, Cost: 3, Now: now}
		h.core.decision(&v, e, c.allowed)
		e.mu.Unlock()
		if v.Decision.Window != c.window || !v.Decision.ResetAt.Equal(c.reset) {
			t.Errorf("%s, used %d, allowed %v: told %v, reset in %v; want %v, %v", c.policy.Algorithm.OrDefault(), c.used, c.allowed,
				v.Decision.Window, v.Decision.ResetAt.Sub(now), c.window, c.reset.Sub(now))
		}
	}
}

// A token bucket's entry that learnt the bucket full denies from memory
// only until what a request needs has refilled since: then it asks the
// primary again. A window's stays full until its reset.
func TestFullBucketAsksOnceRefilled(t *testing.T) {
	for _, c := range []struct {
		policy limiter.Policy
		asks   bool
	}{
		{bucketOf(limiter.ModeAuto), true}, // 5 a second: one unit in 200 ms
		{policyOf(limiter.ModeAuto), false},
	} {
		h := newHarness(t, c.policy, true, fast)
		h.open(testLimit, 0, true)
		e := h.entry()
		e.lock()
		e.lastTake = instantOf(h.clock.Now())
		e.mu.Unlock()
		calls := h.redis.numCalls()
		h.clock.Advance(150 * time.Millisecond)
		v, err := h.decide(1)
		if err != nil || v.Allowed() || v.Path != PathCache || h.redis.numCalls() != calls {
			t.Fatalf("%s: before a unit refilled: allowed %v by %v, %d calls: %v", c.policy.Algorithm.OrDefault(), v.Allowed(), v.Path,
				h.redis.numCalls()-calls, err)
		}
		h.clock.Advance(100 * time.Millisecond)
		v, err = h.decide(1)
		if asked := h.redis.numCalls() > calls; err != nil || asked != c.asks {
			t.Errorf("%s: once a unit refilled: asked the primary %v, want %v (%v by %v): %v", c.policy.Algorithm.OrDefault(), asked,
				c.asks, v.Allowed(), v.Path, err)
		}
	}
}

// An edge that learnt a concurrency limit or a sliding window full reads
// it again while its requests go on being denied, as it does a window:
// room that finishes, refunds or releases made, whose notice it missed, is
// found without waiting for the lease or the sub-window to end. A token
// bucket is not read (it is full only until it refills, which the edge
// knows).
func TestFullLimitsAreReadAgain(t *testing.T) {
	inflight := limiter.Policy{Name: "api", Algorithm: limiter.Concurrency, Limit: testLimit, Window: time.Hour, Slices: 2, Align: true}
	slide := limiter.Policy{Name: "api", Algorithm: limiter.SlidingWindow, Limit: testLimit, Window: time.Hour, Slices: 2, Align: true}
	for _, c := range []struct {
		policy limiter.Policy
		reread bool
	}{{inflight, true}, {slide, true}, {limiter.Policy{Name: "api"}.Bucket(testLimit, testLimit, time.Hour), false}} {
		h := newHarness(t, c.policy, true, Config{RedisBudget: 250 * time.Millisecond, Recheck: 100 * time.Millisecond})
		h.open(testLimit, 0, true)
		sweep := func() { h.core.Sweep(context.Background(), h.clock.Now()) }
		if v, _ := h.decide(1); v.Allowed() {
			t.Fatalf("%s: admitted while full", c.policy.Algorithm)
		}
		sweep() // full since this sweep
		// Finishes applied on the primary, their room notice lost.
		e := h.entry()
		h.redis.set(h.key, e.start.Time(), e.reset.Time(), 2, e.holder, 0)
		h.clock.Advance(150 * time.Millisecond)
		sweep()
		if _, _, full := h.snapshot(); full == c.reread {
			t.Errorf("%s: full %v after a read was due, want %v", c.policy.Algorithm, full, !c.reread)
		}
	}
}
