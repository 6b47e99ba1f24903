package accountant_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/testutil"
)

// A script call whose answer is lost (the primary froze past the read
// timeout, then ran it) is tried again; the records say what the lost call
// did — the refund was applied — not that the retry found it applied
// before.
func TestLostAnswerIsRecordedAsWhatItDid(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start()
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 5)})
	f.waitUsed(k, 5)

	f.primary.Pause()
	f.publish([]events.Accounting{finished("edge-1", 2, k, r, 304, "edge-1", 1)})
	testutil.WaitFor(t, "a call that timed out", func() bool { return a.Stats().Retries > 0 })
	f.primary.Resume()
	f.waitUsed(k, 4)
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	require.Equal(t, []string{"charged", "refunded"}, f.outcomes(2))
	require.EqualValues(t, 1, a.Stats().Refunded)
	require.Zero(t, a.Stats().Duplicates)
}

// The same, when the lease is lost while the answer is: the primary froze
// long enough for the shard to be handed over, and the worker's last try
// also timed out. When the primary answers again, this process takes the
// shard back and sends the run again as itself — not as a new run, which
// would find the refund applied and record it as a duplicate (the
// decisions stream would then count one refund too few).
func TestLostAnswerOutlivesALostLease(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start()
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 5)})
	f.waitUsed(k, 5)

	f.primary.Pause()
	f.publish([]events.Accounting{finished("edge-1", 2, k, r, 304, "edge-1", 1)})
	testutil.WaitFor(t, "a call that timed out", func() bool { return a.Stats().Retries > 0 })
	testutil.WaitFor(t, "the shard let go", func() bool { return !a.Shards()[0].Active })
	f.primary.Resume()
	f.waitUsed(k, 4)
	testutil.WaitFor(t, "the shard taken back", func() bool { return a.Shards()[0].Active })
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	require.Equal(t, []string{"charged", "refunded"}, f.outcomes(2))
	require.EqualValues(t, 1, a.Stats().Refunded)
	require.Zero(t, a.Stats().Duplicates)
}

// Invariant 7 across a crash: an accountant killed while events flow (its
// lease left behind, whatever it applied not yet deleted from the stream)
// is replaced within the lease's lifetime, and every event is applied
// exactly once.
func TestCrashHandOverIsExactlyOnce(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "hot"), reset()
	a := f.start()
	b := f.start() // standby
	var seq atomic.Uint64
	stop := make(chan struct{})
	published := make(chan struct{})
	go func() {
		defer close(published)
		for {
			select {
			case <-stop:
				return
			default:
			}
			var batch []events.Accounting
			for range 10 {
				batch = append(batch, started("edge-1", seq.Add(1), k, r, 1))
			}
			f.publish(batch)
			time.Sleep(2 * time.Millisecond)
		}
	}()
	testutil.WaitFor(t, "a shard served", func() bool { return a.Shards()[0].Active || b.Shards()[0].Active })
	leader, standby := a, b
	if b.Shards()[0].Active {
		leader, standby = b, a
	}
	testutil.WaitFor(t, "charges", func() bool { return leader.Stats().Charged > 100 })
	crashed := time.Now()
	leader.crash()
	testutil.WaitFor(t, "the standby takes over", func() bool { return standby.Shards()[0].Active })
	handOver := time.Since(crashed)
	testutil.WaitFor(t, "charges after the hand-over", func() bool { return standby.Stats().Charged > 100 })
	close(stop)
	<-published
	f.waitUsed(k, int64(seq.Load()))
	require.Less(t, handOver, 3*time.Second, "within the lease's lifetime (1s) and a poll")
	t.Logf("hand-over after a crash: %v; events %d; applied by the standby %d, duplicates %d",
		handOver.Round(time.Millisecond), seq.Load(), standby.Stats().Charged, standby.Stats().Duplicates)
}

// A graceful stop frees the lease: the standby takes over at once.
func TestGracefulHandOver(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start()
	testutil.WaitFor(t, "a serves", func() bool { return a.Shards()[0].Active })
	b := f.start()
	testutil.WaitFor(t, "b to ask for the lease", func() bool { return b.Shards()[0].Leasing })
	require.False(t, b.Shards()[0].Active, "one accountant per shard")
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 1)})
	f.waitUsed(k, 1)
	a.stop()
	stopped := time.Now() // a freed its lease on its way out
	testutil.WaitFor(t, "b serves", func() bool { return b.Shards()[0].Active })
	require.Less(t, time.Since(stopped), time.Second, "b polls every quarter of the lease's lifetime")
	f.publish([]events.Accounting{started("edge-1", 2, k, r, 1)})
	f.waitUsed(k, 2)
}

