package accountant

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

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

// process applies one run of messages, in order. It reports true when every
// message is applied or dead-lettered, false when ctx ended first (the lease
// was lost or the process is stopping) while Redis was failing: the
// messages then stay in the stream for whoever holds the shard next, and
// the worker must read no further (a later message processed would move
// what is purged past them).
func (w *worker) process(ctx context.Context, msgs []jetstream.Msg) bool {
	a := w.a
	items := make([]item, len(msgs))
	for j, m := range msgs {
		it := &items[j]
		it.msg = m
		if md, err := m.Metadata(); err == nil {
			it.seq = md.Sequence.Stream
			a.backlog[w.shard].Store(md.NumPending)
		}
		if it.seq != 0 && it.seq <= w.applied {
			continue // applied by this process's previous worker of the shard, not yet purged
		}
		producer := events.ProducerOfSubject(a.cfg.Streams.Accounting.SubjectPrefix, w.name, m.Subject())
		if producer == "" {
			it.bad = fmt.Errorf("%w: the subject names no producer (want %s.<producer>)", events.ErrInvalidEvent,
				events.AccountingSubject(a.cfg.Streams.Accounting.SubjectPrefix, w.name, ""))
		} else {
			it.evs, it.bad = events.DecodeAccounting(w.name, producer, m.Headers(), m.Data())
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
	// A run whose answer was lost goes again as itself, alone; it is
	// forgotten once its messages are read in another shape (or gone).
	lostFrom, lostTo, resend := 0, 0, false
	if w.lost != nil && len(items) > 0 {
		lostFrom, lostTo, resend = w.lost.lostIn(items)
		if !resend && items[len(items)-1].seq >= w.lost.seqs[0] {
			w.lost = nil
		}
	}
	// Apply the good messages' events in runs of at most BatchSize.
	for from := 0; from < len(items); {
		if resend && from == lostFrom {
			if !w.applyRun(ctx, items[lostFrom:lostTo], w.lost.run) {
				return false
			}
			w.lost, resend, from = nil, false, lostTo
			continue
		}
		limit := len(items)
		if resend && from < lostFrom {
			limit = lostFrom
		}
		to, n := from, 0
		for to < limit && (n == 0 || n+len(items[to].ops) <= a.cfg.BatchSize) {
			n += len(items[to].ops)
			to++
		}
		if !w.applyRun(ctx, items[from:to], limiter.Run{}) {
			return false
		}
		from = to
	}
	for j := range items {
		if items[j].bad != nil {
			if !w.deadLetter(ctx, &items[j]) {
				return false
			}
		}
		w.applied = max(w.applied, items[j].seq)
	}
	a.messages.Add(uint64(len(items)))
	w.flushNotices()
	return true
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
		// The policy and its window are what a window is opened on; a
		// client's limit differs from its policy's by design (tiers,
		// overrides, an operator's temporary limit), so it is not compared.
		// A calendar policy places its events itself: the event's window
		// is the period its reset ends (or its start falls in), whatever
		// length the event says.
		// Envoy's rate-limit rules are not configured policies (they may
		// come by xDS): a rule's policy is taken on a window some rule can
		// have.
		if p, ok := w.a.cfg.Policies[e.Policy]; len(w.a.cfg.Policies) > 0 {
			window := time.Duration(e.WindowSeconds) * time.Second
			switch {
			case ok && p.Calendar != "":
				reset, window := limiter.Entry{Policy: p, ResetAt: e.ResetAt, Start: e.StartedAt}.Placed()
				e.ResetAt, e.WindowSeconds = reset, int64(window/time.Second)
			case !ok && strings.HasPrefix(e.Policy, descriptors.PolicyPrefix):
				if !descriptors.RuleWindow(window, e.Slices) {
					return fmt.Errorf("%w: event %d: policy %q of a rate-limit rule with a window of %ds, which no rule has",
						events.ErrInvalidEvent, k+1, e.Policy, e.WindowSeconds)
				}
			case !ok || p.Window != window:
				return fmt.Errorf("%w: event %d: policy %q with a window of %ds is not configured", events.ErrInvalidEvent,
					k+1, e.Policy, e.WindowSeconds)
			case p.Slices != e.Slices:
				// A sliding window's events name its sub-windows, under keys
				// of their own: an event that disagrees would count where
				// no reservation looks.
				return fmt.Errorf("%w: event %d: policy %q is configured with %d sub-windows, not %d", events.ErrInvalidEvent,
					k+1, e.Policy, p.Slices, e.Slices)
			}
		}
		op, ok, err := e.Op(w.a.keys)
		if err != nil {
			return err
		}
		if got := w.a.store.ShardOf(op.Key); !w.a.store.Holds(w.shard, op.Key) {
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

// applyRun applies the events of items (in one or more calls) as run (the
// zero Run: a new one), retrying transient failures until ctx ends; a
// permanent failure is narrowed down to the message that causes it. It
// reports false when ctx ended first.
func (w *worker) applyRun(ctx context.Context, items []item, run limiter.Run) bool {
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
	if run.Seq == 0 {
		run = limiter.Run{Caller: a.cfg.Owner, Seq: a.runs.Add(1)} // a retry sends the same run again
	}
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
					if !w.applyRun(ctx, items[j:j+1], limiter.Run{}) {
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
		if w.reseeded() {
			return false // read again from the oldest message (errReseeded)
		}
		if errors.Is(err, redisstore.ErrReseeding) {
			a.log.Info("the shard's primary changed; applying resumes when its reseed ends", "shard", w.name)
		} else {
			a.log.Warn("applying events failed; retrying", "shard", w.name, "events", len(ops), "retry_in", w.delay, "err", err)
		}
		if !sleep(ctx, w.delay) {
			if !w.settleLost(run, items, ops) {
				seqs := make([]uint64, len(items))
				for j := range items {
					seqs[j] = items[j].seq
				}
				w.lost = &lostRun{run: run, seqs: seqs, ops: len(ops)}
			}
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
// It reports whether it learnt that answer; when it did not, the next
// worker of this process sends the run again (carry.go).
func (w *worker) settleLost(run limiter.Run, items []item, ops []limiter.Event) bool {
	call, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	res, err := w.a.store.ApplyRun(call, w.shard, w.a.now(), run, ops)
	if err != nil {
		return false
	}
	w.record(items, res)
	return true
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
		if !w.applyRun(ctx, one, limiter.Run{}) {
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
