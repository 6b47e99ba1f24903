package accountant

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/telemetry"
)

// DecisionsConfig says which of the accountant's records go to the
// decisions stream.
type DecisionsConfig struct {
	events.BatcherConfig `yaml:",inline"`
	// SampleApplied is the share of ordinary outcomes recorded (charged,
	// refunded, released, netted), 0 to 1: default 1 (all); negative, none.
	// Anomalies (charged_over_limit, duplicate, late, pending) are always
	// recorded.
	SampleApplied float64 `yaml:"sample_applied"`
	// Disabled publishes no records at all.
	Disabled bool `yaml:"disabled"`
}

// Config tunes the accountant. Zero values take the defaults stated.
type Config struct {
	Streams events.Streams
	// Metrics is where the accountant's instruments are registered and
	// /metrics is served from; default a registry of its own.
	Metrics *telemetry.Metrics
	// Decisions configures the records of what applying each event did,
	// published on the decisions stream (an accountant's subject) for
	// analytics.
	Decisions DecisionsConfig
	// Tracer, when set, makes a consumer span per message applied: the
	// child of the span that published it (the message's traceparent
	// header), linked to the requests its events come from.
	Tracer trace.Tracer
	// Policies, when set, are the deployment's policies: an event whose
	// policy is unknown, or whose limit or window differ, is dead-lettered
	// instead of opening a window on terms nobody configured.
	Policies map[string]limiter.Policy
	// BatchSize is the most events read and applied as one run (the store
	// splits it into script calls of redisstore.Options.ScriptEvents). Default
	// 512.
	BatchSize int
	// BatchWait is how long a run waits for more messages after taking
	// those already received. Default 0: a run takes what has arrived, so
	// runs grow with load on their own (messages arrive while the previous
	// run is applied) and a lone event never waits. A wait below a
	// millisecond costs about a millisecond on an idle process (Go's timers
	// sleep in whole milliseconds there).
	BatchWait time.Duration
	// LeaseTTL is how long a shard's lease outlives its holder's last
	// renewal: the hand-over time after a crash. Default 3s.
	LeaseTTL time.Duration
	// PurgeEvery is how often applied messages are deleted from the stream.
	// Default 200ms.
	PurgeEvery time.Duration
	// RetryMin and RetryMax bound the delay before a failed run is tried
	// again; it doubles with each consecutive failure. Defaults 50ms and 2s.
	RetryMin, RetryMax time.Duration
	// MaxAttempts is how often a message whose events Redis refuses with a
	// permanent error (WRONGTYPE, a script error) is tried before it is
	// dead-lettered. Default 5.
	MaxAttempts int
	// Owner names this process in leases; default a random id.
	Owner string
}

func (c Config) withDefaults() Config {
	c.Streams = c.Streams.WithDefaults()
	if c.BatchSize <= 0 || c.BatchSize > limiter.MaxApply {
		c.BatchSize = 512
	}
	c.BatchWait = max(c.BatchWait, 0)
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 3 * time.Second
	}
	if c.PurgeEvery <= 0 {
		c.PurgeEvery = 200 * time.Millisecond
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(c.RetryMin, 2*time.Second)
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.Owner == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		c.Owner = "accountant-" + hex.EncodeToString(b[:])
	}
	return c
}

// Stats counts what the accountant did since it started.
type Stats struct {
	Charged, Refunded, Released uint64 // events applied, by kind
	Duplicates                  uint64 // events applied before (redelivered, republished)
	Late                        uint64 // events whose window had ended or been replaced
	Netted                      uint64 // charges cancelled by a refund that came first
	Pending                     uint64 // refunds that came before their charge
	Ignored                     uint64 // finished events with nothing to refund
	// NotHeld counts refunds and releases (among those applied) of units
	// their producer did not hold in the window: nothing given back.
	NotHeld      uint64
	DeadLettered uint64 // messages copied to the dead-letter stream
	Retries      uint64 // runs tried again after a failure
	Unconfirmed  uint64 // purges held back: no replica confirmed in time
	Messages     uint64 // stream messages processed
	Repeated     uint64 // messages whose every event was applied before (read or published again)
	// OverLimit counts units charged beyond a window's limit: admissions
	// made without a reservation (mode async over credit, or with Redis
	// unreachable) that turned out to exceed it.
	OverLimit uint64
	Lag       metrics.Snapshot // accounting lag: an event's creation to its effect in Redis
}

