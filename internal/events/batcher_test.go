package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
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
	records := 0
	eachMessage(t, js, streams.Decisions.Name, func(data []byte) {
		var batch []json.RawMessage
		require.NoError(t, json.Unmarshal(data, &batch))
		records += len(batch)
	})
	require.Equal(t, n, records)
}

func decisionRecord(edge string, seq uint64) events.Decision {
	return events.Decision{Time: time.Now(), Source: "tally/edge/test", Edge: edge, Seq: seq, Shard: "s0", Policy: "core",
		Limit: 10, WindowSeconds: 60, Cost: 1, Allowed: true, Path: "credit", ResetAt: time.Now().Add(time.Minute)}
}

// Decisions added at once from several goroutines are all published, each
// once and whole, in the order each goroutine added them; at most Buffer
// wait, the rest are dropped and counted, and nothing is taken after Close.
func TestBatcherBoundsAndOrder(t *testing.T) {
	ns := natstest.Start(t)
	nc, js := ns.Connect()
	streams := events.Streams{}.WithDefaults()
	require.NoError(t, events.EnsureStreams(context.Background(), js, streams, []string{"s0"}))

	// A batch that never fills and an interval that never comes: Buffer
	// decisions wait, the next is dropped; Close publishes those waiting.
	b, err := events.NewBatcher(nc, streams.DecisionsSubject(), events.BatcherConfig{Buffer: 10, MaxBatch: 512, Interval: time.Minute})
	require.NoError(t, err)
	for i := range 10 {
		require.True(t, b.Add(decisionRecord("edge.bound", uint64(i+1))))
	}
	require.False(t, b.Add(decisionRecord("edge.bound", 11)))
	require.Equal(t, 10, b.Stats().Queued)
	require.NoError(t, b.Close(context.Background()))
	require.False(t, b.Add(decisionRecord("edge.bound", 12)), "taken after Close")
	st := b.Stats()
	require.EqualValues(t, 10, st.Published)
	require.EqualValues(t, 2, st.Dropped)
	require.Zero(t, st.Queued)

	// Four goroutines at once, batches of 64.
	b, err = events.NewBatcher(nc, streams.DecisionsSubject(), events.BatcherConfig{MaxBatch: 64, Interval: 5 * time.Millisecond})
	require.NoError(t, err)
	const writers, each = 4, 500
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				b.Add(decisionRecord(fmt.Sprintf("edge.w%d", w), uint64(i+1)))
			}
		})
	}
	wg.Wait()
	require.NoError(t, b.Close(context.Background()))
	st = b.Stats()
	require.EqualValues(t, writers*each, st.Published)
	require.Zero(t, st.Dropped)

	last := map[string]uint64{}
	eachMessage(t, js, streams.Decisions.Name, func(data []byte) {
		var batch []struct {
			ID   string `json:"id"` // <edge>.d.<seq>
			Data struct {
				Edge string `json:"edge"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal(data, &batch))
		require.LessOrEqual(t, len(batch), 64)
		for _, r := range batch {
			edge, seq, ok := strings.Cut(r.ID, ".d.")
			require.True(t, ok, r.ID)
			require.Equal(t, r.Data.Edge, edge)
			require.Equal(t, strconv.FormatUint(last[edge]+1, 10), seq, "%s", edge)
			last[edge]++
		}
	})
	require.EqualValues(t, 10, last["edge.bound"])
	for w := range writers {
		require.EqualValues(t, each, last[fmt.Sprintf("edge.w%d", w)])
	}
}

// eachMessage calls fn with every message of the stream, in order.
func eachMessage(t *testing.T, js jetstream.JetStream, stream string, fn func(data []byte)) {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	require.NoError(t, err)
	c, err := s.OrderedConsumer(context.Background(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	for {
		msgs, err := c.FetchNoWait(100)
		require.NoError(t, err)
		got := 0
		for m := range msgs.Messages() {
			got++
			fn(m.Data())
		}
		if got == 0 {
			return
		}
	}
}
