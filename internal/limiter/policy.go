package limiter

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tallyhq/tally/internal/setting"
)

// ErrInvalidPolicy is wrapped by every policy validation error.
var ErrInvalidPolicy = errors.New("limiter: invalid policy")

// Limits the scripts accept (lua/window.lua); policies are checked against
// them up front so that no request can reach Redis with arguments the
// scripts would refuse.
const (
	MinWindow = time.Second
	MaxWindow = 366 * 24 * time.Hour
	// MaxSpan is the longest window the scripts are given: a calendar year
	// (Year.Longest), a day longer than MaxWindow for zones that move their
	// clocks by more than an hour.
	MaxSpan  = MaxWindow + 24*time.Hour
	MaxLimit = 1_000_000_000
	// MaxMS is the largest time the scripts take, in ms since the epoch
	// (year 5138).
	MaxMS = 100_000_000_000_000
)

// Mode says how an edge decides a policy's requests (docs/accuracy.md).
type Mode string

const (
	// ModeAuto decides from credit the edge reserved on the primary, and
	// reserves one request at a time near the limit. The default.
	ModeAuto Mode = "auto"
	// ModeExact reserves every request on the primary before answering: one
	// atomic call per request.
	ModeExact Mode = "exact"
	// ModeAsync never waits for Redis once a window is open: when its credit
	// runs out, an edge admits from what it last saw and has the accountant
	// charge the overdraft. With several edges it can admit more than the
	// limit; the overshoot is measured.
	ModeAsync Mode = "async"
)

// Validate reports whether m is a known mode; "" means ModeAuto.
func (m Mode) Validate() error {
	switch m {
	case "", ModeAuto, ModeExact, ModeAsync:
		return nil
	}
	return fmt.Errorf("%w: mode %q: want auto, exact or async", ErrInvalidPolicy, m)
}

// OrDefault is m, or ModeAuto when m is empty.
func (m Mode) OrDefault() Mode {
	if m == "" {
		return ModeAuto
	}
	return m
}

// Algorithm names how a policy counts (docs/architecture.md, "The seam
// an algorithm plugs into"). The decision core holds one unit per
// algorithm (credit.algorithm).
type Algorithm string

const (
	// FixedWindow counts Limit units per window: a window opens at a
	// client's first request, at a multiple of its length (Align) or at a
	// calendar boundary (Calendar), and resets at its end. The default.
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindow admits at most Limit units in any Slices consecutive
	// sub-windows of Window, aligned to the clock (docs/windows.md,
	// "Sliding windows"). Each sub-window is stored as a window of its own
	// (Key.SliceKey); a reservation in one counts the others of its span.
	SlidingWindow Algorithm = "sliding_window"
	// Concurrency admits at most Limit units in flight at once: a request
	// holds its units from its start until its finish, or until its lease
	// ends — Window to 2 × Window after its start — when no finish comes
	// (docs/windows.md, "Concurrency limits"). It is counted as a sliding
	// window of two sub-windows of Window (Slices 2, Align) whose finishes,
	// whatever their status, give the request's units back.
	Concurrency Algorithm = "concurrency"
	// TokenBucket admits at most Limit (the burst) + Rate × t / Every units
	// in any interval t (docs/windows.md, "Token buckets"). It is counted
	// in periods of BucketPeriod, aligned to the clock, as a sliding window
	// of two of them (Slices 2, Window BucketPeriod, Align): credit reserved
	// in a period is spent in it, and its units are held until the next
	// period ends; then they are spent for good and the bucket refills at
	// Rate per Every (lua/take.lua's bucket).
	TokenBucket Algorithm = "token_bucket"
)

// BucketPeriod is a token bucket's period: what edges reserve in a period
// is theirs to spend until it ends, and what they leave goes back then.
const BucketPeriod = time.Second

// MaxBucketEvery bounds Policy.Every, and MaxBucketScale the burst times
// Every in ms: the scripts count a bucket's level in units × Every's ms, exactly
// in Lua's numbers (below 2^53).
const (
	MaxBucketEvery = time.Hour
	MaxBucketScale = 1_000_000_000_000_000
)

