package edge

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// OutboxConfig bounds the accounting events an edge holds. Zero values take
// the defaults stated.
type OutboxConfig struct {
	// Capacity is how many events may wait per shard while both NATS and
	// the shard's primary are unreachable; beyond it new events are dropped,
	// counted and logged. Default 100000.
	Capacity int `yaml:"capacity"`
	// PublishTimeout is how long a batch may take on its route (JetStream's
	// acknowledgement, or the primary's answer) before the other route is
	// tried. Default 500ms.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// MaxBatch is the most events in one message. Default 512.
	MaxBatch int `yaml:"max_batch"`
	// InFlight is how many batches per shard may await JetStream's
	// acknowledgement at once. Default 4.
	InFlight int `yaml:"in_flight"`
	// Route is "stream" (default: events go to JetStream, and the edge
	// applies a batch itself when JetStream does not take it in time) or
	// "direct" (the edge applies events on the primary, and hands a batch
	// to JetStream when the primary does not answer in time). See
	// docs/architecture.md for what each costs.
	Route string `yaml:"route"`
}

// Routes of accounting events.
const (
	RouteStream = "stream"
	RouteDirect = "direct"
)

func (c OutboxConfig) withDefaults() OutboxConfig {
	if c.Capacity <= 0 {
		c.Capacity = 100_000
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 500 * time.Millisecond
	}
	if c.MaxBatch <= 0 || c.MaxBatch > events.MaxBatch {
		c.MaxBatch = 512
	}
	if c.InFlight <= 0 {
		c.InFlight = 4
	}
	if c.Route == "" {
		c.Route = RouteStream
	}
	return c
}

// Validate reports whether c's route is known.
func (c OutboxConfig) Validate() error {
	if c.Route != "" && c.Route != RouteStream && c.Route != RouteDirect {
		return fmt.Errorf("edge: outbox route %q: want stream or direct", c.Route)
	}
	return nil
}

// OutboxStats counts what an outbox did.
type OutboxStats struct {
	Published uint64 // events in batches JetStream acknowledged
	Messages  uint64 // those batches
	Direct    uint64 // events the edge applied on a primary itself
	Dropped   uint64 // events dropped: NATS and the primary unreachable and the queue full, or undelivered at close
	Queued    int    // events not delivered yet
}

// outbox sends an edge's accounting events, numbered per shard, in batches.
// On the stream route a batch goes to JetStream (several in flight); when
// JetStream does not acknowledge it within PublishTimeout (NATS slow or
// down, the stream full), the edge applies the batch on the shard's primary
// itself with the same idempotent script, and a copy that reaches the stream
// later is a duplicate. The direct route tries the primary first and
// JetStream second. Only when neither works do events wait, up to Capacity
// per shard; the order in which batches land does not matter (apply.lua
// remembers the numbers a producer skipped).
type outbox struct {
	cfg      OutboxConfig
	producer string
	source   string
	prefix   string // accounting subject prefix
	store    Store
	keys     *limiter.KeySpace
	js       jetstream.JetStream // nil: apply directly
	logger   *rateLog
	queues   []*queue

	published, messages, direct, dropped atomic.Uint64
	// lag of the events the edge applied itself: creation to effect.
	lag metric.Float64Histogram
	// tracer, when set, makes a producer span per published batch.
	tracer trace.Tracer
	// sizes records the events per message published.
	sizes metric.Int64Histogram
	// learn, when set, hears of the room a refund or release the edge
	// applied itself made in a window (the accountant announces what it
	// applies; this is the edge's own share).
	learn func(shard int, dg limiter.Digest, reset time.Time, used int64)
	wg    sync.WaitGroup
	stop  chan struct{}
}

type queue struct {
	shard   int
	name    string
	mu      sync.Mutex
	seq     uint64
	evs     []events.Accounting // not sent yet
	pending atomic.Int64        // not delivered yet: queued and in flight
	wake    chan struct{}
}

// take removes up to n events from the queue.
func (q *queue) take(n int) []events.Accounting {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.evs))
	if n == 0 {
		return nil
	}
	batch := append([]events.Accounting(nil), q.evs[:n]...)
	q.evs = q.evs[n:]
	if len(q.evs) == 0 {
		q.evs = nil // let a large backlog's array go
	}
	return batch
}

