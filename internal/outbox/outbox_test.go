package outbox

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// fakeApplier applies nothing: it records what it was asked to apply, or
// fails (a primary down). The stream route and the real scripts are tested
// in internal/edge and internal/faults.
type fakeApplier struct {
	mu     sync.Mutex
	events []limiter.Event
	down   bool
	calls  int
}

func (f *fakeApplier) Apply(_ context.Context, _ int, _ time.Time, evs []limiter.Event) (limiter.ApplyResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.down {
		return limiter.ApplyResult{}, errors.New("fake: connection refused")
	}
	f.events = append(f.events, evs...)
	res := limiter.ApplyResult{Results: make([]limiter.Result, len(evs))}
	for i := range evs {
		res.Results[i] = limiter.Result{Outcome: limiter.Applied, Amount: evs[i].Units, Used: 1,
			ResetAt: evs[i].ResetAt}
	}
	return res, nil
}

func (f *fakeApplier) Shards() int          { return 2 }
func (f *fakeApplier) ShardName(int) string { return "s" }

func (f *fakeApplier) applied() []limiter.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]limiter.Event(nil), f.events...)
}

func entry(kind limiter.EventKind) limiter.Entry {
	keys, _ := limiter.NewKeySpace("t", []byte("0123456789abcdef0123456789abcdef"))
	start := time.Now()
	return limiter.Entry{Kind: kind, Key: keys.Key("api", "c"), Policy: limiter.Policy{Name: "api", Limit: 10, Window: time.Minute},
		Units: 2, ResetAt: start.Add(time.Minute).Truncate(time.Second), Start: start, Time: start}
}

// Entries are numbered per shard from 1 and applied, as events of the
// producer, in that order; what a release left in a window is learnt.
func TestDirectRouteNumbersAndApplies(t *testing.T) {
	f := &fakeApplier{}
	var learnt []int64
	var mu sync.Mutex
	ob, err := New(Options{Config: Config{Route: RouteDirect}, Applier: f, Producer: "edge.t",
		Learn: func(_ int, _ limiter.Digest, _ time.Time, used int64) {
			mu.Lock()
			learnt = append(learnt, used)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, k := range []limiter.EventKind{limiter.Charge, limiter.Release, limiter.Refund} {
		seqs = append(seqs, ob.Record(0, entry(k)))
	}
	seqs = append(seqs, ob.Record(1, entry(limiter.Charge)))
	if err := ob.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 || seqs[3] != 1 {
		t.Fatalf("sequences %v, want 1 2 3 on shard 0 and 1 on shard 1", seqs)
	}
	evs := f.applied()
	if len(evs) != 4 || evs[0].Producer != "edge.t" || evs[0].Kind != limiter.Charge || evs[0].Units != 2 {
		t.Fatalf("applied %+v", evs)
	}
	if s := ob.Stats(); s.Direct != 4 || s.Queued != 0 || s.Dropped != 0 {
		t.Fatalf("stats %+v", s)
	}
	if len(learnt) != 2 {
		t.Fatalf("learnt %v: want the release and the refund, not the charge", learnt)
	}
}

// With the primary down (and no NATS) entries wait, up to Capacity per
// shard: beyond it Record refuses them (0); what is still waiting when
// Close's context ends is counted as dropped.
func TestEntriesWaitThenAreRefused(t *testing.T) {
	f := &fakeApplier{down: true}
	ob, err := New(Options{Config: Config{Capacity: 3}, Applier: f, Producer: "edge.t"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if ob.Record(0, entry(limiter.Charge)) != uint64(i+1) {
			t.Fatal("refused below capacity")
		}
	}
	if ob.Record(0, entry(limiter.Charge)) != 0 {
		t.Fatal("taken beyond capacity")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := ob.Close(ctx); !errors.Is(err, ErrUndelivered) {
		t.Fatalf("close: %v", err)
	}
	if s := ob.Stats(); s.Dropped != 4 || s.Direct != 0 {
		t.Fatalf("stats %+v: the refused entry and the three left", s)
	}
	if ob.Record(0, entry(limiter.Charge)) != 0 {
		t.Fatal("recorded after close")
	}
}

func TestConfig(t *testing.T) {
	for _, c := range []Config{{Route: "smoke"}, {Capacity: -1}, {MaxBatch: 5000}, {PublishTimeout: -time.Second}} {
		if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: %v", c, err)
		}
	}
	if _, err := New(Options{Applier: &fakeApplier{}, Producer: "not a producer"}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("invalid producer: %v", err)
	}
}
