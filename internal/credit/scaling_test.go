package credit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// reservationsPerDecision is docs/scaling.md's model of the reservations
// (script calls on a primary) an edge makes per decision of a key far from
// its limit, seen at rate perEdge (requests per second) at that edge: a key
// that would not need one unit within half the horizon reserves per request
// (1); a busier one reserves about horizon × its rate at a time, once per
// that many requests.
func reservationsPerDecision(perEdge float64, horizon time.Duration) float64 {
	if perEdge*horizon.Seconds()/2 < 1 {
		return 1
	}
	return 1 / (perEdge * horizon.Seconds())
}

// The model's main ratio, checked on the core itself: edges sharing one
// primary (the fake keeps take.lua's arithmetic), a fixed total rate of
// decisions spread evenly over keys and edges, the default configuration,
// 40 s of simulated time with the sweep running. Reservations per
// decision follow the key's rate at each edge — so they grow with the
// number of keys and of edges at a given total rate — within a factor of
// two of the model (its steps are sharper than the core's), after a
// warm-up in which each key learns its rate.
func TestReservationsPerDecisionFollowTheModel(t *testing.T) {
	if testing.Short() {
		t.Skip("simulates a minute of traffic per case")
	}
	const total = 1000.0 // decisions per second, over every key and edge
	cfg := Config{}.WithDefaults()
	p := limiter.Policy{Name: "api", Limit: limiter.MaxLimit, Window: time.Hour, Mode: limiter.ModeAuto}
	for _, c := range []struct{ keys, edges int }{{1, 1}, {1, 4}, {100, 1}, {100, 4}, {1000, 1}, {400, 4}, {1000, 4}, {10000, 1}} {
		t.Run(fmt.Sprintf("%d keys, %d edges", c.keys, c.edges), func(t *testing.T) {
			redis, ledger := newFakeRedis(), &fakeLedger{}
			keys, err := limiter.NewKeySpace("t", []byte("0123456789abcdef0123456789abcdef"))
			if err != nil {
				t.Fatal(err)
			}
			clock := limiter.NewManualClock(epoch)
			cores := make([]*Core, c.edges)
			for i := range cores {
				cores[i], err = New(cfg, Deps{Reserver: redis, Ledger: ledger, Keys: keys, Clock: clock,
					Producer: fmt.Sprintf("edge.%d", i), FailOpen: true})
				if err != nil {
					t.Fatal(err)
				}
			}
			digests := make([]limiter.Digest, c.keys)
			for k := range digests {
				digests[k] = keys.Key(p.Name, fmt.Sprintf("client-%d", k)).Digest()
			}
			step := time.Duration(float64(time.Second) / total)
			const warmUp, measured = 15 * time.Second, 25 * time.Second
			var calls, decisions, events int
			nextSweep := clock.Now()
			for i := 0; time.Duration(i)*step < warmUp+measured; i++ {
				if i == int(warmUp/step) {
					calls, decisions, events = redis.numCalls(), 0, ledger.len()
				}
				core := cores[i%c.edges]
				v, err := core.Decide(context.Background(), p, 1, digests[(i/c.edges)%c.keys], clock.Now(), uint64(i+1))
				core.Wait()
				if err != nil || !v.Allowed() {
					t.Fatalf("decision %d: %v %v", i, v.Path, err)
				}
				decisions++
				clock.Advance(step)
				if now := clock.Now(); !now.Before(nextSweep) {
					for _, core := range cores {
						core.Sweep(context.Background(), now)
						core.Wait()
					}
					nextSweep = now.Add(250 * time.Millisecond)
				}
			}
			got := float64(redis.numCalls()-calls) / float64(decisions)
			perEdge := total / float64(c.keys*c.edges)
			want := reservationsPerDecision(perEdge, cfg.Horizon)
			t.Logf("each key at %.3g/s per edge: %.4f reservations per decision (model %.4f), %.4f events per decision",
				perEdge, got, want, float64(ledger.len()-events)/float64(decisions))
			if got > 2*want || got < want/2 {
				t.Errorf("%.4f reservations per decision; the model says %.4f", got, want)
			}
		})
	}
}
