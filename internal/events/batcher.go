package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/setting"
)

// BatcherConfig bounds a decisions batcher. Zero values take the defaults
// stated.
type BatcherConfig struct {
	// Buffer is how many decisions may wait; beyond it new ones are dropped
	// and counted, so that telemetry never holds a request up. Default 16384.
	Buffer int `yaml:"buffer"`
	// MaxBatch is the most decisions per message. Default 512.
	MaxBatch int `yaml:"max_batch"`
	// Interval is the longest a decision waits for its batch to fill.
	// Default 50ms.
	Interval time.Duration `yaml:"interval"`
	// MaxInFlight bounds messages awaiting JetStream's ack. Default 64.
	MaxInFlight int `yaml:"max_in_flight"`
}

// Validate refuses negative or unworkable bounds as a *setting.Error
// naming the field; zero values stand for the defaults.
func (c BatcherConfig) Validate() error {
	switch {
	case c.Buffer < 0 || c.Buffer > 10_000_000:
		return setting.Errorf(ErrInvalidConfig, "buffer", "%d: want 1 to 10000000 (0: the default)", c.Buffer)
	case c.MaxBatch < 0 || c.MaxBatch > MaxBatch:
		return setting.Errorf(ErrInvalidConfig, "max_batch", "%d: want 1 to %d (0: the default)", c.MaxBatch, MaxBatch)
	case c.Interval < 0 || c.Interval > time.Minute:
		return setting.Errorf(ErrInvalidConfig, "interval", "%v: want a duration up to 1m (0: the default)", c.Interval)
	case c.MaxInFlight < 0 || c.MaxInFlight > 4096:
		return setting.Errorf(ErrInvalidConfig, "max_in_flight", "%d: want 1 to 4096 (0: the default)", c.MaxInFlight)
	}
	return nil
}

// WithDefaults is c with its zero values replaced by the defaults.
func (c BatcherConfig) WithDefaults() BatcherConfig {
	if c.Buffer <= 0 {
		c.Buffer = 16384
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.Interval <= 0 {
		c.Interval = 50 * time.Millisecond
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 64
	}
	return c
}

// BatcherStats counts what a batcher did.
type BatcherStats struct {
	Published uint64 // decisions in messages JetStream acknowledged
	Messages  uint64 // those messages
	Dropped   uint64 // decisions dropped: buffer full, publish failed for retryFor, or unsent at Close
	Queued    int    // decisions waiting now
	Retrying  int    // messages waiting to be published again
}

// A message JetStream did not take (no stream leader during an election,
// NATS unreachable, a timeout) is published again, with the same message id
// (the decisions stream drops a repeat within its duplicate window), until
// retryFor has passed; at most Buffer decisions wait so at once (besides
// the Buffer queued), and beyond them a failed message is dropped and
// counted.
const (
	retryFor      = 30 * time.Second
	retryFirst    = 100 * time.Millisecond
	retryMostWait = 2 * time.Second
)

// Batcher publishes decisions to the decisions stream in CloudEvents JSON
// batches. Add never blocks; a background loop encodes and publishes.
type Batcher struct {
	cfg     BatcherConfig
	subject string
	js      jetstream.JetStream
	queue   chan Decision
	// free holds message buffers JetStream is done with (acknowledged or
	// failed), for the next batches: a batch grows its buffer once, not
	// every time.
	free   chan []byte
	stop   chan struct{}
	done   chan struct{}
	closed atomic.Bool
	// id and msgs name each message (Nats-Msg-Id): id.<n>.
	id   string
	msgs atomic.Uint64
	// busy counts the goroutines that wait for a message's ack or publish
	// it again; retrying those publishing again, and retried the decisions
	// in them. abandon, cancelled by Close when its context ends, stops
	// them.
	busy, retrying, retried atomic.Int64
	abandon                 context.Context
	abandonAll              context.CancelFunc

	published, messages, dropped atomic.Uint64
}

// NewBatcher starts a batcher publishing on nc to subject.
func NewBatcher(nc *nats.Conn, subject string, cfg BatcherConfig) (*Batcher, error) {
	cfg = cfg.WithDefaults()
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("events: batcher: %w", err)
	}
	b := &Batcher{cfg: cfg, subject: subject, queue: make(chan Decision, cfg.Buffer), free: make(chan []byte, 8),
		stop: make(chan struct{}), done: make(chan struct{}), id: hex.EncodeToString(id[:])}
	b.abandon, b.abandonAll = context.WithCancel(context.Background())
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(5*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("events: batcher: %w", err)
	}
	b.js = js
	go b.run()
	return b, nil
}

