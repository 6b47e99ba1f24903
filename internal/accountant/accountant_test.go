package accountant_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/testutil"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fixture: one shard (primary + replica), an embedded JetStream with Tally's
// streams, a key space.
type fixture struct {
	t       *testing.T
	primary *redistest.Server
	replica *redistest.Server
	nats    *natstest.Server
	js      jetstream.JetStream
	store   *redisstore.Store
	keys    *limiter.KeySpace
	cfg     accountant.Config
	streams events.Streams
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	p, r := redistest.StartPair(t)
	ns := natstest.Start(t)
	_, js := ns.Connect()
	f := &fixture{t: t, primary: p, replica: r, nats: ns, js: js, streams: events.Streams{}.WithDefaults()}
	var err error
	f.keys, err = limiter.NewKeySpace("tally", []byte(testSecret))
	require.NoError(t, err)
	f.store = f.newStore()
	f.cfg = accountant.Config{LeaseTTL: time.Second, RetryMin: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		PurgeEvery: 20 * time.Millisecond, MaxAttempts: 3}
	require.NoError(t, events.EnsureStreams(context.Background(), js, f.streams, []string{"s0"}))
	return f
}

// testSecret is the tests' key secret (32 bytes).
const testSecret = "accountant-tests-secret-01234567"

func (f *fixture) newStore() *redisstore.Store {
	st, err := redisstore.NewStore([]shard.Config{{Name: "s0", Primary: shard.Node{Addr: f.primary.Addr},
		Replicas: []shard.Node{{Addr: f.replica.Addr}}}}, f.keys, redisstore.Options{WaitTimeout: 200 * time.Millisecond})
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = st.Close() })
	return st
}

// running is an accountant in the test's process.
type running struct {
	*accountant.Accountant
	nc    *nats.Conn
	store *redisstore.Store
	stop  func() // graceful
	crash func() // connections cut at once, lease left behind
}

// start runs an accountant with its own NATS connection (as the shipped
// permissions' accountant) and Redis store.
func (f *fixture) start(mut ...func(*accountant.Config)) *running {
	f.t.Helper()
	return f.startWithKeys(f.keys, mut...)
}

// startWithKeys is start with another key space (another secret).
func (f *fixture) startWithKeys(keys *limiter.KeySpace, mut ...func(*accountant.Config)) *running {
	f.t.Helper()
	nc, js := f.nats.ConnectAs("accountant")
	cfg := f.cfg
	for _, m := range mut {
		m(&cfg)
	}
	st := f.newStore()
	a := accountant.New(js, st, keys, cfg, quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = a.Run(ctx); close(done) }()
	wait := func() {
		select {
		case <-done:
			require.NoError(f.t, runErr)
		case <-time.After(15 * time.Second):
			f.t.Fatal("accountant did not stop in 15s")
		}
	}
	var once sync.Once
	r := &running{Accountant: a, nc: nc, store: st}
	r.stop = func() { once.Do(func() { cancel(); wait() }) }
	r.crash = func() { once.Do(func() { nc.Close(); _ = st.Close(); cancel(); <-done }) }
	f.t.Cleanup(func() { once.Do(func() { cancel(); <-done }) })
	return r
}

// reset is the reset of a one-minute window opened now.
func reset() time.Time { return time.Now().Truncate(time.Second).Add(time.Minute) }

func started(producer string, seq uint64, k limiter.Key, r time.Time, units int64) events.Accounting {
	return events.Accounting{Kind: events.Started, Producer: producer, Seq: seq, Source: "test", Time: time.Now(),
		Key: k.Digest().String(), Policy: "core", Limit: 100, WindowSeconds: 60, Units: units, ResetAt: r, StartedAt: time.Now()}
}

func finished(producer string, seq uint64, k limiter.Key, r time.Time, status int, chargeProducer string, chargeSeq uint64) events.Accounting {
	e := started(producer, seq, k, r, 1)
	e.Kind, e.Status, e.ChargeProducer, e.ChargeSeq = events.Finished, status, chargeProducer, chargeSeq
	return e
}

func released(producer string, seq uint64, k limiter.Key, r time.Time, units int64) events.Accounting {
	e := started(producer, seq, k, r, units)
	e.Kind = events.Released
	return e
}

