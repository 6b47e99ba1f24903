package loadgen

import (
	"context"
	"math"
	"sync/atomic"
	"time"
)

// tailWait bounds how long OpenLoop waits, after the measured period, for
// the requests scheduled in it.
const tailWait = 10 * time.Second

// OpenLoop sends requests to t on a fixed schedule, rate requests per
// second evenly spaced, over at most conns connections, for warmup and then
// d. A request is sent at its scheduled time if a connection is free, and
// otherwise waits for the first one to become free.
//
// The requests scheduled in the measured period d are counted, and their
// latency is measured from their scheduled time to the end of the response,
// so time spent waiting for a connection counts. The run ends when all of
// them have completed or failed, or 10 seconds after d: requests still
// outstanding then are given up and counted as Errors. Elapsed runs from the
// start of d to its end or, if later, to the last counted response.
//
// If ctx ends first, OpenLoop stops at once and returns what it counted so
// far with ctx's error; outstanding requests are not counted as Errors.
func OpenLoop(ctx context.Context, t Target, rate float64, conns int, warmup, d time.Duration) (Result, error) {
	if err := checkArgs(t, conns, warmup, d); err != nil {
		return Result{}, err
	}
	if err := checkRate(rate); err != nil {
		return Result{}, err
	}
	s := &schedule{interval: 1e9 / rate}
	s.kStart = s.first(warmup)
	s.kEnd = s.first(warmup + d)
	ws := newWorkers(&t, conns)
	connect(ctx, ws)
	s.start = time.Now()
	mStart := s.start.Add(warmup)
	mEnd := mStart.Add(d)
	tailEnd := mEnd.Add(tailWait)
	rctx, cancel := context.WithDeadline(ctx, tailEnd)
	defer cancel()
	run(rctx, ws, mStart, tailEnd, func(w *worker) { w.openLoop(s) })
	end := time.Now()

	r := collect(ws)
	var failed uint64
	var last time.Time
	for _, w := range ws {
		failed += w.failed
		if w.last.After(last) {
			last = w.last
		}
	}
	if err := ctx.Err(); err != nil && end.Before(tailEnd) {
		r.Elapsed = max(min(end.Sub(mStart), d), last.Sub(mStart), 0)
		return r, err
	}
	r.Elapsed = max(d, last.Sub(mStart))
	if n := s.kEnd - s.kStart; n > r.Completed+failed {
		r.Errors += n - r.Completed - failed
	}
	return r, nil
}

// A schedule numbers requests from 0 and hands them out in order.
// Request k is due interval*k nanoseconds after start; those numbered in
// [kStart, kEnd) are counted, and none from kEnd on is sent.
type schedule struct {
	start        time.Time
	interval     float64 // nanoseconds
	kStart, kEnd uint64
	next         atomic.Uint64
}

// at returns when request k is due, relative to start.
func (s *schedule) at(k uint64) time.Duration {
	return time.Duration(float64(k) * s.interval)
}

// first returns the number of the first request due at or after off.
func (s *schedule) first(off time.Duration) uint64 {
	k := uint64(math.Ceil(float64(off) / s.interval))
	for k > 0 && s.at(k-1) >= off {
		k--
	}
	for s.at(k) < off {
		k++
	}
	return k
}

// openLoop takes the next request of s whenever the worker is free, waits
// for its scheduled time and sends it, until the schedule is exhausted.
func (w *worker) openLoop(s *schedule) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		if w.nc == nil {
			if s.next.Load() >= s.kEnd || !w.dial() {
				return
			}
		}
		k := s.next.Add(1) - 1
		if k >= s.kEnd {
			return
		}
		due := s.start.Add(s.at(k))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-w.ctx.Done():
				timer.Stop()
				return
			}
		}
		counted := k >= s.kStart
		written, status, done, err := w.roundTrip(w.t.Request(w.id, k), k)
		if written && counted {
			w.sent++
		}
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			if counted {
				w.errors++
				w.failed++
			} else {
				w.countError(time.Now())
			}
			continue
		}
		if counted {
			w.complete(status, done.Sub(due))
			w.last = done
		} else {
			w.warmed++
		}
	}
}