// Messages that can never be applied are dead-lettered with their reason;
// the shard goes on with the next ones.
func TestPoisonMessagesAreDeadLettered(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k, r := f.keys.Key("core", "alice"), reset()
	dlq, err := f.js.CreateOrUpdateConsumer(ctx, f.streams.DeadLetters.Name, jetstream.ConsumerConfig{Durable: "inspect"})
	require.NoError(t, err)
	other := started("edge-9", 1, k, r, 1)
	other.Policy, other.WindowSeconds = "core", 3600 // a window nobody configured
	f.publishRaw(`{"not":"an event"`)
	f.publish([]events.Accounting{other})
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 2)})
	tier := started("edge-2", 1, k, r, 1)
	tier.Limit = 5000 // a client's own limit (a tier, an override, a temporary limit): applied
	f.publish([]events.Accounting{tier})
	a := f.start(func(c *accountant.Config) {
		c.Policies = map[string]limiter.Policy{"core": {Name: "core", Limit: 100, Window: time.Minute}}
	})
	f.waitUsed(k, 3)
	testutil.WaitFor(t, "dead letters", func() bool { return a.Stats().DeadLettered == 2 })
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	var reasons []string
	for range 2 {
		m, err := dlq.Next(jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		reasons = append(reasons, m.Headers().Get(accountant.HeaderDeadReason))
		require.Contains(t, []string{"tally.accounting.s0.raw", "tally.accounting.s0.edge-9"}, m.Headers().Get(accountant.HeaderDeadSubject))
		require.NotEmpty(t, m.Headers().Get(accountant.HeaderDeadSeq))
	}
	require.Contains(t, reasons[0], "invalid event")
	require.Contains(t, reasons[1], "not configured")
}

// A Redis error that persists (a key of the wrong type) dead-letters the
// message that causes it after a few attempts; the messages around it are
// applied.
func TestPermanentRedisErrorIsDeadLettered(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k, bad, r := f.keys.Key("core", "alice"), f.keys.Key("core", "broken"), reset()
	require.NoError(t, f.primary.Client().RPush(ctx, bad.String(), "not a window").Err())
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 1)})
	f.publish([]events.Accounting{started("edge-1", 2, bad, r, 1)})
	f.publish([]events.Accounting{started("edge-1", 3, k, r, 1)})
	a := f.start()
	f.waitUsed(k, 2)
	testutil.WaitFor(t, "the dead letter", func() bool { return a.Stats().DeadLettered == 1 })
	require.GreaterOrEqual(t, a.Stats().Retries, uint64(3))
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
}

// A message that mixes a broken window's event with others' (an edge
// batches a shard's events together) loses only that event to the dead
// letters: the others are applied, and the dead letter holds what Redis
// refused and nothing else.
func TestRefusedEventIsSetAsideAlone(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k, bad, r := f.keys.Key("core", "alice"), f.keys.Key("core", "broken"), reset()
	require.NoError(t, f.primary.Client().RPush(ctx, bad.String(), "not a window").Err())
	dlq, err := f.js.CreateOrUpdateConsumer(ctx, f.streams.DeadLetters.Name, jetstream.ConsumerConfig{Durable: "inspect"})
	require.NoError(t, err)
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 1), started("edge-1", 2, bad, r, 1), started("edge-1", 3, k, r, 2)})
	a := f.start()
	f.waitUsed(k, 3)
	testutil.WaitFor(t, "the dead letter", func() bool { return a.Stats().DeadLettered == 1 })
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	m, err := dlq.Next(jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	require.Contains(t, m.Headers().Get(accountant.HeaderDeadReason), "1 of its 3 events")
	require.Contains(t, m.Headers().Get(accountant.HeaderDeadReason), "WRONGTYPE")
	evs, err := events.DecodeAccounting("s0", "edge-1", m.Headers(), m.Data())
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, bad.Digest().String(), evs[0].Key)
	require.EqualValues(t, 2, evs[0].Seq, "republished as it was: its producer number makes a replay safe")
}

