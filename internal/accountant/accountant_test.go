package accountant_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// fixture: one shard (primary + replica), an embedded JetStream, a key space.
type fixture struct {
	t       *testing.T
	primary *redistest.Server
	replica *redistest.Server
	nats    *natstest.Server
	js      jetstream.JetStream
	store   *limiter.Store
	keys    *limiter.KeySpace
	cfg     accountant.Config
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	p, r := redistest.StartPair(t)
	ns := natstest.Start(t)
	_, js := ns.Connect()
	f := &fixture{t: t, primary: p, replica: r, nats: ns, js: js}
	f.store = f.newStore()
	var err error
	f.keys, err = limiter.NewKeySpace("tally", []byte("secret"))
	require.NoError(t, err)
	f.cfg = accountant.Config{
		Consumer: events.ConsumerConfig{AckWait: 2 * time.Second, PinnedTTL: time.Second},
		RetryMin: 50 * time.Millisecond, RetryMax: 200 * time.Millisecond,
	}
	require.NoError(t, events.EnsureStreams(context.Background(), js, f.cfg.Stream))
	return f
}

func (f *fixture) newStore() *limiter.Store {
	st, err := limiter.NewStore([]shard.Config{{Name: "s0", Primary: shard.Node{Addr: f.primary.Addr},
		Replicas: []shard.Node{{Addr: f.replica.Addr}}}}, limiter.Options{})
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = st.Close() })
	return st
}

// start runs an accountant on its own NATS connection until the returned
// stop is called (graceful) or the connection is closed (a crash).
func (f *fixture) start() (*accountant.Accountant, *nats.Conn, func()) {
	f.t.Helper()
	nc, js := f.nats.Connect()
	a := accountant.New(js, f.store, f.keys, f.cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = a.Run(ctx); close(done) }()
	stop := func() {
		cancel()
		select {
		case <-done:
			require.NoError(f.t, runErr)
		case <-time.After(15 * time.Second):
			f.t.Fatal("accountant did not stop in 15s")
		}
	}
	f.t.Cleanup(func() { cancel(); <-done })
	return a, nc, stop
}

func (f *fixture) event(k limiter.Key, kind events.Kind, reqID string, status int) events.Event {
	return events.Event{
		ID: events.EventID(reqID, kind), Kind: kind, Source: "test", Time: time.Now(), Shard: "s0",
		Data: events.Request{RequestID: reqID, Key: k.Digest(), Policy: "core", Limit: 100,
			WindowSeconds: 60, Cost: 1, StartedAt: time.Now(), Status: status},
	}
}

func (f *fixture) publish(e events.Event) {
	f.t.Helper()
	m, err := events.Encode(f.cfg.Stream.WithDefaults().SubjectPrefix, e)
	require.NoError(f.t, err)
	_, err = f.js.PublishMsg(context.Background(), m)
	require.NoError(f.t, err)
}

func (f *fixture) used(k limiter.Key) int64 {
	w, err := f.store.Check(context.Background(), k)
	require.NoError(f.t, err)
	return w.Used
}