// MaxSlices bounds Policy.Slices: a reservation reads 2 × Slices − 1
// sub-windows. DefaultSlices is the number a configuration that names
// none gets (a policy's, an Envoy rule's).
const (
	MaxSlices     = 60
	DefaultSlices = 10
)

// Validate reports whether a is an algorithm this version has; "" means
// FixedWindow.
func (a Algorithm) Validate() error {
	switch a {
	case "", FixedWindow, SlidingWindow, Concurrency, TokenBucket:
		return nil
	}
	return fmt.Errorf("%w: algorithm %q: want %s", ErrInvalidPolicy, a, algorithms)
}

const algorithms = "fixed_window, sliding_window, concurrency or token_bucket"

// Sliding reports whether a counts in sub-windows aligned to the clock
// (Policy.Slices): a sliding window, concurrency's two sub-windows of a
// lease, and a token bucket's two periods.
func (a Algorithm) Sliding() bool { return a == SlidingWindow || a == Concurrency || a == TokenBucket }

// GivesBack is what a request's finish with status gives back of the cost
// units it was charged: all of them for a 304 (nothing was served) and,
// under a concurrency limit, for any finish (the request no longer holds
// its units); nothing otherwise.
func (a Algorithm) GivesBack(status int, cost int64) int64 {
	if status == 304 || a == Concurrency {
		return cost
	}
	return 0
}

// OrDefault is a, or FixedWindow when a is empty.
func (a Algorithm) OrDefault() Algorithm {
	if a == "" {
		return FixedWindow
	}
	return a
}

// Policy is one rate limit: Limit units per Window, Cost units a request.
type Policy struct {
	// Algorithm is how the policy counts; "" means FixedWindow.
	Algorithm Algorithm
	// Slices, for a SlidingWindow, is how many sub-windows of Window its
	// span holds (2 to MaxSlices): at most Limit units are admitted in any
	// Slices consecutive sub-windows. A sliding policy's Window is its
	// sub-window's length and its windows are aligned to the clock (Align).
	// A Concurrency policy's is 2, and its Window the lease. 0 for other
	// algorithms.
	Slices int
	// Name names the limit in X-RateLimit-Resource and RateLimit-Policy, and
	// is part of every key: 1 to 64 of [a-z0-9_.-], starting with a letter or
	// digit.
	Name string
	// Limit is the number of units a window allows, 1 to MaxLimit.
	Limit int64
	// Window is the window length, whole seconds from MinWindow to MaxWindow.
	// A window starts at the whole second of its first request and ends
	// (resets) exactly Window later; with Align, at the multiple of Window
	// since the Unix epoch its first request falls in. For a calendar policy
	// (Calendar) it is Calendar.Longest(), the most one of its windows lasts:
	// what bounds such a window wherever a length bounds one; the window's
	// own length is WindowAt's.
	Window time.Duration
	// Align aligns windows to the clock, as envoyproxy/ratelimit's are: a
	// window of a minute is a minute of the clock, and its reset is known
	// without asking Redis (WindowAt).
	Align bool
	// Calendar, when set, makes every window one period of the calendar of
	// Location (nil: UTC): a day, an ISO week (from Monday), a month or a
	// year, from local midnight of its first day to local midnight of the
	// next period's first day. A month lasts 28 to 31 days, a day with a
	// change of daylight saving time 23 or 25 hours.
	Calendar Period
	Location *time.Location
	// Cost is what one request charges, 1 to Limit. 0 means 1.
	Cost int64
	// Mode is how edges decide; "" means ModeAuto.
	Mode Mode
	// Rate and Every, for a TokenBucket, are how fast it refills: Rate
	// units (1 to MaxLimit) every Every (whole seconds, 1 s to
	// MaxBucketEvery). Its Limit is the burst: at most Limit units at once,
	// and Limit + Rate × t / Every in any interval t. Zero for other
	// algorithms.
	Rate  int64
	Every time.Duration
	// Shadow decides and records without enforcing: a request this limit
	// would deny is let through (charged nothing here), and its decision
	// record says shadow. For rolling a limit out.
	Shadow bool
}

// Span is one window: from Start to ResetAt (exclusive), both whole
// seconds.
type Span struct {
	Start, ResetAt time.Time
}

