package edge_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/outbox"
	"github.com/tallyhq/tally/internal/testutil"
)

// Restarting the accountant, under load and just before a hot key's first
// request, never lets more than the limit through: charges are made on the
// primary before the answer, whatever the accountant does. (Patient edges:
// an edge that stops waiting for a slow primary admits by its
// on_redis_error rule instead, which TestPrimaryDownFollowsPolicy covers.)
func TestAccountantRestartsNeverLetMoreThrough(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 200, Window: time.Minute}
	a, b := pl.edge(patient), pl.edge(patient)
	pl.stopAcc() // just before the hot key's first request
	done := make(chan int64)
	go func() { done <- hammer(t, []*edgeUnderTest{a, b}, "restart", 16, 20) }()
	time.Sleep(50 * time.Millisecond)
	pl.startAccountant() // under load
	allowed := <-done
	require.EqualValues(t, 200, allowed)
	require.EqualValues(t, 200, pl.used(pl.keys.Key("core", "h:restart")))
}

// NATS goes away: requests are still answered at once, and the accounting
// events the edge must send (here a 304 refund in mode exact) are applied on
// the primary by the edge itself.
func TestNATSDownEdgeAppliesItself(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:nats-down")
	require.Equal(t, 200, get(t, e.proxy.URL, "nats-down").StatusCode)
	pl.nats.Shutdown()
	start := time.Now()
	for range 10 {
		require.Equal(t, 304, get(t, e.proxy.URL, "nats-down", "If-None-Match", `"v1"`).StatusCode)
	}
	require.Less(t, time.Since(start), 5*time.Second, "requests were held up")
	pl.waitUsed(k, 1)
	testutil.WaitFor(t, "the count of events applied directly", func() bool {
		return metric(t, e, `tally_edge_accounting_events_total{outcome="applied_directly"}`) == 10
	})
	require.Zero(t, metric(t, e, `tally_edge_accounting_events_total{outcome="dropped"}`))
	resp, err := http.Get(e.admin.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "degraded, not unready")
}

// The primary goes away: a key the edge knows is decided from what it
// knows; an unknown key follows on_redis_error; nothing waits longer than
// the Redis budget, and what was admitted is charged once the primary is
// back.
func TestPrimaryDownFollowsPolicy(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 10, Window: time.Minute, Mode: limiter.ModeExact}
	edges := decisionRecords(t, pl)
	accountants := decisionRecords(t, pl, events.Streams{}.AccountantDecisionsSubject())
	open := pl.edge(nil)
	closed := pl.edge(func(o *edge.Options) { o.DenyOnRedisError = true })
	require.Equal(t, 200, get(t, open.proxy.URL, "known").StatusCode)
	pl.primary.Stop()
	start := time.Now()
	r := get(t, open.proxy.URL, "known")
	require.Equal(t, 200, r.StatusCode, "decided from what the edge knows")
	require.Equal(t, "8", r.Header.Get("X-RateLimit-Remaining"))
	r = get(t, open.proxy.URL, "unknown")
	require.Equal(t, 200, r.StatusCode, "fail open")
	require.Empty(t, r.Header.Get("X-RateLimit-Remaining"), "no headers without knowledge of the window")
	r = get(t, closed.proxy.URL, "unknown")
	require.Equal(t, 503, r.StatusCode, "fail closed")
	require.Equal(t, "1", r.Header.Get("Retry-After"))
	require.Less(t, time.Since(start), 3*time.Second)

	resp, err := http.Get(open.admin.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "an edge that can decide is ready")

	// Restarted empty: the edge re-asserts the known window (its first
	// request's reservation and the admission charged by an event while the
	// primary was down); the unknown key's admission is charged by its
	// start.
	pl.primary.Restart()
	pl.replica.WaitLinkUp()
	testutil.WaitFor(t, "the charges", func() bool {
		return pl.used(pl.keys.Key("core", "h:known")) == 2 && pl.used(pl.keys.Key("core", "h:unknown")) == 1
	})

	// The charges' records join the admissions' by request id.
	testutil.WaitFor(t, "the charges' records", func() bool { return len(accountants()) >= 2 })
	for _, path := range []string{"borrow", "fail-open"} {
		i := slices.IndexFunc(edges(), func(r decisionRecord) bool { return r.Path == path })
		require.GreaterOrEqual(t, i, 0, path)
		admission := edges()[i]
		require.True(t, slices.ContainsFunc(accountants(), func(r decisionRecord) bool {
			return r.RequestID == admission.RequestID && r.Key == admission.Key && r.Outcome == "charged"
		}), "the charge of the %s admission %s", path, admission.RequestID)
	}
}