func newOutbox(cfg OutboxConfig, producer, source, prefix string, store Store, keys *limiter.KeySpace, nc *nats.Conn, logger *rateLog,
	lag metric.Float64Histogram) (*outbox, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := &outbox{cfg: cfg.withDefaults(), producer: producer, source: source, prefix: prefix, store: store, keys: keys,
		logger: logger, lag: lag, sizes: noop.Int64Histogram{}, stop: make(chan struct{})}
	if nc != nil {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(o.cfg.InFlight*store.Shards()*2))
		if err != nil {
			return nil, fmt.Errorf("edge: outbox: %w", err)
		}
		o.js = js
	}
	for i := range store.Shards() {
		q := &queue{shard: i, name: store.ShardName(i), wake: make(chan struct{}, 1)}
		o.queues = append(o.queues, q)
		o.wg.Go(func() { o.run(q) })
	}
	return o, nil
}

// add queues e (its Producer, Seq and Source are set here) for shard i and
// returns its sequence, or 0 when it was dropped.
func (o *outbox) add(i int, e events.Accounting) uint64 {
	q := o.queues[i]
	if q.pending.Load() >= int64(o.cfg.Capacity) {
		o.dropped.Add(1)
		o.logger.Error("accounting event dropped: NATS and the primary are unreachable and the queue is full",
			"shard", q.name, "capacity", o.cfg.Capacity)
		return 0
	}
	q.mu.Lock()
	q.seq++
	e.Producer, e.Seq, e.Source, e.KeyID = o.producer, q.seq, o.source, o.keys.KeyID()
	q.evs = append(q.evs, e)
	q.mu.Unlock()
	q.pending.Add(1)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return e.Seq
}

// flight is a batch awaiting JetStream's acknowledgement.
type flight struct {
	batch    []events.Accounting
	ack      jetstream.PubAckFuture // nil: the publish failed at once
	deadline time.Time
}

func (o *outbox) run(q *queue) {
	var flying []flight
	for {
		stopping := false
		select {
		case <-o.stop:
			stopping = true
		default:
		}
		if stopping && len(flying) == 0 {
			return
		}
		// Send what is queued while there is room in flight.
		for !stopping && len(flying) < o.cfg.InFlight {
			batch := q.take(o.cfg.MaxBatch)
			if batch == nil {
				break
			}
			if o.cfg.Route == RouteDirect || o.js == nil {
				if !o.deliver(q, batch) {
					return // stopping
				}
				continue
			}
			flying = append(flying, o.publish(q, batch))
		}
		if len(flying) == 0 {
			select {
			case <-q.wake:
				continue
			case <-o.stop:
				return
			}
		}
		// Wait for the oldest batch in flight, or for more to send.
		head := &flying[0]
		var wake <-chan struct{}
		if len(flying) < o.cfg.InFlight {
			wake = q.wake
		}
		var okc <-chan *jetstream.PubAck
		var errc <-chan error
		if head.ack != nil {
			okc, errc = head.ack.Ok(), head.ack.Err()
		}
		t := time.NewTimer(time.Until(head.deadline))
		delivered := false
		failed := head.ack == nil
		if !failed {
			select {
			case <-okc:
				delivered = true
			case err := <-errc:
				failed = true
				o.logger.Warn("publishing accounting events failed; applying them on the primary", "shard", q.name, "err", err)
			case <-t.C:
				failed = true
				o.logger.Warn("JetStream did not acknowledge accounting events in time; applying them on the primary", "shard", q.name)
			case <-wake:
			case <-o.stop:
				// Give in-flight batches their time before giving up.
				select {
				case <-okc:
					delivered = true
				case <-errc:
					failed = true
				case <-t.C:
					failed = true
				}
			}
		}
		t.Stop()
		switch {
		case delivered:
			o.published.Add(uint64(len(head.batch)))
			o.messages.Add(1)
			q.pending.Add(-int64(len(head.batch)))
		case failed:
			if !o.deliver(q, head.batch) {
				return
			}
		default: // woken to send more
			continue
		}
		flying = flying[1:]
	}
}

// deliver delivers one batch on the primary, or else to JetStream, retrying
// both until one works or the outbox stops. It reports false when the
// outbox stopped first.
func (o *outbox) deliver(q *queue, batch []events.Accounting) bool {
	delay := 10 * time.Millisecond
	for {
		err := o.apply(q, batch, o.cfg.PublishTimeout)
		if err == nil {
			o.direct.Add(uint64(len(batch)))
			q.pending.Add(-int64(len(batch)))
			return true
		}
		if o.js != nil {
			f := o.publish(q, batch)
			if f.ack != nil {
				t := time.NewTimer(o.cfg.PublishTimeout)
				select {
				case <-f.ack.Ok():
					t.Stop()
					o.published.Add(uint64(len(batch)))
					o.messages.Add(1)
					q.pending.Add(-int64(len(batch)))
					return true
				case <-f.ack.Err():
				case <-t.C:
				}
				t.Stop()
			}
		}
		o.logger.Error("accounting events wait: neither the primary nor JetStream takes them", "shard", q.name,
			"events", len(batch), "err", err)
		select {
		case <-time.After(delay):
		case <-o.stop:
			return false
		}
		delay = min(2*delay, time.Second)
	}
}

