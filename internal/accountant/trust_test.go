package accountant_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// Only who may publish, publishes: the attacks of a service (NATS user
// "billing", with the shipped permissions) on the accounting of windows it
// has no share in, each of which changes nothing.
func TestOnlyWhoMayPublishPublishes(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := f.keys.Key("core", "victim")
	// An edge reserved 60 units of the victim's window, and charged 20 by
	// events of its own.
	r := f.take("edge.e1", k, 60).ResetAt
	f.publish([]events.Accounting{started("edge.e1", 1, k, r, 20)})
	a := f.start()
	f.waitUsed(k, 80)
	_, billing := f.nats.ConnectAs("billing")
	dlq, err := f.js.CreateOrUpdateConsumer(ctx, f.streams.DeadLetters.Name, jetstream.ConsumerConfig{Durable: "inspect"})
	require.NoError(t, err)

	sign := func(evs []events.Accounting) {
		for i := range evs {
			evs[i].KeyID = f.keys.KeyID()
		}
	}
	// publishAs publishes evs as the billing user on subject, written by
	// hand (the encoder refuses some of them).
	publishAs := func(subject string, evs ...events.Accounting) error {
		sign(evs)
		body := []byte("[")
		for i := range evs {
			if i > 0 {
				body = append(body, ',')
			}
			body = events.AppendAccounting(body, "s0", &evs[i])
		}
		m := nats.NewMsg(subject)
		m.Data = append(body, ']')
		c, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err = billing.PublishMsg(c, m)
		return err
	}
	own := events.AccountingSubject(f.streams.Accounting.SubjectPrefix, "s0", "billing.7")

	// 1. Publishing on an edge's subject: NATS refuses it.
	err = publishAs(events.AccountingSubject(f.streams.Accounting.SubjectPrefix, "s0", "edge.e1"),
		released("edge.e1", 2, k, r, 60))
	require.Error(t, err, "a permissions violation")

	// 2. On its own subject, as the edge: the accountant refuses it (the
	// producer is not the subject's).
	require.NoError(t, publishAs(own, released("edge.e1", 2, k, r, 60)))
	// 3. A refund of a reservation it never made, with the window's reset:
	// applied, and gives nothing back.
	require.NoError(t, publishAs(own, finished("billing.7", 1, k, r, 304, "", 0), released("billing.7", 2, k, r, 50)))
	// 4. A refund of the edge's charge: refused (a producer refunds only its
	// own charges).
	require.NoError(t, publishAs(own, finished("billing.7", 3, k, r, 304, "edge.e1", 1)))
	// 5. Numbers far ahead: they are billing.7's own, and make nobody
	// else's events duplicates.
	require.NoError(t, publishAs(own, started("billing.7", 1_000_000_000, k, r, 1)))
	// 6. A shard nobody configured: JetStream has no stream for it.
	err = publishAs(events.AccountingSubject(f.streams.Accounting.SubjectPrefix, "s9", "billing.7"), started("billing.7", 1, k, r, 1))
	require.ErrorIs(t, err, jetstream.ErrNoStreamResponse)

	testutil.WaitFor(t, "every message read", func() bool { return f.streamMsgs() == 0 })
	require.EqualValues(t, 81, f.used(k), "80, and billing's own charge of 1")
	require.EqualValues(t, 2, a.Stats().DeadLettered)
	require.EqualValues(t, 2, a.Stats().NotHeld, "the refund and the release of what it never held")
	var reasons []string
	for range 2 {
		m, err := dlq.Next(jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		reasons = append(reasons, m.Headers().Get(accountant.HeaderDeadReason))
	}
	require.Contains(t, reasons[0], "a producer publishes on its own subject only")
	require.Contains(t, reasons[1], "a producer refunds only its own charges")

	// The edge's own events still apply, in order, none taken for a
	// duplicate.
	f.publish([]events.Accounting{started("edge.e1", 2, k, r, 1), released("edge.e1", 3, k, r, 10)})
	f.waitUsed(k, 72)

	// The stream takes only the configured shards' subjects.
	st, err := f.js.Stream(ctx, f.streams.Accounting.Name)
	require.NoError(t, err)
	require.Equal(t, []string{"tally.accounting.s0.>"}, st.CachedInfo().Config.Subjects)
}

// An accountant holding another key secret refuses the events whose
// digests were made with the deployment's (their windows would be other
// windows), and says why: nothing is applied twice under two secrets.
func TestAnotherSecretIsRefused(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	k := f.keys.Key("core", "alice")
	dlq, err := f.js.CreateOrUpdateConsumer(ctx, f.streams.DeadLetters.Name, jetstream.ConsumerConfig{Durable: "inspect"})
	require.NoError(t, err)
	other, err := limiter.NewKeySpace("tally", []byte("another-deployment-secret-012345"))
	require.NoError(t, err)
	require.NotEqual(t, f.keys.KeyID(), other.KeyID())
	f.publish([]events.Accounting{started("edge.e1", 1, k, reset(), 3)})
	a := f.startWithKeys(other)
	testutil.WaitFor(t, "the dead letter", func() bool { return a.Stats().DeadLettered == 1 })
	require.Zero(t, f.used(k))
	m, err := dlq.Next(jetstream.FetchMaxWait(time.Second))
	require.NoError(t, err)
	require.Contains(t, m.Headers().Get(accountant.HeaderDeadReason), "tallykeyid "+f.keys.KeyID()+" is not this deployment's")
}

// The shipped permissions give every role what it needs and nothing
// more: the analytics user reads the decisions stream and can publish
// nowhere; nobody but edges and accountants sends notices.
func TestPermissionsOfEachRole(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	nc, js := f.nats.ConnectAs("analytics")
	errs := make(chan error, 8)
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	c, err := js.OrderedConsumer(ctx, f.streams.Decisions.Name, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err, "analytics reads the decisions")
	_, err = c.Fetch(1, jetstream.FetchMaxWait(200*time.Millisecond))
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = js.Publish(short, "tally.accounting.s0.analytics", []byte("{}"))
	cancel()
	require.Error(t, err, "analytics publishes no events")
	for user, subject := range map[string]string{
		"analytics": f.streams.NoticePrefix + ".s0",
		"billing":   f.streams.NoticePrefix + ".s0",
	} {
		bc, _ := f.nats.ConnectAs(user)
		got := make(chan error, 4)
		bc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { got <- err })
		require.NoError(t, bc.Publish(subject, []byte("full x 1 1")))
		require.NoError(t, bc.Flush())
		select {
		case err := <-got:
			require.True(t, errors.Is(err, nats.ErrPermissionViolation) ||
				strings.Contains(strings.ToLower(err.Error()), "permissions violation"), "%s: %v", user, err)
		case <-time.After(2 * time.Second):
			t.Fatalf("%s published a notice", user)
		}
	}
}