// The accounting stream fills up (no accountant to empty it): the edge
// notices publishes failing and applies its events itself; once an
// accountant empties the stream nothing was lost and nothing doubled.
func TestFullStreamEdgeAppliesItself(t *testing.T) {
	pl := newPipeline(t)
	pl.stopAcc()
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute, Mode: limiter.ModeExact}
	// A stream of 2 KiB: a couple of batches fill it.
	small := events.Streams{Accounting: events.StreamConfig{MaxBytes: 2048}}
	_, js := pl.nats.Connect()
	require.NoError(t, events.EnsureStreams(context.Background(), js, small, []string{"s0"}))
	e := pl.edge(func(o *edge.Options) { o.Streams = small })
	k := pl.keys.Key("core", "h:full")
	for range 30 {
		require.Equal(t, 304, get(t, e.proxy.URL, "full", "If-None-Match", `"v1"`).StatusCode)
	}
	testutil.WaitFor(t, "events applied by the edge", func() bool {
		return metric(t, e, `tally_edge_accounting_events_total{outcome="applied_directly"}`) > 0
	})
	testutil.WaitFor(t, "every event delivered", func() bool { return metric(t, e, "tally_edge_accounting_queued") == 0 })
	require.Zero(t, metric(t, e, `tally_edge_accounting_events_total{outcome="dropped"}`))
	published := metric(t, e, `tally_edge_accounting_events_total{outcome="published"}`)
	require.Greater(t, published, 0.0, "the first batches went to the stream")
	require.GreaterOrEqual(t, metric(t, e, "tally_edge_accounting_message_events_sum"), published,
		"every message published counted with its events (some were applied by the edge after JetStream refused them)")
	require.Greater(t, metric(t, e, "tally_edge_accounting_message_events_count"), 0.0)
	pl.startAccountant(small)
	pl.waitUsed(k, 0) // 30 charges, 30 refunds: once each, whichever way they went
	testutil.WaitFor(t, "the stream's events applied", func() bool { return pl.acc.Stats().Refunded == uint64(published) })
}

// The direct route: the edge applies its events on the primary, and hands
// them to JetStream only when the primary does not take them.
func TestDirectRoute(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(func(o *edge.Options) { o.Outbox.Route = outbox.RouteDirect })
	k := pl.keys.Key("core", "h:direct")
	for range 5 {
		require.Equal(t, 304, get(t, e.proxy.URL, "direct", "If-None-Match", `"v1"`).StatusCode)
	}
	pl.waitUsed(k, 0)
	testutil.WaitFor(t, "5 events applied by the edge", func() bool {
		return metric(t, e, `tally_edge_accounting_events_total{outcome="applied_directly"}`) == 5
	})
	require.Zero(t, pl.acc.Stats().Messages, "nothing went through the stream")

	// The primary hangs: a request is admitted from what the edge knows
	// (borrowed, charged by an event) and its 304 refunded by another; both
	// go to JetStream when the primary does not answer, and the accountant
	// applies them when it is back.
	pl.primary.Pause()
	require.Equal(t, 304, get(t, e.proxy.URL, "direct", "If-None-Match", `"v1"`).StatusCode)
	testutil.WaitFor(t, "the events handed to JetStream", func() bool {
		return metric(t, e, `tally_edge_accounting_events_total{outcome="published"}`) == 2
	})
	pl.primary.Resume()
	pl.waitUsed(k, 0)
	// The edge's attempts may have reached the hung primary and been
	// applied when it came back; then the JetStream copies are duplicates.
	// Each event once.
	testutil.WaitFor(t, "the accountant read them", func() bool {
		s := pl.acc.Stats()
		return s.Charged+s.Netted+s.Refunded+s.Pending+s.Duplicates == 2
	})
	require.Zero(t, pl.acc.Stats().DeadLettered)
}

