package loadgen

import (
	"context"
	"time"
)

// ClosedLoop runs conns connections to t, each sending a request and waiting
// for its response before sending the next, for warmup and then d. Only the
// measured period d is counted: requests written in it are Sent, and
// responses that end in it are Completed, with their latency measured from
// the write of the request to the end of the response. Elapsed is d.
//
// If ctx ends first, ClosedLoop stops at once and returns what it counted so
// far with ctx's error; Elapsed is then the part of d that had passed.
func ClosedLoop(ctx context.Context, t Target, conns int, warmup, d time.Duration) (Result, error) {
	if err := checkArgs(t, conns, warmup, d); err != nil {
		return Result{}, err
	}
	ws := newWorkers(&t, conns)
	connect(ctx, ws)
	start := time.Now()
	mStart := start.Add(warmup)
	mEnd := mStart.Add(d)
	rctx, cancel := context.WithDeadline(ctx, mEnd)
	defer cancel()
	run(rctx, ws, mStart, mEnd, func(w *worker) { w.closedLoop(mStart, mEnd) })
	end := time.Now()

	r := collect(ws)
	if err := ctx.Err(); err != nil && end.Before(mEnd) {
		r.Elapsed = max(end.Sub(mStart), 0)
		return r, err
	}
	r.Elapsed = d
	return r, nil
}

// closedLoop sends requests back to back until mEnd, counting those of
// [mStart, mEnd).
func (w *worker) closedLoop(mStart, mEnd time.Time) {
	for i := uint64(0); ; i++ {
		if w.nc == nil && !w.dial() {
			return
		}
		req := w.t.Request(w.id, i)
		begin := time.Now()
		if !begin.Before(mEnd) {
			return
		}
		written, status, end, err := w.roundTrip(req, i)
		if written && !begin.Before(mStart) {
			w.sent++
		}
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			w.countError(time.Now())
			continue
		}
		if !end.Before(mStart) && end.Before(mEnd) {
			w.complete(status, end.Sub(begin))
		}
	}
}