// waitUsed waits (bounded) until k's window shows want, and fails otherwise.
func (f *fixture) waitUsed(k limiter.Key, want int64) {
	f.t.Helper()
	var got int64
	for range 300 {
		f.replica.WaitSynced(f.primary)
		if got = f.used(k); got == want {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.t.Fatalf("used = %d, want %d", got, want)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 300 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestChargeRefundAndDuplicates(t *testing.T) {
	f := newFixture(t)
	a, _, stop := f.start()
	k := f.keys.Key("core", "alice")
	for i := range 5 {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("r%d", i), 0))
	}
	f.waitUsed(k, 5)

	// The same event published twice (JetStream dedupes), and the same
	// request under another message id (Redis dedupes): one charge each.
	f.publish(f.event(k, events.KindStarted, "r0", 0))
	dup := f.event(k, events.KindStarted, "r1", 0)
	m, err := events.Encode("tally.events", dup)
	require.NoError(t, err)
	m.Header.Set(events.HeaderMsgID, "another-id")
	_, err = f.js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	waitFor(t, "the duplicate", func() bool { return a.Stats().Duplicates == 1 })

	// 304 refunds, 200 does not.
	f.publish(f.event(k, events.KindFinished, "r2", 304))
	f.publish(f.event(k, events.KindFinished, "r3", 200))
	f.waitUsed(k, 4)
	waitFor(t, "the ignored finish", func() bool { return a.Stats().Ignored == 1 })
	// The refund again: nothing more.
	f.publish(f.event(k, events.KindFinished, "r2", 304))
	m, err = events.Encode("tally.events", f.event(k, events.KindFinished, "r2", 304))
	require.NoError(t, err)
	m.Header.Set(events.HeaderMsgID, "refund-again")
	_, err = f.js.PublishMsg(context.Background(), m)
	require.NoError(t, err)
	waitFor(t, "the duplicate refund", func() bool { return a.Stats().Duplicates == 2 })
	stop()
	require.EqualValues(t, 4, f.used(k))
	s := a.Stats()
	require.EqualValues(t, 5, s.Charged)
	require.EqualValues(t, 1, s.Refunded)
}

func TestPoisonEventIsDeadLettered(t *testing.T) {
	f := newFixture(t)
	a, _, stop := f.start()
	defer stop()
	k := f.keys.Key("core", "alice")
	ctx := context.Background()

	bad := []*nats.Msg{
		{Subject: "tally.events.s0.started", Data: []byte("not json"), Header: nats.Header{"ce-specversion": {"1.0"}}},
		func() *nats.Msg { // valid event, wrong shard in its attributes
			e := f.event(k, events.KindStarted, "wrong-shard", 0)
			e.Shard = "s9"
			m, err := events.Encode("tally.events", e)
			require.NoError(t, err)
			m.Subject = "tally.events.s0.started"
			return m
		}(),
		func() *nats.Msg { // valid envelope, invalid data
			m, err := events.Encode("tally.events", f.event(k, events.KindStarted, "bad-data", 0))
			require.NoError(t, err)
			m.Data = []byte(`{"request_id":"bad-data","key":"alice","policy":"core","limit":1,"window_s":60,"cost":1,"started_at":"2026-01-01T00:00:00Z"}`)
			return m
		}(),
	}
	for _, m := range bad {
		_, err := f.js.PublishMsg(ctx, m)
		require.NoError(t, err)
	}
	f.publish(f.event(k, events.KindStarted, "good", 0))
	f.waitUsed(k, 1)
	waitFor(t, "three dead letters", func() bool { return a.Stats().DeadLettered == 3 })

	dlq, err := f.js.Stream(ctx, "TALLY_DLQ")
	require.NoError(t, err)
	info, err := dlq.Info(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, info.State.Msgs)
	msg, err := dlq.GetMsg(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, "tally.dlq.s0", msg.Subject)
	require.Equal(t, "tally.events.s0.started", msg.Header.Get(accountant.HeaderDeadSubject))
	require.Contains(t, msg.Header.Get(accountant.HeaderDeadReason), "invalid event")
	require.Equal(t, []byte("not json"), msg.Data, "the original body, for replay")

	// The dead events are terminated: the consumer has nothing pending.
	cons, err := f.js.Consumer(ctx, "TALLY_EVENTS", "accountant-s0")
	require.NoError(t, err)
	waitFor(t, "no pending acks", func() bool {
		ci, err := cons.Info(ctx)
		return err == nil && ci.NumAckPending == 0 && ci.NumPending == 0
	})
}

// An accountant that dies between Redis and its acks: the events are
// redelivered to the next one and apply exactly once.
func TestCrashBetweenRedisAndAck(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := f.keys.Key("core", "alice")
	const n = 50
	for i := range n {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("r%d", i), 0))
	}

	// The doomed accountant: pulls a batch, applies it to Redis, dies
	// before acking (its connection closes).
	nc, js := f.nats.Connect()
	cons, err := events.EnsureConsumer(ctx, js, f.cfg.Stream, f.cfg.Consumer, "s0")
	require.NoError(t, err)
	batch, err := cons.Fetch(30, jetstream.FetchMaxWait(5*time.Second), jetstream.FetchPriorityGroup(events.Group))
	require.NoError(t, err)
	var ops []limiter.Op
	for m := range batch.Messages() {
		e, err := events.Decode(m.Headers(), m.Data())
		require.NoError(t, err)
		ops = append(ops, limiter.Op{Kind: limiter.OpCharge, Key: k, EventID: e.Data.RequestID,
			Start: e.Data.StartedAt, Cost: 1, Window: time.Minute})
	}
	require.Len(t, ops, 30)
	_, err = f.store.Apply(ctx, 0, ops)
	require.NoError(t, err)
	nc.Close()
	f.waitUsed(k, 30)

	// The next accountant gets the 30 again (after AckWait, or the pin
	// expiring) and the 20 the first never took.
	a, _, stop := f.start()
	f.waitUsed(k, n)
	waitFor(t, "the redeliveries", func() bool { return a.Stats().Duplicates == 30 })
	stop()
	require.EqualValues(t, n, f.used(k))
	require.EqualValues(t, n-30, a.Stats().Charged)
}

