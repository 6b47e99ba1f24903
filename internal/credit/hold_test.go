package credit

import (
	"context"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Credit held by an edge that dies comes back: a hot key's edge reports
// most of its credit frozen; once the report has expired, another edge
// short of room takes it back. Nothing it may have spent comes back (the
// window never admits more than its limit), and what stays stranded is
// at most the dead edge's free credit (about a second of the key's rate).
func TestDeadEdgesCreditComesBack(t *testing.T) {
	testFrozenCredit(t, false)
}

// An edge whose reports stop arriving for a while (a slow primary, a long
// pause) but which lives on: another edge takes its frozen share back, and
// the edge, told so by its next report, never spends those units.
func TestLiveEdgeNeverSpendsWhatWasTakenBack(t *testing.T) {
	testFrozenCredit(t, true)
}

func testFrozenCredit(t *testing.T, revive bool) {
	redis, ledger := newFakeRedis(), &fakeLedger{}
	keys, err := limiter.NewKeySpace("t", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	clock := limiter.NewManualClock(epoch)
	redis.clock = clock
	p := limiter.Policy{Name: "api", Limit: 10_000, Window: time.Hour}
	core := func(producer string) *Core {
		c, err := New(Config{}, Deps{Reserver: redis, Ledger: ledger, Keys: keys, Clock: clock, Producer: producer, FailOpen: true})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := core("edge.a"), core("edge.b")
	dg := keys.Key(p.Name, "hot").Digest()
	admitted := int64(0)
	var req uint64
	nextSweep := clock.Now()
	run := func(c *Core, d time.Duration, every time.Duration) (denied int) {
		for end := clock.Now().Add(d); clock.Now().Before(end); clock.Advance(every) {
			req++
			v, err := c.Decide(context.Background(), p, 1, dg, clock.Now(), req)
			c.Wait()
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed() {
				admitted++
			} else {
				denied++
			}
			if now := clock.Now(); !now.Before(nextSweep) {
				c.Sweep(context.Background(), now)
				c.Wait()
				nextSweep = now.Add(250 * time.Millisecond)
			}
		}
		return denied
	}
	// A serves the key at 1,000 a second: it holds seconds of its rate,
	// most of it frozen.
	run(a, 3*time.Second, time.Millisecond)
	ea := a.table.lookup(dg)
	ea.mu.Lock()
	credit, frozen, held := ea.credit, ea.frozen, ea.held
	ea.mu.Unlock()
	if frozen == 0 || held != frozen || credit-frozen > 1_100 {
		t.Fatalf("edge A holds %d, frozen %d (recorded %d)", credit, frozen, held)
	}
	// A dies. B takes what is left of the window, then, once A's share
	// has expired, what A froze.
	if run(b, 2*time.Second, 100*time.Microsecond) == 0 {
		t.Fatal("B was never short of room")
	}
	before := redis.takenBack
	run(b, 3*time.Second, 100*time.Microsecond)
	back := redis.takenBack - before
	if back != frozen {
		t.Fatalf("%d units taken back, A had frozen %d", back, frozen)
	}
	if revive {
		// A comes back with what it thinks it holds; its first report says
		// the share is gone, and it spends only its free credit.
		run(a, 3*time.Second, time.Millisecond)
		if a.Stats().TakenBack != uint64(frozen) {
			t.Fatalf("A learnt of %d units taken back, not %d", a.Stats().TakenBack, frozen)
		}
		ea.mu.Lock()
		aCredit := ea.credit
		ea.mu.Unlock()
		credit = aCredit // stranded below: at most A's free credit
		frozen = 0
	}
	if admitted > p.Limit {
		t.Fatalf("%d admitted, limit %d", admitted, p.Limit)
	}
	eb := b.table.lookup(dg)
	eb.mu.Lock()
	bCredit := eb.credit
	eb.mu.Unlock()
	stranded := redis.used(keys.KeyOf(dg)) - admitted - bCredit
	if stranded > credit-frozen || stranded < 0 {
		t.Fatalf("%d units stranded; A's free credit was %d", stranded, credit-frozen)
	}
	t.Logf("A held %d (%d frozen): %d taken back, %d stranded; %d admitted of %d", credit, frozen, back, stranded, admitted, p.Limit)
}

// A burst beyond the free credit does not wait for the next sweep: a
// report lowers the frozen share, and the burst is admitted from credit the
// edge holds.
func TestBurstUnfreezes(t *testing.T) {
	h := newHarness(t, limiter.Policy{Name: "api", Limit: 100_000, Window: time.Hour}, true, Config{})
	for range 2000 { // 1,000 a second: the key's rate is learnt
		if v, _ := h.decide(1); !v.Allowed() {
			t.Fatal(v.Path)
		}
		h.clock.Advance(time.Millisecond)
		if h.reqs%250 == 0 {
			h.core.Sweep(context.Background(), h.clock.Now())
			h.core.Wait()
		}
	}
	e := h.entry()
	e.mu.Lock()
	frozen, credit := e.frozen, e.credit
	e.mu.Unlock()
	if frozen == 0 {
		t.Fatalf("nothing frozen of %d", credit)
	}
	// The rest of the window goes to other edges: no reservation can
	// cover the burst, only the credit this edge holds.
	h.redis.mu.Lock()
	h.redis.windows[h.dg].used = h.policy.Limit
	holds := h.redis.holds
	h.redis.mu.Unlock()
	for range credit { // all of it at once
		if v, _ := h.decide(1); !v.Allowed() || v.Path != PathCredit {
			t.Fatalf("%v: a burst within the credit the edge holds", v.Path)
		}
	}
	if v, _ := h.decide(1); v.Allowed() {
		t.Fatal("allowed past the credit held, in a full window")
	}
	if h.redis.holds == holds {
		t.Fatalf("no report lowered the frozen share: %d frozen of %d, holds %d", frozen, credit, holds)
	}
}