// publish publishes one batch; msgID, when set, replaces the Nats-Msg-Id
// (so that JetStream stores a republished batch again).
func (f *fixture) publish(batch []events.Accounting, msgID ...string) {
	f.t.Helper()
	for i := range batch {
		if batch[i].KeyID == "" {
			batch[i].KeyID = f.keys.KeyID()
		}
	}
	m, err := events.AccountingMsg(f.streams.Accounting.SubjectPrefix, "s0", batch, nil)
	require.NoError(f.t, err)
	if len(msgID) > 0 {
		m.Header.Set(events.HeaderMsgID, msgID[0])
	}
	_, err = f.js.PublishMsg(context.Background(), m)
	require.NoError(f.t, err)
}

// publishRaw publishes body as producer "raw" on shard s0.
func (f *fixture) publishRaw(body string) {
	f.t.Helper()
	_, err := f.js.Publish(context.Background(), events.AccountingSubject(f.streams.Accounting.SubjectPrefix, "s0", "raw"), []byte(body))
	require.NoError(f.t, err)
}

// take reserves units of k's one-minute window for producer, as an edge
// does before it admits requests.
func (f *fixture) take(producer string, k limiter.Key, units int64) limiter.Grant {
	f.t.Helper()
	g, err := f.store.Take(context.Background(), k, time.Now(), limiter.TakeArgs{Window: time.Minute, Limit: 100,
		Need: units, Want: units, Producer: producer})
	require.NoError(f.t, err)
	require.EqualValues(f.t, units, g.Granted)
	return g
}

// used is k's window's count on the primary; while the shard reseeds (its
// primary changed) it waits, bounded, for the reseed's end.
func (f *fixture) used(k limiter.Key) int64 {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		g, err := f.store.Take(context.Background(), k, time.Now(), limiter.TakeArgs{Window: time.Minute, Limit: 1, Producer: "reader"})
		if errors.Is(err, redisstore.ErrReseeding) && time.Now().Before(deadline) {
			continue
		}
		require.NoError(f.t, err)
		return g.Used
	}
}

// waitUsed waits (bounded) until k's window shows want, and fails otherwise.
func (f *fixture) waitUsed(k limiter.Key, want int64) {
	f.t.Helper()
	var got int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = f.used(k); got == want {
			return
		}
	}
	f.t.Fatalf("used = %d, want %d (after 30 s)", got, want)
}

// streamMsgs is how many messages the accounting stream holds.
func (f *fixture) streamMsgs() uint64 {
	st, err := f.js.Stream(context.Background(), f.streams.Accounting.Name)
	require.NoError(f.t, err)
	info, err := st.Info(context.Background())
	require.NoError(f.t, err)
	return info.State.Msgs
}

// Charges, 304 refunds (of a charge and of a reservation) and releases are
// applied; other statuses change nothing; the stream keeps nothing applied.
func TestAppliesAndEmptiesTheStream(t *testing.T) {
	f := newFixture(t)
	k := f.keys.Key("core", "alice")
	r := f.take("edge-2", k, 4).ResetAt // what edge-2 gives back below
	a := f.start()
	f.publish([]events.Accounting{
		started("edge-1", 1, k, r, 5),
		finished("edge-1", 2, k, r, 304, "edge-1", 1), // refunds 1 of the 5 (units 1)
		finished("edge-1", 3, k, r, 200, "", 0),       // nothing to refund
		started("edge-1", 4, k, time.Time{}, 2),       // placed by its start
	})
	f.publish([]events.Accounting{finished("edge-2", 1, k, r, 304, "", 0), released("edge-2", 2, k, r, 3)})
	f.waitUsed(k, 4+5-1+2-1-3)
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	s := a.Stats()
	require.EqualValues(t, 2, s.Charged)
	require.EqualValues(t, 2, s.Refunded)
	require.EqualValues(t, 1, s.Released)
	require.EqualValues(t, 1, s.Ignored)
	require.EqualValues(t, 2, s.Messages)
	require.Zero(t, s.Duplicates+s.DeadLettered)
	require.EqualValues(t, 5, s.Lag.Count)
	require.Less(t, s.Lag.Quantile(0.99), 5*time.Second)
	require.Zero(t, s.OverLimit)

	// Charges beyond the limit (admitted without a reservation) are
	// applied, and the overshoot is counted.
	over := started("edge-3", 1, k, r, 100)
	f.publish([]events.Accounting{over})
	testutil.WaitFor(t, "the charge", func() bool { return a.Stats().Charged == 3 })
	require.EqualValues(t, 6, a.Stats().OverLimit, "6 used + 100 charged: 6 over the limit of 100")
	f.waitUsed(k, 106)

	// What an operator reads on /metrics.
	testutil.WaitFor(t, "a record per event applied (none for the 200)", func() bool {
		return scrape(t, a)[`tally_accountant_decision_records_total{outcome="published"}`] == 6
	})
	m := scrape(t, a)
	for name, want := range map[string]float64{
		`tally_accountant_events_total{outcome="charged"}`:           3,
		`tally_accountant_events_total{outcome="refunded"}`:          2,
		`tally_accountant_messages_total`:                            3,
		`tally_accountant_message_events_count`:                      3,
		`tally_accountant_message_events_sum`:                        7,
		`tally_accountant_message_events_bucket{le="4"}`:             3,
		`tally_accountant_message_events_bucket{le="2"}`:             2,
		`tally_accountant_over_limit_units_total`:                    6,
		`tally_accountant_pending_messages{shard="s0"}`:              0,
		`tally_accountant_shard_active{shard="s0"}`:                  1,
		`tally_accountant_repeated_messages_total`:                   0,
		`tally_accountant_script_reloads_total`:                      2, // the lease and apply scripts, first sent to a fresh Redis
		`tally_accountant_decision_records_total{outcome="dropped"}`: 0,
		`tally_accountant_lag_seconds_count`:                         6,
	} {
		got, ok := m[name]
		require.True(t, ok, "%s missing", name)
		require.Equal(t, want, got, name)
	}
}