// ShardState is what one shard's worker is doing.
type ShardState struct {
	Name   string
	Active bool // this process holds the lease and reads the shard
	// Leasing: the shard's lease has been asked for at least once (held
	// here, or found held by another accountant): its primary answered.
	Leasing bool
	// Err is the last failure, and Since when the shard has been failing
	// (zero when it is not).
	Err   error
	Since time.Time
}

// Accountant runs one worker per shard of its store.
type Accountant struct {
	js    jetstream.JetStream
	store *redisstore.Store
	keys  *limiter.KeySpace
	cfg   Config
	log   *slog.Logger
	now   func() time.Time

	charged, refunded, released, duplicates, late, netted, pending, ignored atomic.Uint64
	notHeld                                                                 atomic.Uint64
	dead, retries, unconfirmed, messages, overLimit, repeated               atomic.Uint64
	backlog                                                                 []atomic.Uint64 // per shard: messages left to read, as of the last one read
	msgEvents                                                               metric.Int64Histogram
	lag                                                                     metrics.Histogram
	lagHist                                                                 metric.Float64Histogram
	decisions                                                               atomic.Pointer[events.Batcher]
	dseq                                                                    atomic.Uint64
	runs                                                                    atomic.Uint64 // the last run sent (limiter.Run); a random start, so that a process reusing an Owner never reuses a number

	// signer signs the room notices the accountant sends.
	signer *events.Notices
	// streamsReady is set once the streams exist.
	streamsReady atomic.Bool

	mu     sync.Mutex
	states []ShardState
}

// New returns an accountant. log may be nil (slog.Default).
func New(js jetstream.JetStream, store *redisstore.Store, keys *limiter.KeySpace, cfg Config, log *slog.Logger) *Accountant {
	if log == nil {
		log = slog.Default()
	}
	a := &Accountant{js: js, store: store, keys: keys, cfg: cfg.withDefaults(), log: log, now: time.Now,
		lagHist: noop.Float64Histogram{}, msgEvents: noop.Int64Histogram{}, signer: events.NewNotices(keys.Derive(events.NoticeKeyLabel))}
	var b [8]byte
	_, _ = rand.Read(b[:])
	a.runs.Store(binary.BigEndian.Uint64(b[:]) >> 16) // below 2^48: room for 2^49 runs under limiter.MaxSeq
	a.backlog = make([]atomic.Uint64, store.Shards())
	a.states = make([]ShardState, store.Shards())
	for i := range a.states {
		a.states[i].Name = store.ShardName(i)
	}
	if err := a.setupMetrics(); err != nil {
		log.Error("metrics could not be set up; /metrics serves what it can", "err", err)
	}
	return a
}

