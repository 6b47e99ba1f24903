package credit

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// The fakes stand in for the core's ports. fakeRedis keeps windows as
// lua/take.lua does (a count that reservations never take past the limit,
// what was reserved for each holder, the producer's applied sequences);
// the integration tests in internal/edge run the real scripts.

var errDown = errors.New("fake: connection refused")

type fakeWindow struct {
	used         int64
	start, reset time.Time
	mine         map[string]int64
	frozen       map[string]fakeShare // hold.lua's shares, by holder
}

type fakeShare struct {
	units  int64
	expiry time.Time
}

type fakeRedis struct {
	mu      sync.Mutex
	windows map[limiter.Digest]*fakeWindow
	applied uint64 // the producer's events applied, in order
	calls   int    // Take and Check calls answered or failed
	holds   int    // Hold calls
	// clock, when set, is what Check compares shares' expiry with (the
	// store's clock).
	clock     limiter.Clock
	takenBack int64 // frozen units taken back
	// down fails every call; lose makes a reservation and then fails (its
	// answer lost); slow, when set, holds every Take until it is closed.
	down, lose bool
	fresh      []bool // TakeArgs.Fresh of every reservation (Need > 0), in order
	own        []bool // TakeArgs.Own of every reservation (Need > 0), in order
	slow       chan struct{}
	late       sync.WaitGroup // calls a slow primary runs when it wakes
}

func newFakeRedis() *fakeRedis { return &fakeRedis{windows: map[limiter.Digest]*fakeWindow{}} }

func (f *fakeRedis) Take(ctx context.Context, k limiter.Key, now time.Time, a limiter.TakeArgs) (limiter.Grant, error) {
	if err := a.Validate(k); err != nil {
		return limiter.Grant{}, err
	}
	f.mu.Lock()
	f.calls++
	if a.Need > 0 {
		f.fresh = append(f.fresh, a.Fresh)
		f.own = append(f.own, a.Own)
	}
	slow := f.slow
	f.mu.Unlock()
	if slow != nil {
		select {
		case <-slow:
		case <-ctx.Done():
			// A frozen primary runs the call when it wakes, for a caller
			// that stopped waiting.
			f.late.Go(func() {
				<-slow
				f.mu.Lock()
				f.take(k, now, a)
				f.mu.Unlock()
			})
			return limiter.Grant{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return limiter.Grant{}, errDown
	}
	g := f.take(k, now, a)
	if f.lose {
		return limiter.Grant{}, errDown
	}
	return g, nil
}

// TakeAsync is Take on a goroutine of its own, bounded as the store's
// timeouts bound a real one.
func (f *fakeRedis) TakeAsync(k limiter.Key, now time.Time, a limiter.TakeArgs, done func(limiter.Grant, error)) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		done(f.Take(ctx, k, now, a))
	}()
}

