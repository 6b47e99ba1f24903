package accountant

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/redisstore"
)

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

	mu      sync.Mutex
	states  []ShardState
	carried []carry // per shard: what its last worker left (carry.go)
}

// New returns an accountant. log may be nil (slog.Default).
func New(js jetstream.JetStream, store *redisstore.Store, keys *limiter.KeySpace, cfg Config, log *slog.Logger) *Accountant {
	if log == nil {
		log = slog.Default()
	}
	a := &Accountant{js: js, store: store, keys: keys, cfg: cfg.WithDefaults(), log: log, now: time.Now,
		lagHist: noop.Float64Histogram{}, msgEvents: noop.Int64Histogram{}, signer: events.NewNotices(keys.Derive(events.NoticeKeyLabel))}
	var b [8]byte
	_, _ = rand.Read(b[:])
	a.runs.Store(binary.BigEndian.Uint64(b[:]) >> 16) // below 2^48: room for 2^49 runs under limiter.MaxSeq
	a.backlog = make([]atomic.Uint64, store.Shards())
	a.states = make([]ShardState, store.Shards())
	a.carried = make([]carry, store.Shards())
	for i := range a.states {
		a.states[i].Name = store.ShardName(i)
	}
	if err := a.setupMetrics(); err != nil {
		log.Error("metrics could not be set up; /metrics serves what it can", "err", err)
	}
	return a
}

// Run refuses a configuration Config.Validate refuses, creates the streams
// if needed (waiting for NATS when it is not up yet), then serves every
// shard until ctx ends. A shard that fails retries by itself (see Shards);
// Run returns nil after a clean shutdown.
func (a *Accountant) Run(ctx context.Context) error {
	if err := a.cfg.Validate(); err != nil {
		return err
	}
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

func nilOnDone(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
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
