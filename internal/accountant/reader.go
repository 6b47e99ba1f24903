package accountant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
)

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
		attempts: map[uint64]int{}, idle: time.NewTimer(a.cfg.PurgeEvery), epoch: a.store.Epoch(i)}
	c := a.takeOver(i)
	w.applied, w.lost = c.applied, c.lost
	defer func() {
		if w.reseeded() {
			// What this process applied before the primary changed may
			// be lost: the next worker applies it all again.
			w.applied = 0
		}
		a.leave(i, carry{applied: w.applied, lost: w.lost})
	}()
	defer w.purge(true)
	for {
		msgs, err := w.collect(in)
		if len(msgs) > 0 && !w.process(ctx, msgs) {
			// Stopped short: nothing after an unapplied message is read,
			// so that nothing purges it.
			if w.reseeded() {
				return errReseeded
			}
			return nil
		}
		if w.reseeded() {
			return errReseeded
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
	// lost is a run whose answer was lost, to send again as itself when
	// its messages are read (carry.go).
	lost *lostRun
	// epoch is the store's count of the shard's reseeds when the worker
	// began (redisstore.Store.Epoch).
	epoch uint64
}

// reseedPoll is how long, at most, an idle worker waits before it looks
// whether its shard reseeded.
const reseedPoll = 250 * time.Millisecond

// errReseeded ends a worker whose shard's primary changed (a reseed): what it
// applied may have been lost with the old primary, and the shard's subject
// is read again from its oldest message.
var errReseeded = errors.New("the shard's primary changed: reading its events again from the oldest")

// reseeded reports whether the shard's primary changed since the worker
// began.
func (w *worker) reseeded() bool { return w.a.store.Epoch(w.shard) != w.epoch }

// received is one message read from the stream, or the error that ended
// reading.
type received struct {
	msg jetstream.Msg
	err error
}

// collect waits up to PurgeEvery (at most reseedPoll, so that a reseed of the
// shard is seen) for one message, then takes those that have arrived since
// (waiting up to BatchWait for more when it is set), up to BatchSize
// messages. No message is no error.
func (w *worker) collect(in <-chan received) ([]jetstream.Msg, error) {
	w.idle.Reset(min(w.a.cfg.PurgeEvery, reseedPoll))
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