// take is take.lua's arithmetic. Callers hold f.mu.
func (f *fakeRedis) take(k limiter.Key, now time.Time, a limiter.TakeArgs) limiter.Grant {
	var owed int64
	for _, o := range a.Owed {
		if o.Seq > f.applied {
			owed += o.Units
		}
	}
	w := f.windows[k.Digest()]
	if w == nil || !now.Before(w.reset) {
		if a.Need == 0 {
			return limiter.Grant{Applied: f.applied}
		}
		w = &fakeWindow{start: now.Truncate(time.Second), reset: now.Truncate(time.Second).Add(a.Window),
			mine: map[string]int64{}}
		if a.Align {
			w.start, w.reset = limiter.Policy{Window: a.Window}.AlignedWindow(now)
		}
		f.windows[k.Digest()] = w
		owed = 0
	}
	g := limiter.Grant{Live: true, ResetAt: w.reset, Start: w.start}
	if len(a.Owed) > 0 { // take.lua reads the producer's hash only then
		g.Applied = f.applied
	}
	if room := a.Limit - w.used - owed; a.Need > 0 && room < a.Need {
		// Expired shares come back first.
		for h, sh := range w.frozen {
			if sh.expiry.Before(now) {
				w.used = max(0, w.used-sh.units)
				delete(w.frozen, h)
				f.takenBack += sh.units
			}
		}
	}
	g.Frozen = -1
	if room := a.Limit - w.used - owed; a.Need > 0 && room >= a.Need {
		g.Granted = min(a.Want, room)
		w.used += g.Granted
		w.mine[a.Holder] += g.Granted
		if have := w.frozen[a.Holder].units; a.Freeze && have == a.Share {
			g.Frozen = have + max(0, g.Granted-a.Keep)
			if w.frozen == nil {
				w.frozen = map[string]fakeShare{}
			}
			w.frozen[a.Holder] = fakeShare{units: g.Frozen, expiry: a.ShareExpiry}
		}
	}
	g.Used, g.Mine = w.used, w.mine[a.Holder]
	// take.lua's own: the window is compact, the holder's alone (no other
	// holder, nothing frozen; a take owing or freezing expands it).
	g.Own = len(w.mine) == 1 && g.Mine == w.used && len(w.frozen) == 0 && len(a.Owed) == 0 && !a.Freeze
	return g
}

// Hold is hold.lua's.
func (f *fakeRedis) Hold(_ context.Context, _ int, hs []limiter.Hold) ([]limiter.HoldResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.holds++
	if f.down {
		return nil, errDown
	}
	out := make([]limiter.HoldResult, len(hs))
	for i, h := range hs {
		w := f.windows[h.Key.Digest()]
		if w == nil || !w.reset.Equal(h.ResetAt) {
			out[i] = limiter.HoldResult{Outcome: limiter.HoldGone}
			continue
		}
		if have := w.frozen[h.Holder].units; have != h.Expected {
			out[i] = limiter.HoldResult{Outcome: limiter.HoldMismatch, Have: have}
			continue
		}
		if w.frozen == nil {
			w.frozen = map[string]fakeShare{}
		}
		if h.Frozen == 0 {
			delete(w.frozen, h.Holder)
		} else {
			w.frozen[h.Holder] = fakeShare{units: h.Frozen, expiry: h.Expiry}
		}
		out[i] = limiter.HoldResult{Outcome: limiter.Held, Have: h.Frozen}
	}
	return out, nil
}

func (f *fakeRedis) Check(_ context.Context, k limiter.Key) (limiter.Window, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return limiter.Window{}, errDown
	}
	w := f.windows[k.Digest()]
	if w == nil {
		return limiter.Window{}, nil
	}
	var expired int64
	for _, sh := range w.frozen {
		if f.clock != nil && sh.expiry.Before(f.clock.Now()) {
			expired += sh.units
		}
	}
	return limiter.Window{Live: true, Used: w.used, Start: w.start, ResetAt: w.reset, Expired: expired}, nil
}

func (f *fakeRedis) Finish(_ context.Context, k limiter.Key, _ time.Time, a limiter.FinishArgs) (limiter.FinishResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return limiter.FinishResult{}, errDown
	}
	w := f.windows[k.Digest()]
	if w == nil || a.Back == 0 {
		return limiter.FinishResult{Outcome: limiter.Finished}, nil
	}
	w.used -= a.Back
	return limiter.FinishResult{Outcome: limiter.Finished, Amount: a.Back, Used: w.used, ResetAt: w.reset}, nil
}

// wake ends a slow primary's freeze and waits for it to run the calls it
// held.
func (f *fakeRedis) wake() {
	f.mu.Lock()
	close(f.slow)
	f.slow = nil
	f.mu.Unlock()
	f.late.Wait()
}

func (f *fakeRedis) ShardOf(limiter.Key) int { return 0 }
func (f *fakeRedis) Shards() int             { return 1 }
func (f *fakeRedis) ShardName(int) string    { return "s0" }