// With ordinary outcomes sampled away, anomalies are still recorded: a
// charge past the limit and a duplicate.
func TestAnomaliesAreNeverSampledAway(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start(func(c *accountant.Config) { c.Decisions.SampleApplied = -1 })
	ordinary := started("edge-1", 1, k, r, 60)
	f.publish([]events.Accounting{ordinary, started("edge-1", 2, k, r, 50)}) // 110 of 100: over
	f.publish([]events.Accounting{ordinary}, "again")                        // a duplicate
	f.waitUsed(k, 110)
	testutil.WaitFor(t, "the duplicate", func() bool { return a.Stats().Duplicates == 1 })

	outcomes := f.outcomes(2)
	require.ElementsMatch(t, []string{"charged_over_limit", "duplicate"}, outcomes, "the ordinary charge sampled away")
}

// outcomes reads the decisions stream from its start until it holds at
// least n records (bounded), and a while longer in case more come; it
// returns their outcomes in order.
func (f *fixture) outcomes(n int) []string {
	f.t.Helper()
	sub, err := f.js.OrderedConsumer(context.Background(), f.streams.Decisions.Name, jetstream.OrderedConsumerConfig{})
	require.NoError(f.t, err)
	var outcomes []string
	read := func(wait time.Duration) {
		b, err := sub.Fetch(10, jetstream.FetchMaxWait(wait))
		require.NoError(f.t, err)
		for m := range b.Messages() {
			var recs []struct {
				Data struct{ Outcome string } `json:"data"`
			}
			require.NoError(f.t, json.Unmarshal(m.Data(), &recs))
			for _, r := range recs {
				outcomes = append(outcomes, r.Data.Outcome)
			}
		}
	}
	testutil.WaitFor(f.t, "the records", func() bool { read(100 * time.Millisecond); return len(outcomes) >= n })
	read(300 * time.Millisecond) // and nothing more
	return outcomes
}

// scrape reads an accountant's /metrics.
func scrape(t *testing.T, a *running) map[string]float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	a.AdminHandler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	m, err := metrics.ParseText(rec.Body)
	require.NoError(t, err)
	return m
}

// Invariant 6: whatever is published or read again takes effect once — a
// republished batch JetStream stored twice, a batch an edge applied itself
// before its copy arrived, a restart of the accountant.
func TestDuplicatesTakeEffectOnce(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k, r := f.keys.Key("core", "alice"), reset()
	batch := []events.Accounting{started("edge-1", 1, k, r, 1), started("edge-1", 2, k, r, 1)}
	// An edge applied the first batch itself (NATS was slow); the copy it
	// had handed to JetStream arrives anyway, twice.
	_, err := f.store.Apply(ctx, 0, time.Now(), []limiter.Event{
		{Producer: "edge-1", Seq: 1, Kind: limiter.Charge, Key: k, ResetAt: r, Start: time.Now(), Window: time.Minute, Units: 1},
		{Producer: "edge-1", Seq: 2, Kind: limiter.Charge, Key: k, ResetAt: r, Start: time.Now(), Window: time.Minute, Units: 1},
	})
	require.NoError(t, err)
	f.publish(batch, "copy-1")
	f.publish(batch, "copy-2")
	f.publish([]events.Accounting{started("edge-1", 3, k, r, 1)})
	a := f.start()
	f.waitUsed(k, 3)
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	require.EqualValues(t, 4, a.Stats().Duplicates)
	require.EqualValues(t, 1, a.Stats().Charged)
	require.EqualValues(t, 2, a.Stats().Repeated, "the two copies: every event applied before")
	a.stop()

	// After a restart, an old batch published again is still a duplicate.
	b := f.start()
	f.publish(batch, "copy-3")
	testutil.WaitFor(t, "the duplicates", func() bool { return b.Stats().Duplicates == 2 })
	require.EqualValues(t, 3, f.used(k))
	require.EqualValues(t, 1, b.Stats().Repeated)
}

