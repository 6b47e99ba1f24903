package events

import (
	"context"
	"fmt"
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
	Dropped   uint64 // decisions dropped: buffer full, publish failed, or unsent at Close
	Queued    int    // decisions waiting now
}

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

	published, messages, dropped atomic.Uint64
}

// NewBatcher starts a batcher publishing on nc to subject.
func NewBatcher(nc *nats.Conn, subject string, cfg BatcherConfig) (*Batcher, error) {
	cfg = cfg.WithDefaults()
	b := &Batcher{cfg: cfg, subject: subject, queue: make(chan Decision, cfg.Buffer), free: make(chan []byte, 8),
		stop: make(chan struct{}), done: make(chan struct{})}
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
		fut, err := b.js.PublishMsgAsync(DecisionsMsg(b.subject, body))
		if err != nil {
			b.dropped.Add(count)
			reuse(body)
		} else {
			go func() {
				select {
				case <-fut.Ok():
					b.published.Add(count)
					b.messages.Add(1)
				case <-fut.Err():
					b.dropped.Add(count)
				}
				reuse(body)
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

// Stats returns the batcher's counters.
func (b *Batcher) Stats() BatcherStats {
	return BatcherStats{Published: b.published.Load(), Messages: b.messages.Load(), Dropped: b.dropped.Load(), Queued: len(b.queue)}
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
	if n := b.js.PublishAsyncPending(); n > 0 && b.js.Conn().IsClosed() {
		// Nothing can confirm them any more: do not wait for ctx.
		return fmt.Errorf("events: %d decision messages unconfirmed at close: the NATS connection is closed", n)
	}
	select {
	case <-b.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("events: decisions unconfirmed at close: %w", ctx.Err())
	}
}
