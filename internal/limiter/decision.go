package limiter

import (
	"net/http"
	"strconv"
	"time"
)

// Window is one key's window as a single read saw it.
type Window struct {
	// Live is false when the read found no window whose reset_at is after
	// the read's now; the other fields are then zero.
	Live bool
	// Used is the number of units charged to the window.
	Used int64
	// Start is when the window opened; ResetAt is when it closes. ResetAt is
	// stored in Redis next to the count and never derived from a TTL, so
	// every read of one window reports the same ResetAt.
	Start, ResetAt time.Time
}

// Decision is the answer for one request, and everything its response
// headers say. It is built from one read of the window (Decide), so a
// rejection's headers come from the read that rejected it.
type Decision struct {
	Allowed  bool
	Resource string
	Limit    int64
	// Cost is what the request is charged if allowed.
	Cost int64
	// Used counts the units of the window including this request when it is
	// allowed, and excluding it when it is denied; Remaining = Limit - Used,
	// never below zero.
	Used      int64
	Remaining int64
	Window    time.Duration
	// ResetAt is the window's reset time, a whole second.
	ResetAt time.Time
	// Now is the time the decision was made at; relative headers (Retry-After,
	// RateLimit's t) count from it.
	Now time.Time
}

// Decide applies policy p to window w at time now. A request is allowed iff
// used + cost <= limit. When w is not live, the window is taken as empty and
// its reset as now + window rounded up to a whole second: the values that
// opening a window at now stores (Store.Take).
//
// p must be valid (Policy.Validate); with Cost <= Limit a denial always has
// Used >= 1, so a 429 never says Remaining equals the limit.
func Decide(p Policy, w Window, now time.Time) Decision {
	cost := p.CostOrDefault()
	used, reset := w.Used, w.ResetAt
	if !w.Live {
		used, reset = 0, ceilSecond(now.Add(p.Window))
	}
	d := Decision{
		Allowed:  used+cost <= p.Limit,
		Resource: p.Name,
		Limit:    p.Limit,
		Cost:     cost,
		Used:     used,
		Window:   p.Window,
		ResetAt:  ceilSecond(reset),
		Now:      now,
	}
	if d.Allowed {
		d.Used += cost
	}
	d.Remaining = max(0, d.Limit-d.Used)
	return d
}

// ResetIn is the time until the window resets, rounded up to whole seconds,
// never negative and never more than the window: a window opened at 10.3 s
// resets at 71 s (a whole second), and its first response says 60, not 61.
func (d Decision) ResetIn() time.Duration {
	left := d.ResetAt.Sub(d.Now)
	if left <= 0 {
		return 0
	}
	return min((left + time.Second - 1).Truncate(time.Second), max(d.Window, time.Second))
}

// RetryAfter is what a denied request's Retry-After says: the time until
// the window resets, rounded up, at least one second. It is never earlier
// than RateLimit's t (ResetIn).
func (d Decision) RetryAfter() time.Duration {
	left := d.ResetAt.Sub(d.Now)
	return max(time.Second, (left + time.Second - 1).Truncate(time.Second))
}

// SetHeaders writes the decision's rate-limit headers into h:
// GitHub's X-RateLimit-Limit, -Remaining, -Used, -Reset (Unix seconds) and
// -Resource; the IETF draft's RateLimit-Policy and RateLimit; and, when the
// request is denied, Retry-After (never earlier than RateLimit's t).
//
// It writes the canonical header keys directly (as Header.Set would store
// them) and builds the values in one buffer: it runs on every response.
func (d Decision) SetHeaders(h http.Header) {
	var buf [192]byte
	b := buf[:0]
	var ends [8]int
	n := 0
	mark := func() { ends[n] = len(b); n++ }
	b = strconv.AppendInt(b, d.Limit, 10)
	mark()
	b = strconv.AppendInt(b, d.Remaining, 10)
	mark()
	b = strconv.AppendInt(b, d.Used, 10)
	mark()
	b = strconv.AppendInt(b, d.ResetAt.Unix(), 10)
	mark()
	b = append(b, d.Resource...)
	mark()
	b = append(append(append(b, '"'), d.Resource...), `";q=`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = strconv.AppendInt(append(b, ";w="...), int64(d.Window/time.Second), 10)
	mark()
	b = append(append(append(b, '"'), d.Resource...), `";r=`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = strconv.AppendInt(append(b, ";t="...), int64(d.ResetIn()/time.Second), 10)
	mark()
	if !d.Allowed {
		b = strconv.AppendInt(b, int64(d.RetryAfter()/time.Second), 10)
		mark()
	}
	all := string(b) // one allocation for every value
	vals := make([]string, n)
	start := 0
	for i := range n {
		vals[i] = all[start:ends[i]]
		start = ends[i]
	}
	for i, k := range headerKeys[:n] {
		h[k] = vals[i : i+1 : i+1]
	}
}

// headerKeys are the canonical forms (textproto.CanonicalMIMEHeaderKey) of
// the headers SetHeaders writes, in its order.
var headerKeys = [...]string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Used", "X-Ratelimit-Reset",
	"X-Ratelimit-Resource", "Ratelimit-Policy", "Ratelimit", "Retry-After"}

// ceilSecond rounds t up to a whole second.
func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); !r.Equal(t) {
		return r.Add(time.Second)
	}
	return t
}