// Transient failures — a primary that is down, or read-only after a
// failover the configuration has not caught up with — hold the shard's
// place: events wait in the stream and apply once it is back, none lost.
func TestTransientFailuresWaitThenApply(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start()
	testutil.WaitFor(t, "a serves", func() bool { return a.Shards()[0].Active })

	other := redistest.Start(t)
	require.NoError(t, f.primary.Client().Do(ctx, "REPLICAOF", "127.0.0.1", other.Port).Err())
	for i := range uint64(10) {
		f.publish([]events.Accounting{started("edge-1", i+1, k, r, 1)})
	}
	testutil.WaitFor(t, "the shard failing", func() bool { return a.Shards()[0].Err != nil })
	require.Zero(t, a.Stats().Charged)
	require.NoError(t, f.primary.Client().Do(ctx, "REPLICAOF", "NO", "ONE").Err())
	f.replica.WaitLinkUp()
	f.waitUsed(k, 10)
	require.Zero(t, a.Stats().DeadLettered, "READONLY is transient, never poison")
	testutil.WaitFor(t, "the applied events purged", func() bool { return f.streamMsgs() == 0 })

	f.primary.Stop()
	for i := range uint64(10) {
		f.publish([]events.Accounting{started("edge-1", i+11, k, r, 1)})
	}
	testutil.WaitFor(t, "the shard failing", func() bool { return a.Shards()[0].Err != nil })
	// Failing long enough for the accountant to say it is not ready (twice
	// the lease's lifetime): every attempt meanwhile could have deleted
	// them had it wrongly believed them applied.
	testutil.WaitFor(t, "the shard failing for two lease lifetimes", func() bool { return a.Ready(ctx, nil) != nil })
	require.EqualValues(t, 10, f.streamMsgs(), "nothing is deleted that was not applied")
	f.primary.Restart() // empty: no persistence in tests
	f.replica.WaitLinkUp()
	f.waitUsed(k, 10)
	require.Zero(t, a.Stats().DeadLettered)
}

// Applied events stay in the stream until a replica confirms them (WAIT),
// so that a failover cannot lose what the stream no longer holds.
func TestStreamKeepsWhatNoReplicaConfirmed(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start()
	f.publish([]events.Accounting{started("edge-1", 1, k, r, 1)})
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	f.replica.Stop()
	f.publish([]events.Accounting{started("edge-1", 2, k, r, 1)})
	f.waitUsed(k, 2)
	testutil.WaitFor(t, "an unconfirmed run", func() bool { return a.Stats().Unconfirmed > 0 })
	testutil.WaitFor(t, "a second purge, unconfirmed too", func() bool { return a.Stats().Unconfirmed > 1 })
	require.EqualValues(t, 1, f.streamMsgs(), "applied, not confirmed: kept")
	f.replica.Restart()
	f.publish([]events.Accounting{started("edge-1", 3, k, r, 1)})
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	f.waitUsed(k, 3)
}

// Shutdown: the run in hand is applied and deleted from the stream, the
// lease is given up, and what was not read waits for the next accountant.
func TestShutdownLeavesNothingHalfDone(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	warm := f.start()
	f.publish([]events.Accounting{started("edge-0", 1, k, r, 1)})
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 }) // the replica acknowledges
	warm.stop()
	for i := range uint64(200) {
		f.publish([]events.Accounting{started("edge-1", i+1, k, r, 1)})
	}
	a := f.start()
	testutil.WaitFor(t, "some charges", func() bool { return a.Stats().Charged > 0 })
	a.stop()
	charged := a.Stats().Charged
	require.EqualValues(t, charged+1, f.used(k))
	require.LessOrEqual(t, f.streamMsgs(), 200-charged, "what was applied is deleted (or applied again harmlessly)")
	b := f.start()
	f.waitUsed(k, 201)
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	require.EqualValues(t, 200-charged, b.Stats().Charged)
}