// A refund or release that gives a window room again is announced to the
// edges on core NATS.
func TestRoomNotices(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	nc, _ := f.nats.Connect()
	got := make(chan *nats.Msg, 4)
	_, err := nc.ChanSubscribe(f.streams.NoticePrefix+".>", got)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	f.start()
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 3), released("edge-1", 2, k, r, 1)})
	select {
	case m := <-got:
		require.Equal(t, f.streams.NoticePrefix+".s0", m.Subject)
		ns, err := events.NewNotices(f.keys.Derive(events.NoticeKeyLabel)).Decode(m.Data, time.Now())
		require.NoError(t, err)
		require.Equal(t, []events.Notice{{Full: false, Key: k.Digest().String(), ResetAt: r, Used: 2}},
			[]events.Notice{{Full: ns[0].Full, Key: ns[0].Key, ResetAt: ns[0].ResetAt.Round(0).In(r.Location()), Used: ns[0].Used}})
	case <-time.After(5 * time.Second):
		t.Fatal("no notice")
	}
}

// A shard whose primary stays unreachable makes the accountant unready
// after twice the lease's lifetime; it recovers by itself.
func TestReadinessFollowsShards(t *testing.T) {
	f := newFixture(t)
	a := f.start()
	ctx := context.Background()
	testutil.WaitFor(t, "ready", func() bool { return a.Ready(ctx, nil) == nil && a.Shards()[0].Active })
	f.primary.Stop()
	testutil.WaitFor(t, "unready", func() bool { return a.Ready(ctx, nil) != nil })
	require.ErrorContains(t, a.Ready(ctx, nil), "shard s0 failing")
	f.primary.Restart()
	testutil.WaitFor(t, "ready again", func() bool { return a.Ready(ctx, nil) == nil && a.Shards()[0].Active })
}

// A batch waiting in the stream is still applied after a later batch of the
// same producer was applied directly (an edge whose publish timed out, or
// that applies first): nothing is skipped as a duplicate.
func TestEarlierBatchInTheStreamAfterALaterDirectOne(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k, r := f.keys.Key("core", "alice"), reset()
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 1), started("edge-1", 2, k, r, 1)})
	_, err := f.store.Apply(ctx, 0, time.Now(), []limiter.Event{
		{Producer: "edge-1", Seq: 3, Kind: limiter.Charge, Key: k, ResetAt: r, Start: time.Now(), Window: time.Minute, Units: 1},
	})
	require.NoError(t, err)
	require.EqualValues(t, 1, f.used(k))
	a := f.start()
	f.waitUsed(k, 3)
	// The counts are taken after Redis answers: the stream empties after them.
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	require.EqualValues(t, 2, a.Stats().Charged)
	require.Zero(t, a.Stats().Duplicates)
}

// Traced, the accountant's Redis calls are children of the process span of
// the message they apply (with several messages in a run, of an apply span
// linked to each).
func TestRedisCallsAreChildrenOfTheMessage(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	f := newFixture(t)
	a := f.start(func(c *accountant.Config) { c.Tracer = provider.Tracer("tally/test") })
	require.NoError(t, a.store.InstrumentTracing(provider))
	k := f.keys.Key("core", "traced")
	f.publish([]events.Accounting{started("edge-1", 1, k, reset(), 1)})
	f.waitUsed(k, 1)
	var process, evalsha tracetest.SpanStub
	testutil.WaitFor(t, "the process and Redis spans", func() bool {
		for _, s := range spans.GetSpans() {
			switch {
			case s.SpanKind == trace.SpanKindConsumer:
				process = s
			case s.Name == "evalsha" || s.Name == "eval":
				evalsha = s
			}
		}
		return process.Name != "" && evalsha.Name != "" && evalsha.Parent.SpanID() == process.SpanContext.SpanID()
	})
	require.Equal(t, process.SpanContext.TraceID(), evalsha.SpanContext.TraceID())
}