// Run creates the streams if needed (waiting for NATS when it is not up
// yet), then serves every shard until ctx ends. A shard that fails retries
// by itself (see Shards); Run returns nil after a clean shutdown.
func (a *Accountant) Run(ctx context.Context) error {
	names := make([]string, a.store.Shards())
	for i := range names {
		names[i] = a.store.ShardName(i)
	}
	err := events.EnsureStreamsRetry(ctx, a.js, a.cfg.Streams, names, 2*time.Second, func(err error) {
		a.log.Warn("creating streams failed; retrying", "err", err)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	a.streamsReady.Store(true)
	if !a.cfg.Decisions.Disabled {
		b, err := events.NewBatcher(a.js.Conn(), a.cfg.Streams.AccountantDecisionsSubject(), a.cfg.Decisions.BatcherConfig)
		if err != nil {
			return err
		}
		a.decisions.Store(b)
		defer func() {
			done, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := b.Close(done); err != nil {
				a.log.Warn("decision records not all published", "err", err)
			}
		}()
	}
	var wg sync.WaitGroup
	for i := range a.store.Shards() {
		wg.Go(func() { a.serveShard(ctx, i) })
	}
	wg.Wait()
	return nil
}

// recordDecision publishes what applying e did (outcome) on the decisions
// stream, when records are on.
func (a *Accountant) recordDecision(shard string, e *events.Accounting, outcome string, r limiter.Result, now time.Time) {
	b := a.decisions.Load()
	if b == nil {
		return
	}
	switch outcome {
	case "charged", "refunded", "released", "netted": // the ordinary; anomalies are always recorded
		if !events.Sampled(a.cfg.Decisions.SampleApplied) {
			return
		}
	}
	dg, err := limiter.ParseDigest(e.Key)
	if err != nil {
		return
	}
	cost := e.Units
	if outcome == "refunded" || outcome == "released" {
		cost = r.Amount // at most what the producer held in the window
	}
	d := events.Decision{Time: now, Source: "accountant", Edge: a.cfg.Owner, Seq: a.dseq.Add(1), Shard: shard,
		TraceParent: e.TraceParent, Key: dg, Policy: e.Policy, Limit: e.Limit, WindowSeconds: e.WindowSeconds,
		Cost: cost, Allowed: true, Path: "accountant", Outcome: outcome, RequestID: e.RequestID, Used: r.Used,
		ResetAt: r.ResetAt, Lag: max(0, now.Sub(e.Time))}
	b.Add(d)
}

// Shards reports what each shard's worker is doing.
func (a *Accountant) Shards() []ShardState {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]ShardState(nil), a.states...)
}

func (a *Accountant) setState(i int, active bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := &a.states[i]
	s.Active = active
	if err == nil {
		s.Leasing = true
	}
	if err == nil {
		s.Err, s.Since = nil, time.Time{}
		return
	}
	if s.Err == nil {
		s.Since = a.now()
	}
	s.Err = err
}

// Stats returns the counters.
func (a *Accountant) Stats() Stats {
	return Stats{
		Charged: a.charged.Load(), Refunded: a.refunded.Load(), Released: a.released.Load(),
		Duplicates: a.duplicates.Load(), Late: a.late.Load(), Netted: a.netted.Load(), Pending: a.pending.Load(),
		Ignored: a.ignored.Load(), NotHeld: a.notHeld.Load(), DeadLettered: a.dead.Load(), Retries: a.retries.Load(),
		Unconfirmed: a.unconfirmed.Load(), Messages: a.messages.Load(), Repeated: a.repeated.Load(), OverLimit: a.overLimit.Load(), Lag: a.lag.Snapshot(),
	}
}

// serveShard holds shard i's lease and reads its events while it holds it,
// until ctx ends.
func (a *Accountant) serveShard(ctx context.Context, i int) {
	name := a.store.ShardName(i)
	poll := a.cfg.LeaseTTL / 4
	delay := a.cfg.RetryMin
	defer func() {
		free, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = a.store.FreeLease(free, i, a.cfg.Owner)
	}()
	for ctx.Err() == nil {
		held, err := a.hold(ctx, i)
		switch {
		case err != nil:
			a.setState(i, false, err)
			a.log.Warn("shard lease unavailable; retrying", "shard", name, "err", err)
			sleep(ctx, delay)
			delay = min(2*delay, a.cfg.RetryMax)
			continue
		case !held: // another accountant serves the shard
			a.setState(i, false, nil)
			sleep(ctx, poll)
			continue
		}
		delay = a.cfg.RetryMin
		a.setState(i, true, nil)
		a.log.Info("serving shard", "shard", name, "owner", a.cfg.Owner)
		err = a.lead(ctx, i)
		a.setState(i, false, err)
		if err != nil && ctx.Err() == nil {
			a.log.Error("shard stopped; restarting it", "shard", name, "err", err)
			sleep(ctx, a.cfg.RetryMin)
		}
	}
}

func (a *Accountant) hold(ctx context.Context, i int) (bool, error) {
	c, cancel := context.WithTimeout(ctx, a.cfg.LeaseTTL/2)
	defer cancel()
	l, err := a.store.HoldLease(c, i, a.cfg.Owner, a.cfg.LeaseTTL)
	return l.Held, err
}

