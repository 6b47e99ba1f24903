// Package accountant applies request events to the windows in Redis: one
// worker per shard consumes the shard's events from JetStream in
// micro-batches, runs them as one pipeline of charge and refund scripts on
// the shard's primary, and acknowledges each event only after Redis
// confirmed it.
//
// # Guarantees
//
// Every event JetStream accepted is applied eventually, at most once:
//   - transient failures (connection loss, READONLY after a failover, a
//     restarting primary) nak the batch with a growing delay; the events wait
//     in JetStream and the consumer redelivers them without limit;
//   - redeliveries, duplicate publishes, a late ack after a crash between
//     Redis and the ack: the scripts apply each event id once;
//   - an event that can never be applied (undecodable, invalid, published to
//     the wrong shard) is copied to the dead-letter stream with its reason
//     and terminated, and the worker goes on.
//
// Several accountant processes can run at once: each shard's consumer pins
// one of them, and another takes over when the pinned one stops pulling.
//
// # Shutdown
//
// When the context ends, each worker stops pulling (the iterator drains),
// applies and acknowledges the batch in hand and the buffered events, and
// returns; Run flushes the acks to the server. Events still in flight from
// the server are redelivered after the ack wait. Close the Redis store and
// the NATS connection after Run returns.
package accountant

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// Config tunes the accountant. Zero values take the defaults stated.
type Config struct {
	Stream   events.StreamConfig
	Consumer events.ConsumerConfig
	// BatchSize is the most events applied in one Redis pipeline. Default 256.
	BatchSize int
	// BatchWait is how long a batch waits to fill after its first event.
	// Default 2ms: latency stays low under light load, batches fill under
	// heavy load.
	BatchWait time.Duration
	// RetryMin and RetryMax bound the nak delay after a transient failure;
	// it doubles with each consecutive failure. Defaults 100ms and 5s.
	RetryMin, RetryMax time.Duration
}

func (c Config) withDefaults() Config {
	c.Stream, c.Consumer = c.Stream.WithDefaults(), c.Consumer.WithDefaults()
	if c.BatchSize <= 0 {
		c.BatchSize = 256
	}
	if c.BatchWait <= 0 {
		c.BatchWait = 2 * time.Millisecond
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(c.RetryMin, 5*time.Second)
	}
	return c
}

// Stats counts what the accountant did since it started.
type Stats struct {
	Charged      uint64 // charges applied
	Refunded     uint64 // refunds applied
	Duplicates   uint64 // events that had taken effect before
	Late         uint64 // events whose window had closed or been replaced
	Netted       uint64 // charges cancelled by a refund that came first
	Pending      uint64 // refunds that came before their charge
	Ignored      uint64 // finished events with nothing to refund
	DeadLettered uint64 // events sent to the dead-letter stream
	Retries      uint64 // batches nak'ed after a transient failure
	// LagMax and LagSum/LagCount describe accounting lag: the time from an
	// event's publication to its effect in Redis.
	LagMax   time.Duration
	LagSum   time.Duration
	LagCount uint64
}

// Accountant runs one worker per shard of its store.
type Accountant struct {
	js    jetstream.JetStream
	store *limiter.Store
	keys  *limiter.KeySpace
	cfg   Config
	log   *slog.Logger
	now   func() time.Time

	charged, refunded, duplicates, late, netted, pending, ignored, dead, retries atomic.Uint64
	lagMax, lagSum, lagCount                                                     atomic.Int64
}

// New returns an accountant. log may be nil (slog.Default).
func New(js jetstream.JetStream, store *limiter.Store, keys *limiter.KeySpace, cfg Config, log *slog.Logger) *Accountant {
	if log == nil {
		log = slog.Default()
	}
	return &Accountant{js: js, store: store, keys: keys, cfg: cfg.withDefaults(), log: log, now: time.Now}
}

