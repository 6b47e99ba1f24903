package events_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/natstest"
)

// racingManager is a JetStream whose first stream lookup misses a stream
// another process creates, with its own settings, right after the lookup.
type racingManager struct {
	jetstream.JetStream
	other events.Streams
	raced bool
}

func (m *racingManager) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := m.JetStream.Stream(ctx, name)
	if !m.raced && name == m.other.WithDefaults().Accounting.Name {
		m.raced = true
		if err := events.EnsureStreams(ctx, m.JetStream, m.other, []string{"s0"}); err != nil {
			return nil, err
		}
	}
	return s, err
}

// Two processes start at once with different stream settings: the one
// whose create is refused (the name is in use) reads the stream again and
// brings it to its settings instead of failing.
func TestEnsureStreamsCreatedMeanwhile(t *testing.T) {
	ns := natstest.Start(t)
	_, js := ns.Connect()
	m := &racingManager{JetStream: js, other: events.Streams{}}
	small := events.Streams{Accounting: events.StreamConfig{MaxBytes: 2048}}
	require.NoError(t, events.EnsureStreams(context.Background(), m, small, []string{"s0"}))
	require.True(t, m.raced)
	s, err := js.Stream(context.Background(), small.WithDefaults().Accounting.Name)
	require.NoError(t, err)
	info, err := s.Info(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 2048, info.Config.MaxBytes, "the later process's settings")
}