// lead reads shard i while this process holds its lease: a renewal loop
// ends the reading as soon as the lease is lost or cannot be renewed in
// time.
func (a *Accountant) lead(ctx context.Context, i int) error {
	leading, lost := context.WithCancelCause(ctx)
	defer lost(nil)
	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		last := time.Now()
		t := time.NewTicker(a.cfg.LeaseTTL / 3)
		defer t.Stop()
		for {
			select {
			case <-leading.Done():
				return
			case <-t.C:
			}
			held, err := a.hold(leading, i)
			switch {
			case err == nil && held:
				last = time.Now()
			case err == nil:
				lost(errors.New("lease taken by another accountant"))
				return
			case time.Since(last) > a.cfg.LeaseTTL*2/3:
				lost(fmt.Errorf("lease not renewed: %w", err))
				return
			}
		}
	}()
	err := a.consume(leading, i)
	lost(nil)
	<-renewed
	if cause := context.Cause(leading); err == nil && ctx.Err() == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		a.log.Warn("shard handed over", "shard", a.store.ShardName(i), "reason", cause)
	}
	return err
}

// consume reads shard i's subject in order from its oldest message and
// applies it, until ctx ends or reading fails.
func (a *Accountant) consume(ctx context.Context, i int) error {
	name := a.store.ShardName(i)
	subject := events.ShardSubjects(a.cfg.Streams.Accounting.SubjectPrefix, name)
	a.backlog[i].Store(0)
	stream, err := a.js.Stream(ctx, a.cfg.Streams.Accounting.Name)
	if err != nil {
		return nilOnDone(ctx, fmt.Errorf("accountant: shard %s: %w", name, err))
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subject}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nilOnDone(ctx, fmt.Errorf("accountant: shard %s: %w", name, err))
	}
	it, err := cons.Messages(jetstream.PullMaxMessages(2 * a.cfg.BatchSize))
	if err != nil {
		return nilOnDone(ctx, fmt.Errorf("accountant: shard %s: %w", name, err))
	}
	stop := context.AfterFunc(ctx, it.Stop)
	defer stop()

	// One goroutine reads, so that a run can take what has arrived without
	// a timer.
	in := make(chan received, 2*a.cfg.BatchSize)
	done := make(chan struct{})
	var reader sync.WaitGroup
	reader.Go(func() {
		for {
			m, err := it.Next()
			select {
			case in <- received{m, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	})
	defer reader.Wait()
	defer close(done)
	defer it.Stop()

	w := &worker{a: a, shard: i, name: name, subject: subject, stream: stream, delay: a.cfg.RetryMin,
		attempts: map[uint64]int{}, idle: time.NewTimer(a.cfg.PurgeEvery)}
	defer w.purge(true)
	for {
		msgs, err := w.collect(in)
		if len(msgs) > 0 {
			w.process(ctx, msgs)
		}
		w.purge(false)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accountant: shard %s: reading stopped: %w", name, err)
		}
	}
}

func nilOnDone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

type worker struct {
	a       *Accountant
	shard   int
	name    string
	subject string
	stream  jetstream.Stream
	delay   time.Duration // before the next retry

	// Stream sequences: the last message processed (applied or
	// dead-lettered) and the last deleted from the stream.
	applied, purged uint64
	lastPurge       time.Time
	idle            *time.Timer    // collect's timer
	purging         sync.WaitGroup // a purge in the background
	purgeFailed     atomic.Bool    // the last purge failed: do it again
	attempts        map[uint64]int // stream seq → permanent failures
	notices         []byte
	notHeldLogged   time.Time // the last not_held event logged
}

// received is one message read from the stream, or the error that ended
// reading.
type received struct {
	msg jetstream.Msg
	err error
}

// collect waits up to PurgeEvery for one message, then takes those that
// have arrived since (waiting up to BatchWait for more when it is set), up
// to BatchSize messages. No message is no error.
func (w *worker) collect(in <-chan received) ([]jetstream.Msg, error) {
	w.idle.Reset(w.a.cfg.PurgeEvery)
	var r received
	select {
	case r = <-in:
	case <-w.idle.C:
		return nil, nil
	}
	if r.err != nil {
		return nil, r.err
	}
	batch := []jetstream.Msg{r.msg}
	var wait <-chan time.Time
	for len(batch) < w.a.cfg.BatchSize {
		select {
		case r = <-in:
			if r.err != nil {
				return batch, r.err
			}
			batch = append(batch, r.msg)
			continue
		default:
		}
		if w.a.cfg.BatchWait == 0 {
			break
		}
		if wait == nil {
			w.idle.Reset(w.a.cfg.BatchWait)
			wait = w.idle.C
		}
		select {
		case r = <-in:
			if r.err != nil {
				return batch, r.err
			}
			batch = append(batch, r.msg)
		case <-wait:
			return batch, nil
		}
	}
	return batch, nil
}

// item is one message of a run.
type item struct {
	msg    jetstream.Msg
	seq    uint64 // stream sequence
	evs    []events.Accounting
	ops    []limiter.Event
	opsFor []int      // index in evs of each op
	bad    error      // why the message must be dead-lettered
	span   trace.Span // its process span, when traced
	// refused, when set, are the only events of the message to
	// dead-letter: Redis applied the others.
	refused []events.Accounting
}

// process applies one run of messages, in order. It returns when every
// message is applied or dead-lettered, or when ctx ends (the lease was lost
// or the process is stopping) while Redis is failing: the messages then stay
// in the stream for whoever holds the shard next.
func (w *worker) process(ctx context.Context, msgs []jetstream.Msg) {
	a := w.a
	items := make([]item, len(msgs))
	for j, m := range msgs {
		it := &items[j]
		it.msg = m
		if md, err := m.Metadata(); err == nil {
			it.seq = md.Sequence.Stream
			a.backlog[w.shard].Store(md.NumPending)
		}
		producer := events.ProducerOfSubject(a.cfg.Streams.Accounting.SubjectPrefix, w.name, m.Subject())
		if producer == "" {
			it.bad = fmt.Errorf("%w: the subject names no producer (want %s.<producer>)", events.ErrInvalidEvent,
				events.AccountingSubject(a.cfg.Streams.Accounting.SubjectPrefix, w.name, ""))
		} else {
			it.evs, it.bad = events.DecodeAccounting(w.name, producer, m.Data())
		}
		a.msgEvents.Record(context.Background(), int64(len(it.evs)))
		if it.bad == nil {
			it.bad = w.convert(it)
		}
		if a.cfg.Tracer != nil {
			_, it.span = a.cfg.Tracer.Start(events.ExtractTrace(context.Background(), m.Headers()), "process "+m.Subject(),
				trace.WithSpanKind(trace.SpanKindConsumer), trace.WithLinks(events.Links(it.evs)...),
				trace.WithAttributes(events.MessagingAttributes("process", m.Subject(), w.name, len(it.evs))...))
			defer it.span.End()
		}
	}
	// Apply the good messages' events in runs of at most BatchSize.
	for from := 0; from < len(items); {
		to, n := from, 0
		for to < len(items) && (n == 0 || n+len(items[to].ops) <= a.cfg.BatchSize) {
			n += len(items[to].ops)
			to++
		}
		if !w.applyRun(ctx, items[from:to]) {
			return
		}
		from = to
	}
	for j := range items {
		if items[j].bad != nil {
			if !w.deadLetter(ctx, &items[j]) {
				return
			}
		}
		w.applied = max(w.applied, items[j].seq)
	}
	a.messages.Add(uint64(len(items)))
	w.flushNotices()
}

// convert turns a message's events into window operations, or says why
// they must not be applied.
func (w *worker) convert(it *item) error {
	for k := range it.evs {
		e := &it.evs[k]
		if e.KeyID != w.a.keys.KeyID() {
			return fmt.Errorf("%w: event %d: tallykeyid %s is not this deployment's (%s): its key digest was made with another "+
				"TALLY_KEY_SECRET and names another window", events.ErrInvalidEvent, k+1, e.KeyID, w.a.keys.KeyID())
		}
		if p, ok := w.a.cfg.Policies[e.Policy]; len(w.a.cfg.Policies) > 0 &&
			(!ok || p.Limit != e.Limit || p.Window != time.Duration(e.WindowSeconds)*time.Second) {
			return fmt.Errorf("%w: event %d: policy %q with limit %d per %ds is not configured", events.ErrInvalidEvent,
				k+1, e.Policy, e.Limit, e.WindowSeconds)
		}
		op, ok, err := e.Op(w.a.keys)
		if err != nil {
			return err
		}
		if got := w.a.store.ShardOf(op.Key); got != w.shard {
			return fmt.Errorf("%w: event %d: key of shard %s on shard %s's subject", events.ErrInvalidEvent,
				k+1, w.a.store.ShardName(got), w.name)
		}
		if !ok { // a finish with nothing to refund
			w.a.ignored.Add(1)
			continue
		}
		it.ops = append(it.ops, op)
		it.opsFor = append(it.opsFor, k)
	}
	return nil
}

// applyRun applies the events of items (in one or more calls), retrying
// transient failures until ctx ends; a permanent failure is narrowed down to
// the message that causes it. It reports false when ctx ended first.
func (w *worker) applyRun(ctx context.Context, items []item) bool {
	a := w.a
	var ops []limiter.Event
	for j := range items {
		if items[j].bad == nil {
			ops = append(ops, items[j].ops...)
		}
	}
	if len(ops) == 0 {
		return true
	}
	call, end := w.traced(ctx, items)
	defer end()
	run := limiter.Run{Caller: a.cfg.Owner, Seq: a.runs.Add(1)} // a retry sends the same run again
	for {
		res, err := w.apply(call, run, ops)
		if err == nil {
			w.delay = a.cfg.RetryMin
			w.record(items, res)
			return true
		}
		a.retries.Add(1)
		if redisstore.Permanent(err) {
			if len(items) > 1 { // find the message that fails
				for j := range items {
					if !w.applyRun(ctx, items[j:j+1]) {
						return false
					}
				}
				return true
			}
			it := &items[0]
			w.attempts[it.seq]++
			if w.attempts[it.seq] >= a.cfg.MaxAttempts {
				delete(w.attempts, it.seq)
				if len(it.ops) > 1 { // find the events that fail
					return w.applyEach(ctx, it)
				}
				it.bad = fmt.Errorf("redis refused its events %d times: %w", a.cfg.MaxAttempts, err)
				return true
			}
		}
		if redisstore.Permanent(err) {
			// Redis refused the command and will again: retry soon, a
			// bounded number of times, without slowing down what follows
			// (the backoff is for a node that is unreachable or busy).
			a.log.Warn("Redis refused events; trying again before dead-lettering them", "shard", w.name,
				"message", items[0].seq, "attempt", w.attempts[items[0].seq], "err", err)
			if !sleep(ctx, a.cfg.RetryMin) {
				return false
			}
			continue
		}
		a.log.Warn("applying events failed; retrying", "shard", w.name, "events", len(ops), "retry_in", w.delay, "err", err)
		if !sleep(ctx, w.delay) {
			w.settleLost(run, items, ops)
			return false
		}
		w.delay = min(2*w.delay, a.cfg.RetryMax)
	}
}

// settleLost asks once more, before the worker lets its shard go, what a
// run whose answer was lost did: the primary may have applied it (a frozen
// primary runs what its sockets hold when it wakes), and the next owner,
// finding its events applied, can only record them as duplicates. The same
// run sent again answers what the lost call did, so its records say so.
func (w *worker) settleLost(run limiter.Run, items []item, ops []limiter.Event) {
	call, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if res, err := w.a.store.ApplyRun(call, w.shard, w.a.now(), run, ops); err == nil {
		w.record(items, res)
	}
}

// traced returns ctx with the span a run's Redis calls are children of:
// its message's process span when the run is one message, else an apply
// span linked to each message's (end ends it). Untraced: ctx itself.
func (w *worker) traced(ctx context.Context, items []item) (context.Context, func()) {
	if w.a.cfg.Tracer == nil || len(items) == 0 {
		return ctx, func() {}
	}
	if len(items) == 1 && items[0].span != nil {
		return trace.ContextWithSpan(ctx, items[0].span), func() {}
	}
	links := make([]trace.Link, 0, len(items))
	for j := range items {
		if items[j].span != nil {
			links = append(links, trace.Link{SpanContext: items[j].span.SpanContext()})
		}
	}
	ctx, span := w.a.cfg.Tracer.Start(ctx, "apply "+w.name, trace.WithLinks(links...))
	return ctx, func() { span.End() }
}

// applyEach applies the events of a message Redis keeps refusing one at a
// time: those it accepts take effect (a message mixes the events of many
// windows, and one broken window must not take the others' refunds with
// it); those it refuses are the only ones dead-lettered. It reports false
// when ctx ended first.
func (w *worker) applyEach(ctx context.Context, it *item) bool {
	var refused []error
	for n := range it.ops {
		one := []item{{msg: it.msg, seq: it.seq, evs: it.evs, ops: it.ops[n : n+1], opsFor: it.opsFor[n : n+1], span: it.span}}
		if !w.applyRun(ctx, one) {
			return false
		}
		if one[0].bad != nil {
			it.refused = append(it.refused, it.evs[it.opsFor[n]])
			refused = append(refused, one[0].bad)
		}
	}
	if len(refused) > 0 {
		it.bad = fmt.Errorf("%d of its %d events: %w", len(refused), len(it.ops), refused[0])
	}
	it.ops = nil // applied or set aside: nothing left to record
	return true
}

// apply applies ops as run (the store bounds each script call): sent again
// after an answer was lost, a run's results are what the lost call did.
// The run in hand finishes even when shutdown has begun.
func (w *worker) apply(ctx context.Context, run limiter.Run, ops []limiter.Event) (limiter.ApplyResult, error) {
	call, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return w.a.store.ApplyRun(call, w.shard, w.a.now(), run, ops)
}

// record counts what a run did and notes the windows that have room again.
func (w *worker) record(items []item, res limiter.ApplyResult) {
	a := w.a
	now := a.now()
	k := 0
	for j := range items {
		it := &items[j]
		if it.bad != nil {
			continue
		}
		dups := 0
		for n, op := range it.ops {
			r := res.Results[k]
			k++
			if r.Outcome == limiter.Duplicate && r.Err == nil {
				dups++
			}
			e := &it.evs[it.opsFor[n]]
			if r.Err != nil { // refused for its fields: the message goes to the dead letters
				it.bad = r.Err
				continue
			}
			if r.Outcome != limiter.Duplicate {
				a.lag.Observe(now.Sub(e.Time))
				a.lagHist.Record(context.Background(), max(0, now.Sub(e.Time).Seconds()))
			}
			outcome := r.Outcome.String()
			switch r.Outcome {
			case limiter.Applied:
				switch {
				case op.Kind == limiter.Charge:
					a.charged.Add(1)
					outcome = "charged"
					if over := r.Used - e.Limit; over > 0 {
						a.overLimit.Add(uint64(min(over, r.Amount)))
						outcome = "charged_over_limit"
					}
				case r.Amount == 0:
					// A refund or release of units its producer did not hold
					// in the window: nothing given back (a producer's bug, or
					// one trying to give back what others charged).
					a.notHeld.Add(1)
					outcome = "not_held"
					if now.Sub(w.notHeldLogged) >= 5*time.Second {
						w.notHeldLogged = now
						a.log.Warn("a producer gave back units it does not hold in the window: nothing given back "+
							"(at most one such line every 5 s per shard)", "shard", w.name, "producer", e.Producer, "seq", e.Seq)
					}
				case op.Kind == limiter.Refund:
					a.refunded.Add(1)
					outcome = "refunded"
				case op.Kind == limiter.Release:
					a.released.Add(1)
					outcome = "released"
				}
				if op.Kind != limiter.Charge && r.Amount > 0 {
					w.notices = a.signer.Append(w.notices, events.Notice{Key: e.Key, ResetAt: r.ResetAt, Used: r.Used}, now)
				}
			case limiter.Duplicate:
				a.duplicates.Add(1)
			case limiter.Late:
				a.late.Add(1)
			case limiter.Netted:
				a.netted.Add(1)
			case limiter.Pending:
				a.pending.Add(1)
			}
			a.recordDecision(w.name, e, outcome, r, now)
		}
		if dups > 0 && dups == len(it.ops) {
			a.repeated.Add(1)
		}
	}
}

// flushNotices tells the edges which windows have room again.
func (w *worker) flushNotices() {
	if len(w.notices) == 0 {
		return
	}
	subject := events.NoticeSubject(w.a.cfg.Streams.NoticePrefix, w.name)
	if err := w.a.js.Conn().Publish(subject, w.notices); err != nil {
		w.a.log.Debug("publishing notices failed; edges converge by reading", "shard", w.name, "err", err)
	}
	w.notices = w.notices[:0]
}

// purge deletes from the stream what is applied (or dead-lettered), once a
// replica has confirmed it, at most every PurgeEvery, in the background so
// that reading goes on meanwhile (the final purge waits). The confirmation
// is a renewal of the lease with a WAIT: replication keeps order, so it
// covers every event applied before it.
func (w *worker) purge(final bool) {
	if final {
		// The last purge also waits for one still in flight: it holds the
		// lease while it confirms, and must not take it back after the
		// shard's lease is freed.
		defer w.purging.Wait()
	}
	upTo := w.applied
	if (upTo <= w.purged && !w.purgeFailed.Load()) || upTo == 0 || (!final && time.Since(w.lastPurge) < w.a.cfg.PurgeEvery) {
		return
	}
	w.purging.Wait() // one at a time
	w.purgeFailed.Store(false)
	w.purged, w.lastPurge = upTo, time.Now()
	w.purging.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		l, err := w.a.store.ConfirmApplied(ctx, w.shard, w.a.cfg.Owner, w.a.cfg.LeaseTTL)
		if err != nil || l.Replicated < l.Waited {
			w.purgeFailed.Store(true)
			w.a.unconfirmed.Add(1)
			w.a.log.Warn("no replica confirmed applied events in time; they stay in the stream until one does",
				"shard", w.name, "waited_for", l.Waited, "replicated", l.Replicated, "err", err)
			return
		}
		if err := w.stream.Purge(ctx, jetstream.WithPurgeSubject(w.subject), jetstream.WithPurgeSequence(upTo+1)); err != nil {
			w.purgeFailed.Store(true)
			w.a.log.Warn("deleting applied events from the stream failed; will retry", "shard", w.name, "err", err)
		}
	})
}