// publish hands a batch to JetStream without waiting.
func (o *outbox) publish(q *queue, batch []events.Accounting) flight {
	f := flight{batch: batch, deadline: time.Now().Add(o.cfg.PublishTimeout)}
	m, err := events.AccountingMsg(o.prefix, q.name, batch, nil)
	if err != nil {
		o.logger.Error("an accounting batch could not be encoded", "shard", q.name, "err", err) // a defect
		return f
	}
	o.sizes.Record(context.Background(), int64(len(batch)))
	if o.tracer != nil {
		ctx, span := o.tracer.Start(context.Background(), "send "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(events.Links(batch)...),
			trace.WithAttributes(events.MessagingAttributes("send", m.Subject, q.name, len(batch))...))
		events.InjectTrace(ctx, m)
		defer span.End()
	}
	ack, err := o.js.PublishMsgAsync(m, jetstream.WithMsgID(m.Header.Get(events.HeaderMsgID)))
	if err != nil {
		o.logger.Warn("publishing accounting events failed", "shard", q.name, "err", err)
		return f
	}
	f.ack = ack
	return f
}

// apply applies a batch on the shard's primary, as the accountant would,
// within timeout.
func (o *outbox) apply(q *queue, batch []events.Accounting, timeout time.Duration) error {
	evs := make([]limiter.Event, 0, len(batch))
	for i := range batch {
		ev, ok, err := batch[i].Op(o.keys)
		if err != nil {
			return err // a defect: the edge builds its events from valid keys
		}
		if ok {
			evs = append(evs, ev)
		}
	}
	if len(evs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	res, err := o.store.Apply(ctx, q.shard, time.Now(), evs)
	if err != nil {
		return err
	}
	done := time.Now()
	for i := range batch {
		o.lag.Record(context.Background(), max(0, done.Sub(batch[i].Time).Seconds()))
	}
	for j, r := range res.Results {
		if r.Err != nil {
			o.logger.Error("an accounting event was refused", "shard", q.name, "err", r.Err)
			continue
		}
		if o.learn != nil && r.Outcome == limiter.Applied && evs[j].Kind != limiter.Charge && r.Amount > 0 {
			o.learn(q.shard, evs[j].Key.Digest(), r.ResetAt, r.Used)
		}
	}
	return nil
}

func (o *outbox) stats() OutboxStats {
	s := OutboxStats{Published: o.published.Load(), Messages: o.messages.Load(), Direct: o.direct.Load(), Dropped: o.dropped.Load()}
	for _, q := range o.queues {
		s.Queued += int(q.pending.Load())
	}
	return s
}

// close delivers what is queued until ctx ends, then stops; what is left
// is counted as dropped.
func (o *outbox) close(ctx context.Context) error {
	for o.stats().Queued > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(o.stop)
	o.wg.Wait()
	if left := o.stats().Queued; left > 0 {
		o.dropped.Add(uint64(left))
		return fmt.Errorf("edge: %d accounting events undelivered at shutdown", left)
	}
	return nil
}

// rateLog logs at most one line per message every interval, counting the
// ones it held back.
type rateLog struct {
	log      *slog.Logger
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
	held     map[string]int
}

func newRateLog(log *slog.Logger, interval time.Duration) *rateLog {
	return &rateLog{log: log, interval: interval, last: map[string]time.Time{}, held: map[string]int{}}
}

func (r *rateLog) emit(level slog.Level, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last[msg]) < r.interval {
		r.held[msg]++
		r.mu.Unlock()
		return
	}
	held := r.held[msg]
	r.last[msg], r.held[msg] = now, 0
	r.mu.Unlock()
	if held > 0 {
		args = append(args, "repeated", held)
	}
	r.log.Log(context.Background(), level, msg, args...)
}

func (r *rateLog) Warn(msg string, args ...any)  { r.emit(slog.LevelWarn, msg, args...) }
func (r *rateLog) Error(msg string, args ...any) { r.emit(slog.LevelError, msg, args...) }
func (r *rateLog) Info(msg string, args ...any)  { r.emit(slog.LevelInfo, msg, args...) }