// Run creates the streams and consumers if needed (waiting for NATS when it
// is not up yet), then consumes until ctx ends, and drains. It returns the first worker error that was not caused
// by ctx ending.
func (a *Accountant) Run(ctx context.Context) error {
	err := events.EnsureStreamsRetry(ctx, a.js, a.cfg.Stream, 2*time.Second, func(err error) {
		a.log.Warn("creating streams failed; retrying", "err", err)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	var wg sync.WaitGroup
	errs := make([]error, a.store.Shards())
	for i := range a.store.Shards() {
		cons, err := events.EnsureConsumer(ctx, a.js, a.cfg.Stream, a.cfg.Consumer, a.store.ShardName(i))
		if err != nil {
			cancelled := ctx.Err() != nil // stopped while starting: not a failure
			wg.Wait()
			if cancelled {
				return nil
			}
			return err
		}
		wg.Go(func() { errs[i] = a.work(ctx, i, cons) })
	}
	wg.Wait()
	// Acks are fire-and-forget publishes: make sure the server has them
	// before saying the batch in hand is done.
	if err := a.js.Conn().FlushTimeout(5 * time.Second); err != nil {
		errs = append(errs, fmt.Errorf("accountant: flushing acks: %w", err))
	}
	return errors.Join(errs...)
}

// Stats returns the counters.
func (a *Accountant) Stats() Stats {
	return Stats{
		Charged: a.charged.Load(), Refunded: a.refunded.Load(), Duplicates: a.duplicates.Load(),
		Late: a.late.Load(), Netted: a.netted.Load(), Pending: a.pending.Load(), Ignored: a.ignored.Load(),
		DeadLettered: a.dead.Load(), Retries: a.retries.Load(),
		LagMax: time.Duration(a.lagMax.Load()), LagSum: time.Duration(a.lagSum.Load()), LagCount: uint64(a.lagCount.Load()),
	}
}

func (a *Accountant) work(ctx context.Context, shard int, cons jetstream.Consumer) error {
	name := a.store.ShardName(shard)
	it, err := cons.Messages(jetstream.PullMaxMessages(2*a.cfg.BatchSize), jetstream.PullPriorityGroup(events.Group))
	if err != nil {
		return fmt.Errorf("accountant: shard %s: %w", name, err)
	}
	stop := context.AfterFunc(ctx, it.Drain)
	defer stop()
	defer it.Stop()
	w := &worker{a: a, shard: shard, name: name, delay: a.cfg.RetryMin}
	for {
		batch, err := w.collect(it)
		if len(batch) > 0 {
			w.process(batch)
		}
		if err != nil {
			if ctx.Err() != nil { // drained on shutdown
				return nil
			}
			// The consumer was deleted or the connection closed under us:
			// fail loudly so that a supervisor restarts the process.
			return fmt.Errorf("accountant: shard %s: consuming stopped: %w", name, err)
		}
		if w.backoff > 0 { // the last batch failed: give Redis a moment
			select {
			case <-time.After(w.backoff):
			case <-ctx.Done():
			}
		}
	}
}

type worker struct {
	a       *Accountant
	shard   int
	name    string
	delay   time.Duration // next nak delay
	backoff time.Duration // pause before the next batch; 0 after a success
}

// collect blocks for one event, then takes more for up to BatchWait.
func (w *worker) collect(it jetstream.MessagesContext) ([]jetstream.Msg, error) {
	m, err := it.Next()
	if err != nil {
		return nil, err
	}
	batch := []jetstream.Msg{m}
	for len(batch) < w.a.cfg.BatchSize {
		m, err := it.Next(jetstream.NextMaxWait(w.a.cfg.BatchWait))
		if err != nil {
			if errors.Is(err, nats.ErrTimeout) {
				return batch, nil
			}
			return batch, err
		}
		batch = append(batch, m)
	}
	return batch, nil
}

// process applies one batch. It never returns an error: each event ends
// acknowledged (applied, or nothing to do), terminated (dead-lettered), or
// nak'ed with a delay (transient failure: it will be redelivered).
func (w *worker) process(batch []jetstream.Msg) {
	a := w.a
	ops := make([]limiter.Op, 0, len(batch))
	msgs := make([]jetstream.Msg, 0, len(batch))
	published := make([]time.Time, 0, len(batch))
	for _, m := range batch {
		ev, err := events.Decode(m.Headers(), m.Data())
		if err == nil && ev.Shard != w.name {
			err = fmt.Errorf("%w: event of shard %s on shard %s's subject", events.ErrInvalidEvent, ev.Shard, w.name)
		}
		var key limiter.Key
		if err == nil {
			key, err = a.keys.KeyFromDigest(ev.Data.Key)
		}
		if err != nil {
			w.deadLetter(m, err)
			continue
		}
		op := limiter.Op{Key: key, EventID: ev.Data.RequestID, Start: ev.Data.StartedAt,
			Cost: ev.Data.Cost, Window: time.Duration(ev.Data.WindowSeconds) * time.Second}
		switch {
		case ev.Kind == events.KindStarted:
			op.Kind = limiter.OpCharge
		case ev.Kind == events.KindFinished && ev.Data.Status == 304:
			op.Kind = limiter.OpRefund
		default: // a finished event with nothing to refund, or telemetry
			a.ignored.Add(1)
			_ = m.Ack()
			continue
		}
		ops, msgs, published = append(ops, op), append(msgs, m), append(published, ev.Time)
	}
	if len(ops) == 0 {
		return
	}
	// The batch in hand finishes even when shutdown has begun.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	results, err := a.store.Apply(ctx, w.shard, ops)
	if err != nil {
		a.retries.Add(1)
		a.log.Warn("apply failed; events nak'ed and will be redelivered",
			"shard", w.name, "events", len(msgs), "retry_in", w.delay, "err", err)
		for _, m := range msgs {
			_ = m.NakWithDelay(w.delay)
		}
		w.backoff = w.delay
		w.delay = min(2*w.delay, a.cfg.RetryMax)
		return
	}
	w.delay, w.backoff = a.cfg.RetryMin, 0
	now := a.now()
	for j, r := range results {
		if r.Err != nil {
			w.deadLetter(msgs[j], r.Err)
			continue
		}
		a.count(ops[j], r)
		_ = msgs[j].Ack()
		a.observeLag(now.Sub(published[j]))
	}
}

func (a *Accountant) count(op limiter.Op, r limiter.Result) {
	switch r.Outcome {
	case limiter.Applied:
		if op.Kind == limiter.OpCharge {
			a.charged.Add(1)
		} else {
			a.refunded.Add(1)
		}
	case limiter.Duplicate:
		a.duplicates.Add(1)
	case limiter.Late:
		a.late.Add(1)
		a.log.Info("late event not applied: its window has closed", "op", op.Kind.String(),
			"key", op.Key.Digest(), "request_id", op.EventID, "started_at", op.Start)
	case limiter.Netted:
		a.netted.Add(1)
	case limiter.Pending:
		a.pending.Add(1)
	}
}

func (a *Accountant) observeLag(d time.Duration) {
	d = max(0, d)
	a.lagSum.Add(int64(d))
	a.lagCount.Add(1)
	for {
		cur := a.lagMax.Load()
		if int64(d) <= cur || a.lagMax.CompareAndSwap(cur, int64(d)) {
			return
		}
	}
}

// Dead-letter headers, added to a copy of the original message.
const (
	HeaderDeadReason  = "Tally-Dead-Letter-Reason"
	HeaderDeadSubject = "Tally-Original-Subject"
	HeaderDeadSeq     = "Tally-Original-Sequence"
)

// deadLetter copies m to the dead-letter stream with the reason, then
// terminates it. If the copy cannot be stored, m is nak'ed instead: an
// event is never dropped without a trace.
func (w *worker) deadLetter(m jetstream.Msg, reason error) {
	a := w.a
	dm := nats.NewMsg(a.cfg.Stream.DeadLetterPrefix + "." + w.name)
	dm.Header = nats.Header{}
	for k, v := range m.Headers() {
		if k != events.HeaderMsgID {
			dm.Header[k] = append([]string(nil), v...)
		}
	}
	msgID := "dead." + w.name
	if md, err := m.Metadata(); err == nil {
		seq := strconv.FormatUint(md.Sequence.Stream, 10)
		dm.Header[HeaderDeadSeq] = []string{seq}
		msgID += "." + seq
	}
	dm.Header[HeaderDeadReason] = []string{reason.Error()}
	dm.Header[HeaderDeadSubject] = []string{m.Subject()}
	dm.Data = m.Data()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := a.js.PublishMsg(ctx, dm, jetstream.WithMsgID(msgID)); err != nil {
		a.log.Error("dead-letter publish failed; event nak'ed", "shard", w.name, "err", err)
		_ = m.NakWithDelay(a.cfg.RetryMax)
		return
	}
	a.dead.Add(1)
	a.log.Warn("event dead-lettered", "shard", w.name, "subject", m.Subject(), "reason", reason)
	_ = m.TermWithReason(clip(reason.Error()))
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}
