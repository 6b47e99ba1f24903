package events

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
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
// batches. Add encodes a decision into the batch being filled, under a
// lock held for that only, and never blocks on NATS; a background loop
// publishes each batch when it is full or Interval has passed.
type Batcher struct {
	cfg     BatcherConfig
	subject string
	js      jetstream.JetStream

	// mu guards the batch being filled (buf, n), the full batches waiting
	// for the loop (full) and waiting: the decisions in both, which Buffer
	// bounds.
	mu      sync.Mutex
	buf     []byte
	n       int
	full    []batch
	waiting int
	shut    bool // the loop has taken its last batches: Add drops
	// kick wakes the loop when a batch is full.
	kick chan struct{}
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

// batch is a message body of n decisions: a JSON array, its closing
// bracket not yet written.
type batch struct {
	body []byte
	n    int
}

// NewBatcher starts a batcher publishing on nc to subject.
func NewBatcher(nc *nats.Conn, subject string, cfg BatcherConfig) (*Batcher, error) {
	cfg = cfg.WithDefaults()
	var id [8]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, fmt.Errorf("events: batcher: %w", err)
	}
	b := &Batcher{cfg: cfg, subject: subject, buf: make([]byte, 0, 64<<10), kick: make(chan struct{}, 1), free: make(chan []byte, 8),
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

// Add encodes d into the batch being filled, without waiting on NATS; it
// reports false when d was dropped (Buffer decisions wait already, or the
// batcher has taken its last batch: Close has returned or is returning).
func (b *Batcher) Add(d Decision) bool {
	b.mu.Lock()
	if b.waiting >= b.cfg.Buffer || b.shut {
		b.mu.Unlock()
		b.dropped.Add(1)
		return false
	}
	if b.n == 0 {
		b.buf = append(b.buf, '[')
	} else {
		b.buf = append(b.buf, ',')
	}
	b.buf = AppendDecision(b.buf, &d)
	b.n++
	b.waiting++
	kick := false
	if b.n >= b.cfg.MaxBatch || len(b.buf) >= 512<<10 {
		b.full = append(b.full, batch{body: b.buf, n: b.n})
		b.buf, b.n, kick = b.freeBuf(), 0, true
	}
	b.mu.Unlock()
	if kick {
		select {
		case b.kick <- struct{}{}:
		default:
		}
	}
	return true
}

// freeBuf is a message buffer JetStream is done with, or a new one.
func (b *Batcher) freeBuf() []byte {
	select {
	case buf := <-b.free:
		return buf
	default:
		return make([]byte, 0, 64<<10)
	}
}

// take removes the full batches and, when all is set, the one being
// filled: what the loop publishes next. After a last take, Add drops.
func (b *Batcher) take(all, last bool, into []batch) []batch {
	b.mu.Lock()
	defer b.mu.Unlock()
	if last {
		b.shut = true
	}
	into = append(into, b.full...)
	clear(b.full)
	b.full = b.full[:0]
	if all && b.n > 0 {
		into = append(into, batch{body: b.buf, n: b.n})
		b.buf, b.n = b.freeBuf(), 0
	}
	for _, bt := range into {
		b.waiting -= bt.n
	}
	return into
}

func (b *Batcher) run() {
	defer close(b.done)
	t := time.NewTicker(b.cfg.Interval)
	defer t.Stop()
	reuse := func(body []byte) {
		select {
		case b.free <- body[:0]:
		default:
		}
	}
	publish := func(bt batch) {
		body := append(bt.body, ']')
		count := uint64(bt.n)
		msg := DecisionsMsg(b.subject, body)
		msg.Header.Set(jetstream.MsgIDHeader, b.id+"."+strconv.FormatUint(b.msgs.Add(1), 10))
		fut, err := b.js.PublishMsgAsync(msg)
		if err != nil {
			b.retry(msg, count) // it keeps the body
			return
		}
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
	var batches []batch
	flush := func(all, last bool) {
		batches = b.take(all, last, batches[:0])
		for _, bt := range batches {
			publish(bt)
		}
		clear(batches)
	}
	for {
		select {
		case <-b.kick:
			flush(false, false)
		case <-t.C:
			flush(true, false)
		case <-b.stop:
			flush(true, true)
			return
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
	return BatcherStats{Published: b.published.Load(), Messages: b.messages.Load(), Dropped: b.dropped.Load(), Queued: b.queued(),
		Retrying: int(b.retrying.Load())}
}

// queued is how many decisions wait to be published.
func (b *Batcher) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.waiting
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