// A decision-API finish is applied on the primary before it is answered:
// with the primary hung, the caller is told to retry (503), and a retry
// after the hung primary ran the first attempt is answered as already
// finished — the charge given back once either way.
func TestFinishWhilePrimaryHangs(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:hung")
	resp, m := check(t, e, "hung")
	require.Equal(t, 200, resp.StatusCode)
	body := fmt.Sprintf(`{"request_id":%q,"status":304}`, m["request_id"])
	pl.primary.Pause()
	resp, _ = post(t, e.api.URL+"/v1/finish", body)
	require.Equal(t, 503, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	pl.primary.Resume()
	pl.waitUsed(k, 0) // the hung primary ran it when it woke
	resp, _ = post(t, e.api.URL+"/v1/finish", body)
	require.Equal(t, 409, resp.StatusCode)
	require.EqualValues(t, 0, pl.used(k))
}

// observed wraps the real store and records, per window (by its reset),
// the units reserved and the units given back: what the window was charged.
type observed struct {
	edge.Store
	mu      sync.Mutex
	charged map[int64]int64
}

func (o *observed) Take(ctx context.Context, k limiter.Key, now time.Time, a limiter.TakeArgs) (limiter.Grant, error) {
	g, err := o.Store.Take(ctx, k, now, a)
	if err == nil && g.Granted > 0 {
		o.mu.Lock()
		o.charged[g.ResetAt.Unix()] += g.Granted
		o.mu.Unlock()
	}
	return g, err
}

func (o *observed) TakeAsync(k limiter.Key, now time.Time, a limiter.TakeArgs, done func(limiter.Grant, error)) {
	o.Store.TakeAsync(k, now, a, func(g limiter.Grant, err error) {
		if err == nil && g.Granted > 0 {
			o.mu.Lock()
			o.charged[g.ResetAt.Unix()] += g.Granted
			o.mu.Unlock()
		}
		done(g, err)
	})
}

func (o *observed) Apply(ctx context.Context, shard int, now time.Time, evs []limiter.Event) (limiter.ApplyResult, error) {
	res, err := o.Store.Apply(ctx, shard, now, evs)
	if err == nil {
		o.mu.Lock()
		for i, r := range res.Results {
			if r.Outcome != limiter.Applied {
				continue
			}
			switch evs[i].Kind {
			case limiter.Charge:
				o.charged[r.ResetAt.Unix()] += r.Amount
			default:
				o.charged[r.ResetAt.Unix()] -= r.Amount
			}
		}
		o.mu.Unlock()
	}
	return res, err
}

// Windows roll over while two edges are under load: every allowed request
// is charged in the window its response showed, and no window admits more
// than its limit.
func TestRolloverUnderLoadChargesEveryRequest(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 40, Window: 2 * time.Second}
	var stores []*observed
	var edges []*edgeUnderTest
	for range 2 {
		o := &observed{charged: map[int64]int64{}}
		edges = append(edges, pl.edge(func(opts *edge.Options) {
			o.Store = opts.Store
			opts.Store = o
			opts.Outbox.Route = outbox.RouteDirect // so that releases go through the observed store
		}))
		stores = append(stores, o)
	}
	var mu sync.Mutex
	allowed := map[int64]int64{}
	var wg sync.WaitGroup
	deadline := time.Now().Add(7 * time.Second) // windows of 2 to 3 s: at least two rollovers
	for _, e := range edges {
		for range 8 {
			wg.Go(func() {
				for time.Now().Before(deadline) {
					resp, m := check(t, e, "rolling")
					if resp.StatusCode == 200 {
						mu.Lock()
						allowed[int64(m["reset"].(float64))]++
						mu.Unlock()
					}
					time.Sleep(2 * time.Millisecond)
				}
			})
		}
	}
	wg.Wait()
	// Unused credit of the current window is given back when the edges stop.
	for _, e := range edges {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		require.NoError(t, e.srv.Close(ctx))
		cancel()
	}
	require.GreaterOrEqual(t, len(allowed), 3, "the run spans several windows: %v", allowed)
	charged := map[int64]int64{}
	for _, o := range stores {
		for r, n := range o.charged {
			charged[r] += n
		}
	}
	for r, n := range allowed {
		require.LessOrEqual(t, n, int64(40), "window %d", r)
		require.GreaterOrEqual(t, charged[r], n, "window %d: every allowed request charged in the window its response showed", r)
		require.LessOrEqual(t, charged[r], int64(40), "window %d: charges within the limit", r)
	}
	t.Logf("allowed per window %v, charged %v", allowed, charged)
}