// Length is how long s lasts.
func (s Span) Length() time.Duration { return s.ResetAt.Sub(s.Start) }

// IsZero reports whether s is no window.
func (s Span) IsZero() bool { return s.ResetAt.IsZero() }

// Contains reports whether t lies in s.
func (s Span) Contains(t time.Time) bool { return !t.Before(s.Start) && t.Before(s.ResetAt) }

// Fixed reports whether p's windows are known from the clock alone (aligned
// to it, or on the calendar): where a window opens does not depend on
// when a client first came.
func (p Policy) Fixed() bool { return p.Align || p.Calendar != "" }

// WindowAt is the window a request at t opens when none is live: the whole
// second t falls in and Window after it (first_request); the multiple of
// Window since the Unix epoch at or before t and Window after it (Align);
// the calendar period t falls in (Calendar). Its bounds are what the
// scripts store as the window's start and reset.
func (p Policy) WindowAt(t time.Time) Span {
	switch {
	case p.Calendar != "":
		return p.Calendar.span(t, p.Location)
	case p.Window < time.Second:
		return Span{}
	case p.Align:
		w := int64(p.Window / time.Second)
		s := t.Unix()
		s -= s % w
		return Span{Start: time.Unix(s, 0), ResetAt: time.Unix(s+w, 0)}
	}
	s := t.Unix()
	return Span{Start: time.Unix(s, 0), ResetAt: time.Unix(s, 0).Add(p.Window)}
}

// AlignedWindow is the window aligned to the clock that t falls in: from the
// multiple of p.Window since the Unix epoch at or before t, for p.Window.
func (p Policy) AlignedWindow(t time.Time) (start, reset time.Time) {
	p.Align, p.Calendar = true, ""
	s := p.WindowAt(t)
	return s.Start, s.ResetAt
}

// LengthAt is how long p's window at t lasts, as a client is told: Window,
// a sliding window's span, or for a calendar policy the length of the
// period t falls in.
func (p Policy) LengthAt(t time.Time) time.Duration {
	switch {
	case p.Slices > 0:
		return p.Span()
	case p.Calendar == "":
		return p.Window
	}
	return p.WindowAt(t).Length()
}

// Ending is p's window that resets at reset: the calendar period that ends
// there (from the period's start, should reset be no boundary of it: a
// window opened before p's terms changed), else Window before it.
func (p Policy) Ending(reset time.Time) Span {
	if p.Calendar != "" {
		return Span{Start: p.Calendar.span(reset.Add(-time.Nanosecond), p.Location).Start, ResetAt: reset}
	}
	return Span{Start: reset.Add(-p.Window), ResetAt: reset}
}

// Bucket is p as a token bucket of burst units refilled rate every every,
// counted in two periods of BucketPeriod aligned to the clock: the one
// place the terms of its periods are set.
func (p Policy) Bucket(burst, rate int64, every time.Duration) Policy {
	p.Algorithm, p.Limit, p.Rate, p.Every = TokenBucket, burst, rate, every
	p.Slices, p.Window, p.Align, p.Calendar, p.Location = 2, BucketPeriod, true, "", nil
	return p
}

// HoldsCredit reports whether edges may hold credit of p ahead of its
// requests: always but for a token bucket whose burst is less than two
// periods of its rate. Units held are the bucket's until the period after
// theirs ends, so such a bucket would admit less than its rate; it is
// decided in mode exact, every request its own reservation, spent at once.
func (p Policy) HoldsCredit() bool {
	return p.Algorithm != TokenBucket || p.Limit*p.Every.Milliseconds() >= 2*p.Rate*BucketPeriod.Milliseconds()
}

// WithDefaultMode is p with mode exact when it names none and edges may
// not hold its credit (HoldsCredit).
func (p Policy) WithDefaultMode() Policy {
	if p.Mode == "" && !p.HoldsCredit() {
		p.Mode = ModeExact
	}
	return p
}