// A primary that comes back without its data (no persistence) loses what
// the accountant applied there. Events applied and not yet deleted from the
// stream are applied again once the shard has reseeded: the accountant reads
// the shard's subject again from its oldest message.
func TestAppliedEventsComeBackAfterAnEmptyRestart(t *testing.T) {
	f := newFixture(t)
	k, r := f.keys.Key("core", "alice"), reset()
	a := f.start()
	f.replica.Stop() // no replica confirms: applied events stay in the stream
	for i := range uint64(5) {
		f.publish([]events.Accounting{started("edge-1", i+1, k, r, 1)})
	}
	f.waitUsed(k, 5)
	testutil.WaitFor(t, "an unconfirmed purge", func() bool { return a.Stats().Unconfirmed > 0 })
	require.EqualValues(t, 5, f.streamMsgs())
	f.primary.Restart() // empty: no persistence in tests
	f.replica.Restart()
	f.waitUsed(k, 5)
	testutil.WaitFor(t, "an empty stream", func() bool { return f.streamMsgs() == 0 })
	require.EqualValues(t, 10, a.Stats().Charged, "each event applied on both primaries")
	require.Zero(t, a.Stats().DeadLettered)
}

// An accountant that knows the deployment's policies takes the events of
// Envoy's rate-limit rules (their policies are named after the rules, and
// the rules may come by xDS, which the accountant does not read) on any
// window a rule can have, a unit's or a calendar period's, and
// dead-letters those on a window no rule has.
func TestRuleEventsAreTakenBesidePolicies(t *testing.T) {
	f := newFixture(t)
	policy := "rls.mongo_cps.database_users-1f2e3d4c"
	var keys []limiter.Key
	var batch []events.Accounting
	for i, window := range []int64{60, 30 * 86400, 31 * 86400, 23 * 3600, 5 * 3600} {
		k := f.keys.Key(policy, "client-"+strconv.Itoa(i))
		ev := started("edge-1", uint64(i+1), k, time.Time{}, int64(i+1))
		ev.Policy, ev.WindowSeconds = policy, window
		keys, batch = append(keys, k), append(batch, ev)
	}
	dlq, err := f.js.CreateOrUpdateConsumer(context.Background(), f.streams.DeadLetters.Name, jetstream.ConsumerConfig{Durable: "inspect"})
	require.NoError(t, err)
	for _, ev := range batch {
		f.publish([]events.Accounting{ev})
	}
	a := f.start(func(c *accountant.Config) {
		c.Policies = map[string]limiter.Policy{"core": {Name: "core", Limit: 100, Window: time.Minute}}
	})
	for i, k := range keys[:4] { // a minute, a 30-day month, a calendar month, a day of a DST change
		f.waitUsed(k, int64(i+1))
	}
	testutil.WaitFor(t, "the dead letter", func() bool { return a.Stats().DeadLettered == 1 })
	m, err := dlq.Next(jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	require.Contains(t, m.Headers().Get(accountant.HeaderDeadReason), "which no rule has")
	n, err := f.primary.Client().Exists(context.Background(), keys[4].String()).Result()
	require.NoError(t, err)
	require.Zero(t, n, "a window no rule has is not opened")

	// A sliding rule's events name its sub-windows: ten of six seconds make
	// a minute, a rule's unit; ten of seven seconds make none.
	sub := limiter.Policy{Window: 6 * time.Second, Align: true}.WindowAt(time.Now())
	slide := func(seq uint64, window int64, k limiter.Key) events.Accounting {
		ev := started("edge-1", seq, k, sub.ResetAt, 2)
		ev.Policy, ev.WindowSeconds, ev.Slices, ev.StartedAt = policy, window, 10, sub.Start
		return ev
	}
	k, bad := f.keys.Key(policy, "sliding"), f.keys.Key(policy, "sliding-bad")
	f.publish([]events.Accounting{slide(6, 6, k)})
	odd := slide(7, 7, bad)
	odd.ResetAt = limiter.Policy{Window: 7 * time.Second, Align: true}.WindowAt(time.Now()).ResetAt
	odd.StartedAt = odd.ResetAt.Add(-7 * time.Second)
	f.publish([]events.Accounting{odd})
	testutil.WaitFor(t, "the sub-window's event applied, the other dead-lettered", func() bool {
		u, _ := f.primary.Client().HGet(context.Background(), k.SliceKey(sub.ResetAt), "u").Int64()
		return u == 2 && a.Stats().DeadLettered == 2
	})
}