// Two accountants on the same shards: no double charge, and the second
// takes over when the first stops.
func TestSecondAccountantTakesOver(t *testing.T) {
	f := newFixture(t)
	k := f.keys.Key("core", "alice")
	a1, _, stop1 := f.start()
	a2, _, stop2 := f.start()
	defer stop2()
	for i := range 100 {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("a%d", i), 0))
	}
	f.waitUsed(k, 100)
	// Counters move just after Redis confirms a batch.
	waitFor(t, "the counters", func() bool { return a1.Stats().Charged+a2.Stats().Charged >= 100 })
	s1, s2 := a1.Stats(), a2.Stats()
	require.EqualValues(t, 100, s1.Charged+s2.Charged)
	require.Zero(t, s1.Duplicates+s2.Duplicates, "no event was applied twice")
	require.True(t, s1.Charged == 0 || s2.Charged == 0, "one pinned accountant did the work: %d and %d", s1.Charged, s2.Charged)

	// Stop whichever is active; the other takes over.
	active, standby := a1, a2
	stopActive := stop1
	if s2.Charged > 0 {
		active, standby = a2, a1
		stopActive = stop2
	}
	before := active.Stats().Charged
	stopActive()
	for i := range 50 {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("b%d", i), 0))
	}
	f.waitUsed(k, 150)
	require.EqualValues(t, before, active.Stats().Charged)
	require.EqualValues(t, 50, standby.Stats().Charged)
}

// The shard primary goes away and comes back empty (no script cache) while
// events flow: they wait in JetStream and then apply, none lost.
func TestPrimaryRestartWhileEventsFlow(t *testing.T) {
	f := newFixture(t)
	k := f.keys.Key("core", "alice")
	a, _, stop := f.start()
	defer stop()
	f.primary.Stop()
	for i := range 40 {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("r%d", i), 0))
	}
	waitFor(t, "failed attempts", func() bool { return a.Stats().Retries >= 2 })
	require.Zero(t, a.Stats().Charged)
	f.primary.Restart()
	f.replica.WaitLinkUp()
	f.waitUsed(k, 40)
	require.EqualValues(t, 40, a.Stats().Charged)
	require.Zero(t, a.Stats().DeadLettered)
}