// A primary without persistence restarts empty under two edges. Before
// anyone reserves there again, the edges re-assert what they hold in its
// windows: the hot key, full before, admits nothing more in its window
// (without the reseed the empty primary opened it again, and the edges'
// rereads of the full window found it gone); the other windows hold
// exactly what their clients were allowed, their 304s given back. What no
// live edge held is the bound docs/operations.md states: a window whose
// only edge stopped before the restart opens again, and its client gets
// its limit once more.
func TestPrimaryRestartedEmptyLosesNothing(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 50, Window: time.Minute}
	a, b, gone := pl.edge(patient), pl.edge(patient), pl.edge(patient)
	edges := []*edgeUnderTest{a, b}
	require.EqualValues(t, 50, hammer(t, edges, "hot", 8, 8))
	require.EqualValues(t, 50, hammer(t, []*edgeUnderTest{gone}, "alone", 8, 8))
	gone.close(t)
	var cold []limiter.Key
	for i := range 20 {
		e, id := edges[i%2], fmt.Sprintf("cold-%d", i)
		require.Equal(t, 200, get(t, e.proxy.URL, id).StatusCode)
		require.Equal(t, 200, get(t, e.proxy.URL, id).StatusCode)
		require.Equal(t, 304, get(t, e.proxy.URL, id, "If-None-Match", `"v1"`).StatusCode)
		cold = append(cold, pl.keys.Key("core", "h:"+id))
	}
	for _, k := range cold { // what the edges held unused goes back (idle_release)
		pl.waitUsed(k, 2)
	}

	pl.primary.Restart()
	pl.replica.WaitLinkUp()
	allowed := 0
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		for _, e := range edges {
			if resp, _ := check(t, e, "hot"); resp.StatusCode == 200 {
				allowed++
			}
		}
	}
	require.Zero(t, allowed, "the full window let more through after its primary came back empty")
	require.EqualValues(t, 50, pl.used(pl.keys.Key("core", "h:hot")))
	for _, k := range cold {
		require.EqualValues(t, 2, pl.used(k))
	}
	for _, e := range edges {
		require.Positive(t, metric(t, e, `tally_edge_reseeded_windows_total{outcome="opened"}`), "windows re-asserted")
		require.Zero(t, metric(t, e, `tally_edge_reseeds_total{timing="late"}`))
	}
	require.EqualValues(t, 50, hammer(t, edges, "alone", 8, 8), "a window no live edge held: its limit once more, no more")
}
