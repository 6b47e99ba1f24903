package outbox

import (
	"context"
	"errors"
	"fmt"
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

// Applier applies events on the shards' primaries (redisstore.Store).
type Applier interface {
	Apply(ctx context.Context, shard int, now time.Time, evs []limiter.Event) (limiter.ApplyResult, error)
	Shards() int
	ShardName(i int) string
}

// Log is where the outbox reports what an operator should know; it is
// called on every failure, so it should hold back repeats
// (telemetry.RateLog).
type Log interface {
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}

// Options configure an Outbox. Applier and a valid Producer are required.
type Options struct {
	Config  Config
	Applier Applier
	// NATS, when set, carries the events to JetStream; without it every
	// batch is applied on its primary.
	NATS *nats.Conn
	// Producer numbers the events (limiter.ValidProducer); Source is their
	// CloudEvents source; KeyID names the key secret their digests were
	// made with; Prefix is the accounting subject prefix.
	Producer, Source, KeyID, Prefix string
	Log                             Log
	// Learn, when set, hears what a refund or release the edge applied
	// itself left in a window (the accountant announces what it applies;
	// this is the edge's own share).
	Learn func(shard int, dg limiter.Digest, reset time.Time, used int64)
	// Lag records, for the events applied directly, the time from an
	// event's creation to its effect; Sizes the events per message
	// published. Tracer, when set, makes a producer span per message.
	Lag    metric.Float64Histogram
	Sizes  metric.Int64Histogram
	Tracer trace.Tracer
}

// Stats counts what an outbox did.
type Stats struct {
	Published uint64 // events in batches JetStream acknowledged
	Messages  uint64 // those batches
	Direct    uint64 // events the edge applied on a primary itself
	Dropped   uint64 // events dropped: NATS and the primary unreachable and the queue full, or undelivered at close
	Queued    int    // events not delivered yet
	// Redelivered: events applied directly and delivered again after their
	// primary changed (Redeliver).
	Redelivered uint64
}

// Outbox numbers, batches and delivers an edge's accounting entries
// (doc.go). It is safe for concurrent use.
type Outbox struct {
	o      Options
	cfg    Config
	js     jetstream.JetStream // nil: apply directly
	queues []*queue

	published, messages, direct, dropped atomic.Uint64
	redelivered                          atomic.Uint64
	wg                                   sync.WaitGroup
	stop                                 chan struct{}
	closed                               atomic.Bool
}

// item is an entry numbered.
type item struct {
	seq uint64
	e   limiter.Entry
}

type queue struct {
	shard   int
	name    string
	mu      sync.Mutex
	seq     uint64
	items   []item       // not sent yet
	pending atomic.Int64 // not delivered yet: queued and in flight
	wake    chan struct{}
	// applied are the last items the edge applied on the primary itself,
	// with when: a primary that changes can lose them (Redeliver).
	applied []appliedItem
}

type appliedItem struct {
	item
	at time.Time
}

// Items applied on a primary are kept for Redeliver this long, and at most
// this many per shard: a primary that takes over lacks only its
// predecessor's last writes.
const (
	keepApplied    = 30 * time.Second
	keepAppliedMax = 4096
)

// take removes up to n items from the queue.
func (q *queue) take(n int) []item {
	q.mu.Lock()
	defer q.mu.Unlock()
	n = min(n, len(q.items))
	if n == 0 {
		return nil
	}
	batch := append([]item(nil), q.items[:n]...)
	q.items = q.items[n:]
	if len(q.items) == 0 {
		q.items = nil // let a large backlog's array go
	}
	return batch
}

// New validates o and starts one sender per shard. Call Close to stop
// them.
func New(o Options) (*Outbox, error) {
	if err := o.Config.Validate(); err != nil {
		return nil, err
	}
	if o.Applier == nil || !limiter.ValidProducer(o.Producer) {
		return nil, fmt.Errorf("%w: an Applier and a producer id are required", ErrInvalidConfig)
	}
	if o.Log == nil {
		o.Log = discard{}
	}
	if o.Lag == nil {
		o.Lag = noop.Float64Histogram{}
	}
	if o.Sizes == nil {
		o.Sizes = noop.Int64Histogram{}
	}
	ob := &Outbox{o: o, cfg: o.Config.WithDefaults(), stop: make(chan struct{})}
	if o.NATS != nil {
		js, err := jetstream.New(o.NATS, jetstream.WithPublishAsyncMaxPending(ob.cfg.InFlight*o.Applier.Shards()*2))
		if err != nil {
			return nil, fmt.Errorf("outbox: %w", err)
		}
		ob.js = js
	}
	for i := range o.Applier.Shards() {
		q := &queue{shard: i, name: o.Applier.ShardName(i), wake: make(chan struct{}, 1)}
		ob.queues = append(ob.queues, q)
		ob.wg.Go(func() { ob.run(q) })
	}
	return ob, nil
}

type discard struct{}

func (discard) Warn(string, ...any)  {}
func (discard) Error(string, ...any) {}

// Record queues e for shard's primary and returns its sequence number, or
// 0 when it was refused: the shard's queue is full (NATS and the primary
// unreachable), or the outbox is closed.
func (ob *Outbox) Record(shard int, e limiter.Entry) uint64 {
	q := ob.queues[shard]
	if ob.closed.Load() || q.pending.Load() >= int64(ob.cfg.Capacity) {
		ob.dropped.Add(1)
		ob.o.Log.Error("accounting event dropped: NATS and the primary are unreachable and the queue is full",
			"shard", q.name, "capacity", ob.cfg.Capacity)
		return 0
	}
	q.mu.Lock()
	q.seq++
	seq := q.seq
	q.items = append(q.items, item{seq: seq, e: e})
	q.mu.Unlock()
	q.pending.Add(1)
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return seq
}

// flight is a batch awaiting JetStream's acknowledgement.
type flight struct {
	batch    []item
	ack      jetstream.PubAckFuture // nil: the publish failed at once
	deadline time.Time
}

func (ob *Outbox) run(q *queue) {
	var flying []flight
	for {
		stopping := false
		select {
		case <-ob.stop:
			stopping = true
		default:
		}
		if stopping && len(flying) == 0 {
			return
		}
		// Send what is queued while there is room in flight.
		for !stopping && len(flying) < ob.cfg.InFlight {
			batch := q.take(ob.cfg.MaxBatch)
			if batch == nil {
				break
			}
			if ob.cfg.Route == RouteDirect || ob.js == nil {
				if !ob.deliver(q, batch) {
					return // stopping
				}
				continue
			}
			flying = append(flying, ob.publish(q, batch))
		}
		if len(flying) == 0 {
			select {
			case <-q.wake:
				continue
			case <-ob.stop:
				return
			}
		}
		// Wait for the oldest batch in flight, or for more to send.
		head := &flying[0]
		switch ob.await(q, head, len(flying) < ob.cfg.InFlight) {
		case delivered:
			ob.published.Add(uint64(len(head.batch)))
			ob.messages.Add(1)
			q.pending.Add(-int64(len(head.batch)))
		case failed:
			if !ob.deliver(q, head.batch) {
				return
			}
		default: // woken to send more
			continue
		}
		flying = flying[1:]
	}
}

type result int

const (
	woken result = iota
	delivered
	failed
)

// await waits for f's acknowledgement until its deadline, or, when more
// may be sent (room), for more entries.
func (ob *Outbox) await(q *queue, f *flight, room bool) result {
	if f.ack == nil {
		return failed
	}
	var wake <-chan struct{}
	if room {
		wake = q.wake
	}
	t := time.NewTimer(time.Until(f.deadline))
	defer t.Stop()
	select {
	case <-f.ack.Ok():
		return delivered
	case err := <-f.ack.Err():
		ob.o.Log.Warn("publishing accounting events failed; applying them on the primary", "shard", q.name, "err", err)
		return failed
	case <-t.C:
		ob.o.Log.Warn("JetStream did not acknowledge accounting events in time; applying them on the primary", "shard", q.name)
		return failed
	case <-wake:
		return woken
	case <-ob.stop:
		// Give in-flight batches their time before giving up.
		select {
		case <-f.ack.Ok():
			return delivered
		case <-f.ack.Err():
		case <-t.C:
		}
		return failed
	}
}

// deliver delivers one batch on the primary, or else to JetStream, retrying
// both until one works or the outbox stops. It reports false when the
// outbox stopped first.
func (ob *Outbox) deliver(q *queue, batch []item) bool {
	delay := 10 * time.Millisecond
	for {
		err := ob.apply(q, batch)
		if err == nil {
			ob.direct.Add(uint64(len(batch)))
			q.remember(batch)
			q.pending.Add(-int64(len(batch)))
			return true
		}
		if ob.js != nil {
			f := ob.publish(q, batch)
			if f.ack != nil {
				t := time.NewTimer(ob.cfg.PublishTimeout)
				select {
				case <-f.ack.Ok():
					t.Stop()
					ob.published.Add(uint64(len(batch)))
					ob.messages.Add(1)
					q.pending.Add(-int64(len(batch)))
					return true
				case <-f.ack.Err():
				case <-t.C:
				}
				t.Stop()
			}
		}
		ob.o.Log.Error("accounting events wait: neither the primary nor JetStream takes them", "shard", q.name,
			"events", len(batch), "err", err)
		select {
		case <-time.After(delay):
		case <-ob.stop:
			return false
		}
		delay = min(2*delay, time.Second)
	}
}

// publish hands a batch to JetStream without waiting.
func (ob *Outbox) publish(q *queue, batch []item) flight {
	f := flight{batch: batch, deadline: time.Now().Add(ob.cfg.PublishTimeout)}
	evs := make([]events.Accounting, len(batch))
	for i, it := range batch {
		evs[i] = events.AccountingOf(it.e, ob.o.Producer, it.seq, ob.o.Source, ob.o.KeyID)
	}
	m, err := events.AccountingMsg(ob.o.Prefix, q.name, evs, nil)
	if err != nil {
		// A defect: every entry the decision core makes encodes
		// (credit's TestEntriesAreValidOnTheWire). The batch is applied on
		// the primary instead.
		ob.o.Log.Error("an accounting batch could not be encoded", "shard", q.name, "err", err)
		return f
	}
	ob.o.Sizes.Record(context.Background(), int64(len(batch)))
	if ob.o.Tracer != nil {
		ctx, span := ob.o.Tracer.Start(context.Background(), "send "+m.Subject, trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithLinks(events.Links(evs)...),
			trace.WithAttributes(events.MessagingAttributes("send", m.Subject, q.name, len(batch))...))
		events.InjectTrace(ctx, m)
		defer span.End()
	}
	ack, err := ob.js.PublishMsgAsync(m, jetstream.WithMsgID(m.Header.Get(events.HeaderMsgID)))
	if err != nil {
		ob.o.Log.Warn("publishing accounting events failed", "shard", q.name, "err", err)
		return f
	}
	f.ack = ack
	return f
}

// apply applies a batch on the shard's primary, as the accountant would,
// within PublishTimeout.
func (ob *Outbox) apply(q *queue, batch []item) error {
	evs := make([]limiter.Event, len(batch))
	for i, it := range batch {
		evs[i] = it.e.Event(ob.o.Producer, it.seq)
	}
	ctx, cancel := context.WithTimeout(context.Background(), ob.cfg.PublishTimeout)
	defer cancel()
	res, err := ob.o.Applier.Apply(ctx, q.shard, time.Now(), evs)
	if err != nil {
		return err
	}
	done := time.Now()
	for _, it := range batch {
		ob.o.Lag.Record(context.Background(), max(0, done.Sub(it.e.Time).Seconds()))
	}
	for j, r := range res.Results {
		if r.Err != nil {
			ob.o.Log.Error("an accounting event was refused", "shard", q.name, "err", r.Err)
			continue
		}
		if ob.o.Learn != nil && r.Outcome == limiter.Applied && evs[j].Kind != limiter.Charge && r.Amount > 0 {
			ob.o.Learn(q.shard, evs[j].Key.Digest(), r.ResetAt, r.Used)
		}
	}
	return nil
}

// remember keeps batch, just applied on the primary, for Redeliver.
func (q *queue) remember(batch []item) {
	now := time.Now()
	q.mu.Lock()
	defer q.mu.Unlock()
	drop := 0
	for drop < len(q.applied) && (now.Sub(q.applied[drop].at) > keepApplied || len(q.applied)-drop+len(batch) > keepAppliedMax) {
		drop++
	}
	q.applied = q.applied[drop:]
	for _, it := range batch[max(0, len(batch)-keepAppliedMax):] {
		q.applied = append(q.applied, appliedItem{item: it, at: now})
	}
}

// Redeliver delivers again what the edge applied on shard's primary itself
// in the last keepApplied: that primary was replaced, or restarted without
// its data, and its successor may lack them. Each event keeps its number,
// so that one the successor has is a duplicate there.
func (ob *Outbox) Redeliver(shard int) int {
	q := ob.queues[shard]
	now := time.Now()
	q.mu.Lock()
	var again []item
	for _, a := range q.applied {
		if now.Sub(a.at) <= keepApplied {
			again = append(again, a.item)
		}
	}
	q.applied = nil
	q.items = append(again, q.items...)
	q.mu.Unlock()
	if len(again) == 0 {
		return 0
	}
	q.pending.Add(int64(len(again)))
	ob.redelivered.Add(uint64(len(again)))
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return len(again)
}

// Stats reads the outbox's counters.
func (ob *Outbox) Stats() Stats {
	s := Stats{Published: ob.published.Load(), Messages: ob.messages.Load(), Direct: ob.direct.Load(), Dropped: ob.dropped.Load(),
		Redelivered: ob.redelivered.Load()}
	for _, q := range ob.queues {
		s.Queued += int(q.pending.Load())
	}
	return s
}

// ErrUndelivered is returned by Close when events were left undelivered.
var ErrUndelivered = errors.New("outbox: accounting events undelivered at shutdown")

// Close delivers what is queued until ctx ends, then stops; what is left
// is counted as dropped. Record refuses entries once Close has begun.
func (ob *Outbox) Close(ctx context.Context) error {
	if !ob.closed.CompareAndSwap(false, true) {
		return nil
	}
	for ob.Stats().Queued > 0 && ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	close(ob.stop)
	ob.wg.Wait()
	if left := ob.Stats().Queued; left > 0 {
		ob.dropped.Add(uint64(left))
		return fmt.Errorf("%w: %d", ErrUndelivered, left)
	}
	return nil
}