// WithLimit is p with another limit, as a client's tier or override names
// one: Limit for a window or a concurrency limit; for a token bucket its
// Rate, and its burst (Limit) scaled alike, so that the burst refills in
// the same time (at least 1, at most what MaxBucketScale allows).
func (p Policy) WithLimit(n int64) Policy {
	if p.Algorithm != TokenBucket || p.Rate <= 0 {
		p.Limit = n
		return p
	}
	burst := max(1, int64(float64(p.Limit)*float64(n)/float64(p.Rate)))
	if ms := p.Every.Milliseconds(); ms > 0 {
		burst = min(burst, MaxBucketScale/ms, MaxLimit)
	}
	p.Rate, p.Limit = n, burst
	return p
}

// Refill is how long a token bucket takes to refill units from empty, at
// Rate per Every, rounded up to the millisecond (0 for other policies).
func (p Policy) Refill(units int64) time.Duration {
	if p.Rate <= 0 || units <= 0 {
		return 0
	}
	ms := p.Every.Milliseconds()
	return time.Duration((units*ms+p.Rate-1)/p.Rate) * time.Millisecond
}

// Span is how long the stretch p counts Limit over lasts: a sliding
// window's Slices sub-windows, else its window (for a calendar policy, its
// longest).
func (p Policy) Span() time.Duration {
	if p.Slices > 0 {
		return time.Duration(p.Slices) * p.Window
	}
	return p.Window
}

// Linger is how long after its reset a window of p still counts: a
// sliding window's sub-window is in the spans of the Slices − 1 after it;
// 0 for other policies.
func (p Policy) Linger() time.Duration { return Linger(p.Window, p.Slices) }

// Linger is how long after its reset a sub-window of length window, of a
// sliding window of slices of them, still counts (0 for slices 0: a
// window that ends at its reset).
func Linger(window time.Duration, slices int) time.Duration {
	if slices < 2 {
		return 0
	}
	return time.Duration(slices-1) * window
}

// Per says how long p's windows last, for people: "1h0m0s", "calendar
// month (Europe/Berlin)", or "1m0s, sliding in 6 sub-windows of 10s".
func (p Policy) Per() string {
	if p.Algorithm == TokenBucket {
		return "a bucket of " + strconv.FormatInt(p.Limit, 10) + ", refilled " + strconv.FormatInt(p.Rate, 10) + " every " + p.Every.String()
	}
	if p.Algorithm == Concurrency {
		return "in flight, each request's units held until its finish or a lease of " + p.Window.String() + " to " + p.Span().String()
	}
	if p.Slices > 0 {
		return p.Span().String() + ", sliding in " + strconv.Itoa(p.Slices) + " sub-windows of " + p.Window.String()
	}
	if p.Calendar == "" {
		return p.Window.String()
	}
	return "calendar " + string(p.Calendar) + " (" + locationName(p.Location) + ")"
}

func locationName(l *time.Location) string {
	if l == nil {
		return "UTC"
	}
	return l.String()
}

// PolicyError is a policy problem with the field it is in (name, limit,
// window, cost or mode); it wraps ErrInvalidPolicy.
type PolicyError = setting.Error

// ValidPolicyName reports whether s can name a policy: 1 to 64 of
// [a-z0-9_.-], starting with a letter or digit.
func ValidPolicyName(s string) bool {
	if len(s) < 1 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
		if !alnum && (i == 0 || (c != '_' && c != '.' && c != '-')) {
			return false
		}
	}
	return true
}