// Dead-letter headers, added to a copy of the original message.
const (
	HeaderDeadReason  = "Tally-Dead-Letter-Reason"
	HeaderDeadSubject = "Tally-Original-Subject"
	HeaderDeadSeq     = "Tally-Original-Sequence"
)

// deadLetter copies a message to the dead-letter stream with the reason,
// retrying until it is stored or ctx ends (reporting false): a message is
// never dropped without a trace.
func (w *worker) deadLetter(ctx context.Context, it *item) bool {
	a := w.a
	dm := nats.NewMsg(a.cfg.Streams.DeadLetters.SubjectPrefix + "." + w.name)
	dm.Header = nats.Header{}
	for k, v := range it.msg.Headers() {
		if k != events.HeaderMsgID {
			dm.Header[k] = append([]string(nil), v...)
		}
	}
	seq := strconv.FormatUint(it.seq, 10)
	dm.Header[HeaderDeadSeq] = []string{seq}
	dm.Header[HeaderDeadReason] = []string{clip(it.bad.Error(), 1000)}
	dm.Header[HeaderDeadSubject] = []string{it.msg.Subject()}
	dm.Data = it.msg.Data()
	if len(it.refused) > 0 {
		// Only what Redis refused: the message's other events were applied.
		if m, err := events.AccountingMsg(a.cfg.Streams.Accounting.SubjectPrefix, w.name, it.refused, nil); err == nil {
			dm.Data = m.Data
		}
	}
	for delay := a.cfg.RetryMin; ; delay = min(2*delay, a.cfg.RetryMax) {
		call, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_, err := a.js.PublishMsg(call, dm, jetstream.WithMsgID("dead."+w.name+"."+seq))
		cancel()
		if err == nil {
			a.dead.Add(1)
			a.log.Warn("message dead-lettered", "shard", w.name, "seq", it.seq, "reason", it.bad)
			return true
		}
		a.log.Error("dead-letter publish failed; retrying", "shard", w.name, "err", err)
		if !sleep(ctx, delay) {
			return false
		}
	}
}

// sleep waits d or until ctx ends, reporting whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