// set makes k's window hold used units, reserved (mine) for holder.
func (f *fakeRedis) set(k limiter.Key, start, reset time.Time, used int64, holder string, mine int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.windows[k.Digest()] = &fakeWindow{used: used, start: start, reset: reset, mine: map[string]int64{holder: mine}}
}

func (f *fakeRedis) used(k limiter.Key) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w := f.windows[k.Digest()]; w != nil {
		return w.used
	}
	return 0
}

func (f *fakeRedis) numCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

// fakeLedger numbers what it is handed, as the outbox does, or refuses it
// (full).
type fakeLedger struct {
	mu      sync.Mutex
	entries []limiter.Entry
	full    bool
}

func (l *fakeLedger) Record(_ int, e limiter.Entry) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.full {
		return 0
	}
	l.entries = append(l.entries, e)
	return uint64(len(l.entries))
}

// kinds lists the kinds and units recorded since entry from.
func (l *fakeLedger) since(from int) []limiter.Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]limiter.Entry(nil), l.entries[from:]...)
}

func (l *fakeLedger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.entries)
}

// apply applies what was recorded up to n on the fake primary, as an
// accountant would: charges added, releases and refunds given back.
func (l *fakeLedger) apply(f *fakeRedis, keys *limiter.KeySpace, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := int(f.applied); i < n; i++ {
		e := l.entries[i]
		if w := f.windows[e.Key.Digest()]; w != nil {
			switch e.Kind {
			case limiter.Charge:
				w.used += e.Units
			default:
				w.used -= e.Units
			}
		}
		f.applied = uint64(i + 1)
	}
}

type fakeNotifier struct {
	mu      sync.Mutex
	notices []Notice
}

func (n *fakeNotifier) Notify(_ int, x Notice) {
	n.mu.Lock()
	n.notices = append(n.notices, x)
	n.mu.Unlock()
}

func (n *fakeNotifier) len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.notices)
}

// harness is a Core on fakes and a manual clock, with one key under one
// policy.
type harness struct {
	t      *testing.T
	core   *Core
	clock  *limiter.ManualClock
	redis  *fakeRedis
	ledger *fakeLedger
	notes  *fakeNotifier
	keys   *limiter.KeySpace
	policy limiter.Policy
	dg     limiter.Digest
	key    limiter.Key
	reqs   uint64
}

var epoch = time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)

func newHarness(t *testing.T, p limiter.Policy, failOpen bool, cfg Config, with ...func(*Deps)) *harness {
	t.Helper()
	keys, err := limiter.NewKeySpace("t", []byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, clock: limiter.NewManualClock(epoch), redis: newFakeRedis(), ledger: &fakeLedger{},
		notes: &fakeNotifier{}, keys: keys, policy: p}
	h.key = keys.Key(p.Name, "client")
	h.dg = h.key.Digest()
	d := Deps{Reserver: h.redis, Ledger: h.ledger, Notifier: h.notes, Keys: keys, Clock: h.clock,
		Producer: "edge.test", FailOpen: failOpen, Policies: map[string]limiter.Policy{p.Name: p}}
	for _, f := range with {
		f(&d)
	}
	h.core, err = New(cfg, d)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.core.Wait)
	return h
}

// decide decides one request of cost at the clock's time, and waits for
// the reservations it started in the background.
func (h *harness) decide(cost int64) (Verdict, error) {
	h.reqs++
	v, err := h.core.Decide(context.Background(), h.policy, cost, h.dg, h.clock.Now(), h.reqs)
	h.core.Wait()
	return v, err
}

// entry is the core's entry of the harness's key (nil: none).
func (h *harness) entry() *entry { return h.core.table.lookup(h.dg) }

// snapshot reads the entry's credit, used and full under its lock.
func (h *harness) snapshot() (credit, used int64, full bool) {
	e := h.entry()
	if e == nil {
		return 0, 0, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.credit, e.used, e.full
}
