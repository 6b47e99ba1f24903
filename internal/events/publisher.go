package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PublisherConfig bounds what an edge holds while NATS is slow or away.
// Zero values take the defaults stated.
type PublisherConfig struct {
	// Buffer is how many events may wait to be published. When it is full,
	// new events are dropped and counted: requests are never held up and
	// memory never grows without bound. Default 10000.
	Buffer int `yaml:"buffer"`
	// MaxInFlight bounds asynchronous publishes awaiting JetStream's ack.
	// Default 512.
	MaxInFlight int `yaml:"max_in_flight"`
	// AckTimeout is how long one publish waits for its ack before it is
	// retried. Default 5s.
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// Attempts is how often one event is tried before it is dropped and
	// counted. Retries are safe: JetStream drops a repeated Nats-Msg-Id and
	// Redis applies each event once. Default 5.
	Attempts int `yaml:"attempts"`
}

func (c PublisherConfig) withDefaults() PublisherConfig {
	if c.Buffer <= 0 {
		c.Buffer = 10000
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 512
	}
	if c.AckTimeout <= 0 {
		c.AckTimeout = 5 * time.Second
	}
	if c.Attempts <= 0 {
		c.Attempts = 5
	}
	return c
}

// PublisherStats counts what a publisher did.
type PublisherStats struct {
	Published uint64 // acknowledged by JetStream
	Retried   uint64 // publishes tried again after an error or timeout
	Dropped   uint64 // given up: buffer full, attempts exhausted, or unsent at Close
	Queued    int    // waiting now
}

// Publisher publishes events asynchronously with a bounded buffer: Publish
// never blocks, a background loop feeds JetStream, failed publishes are
// retried, and anything that cannot be kept is dropped and counted.
type Publisher struct {
	cfg   PublisherConfig
	js    jetstream.JetStream
	queue chan *nats.Msg

	mu       sync.Mutex
	attempts map[*nats.Msg]int // messages that failed at least once
	closed   atomic.Bool

	published, retried, dropped atomic.Uint64
	stop                        chan struct{}
	done                        chan struct{}
}

// NewPublisher starts a publisher on nc. Call Close to flush and stop it.
func NewPublisher(nc *nats.Conn, cfg PublisherConfig) (*Publisher, error) {
	cfg = cfg.withDefaults()
	p := &Publisher{
		cfg:      cfg,
		queue:    make(chan *nats.Msg, cfg.Buffer),
		attempts: make(map[*nats.Msg]int),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(cfg.MaxInFlight),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout),
		jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, m *nats.Msg, err error) { p.failed(m) }),
		jetstream.WithPublishAsyncAckHandler(func(_ jetstream.JetStream, m *nats.Msg, _ *jetstream.PubAck) {
			p.published.Add(1)
			p.mu.Lock()
			delete(p.attempts, m)
			p.mu.Unlock()
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("events: publisher: %w", err)
	}
	p.js = js
	go p.run()
	return p, nil
}

// Publish queues m (from Encode) without blocking. It returns false when
// the event was dropped: the buffer is full or the publisher is closed.
func (p *Publisher) Publish(m *nats.Msg) bool {
	if p.closed.Load() {
		p.dropped.Add(1)
		return false
	}
	select {
	case p.queue <- m:
		return true
	default:
		p.dropped.Add(1)
		return false
	}
}

// failed retries m, or drops it after its last attempt.
func (p *Publisher) failed(m *nats.Msg) {
	p.mu.Lock()
	n := p.attempts[m] + 1
	give := n >= p.cfg.Attempts
	if give {
		delete(p.attempts, m)
	} else {
		p.attempts[m] = n
	}
	p.mu.Unlock()
	if give {
		p.dropped.Add(1)
		return
	}
	p.retried.Add(1)
	select {
	case p.queue <- m:
	default:
		p.mu.Lock()
		delete(p.attempts, m)
		p.mu.Unlock()
		p.dropped.Add(1)
	}
}

func (p *Publisher) run() {
	defer close(p.done)
	for {
		select {
		case m := <-p.queue:
			p.send(m)
		case <-p.stop:
			for { // flush what is queued, then leave
				select {
				case m := <-p.queue:
					p.send(m)
				default:
					return
				}
			}
		}
	}
}

func (p *Publisher) send(m *nats.Msg) {
	_, err := p.js.PublishMsgAsync(m, jetstream.WithMsgID(m.Header.Get(HeaderMsgID)))
	if err == nil {
		return
	}
	if errors.Is(err, jetstream.ErrTooManyStalledMsgs) || errors.Is(err, nats.ErrReconnectBufExceeded) {
		// Back-pressure: wait a moment instead of spinning.
		select {
		case <-time.After(20 * time.Millisecond):
		case <-p.stop:
		}
	}
	p.failed(m)
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{Published: p.published.Load(), Retried: p.retried.Load(), Dropped: p.dropped.Load(), Queued: len(p.queue)}
}

// Close stops accepting events, publishes what is queued and waits for
// outstanding acks until ctx is done. Events still unacknowledged then are
// counted as dropped (they may yet have been stored).
func (p *Publisher) Close(ctx context.Context) error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(p.stop)
	select {
	case <-p.done:
	case <-ctx.Done():
	}
	select {
	case <-p.js.PublishAsyncComplete():
		if n := len(p.queue); n > 0 { // retries queued after the flush
			p.dropped.Add(uint64(n))
			return fmt.Errorf("events: publisher closed with %d events unsent", n)
		}
		return nil
	case <-ctx.Done():
		n := p.js.PublishAsyncPending() + len(p.queue)
		p.dropped.Add(uint64(n))
		return fmt.Errorf("events: publisher closed with %d events unconfirmed: %w", n, ctx.Err())
	}
}