// An accountant is ready once its streams exist and every shard's lease
// has been asked for (held here or elsewhere): before, /readyz says what
// is missing. A suite that reads a stream right after readiness finds it.
func TestReadyMeansStreamsAndLeases(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.primary.Stop()
	a := f.start()
	testutil.WaitFor(t, "a failing lease", func() bool { return a.Shards()[0].Err != nil })
	require.ErrorContains(t, a.Ready(ctx, nil), "no lease asked for yet on shard(s) s0")
	f.primary.Restart()
	testutil.WaitFor(t, "ready", func() bool { return a.Ready(ctx, nil) == nil })
	_, err := f.js.Stream(ctx, f.streams.Accounting.Name)
	require.NoError(t, err)
}

// What a publisher got wrong is dead-lettered at once, and nothing it put
// where a digest belongs is written down: not in the dead letter's reason,
// not in a log line. A reset_at beyond what any window could show is
// refused when the message is read, not retried against Redis.
func TestBadEventsAreRefusedWithoutSecrets(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	dlq, err := f.js.CreateOrUpdateConsumer(ctx, f.streams.DeadLetters.Name, jetstream.ConsumerConfig{Durable: "inspect"})
	require.NoError(t, err)
	var logs testutil.Buffer
	f.cfg.MaxAttempts = 5
	nc, js := f.nats.ConnectAs("accountant")
	_ = nc
	a := accountant.New(js, f.newStore(), f.keys, f.cfg, slog.New(slog.NewJSONHandler(&logs, nil)))
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = a.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })

	k := f.keys.Key("core", "alice")
	token := "sk_live_4f9a0c2e7b1d"
	leaked := started("edge.e1", 1, k, reset(), 1)
	leaked.KeyID = f.keys.KeyID()
	body := strings.Replace(string(events.AppendAccounting([]byte("["), "s0", &leaked))+"]",
		`"key":"`+leaked.Key, `"key":"Bearer `+token, 1)
	_, err = f.js.Publish(ctx, events.AccountingSubject(f.streams.Accounting.SubjectPrefix, "s0", "edge.e1"), []byte(body))
	require.NoError(t, err)
	far := started("edge.e1", 2, k, time.UnixMilli(limiter.MaxMS).Truncate(time.Second), 1)
	far.KeyID = f.keys.KeyID()
	body = string(events.AppendAccounting([]byte("["), "s0", &far)) + "]"
	_, err = f.js.Publish(ctx, events.AccountingSubject(f.streams.Accounting.SubjectPrefix, "s0", "edge.e1"), []byte(body))
	require.NoError(t, err)

	testutil.WaitFor(t, "both dead-lettered", func() bool { return a.Stats().DeadLettered == 2 })
	require.Zero(t, a.Stats().Retries, "refused when read: no retries that stall the shard")
	for range 2 {
		m, err := dlq.Next(jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		require.NotContains(t, m.Headers().Get(accountant.HeaderDeadReason), token)
	}
	require.NotContains(t, logs.String(), token)
	require.Contains(t, logs.String(), "message dead-lettered")
}
