package client

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDecisionsStream is the decisions stream's name unless a
// deployment configures another (nats.streams.decisions.name).
const DefaultDecisionsStream = "TALLY_DECISIONS"

// DecisionRecord is one record of the decisions stream: an edge's
// decision, an accountant's application of an accounting event, or an
// operator's action (docs/events.md#decisions says what each field holds
// for each).
type DecisionRecord struct {
	ID          string    `json:"id"`
	Source      string    `json:"source"`
	Type        string    `json:"type"`
	Time        time.Time `json:"time"`
	TraceParent string    `json:"traceparent"`
	Data        struct {
		Key           string    `json:"key"`
		Policy        string    `json:"policy"`
		Limit         int64     `json:"limit"`
		WindowSeconds int64     `json:"window_s"`
		Cost          int64     `json:"cost"`
		Allowed       bool      `json:"allowed"`
		Path          string    `json:"path"`
		Used          int64     `json:"used"`
		ResetAt       time.Time `json:"reset_at"`
		Outcome       string    `json:"outcome"`
		LagMS         float64   `json:"lag_ms"`
		RequestID     string    `json:"request_id"`
		Shadow        bool      `json:"shadow"`
		Until         time.Time `json:"until"`
		Strikes       int       `json:"strikes"`
		Note          string    `json:"note"`
		Domain        string    `json:"domain"`
		Rule          string    `json:"rule"`
		Edge          string    `json:"edge"`
		Shard         string    `json:"shard"`
	} `json:"data"`
	// StreamSeq is the stream sequence of the message that carried the
	// record (the records of one message share it): follow again from
	// StreamSeq+1 to resume after that message.
	StreamSeq uint64 `json:"-"`
}

// FollowConfig says where to read the decisions stream from.
type FollowConfig struct {
	// Stream is DefaultDecisionsStream when empty.
	Stream string
	// Subjects filters the stream (tally.decisions.edge for edges' records
	// only); every subject when empty.
	Subjects []string
	// StartSeq, when set, is the first stream sequence to read; else
	// StartTime, when set, the first time; else the stream's first record.
	StartSeq  uint64
	StartTime time.Time
}

// Follow reads the decisions stream in order and calls fn with each
// record, until ctx ends (Follow then returns nil, once it has begun to
// read) or fn returns an error (Follow returns it). It keeps no state on the server (an ordered
// consumer), so the NATS user needs only to read the stream: the
// analytics user of deploy/nats/tally.conf.
func Follow(ctx context.Context, js jetstream.JetStream, c FollowConfig, fn func(DecisionRecord) error) error {
	if c.Stream == "" {
		c.Stream = DefaultDecisionsStream
	}
	oc := jetstream.OrderedConsumerConfig{FilterSubjects: c.Subjects}
	switch {
	case c.StartSeq > 0:
		oc.DeliverPolicy, oc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, c.StartSeq
	case !c.StartTime.IsZero():
		t := c.StartTime
		oc.DeliverPolicy, oc.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
	cons, err := js.OrderedConsumer(ctx, c.Stream, oc)
	if err != nil { // also when ctx ended first: nothing was read
		return fmt.Errorf("client: reading %s (does the NATS user have the permissions to?): %w", c.Stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("client: following %s: %w", c.Stream, err)
	}
	defer it.Stop()
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("client: following %s: %w", c.Stream, err)
		}
		var recs []DecisionRecord // one message is a JSON batch of records
		if err := json.Unmarshal(m.Data(), &recs); err != nil {
			return fmt.Errorf("client: a message of %s is not a batch of records: %w", c.Stream, err)
		}
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		for i := range recs {
			recs[i].StreamSeq = seq
			if err := fn(recs[i]); err != nil {
				return err
			}
		}
	}
}
