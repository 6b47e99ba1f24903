package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
	// PublishTimeout is how long a batch waits for JetStream's ack before
	// the edge applies it on the primary itself. Default 500ms.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// MaxBatch is the most events in one message. Default 512.
	MaxBatch int `yaml:"max_batch"`
}

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
	return c
}

// OutboxStats counts what an outbox did.
type OutboxStats struct {
	Published uint64 // events in batches JetStream acknowledged
	Messages  uint64 // those batches
	Direct    uint64 // events the edge applied on a primary itself
	Dropped   uint64 // events dropped: NATS and the primary unreachable and the queue full, or unsent at Close
	Queued    int    // events waiting now
}

// outbox sends an edge's accounting events: per shard, in the order of their
// sequence numbers, one batch at a time. A batch goes to JetStream; when
// JetStream does not acknowledge it within PublishTimeout (NATS slow or
// down, the stream full), the edge applies the batch on the shard's primary
// itself with the same idempotent script, and a copy that reaches the stream
// later is a duplicate. Only when neither works do events wait, up to
// Capacity per shard.
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
	wg                                   sync.WaitGroup
	stop                                 chan struct{}
}

type queue struct {
	shard int
	name  string
	mu    sync.Mutex
	seq   uint64
	evs   []events.Accounting
	wake  chan struct{}
}

func newOutbox(cfg OutboxConfig, producer, source, prefix string, store Store, keys *limiter.KeySpace, nc *nats.Conn, logger *rateLog) (*outbox, error) {
	o := &outbox{cfg: cfg.withDefaults(), producer: producer, source: source, prefix: prefix, store: store, keys: keys,
		logger: logger, stop: make(chan struct{})}
	if nc != nil {
		js, err := jetstream.New(nc)
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
	q.mu.Lock()
	if len(q.evs) >= o.cfg.Capacity {
		q.mu.Unlock()
		o.dropped.Add(1)
		o.logger.Error("accounting event dropped: NATS and the primary are unreachable and the queue is full",
			"shard", q.name, "capacity", o.cfg.Capacity)
		return 0
	}
	q.seq++
	e.Producer, e.Seq, e.Source = o.producer, q.seq, o.source
	q.evs = append(q.evs, e)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return e.Seq
}

func (o *outbox) run(q *queue) {
	delay := 10 * time.Millisecond
	for {
		q.mu.Lock()
		n := min(len(q.evs), o.cfg.MaxBatch)
		batch := append([]events.Accounting(nil), q.evs[:n]...)
		q.mu.Unlock()
		if n == 0 {
			select {
			case <-q.wake:
				continue
			case <-o.stop:
				return
			}
		}
		if o.send(q, batch) {
			q.mu.Lock()
			q.evs = q.evs[n:]
			if len(q.evs) == 0 {
				q.evs = nil // let a large backlog's array go
			}
			q.mu.Unlock()
			delay = 10 * time.Millisecond
			continue
		}
		select { // neither NATS nor the primary: wait, keep the order
		case <-time.After(delay):
		case <-o.stop:
			return
		}
		delay = min(2*delay, time.Second)
	}
}

// send delivers one batch: to JetStream, or else on the primary. It reports
// whether the batch is delivered.
func (o *outbox) send(q *queue, batch []events.Accounting) bool {
	if o.js != nil {
		err := o.publish(q, batch)
		if err == nil {
			o.published.Add(uint64(len(batch)))
			o.messages.Add(1)
			return true
		}
		o.logger.Warn("publishing accounting events failed; applying them on the primary", "shard", q.name, "err", err)
	}
	if err := o.apply(q, batch); err != nil {
		o.logger.Error("applying accounting events on the primary failed; they wait", "shard", q.name,
			"events", len(batch), "err", err)
		return false
	}
	o.direct.Add(uint64(len(batch)))
	return true
}

func (o *outbox) publish(q *queue, batch []events.Accounting) error {
	m, err := events.AccountingMsg(o.prefix, q.name, batch, nil)
	if err != nil {
		return err // a defect: events are validated when built
	}
	fut, err := o.js.PublishMsgAsync(m, jetstream.WithMsgID(m.Header.Get(events.HeaderMsgID)))
	if err != nil {
		return err
	}
	t := time.NewTimer(o.cfg.PublishTimeout)
	defer t.Stop()
	select {
	case <-fut.Ok():
		return nil
	case err := <-fut.Err():
		return err
	case <-t.C:
		return errors.New("no acknowledgement within the publish timeout")
	}
}

// apply applies a batch on the shard's primary, as the accountant would.
func (o *outbox) apply(q *queue, batch []events.Accounting) error {
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := o.store.Apply(ctx, q.shard, time.Now(), evs)
	if err != nil {
		return err
	}
	for _, r := range res.Results {
		if r.Err != nil {
			o.logger.Error("an accounting event was refused", "shard", q.name, "err", r.Err)
		}
	}
	return nil
}

func (o *outbox) stats() OutboxStats {
	s := OutboxStats{Published: o.published.Load(), Messages: o.messages.Load(), Direct: o.direct.Load(), Dropped: o.dropped.Load()}
	for _, q := range o.queues {
		q.mu.Lock()
		s.Queued += len(q.evs)
		q.mu.Unlock()
	}
	return s
}

// close delivers what is queued until ctx ends, then stops; what is left
// is counted as dropped.
func (o *outbox) close(ctx context.Context) error {
	for {
		if o.stats().Queued == 0 {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
			continue
		}
		break
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
