package accountant

import (
	"context"
	"time"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

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
				switch {
				case op.Kind != limiter.Charge && r.Amount > 0:
					w.notices = a.signer.Append(w.notices, events.Notice{Key: e.Key, ResetAt: r.ResetAt, Used: r.Used}, now)
				case op.Kind == limiter.Charge && r.Amount > 0 && r.Used >= e.Limit && !r.ResetAt.IsZero():
					// A charge that spent the window (an overdraft: a cost
					// known only at the end, an admission made without a
					// reservation): every edge denies it from now on.
					w.notices = a.signer.Append(w.notices, events.Notice{Full: true, Key: e.Key, ResetAt: r.ResetAt, Used: r.Used}, now)
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
			a.log.Debug("event", "shard", w.name, "message", it.seq, "producer", e.Producer, "seq", e.Seq, "kind", op.Kind,
				"outcome", outcome, "amount", r.Amount, "used", r.Used, "request_id", e.RequestID)
			a.recordDecision(w.name, e, outcome, r, now)
		}
		if dups > 0 && dups == len(it.ops) {
			a.repeated.Add(1)
		}
	}
}

// flushNotices tells the edges which windows have room again, and which
// a charge spent.
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