// Validate reports the first problem with p as a *PolicyError.
func (p Policy) Validate() error {
	bad := func(field, format string, args ...any) error {
		return setting.Errorf(ErrInvalidPolicy, field, format, args...)
	}
	switch {
	case !ValidPolicyName(p.Name):
		return bad("name", "%q: want 1 to 64 of [a-z0-9_.-], starting with a letter or digit", truncate(p.Name, 70))
	case p.Limit < 1 || p.Limit > MaxLimit:
		return bad("limit", "%d: want 1 to %d (policy %s)", p.Limit, MaxLimit, p.Name)
	case p.Calendar != "" && p.Calendar.Validate() != nil:
		return bad("period", "%q: want day, week, month or year (policy %s)", p.Calendar, p.Name)
	case p.Calendar != "" && p.Align:
		return bad("windows", "a calendar policy's windows are its periods, not aligned to a length (policy %s)", p.Name)
	case p.Calendar != "" && p.Window != p.Calendar.Longest():
		return bad("window", "%v: a calendar %s's windows last their period (policy %s)", p.Window, p.Calendar, p.Name)
	case p.Calendar == "" && (p.Window < MinWindow || p.Window > MaxWindow || p.Window%time.Second != 0):
		return bad("window", "%v: want whole seconds from %v to %v (policy %s)", p.Window, MinWindow, MaxWindow, p.Name)
	case p.Cost < 0 || p.Cost > p.Limit:
		return bad("cost", "%d: want 1 to the limit, %d (policy %s)", p.Cost, p.Limit, p.Name)
	case p.Mode.Validate() != nil:
		return bad("mode", "%q: want auto, exact or async (policy %s)", p.Mode, p.Name)
	case p.Algorithm.Validate() != nil:
		return bad("algorithm", "%q: want %s (policy %s)", p.Algorithm, algorithms, p.Name)
	case p.Algorithm == SlidingWindow && (p.Slices < 2 || p.Slices > MaxSlices):
		return bad("slices", "%d: want 2 to %d (policy %s)", p.Slices, MaxSlices, p.Name)
	case p.Algorithm == Concurrency && p.Slices != 2:
		return bad("slices", "%d: a concurrency limit is counted in 2 sub-windows of its lease (policy %s)", p.Slices, p.Name)
	case p.Algorithm == TokenBucket && (p.Slices != 2 || p.Window != BucketPeriod):
		return bad("slices", "%d of %v: a token bucket is counted in 2 periods of %v (policy %s)", p.Slices, p.Window, BucketPeriod, p.Name)
	case p.Algorithm == TokenBucket && (p.Rate < 1 || p.Rate > MaxLimit):
		return bad("limit", "%d: a token bucket refills 1 to %d units every window (policy %s)", p.Rate, MaxLimit, p.Name)
	case p.Algorithm == TokenBucket && (p.Every < time.Second || p.Every > MaxBucketEvery || p.Every%time.Second != 0):
		return bad("window", "%v: a token bucket refills every whole number of seconds, 1s to %v (policy %s)", p.Every, MaxBucketEvery, p.Name)
	case p.Algorithm == TokenBucket && p.Limit*p.Every.Milliseconds() > MaxBucketScale:
		return bad("burst", "%d: a bucket refilled every %v holds at most %d (policy %s)", p.Limit, p.Every, MaxBucketScale/p.Every.Milliseconds(), p.Name)
	case p.Algorithm == TokenBucket && p.Mode.OrDefault() != ModeExact && !p.HoldsCredit():
		return bad("mode", "%s: a token bucket of %d refilled %d every %v holds less than two periods (%v) of its rate: mode exact (policy %s)",
			p.Mode.OrDefault(), p.Limit, p.Rate, p.Every, 2*BucketPeriod, p.Name)
	case p.Algorithm != TokenBucket && (p.Rate != 0 || p.Every != 0):
		return bad("algorithm", "a rate is a token bucket's (policy %s)", p.Name)
	case p.Algorithm.Sliding() && (!p.Align || p.Calendar != ""):
		return bad("windows", "a sliding window's sub-windows are aligned to the clock (policy %s)", p.Name)
	case p.Algorithm.Sliding() && p.Span() > MaxWindow:
		return bad("window", "%v: a sliding window spans at most %v (policy %s)", p.Span(), MaxWindow, p.Name)
	case !p.Algorithm.Sliding() && p.Slices != 0:
		return bad("slices", "%d: sub-windows are a sliding window's (policy %s)", p.Slices, p.Name)
	}
	return nil
}

func validWindow(w time.Duration) error {
	if w < MinWindow || w > MaxSpan {
		return fmt.Errorf("%w: window %v: want %v to %v", ErrInvalidArgument, w, MinWindow, MaxSpan)
	}
	return nil
}

// CostOrDefault is the policy's cost, 1 when unset.
func (p Policy) CostOrDefault() int64 {
	if p.Cost == 0 {
		return 1
	}
	return p.Cost
}