// Streams and consumers are created or updated idempotently at start-up.
func TestStreamsAndConsumersAreIdempotent(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	require.NoError(t, events.EnsureStreams(ctx, f.js, f.cfg.Stream), "again, unchanged")
	changed := f.cfg.Stream
	changed.MaxAge = time.Hour
	require.NoError(t, events.EnsureStreams(ctx, f.js, changed), "updated in place")
	st, err := f.js.Stream(ctx, "TALLY_EVENTS")
	require.NoError(t, err)
	info, err := st.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, time.Hour, info.Config.MaxAge)
	require.Equal(t, jetstream.DiscardNew, info.Config.Discard)
	require.Equal(t, 2*time.Minute, info.Config.Duplicates)
	require.Equal(t, jetstream.FileStorage, info.Config.Storage)

	for range 2 {
		cons, err := events.EnsureConsumer(ctx, f.js, f.cfg.Stream, f.cfg.Consumer, "s0")
		require.NoError(t, err)
		ci, err := cons.Info(ctx)
		require.NoError(t, err)
		require.Equal(t, -1, ci.Config.MaxDeliver, "transient failures must never exhaust deliveries")
		require.Equal(t, jetstream.PriorityPolicyPinned, ci.Config.PriorityPolicy)
		require.Equal(t, []string{"tally.events.s0.started", "tally.events.s0.finished"}, ci.Config.FilterSubjects)
	}
	for _, bad := range []events.StreamConfig{{Storage: "tape"}, {Discard: "maybe"}, {Replicas: 9}, {Duplicates: time.Hour, MaxAge: time.Minute}} {
		require.ErrorIs(t, events.EnsureStreams(ctx, f.js, bad), events.ErrInvalidConfig)
	}
	_, err = events.EnsureConsumer(ctx, f.js, f.cfg.Stream, f.cfg.Consumer, "S 0")
	require.ErrorIs(t, err, events.ErrInvalidConfig)
}

// The configured primary was demoted (a failover the configuration has not
// caught up with): writes fail with READONLY, events wait, and apply once
// the node is a primary again.
func TestReadOnlyPrimaryWaitsThenApplies(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := f.keys.Key("core", "alice")
	other := redistest.Start(t)
	require.NoError(t, f.primary.Client().Do(ctx, "REPLICAOF", "127.0.0.1", other.Port).Err())
	a, _, stop := f.start()
	defer stop()
	for i := range 10 {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("r%d", i), 0))
	}
	waitFor(t, "failed attempts", func() bool { return a.Stats().Retries >= 2 })
	require.Zero(t, a.Stats().Charged)
	require.NoError(t, f.primary.Client().Do(ctx, "REPLICAOF", "NO", "ONE").Err())
	f.replica.WaitLinkUp()
	f.waitUsed(k, 10)
	require.EqualValues(t, 10, a.Stats().Charged)
	require.Zero(t, a.Stats().DeadLettered, "READONLY is transient, never poison")
}

// Shutdown drains: every event the accountant applied is acknowledged
// before it stops. Events the server had already sent towards it but that it
// never received stay unapplied and are redelivered to the next accountant
// after the ack wait; none is applied twice, none is lost.
func TestShutdownDrains(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := f.keys.Key("core", "alice")
	for i := range 500 {
		f.publish(f.event(k, events.KindStarted, fmt.Sprintf("r%d", i), 0))
	}
	a, _, stop := f.start()
	waitFor(t, "some charges", func() bool { return a.Stats().Charged > 0 })
	stop()
	charged := a.Stats().Charged
	f.waitUsed(k, int64(charged))
	// The server handles acks asynchronously: give it a moment, well under
	// the 2s ack wait after which unacknowledged events would be redelivered.
	cons, err := f.js.Consumer(ctx, "TALLY_EVENTS", "accountant-s0")
	require.NoError(t, err)
	var accounted int
	for range 50 {
		ci, err := cons.Info(ctx)
		require.NoError(t, err)
		// Applied-but-unacknowledged events would be counted twice here.
		if accounted = int(charged) + int(ci.NumPending) + ci.NumAckPending; accounted == 500 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Equal(t, 500, accounted, "every event is applied and acked, waiting, or in flight and unapplied")

	// The next accountant finishes the rest, with no duplicates.
	b, _, stopB := f.start()
	defer stopB()
	f.waitUsed(k, 500)
	require.Zero(t, b.Stats().Duplicates)
}
