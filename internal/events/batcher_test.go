package events_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/testutil"
)

// Decision records JetStream cannot take for a while (here: no stream yet;
// in production, a stream leader being elected or NATS unreachable) are
// published again once it can, each message once: nothing is dropped and
// nothing recorded twice.
func TestBatcherPublishesAgain(t *testing.T) {
	ns := natstest.Start(t)
	nc, js := ns.Connect()
	streams := events.Streams{}.WithDefaults()
	b, err := events.NewBatcher(nc, streams.DecisionsSubject(), events.BatcherConfig{MaxBatch: 10, Interval: 5 * time.Millisecond})
	require.NoError(t, err)
	const n = 200
	for i := range n {
		require.True(t, b.Add(events.Decision{Time: time.Now(), Source: "tally/edge/test", Edge: "edge.test", Seq: uint64(i + 1),
			Shard: "s0", Policy: "core", Limit: 10, WindowSeconds: 60, Cost: 1, Allowed: true, Path: "credit",
			ResetAt: time.Now().Add(time.Minute)}))
	}
	testutil.WaitFor(t, "publishes failing", func() bool { return b.Stats().Retrying > 0 })
	require.Zero(t, b.Stats().Published)

	require.NoError(t, events.EnsureStreams(context.Background(), js, streams, []string{"s0"}))
	testutil.WaitFor(t, "every record published", func() bool { return b.Stats().Published == n })
	require.NoError(t, b.Close(context.Background()))
	st := b.Stats()
	require.Zero(t, st.Dropped)
	require.Zero(t, st.Retrying)

	// Each message once: the stream holds n records.
	s, err := js.Stream(context.Background(), streams.Decisions.Name)
	require.NoError(t, err)
	c, err := s.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	records := 0
	for {
		msgs, err := c.FetchNoWait(100)
		require.NoError(t, err)
		got := 0
		for m := range msgs.Messages() {
			got++
			var batch []json.RawMessage
			require.NoError(t, json.Unmarshal(m.Data(), &batch))
			records += len(batch)
		}
		if got == 0 {
			break
		}
	}
	require.Equal(t, n, records)
}