// Add queues d without blocking; it reports false when d was dropped.
func (b *Batcher) Add(d Decision) bool {
	if b.closed.Load() {
		b.dropped.Add(1)
		return false
	}
	select {
	case b.queue <- d:
		return true
	default:
		b.dropped.Add(1)
		return false
	}
}

func (b *Batcher) run() {
	defer close(b.done)
	t := time.NewTicker(b.cfg.Interval)
	defer t.Stop()
	buf := make([]byte, 0, 64<<10)
	n := 0
	reuse := func(body []byte) {
		select {
		case b.free <- body[:0]:
		default:
		}
	}
	flush := func() {
		if n == 0 {
			return
		}
		body := append(buf, ']')
		count := uint64(n)
		msg := DecisionsMsg(b.subject, body)
		msg.Header.Set(jetstream.MsgIDHeader, b.id+"."+strconv.FormatUint(b.msgs.Add(1), 10))
		fut, err := b.js.PublishMsgAsync(msg)
		if err != nil {
			b.retry(msg, count) // it keeps the body
		} else {
			b.busy.Add(1)
			go func() {
				defer b.busy.Add(-1)
				select {
				case <-fut.Ok():
					b.published.Add(count)
					b.messages.Add(1)
					reuse(body)
				case <-fut.Err():
					b.retry(msg, count)
				case <-b.abandon.Done():
					b.dropped.Add(count)
				}
			}()
		}
		n = 0
		select {
		case buf = <-b.free:
		default:
			buf = make([]byte, 0, 64<<10)
		}
	}
	add := func(d *Decision) {
		if n == 0 {
			buf = append(buf, '[')
		} else {
			buf = append(buf, ',')
		}
		buf = AppendDecision(buf, d)
		n++
		if n >= b.cfg.MaxBatch || len(buf) >= 512<<10 {
			flush()
		}
	}
	for {
		select {
		case d := <-b.queue:
			add(&d)
		case <-t.C:
			flush()
		case <-b.stop:
			for {
				select {
				case d := <-b.queue:
					add(&d)
				default:
					flush()
					return
				}
			}
		}
	}
}

// retry publishes msg (count decisions) again until JetStream takes it,
// retryFor passes or Close abandons it; it drops msg at once when Buffer
// decisions are being published again already.
func (b *Batcher) retry(msg *nats.Msg, count uint64) {
	if b.retried.Add(int64(count)) > int64(b.cfg.Buffer) {
		b.retried.Add(-int64(count))
		b.dropped.Add(count)
		return
	}
	b.retrying.Add(1)
	b.busy.Add(1)
	go func() {
		defer b.busy.Add(-1)
		defer b.retrying.Add(-1)
		defer b.retried.Add(-int64(count))
		wait, deadline := retryFirst, time.Now().Add(retryFor)
		for {
			select {
			case <-b.abandon.Done():
				b.dropped.Add(count)
				return
			case <-time.After(wait):
			}
			ctx, cancel := context.WithTimeout(b.abandon, retryMostWait)
			_, err := b.js.PublishMsg(ctx, msg)
			cancel()
			if err == nil {
				b.published.Add(count)
				b.messages.Add(1)
				return
			}
			if time.Now().After(deadline) || b.js.Conn().IsClosed() {
				b.dropped.Add(count)
				return
			}
			wait = min(2*wait, retryMostWait)
		}
	}()
}

// Stats returns the batcher's counters.
func (b *Batcher) Stats() BatcherStats {
	return BatcherStats{Published: b.published.Load(), Messages: b.messages.Load(), Dropped: b.dropped.Load(), Queued: len(b.queue),
		Retrying: int(b.retrying.Load())}
}

// Close stops accepting decisions, publishes what is queued and waits for
// the acks until ctx is done.
func (b *Batcher) Close(ctx context.Context) error {
	if !b.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(b.stop)
	select {
	case <-b.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	// Whatever happens, nothing outlives Close: what still waits is
	// abandoned (dropped, counted).
	defer func() {
		b.abandonAll()
		for b.busy.Load() > 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if b.js.Conn().IsClosed() {
		// Nothing can publish or confirm them any more: do not wait for ctx.
		if n := b.js.PublishAsyncPending() + int(b.retrying.Load()); n > 0 {
			return fmt.Errorf("events: %d decision messages unconfirmed at close: the NATS connection is closed", n)
		}
		return nil
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-ctx.Done():
		return fmt.Errorf("events: decisions unconfirmed at close: %w", ctx.Err())
	}
	for b.busy.Load() > 0 { // acks being counted, messages being published again
		select {
		case <-ctx.Done():
			return fmt.Errorf("events: %d decision messages still being published again at close: %w", b.retrying.Load(), ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}
