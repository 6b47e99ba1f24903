package limiter

import (
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
	// Expired are units of frozen shares whose holders stopped reporting
	// (lua/hold.lua): the next reservation short of room takes them back.
	Expired int64
}

// Decision is the answer for one request, and everything its response
// headers say: the front doors (HTTP headers, a gRPC status) render it. It
// comes from the state that decided the request, so a rejection's numbers
// are those of what rejected it.
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
	// RetryAt, when later than ResetAt, is when a denied client may try
	// again: progressive backoff told a client that came back too early to
	// wait longer. Strikes counts those early returns in a row.
	RetryAt time.Time
	Strikes int
}

// ResetIn is the time until the window resets, rounded up to whole seconds,
// never negative and never more than the window: a window opened by a
// request at 10.3 s starts at 10 s and resets at 70 s, and its first
// response says 60; an edge whose clock runs behind the one that opened the
// window says no more than 60 either.
func (d Decision) ResetIn() time.Duration {
	left := d.ResetAt.Sub(d.Now)
	if left <= 0 {
		return 0
	}
	return min((left + time.Second - 1).Truncate(time.Second), max(d.Window, time.Second))
}

// RetryAfter is what a denied request's Retry-After says: the time until
// the window resets (or RetryAt, when later), rounded up, at least one
// second. It is never earlier than RateLimit's t (ResetIn).
func (d Decision) RetryAfter() time.Duration {
	left := d.ResetAt.Sub(d.Now)
	if d.RetryAt.After(d.ResetAt) {
		left = d.RetryAt.Sub(d.Now)
	}
	return max(time.Second, (left + time.Second - 1).Truncate(time.Second))
}
