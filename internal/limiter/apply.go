package limiter

import (
	"fmt"
	"time"
)

// EventKind says what an accounting event does to a window.
type EventKind uint8

const (
	// Charge adds Units to the window.
	Charge EventKind = iota + 1
	// Refund gives back Units of an earlier charge (a 304 response).
	Refund
	// Release gives back Units an edge reserved and did not use.
	Release
)

func (k EventKind) String() string {
	switch k {
	case Charge:
		return "charge"
	case Refund:
		return "refund"
	case Release:
		return "release"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// MaxSeq is the largest event sequence number.
const MaxSeq = 999_999_999_999_999

// Event is one accounting event: a producer's numbered change to one window.
// Each producer numbers its events per shard 1, 2, 3, ... and applies (or
// publishes) them in that order; an event whose number the shard has already
// applied is a Duplicate, whoever sends it again.
type Event struct {
	Producer string // ValidProducer
	Seq      uint64 // 1 to MaxSeq
	Kind     EventKind
	Key      Key
	// ResetAt names the window, as the response that the event belongs to
	// showed it (a whole second). Zero: the event is placed by Start.
	ResetAt time.Time
	// Start is when the request started.
	Start time.Time
	// Window is the policy's window length, used when the event opens one.
	Window time.Duration
	// Units is what the event adds or gives back, 1 to MaxLimit.
	Units int64
	// RefProducer and RefSeq name the charge a Refund gives back: a charge
	// of the same producer (RefProducer is Producer), numbered before the
	// refund. Empty: the charge was a reservation (Store.Take), known to be
	// applied; ResetAt must then be set. Other kinds leave them empty.
	RefProducer string
	RefSeq      uint64
	// Slices, above 0, names a sub-window of a sliding window of that many
	// sub-windows of Window (Policy.Slices): its own key (Key.SliceKey),
	// named by ResetAt, which must be set; the event applies to it while
	// it is in a span, until Linger after its reset.
	Slices int
}

// MaxResetAhead is how long after a request started its window may reset
// beyond the window's length: a second of rounding and a minute for clocks
// that differ. An event whose ResetAt lies outside (Start, Start + Window +
// MaxResetAhead] is refused.
const MaxResetAhead = 61 * time.Second

// Outcome is what an event did.
type Outcome uint8

// The values match lua/apply.lua's.
const (
	// Applied: the units were added or given back.
	Applied Outcome = iota + 1
	// Duplicate: the producer's event was applied before; nothing changed.
	Duplicate
	// Late: the event's window has ended or been replaced; nothing changed.
	Late
	// Netted: a charge whose refund came first; the two cancel.
	Netted
	// Pending: a refund whose charge has not come yet; it will net to zero.
	Pending
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Late:
		return "late"
	case Netted:
		return "netted"
	case Pending:
		return "pending"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Result is what one event did.
type Result struct {
	Outcome Outcome
	// Used and ResetAt are the window after an Applied event; Amount is what
	// it added or gave back (a refund never takes a window below zero).
	Used    int64
	ResetAt time.Time
	Amount  int64
	// Err is set, wrapping ErrInvalidArgument, when the event was refused
	// for its fields; it was not sent to Redis and the others still ran.
	Err error
}

// ApplyResult is what Apply did.
type ApplyResult struct {
	Results []Result
}

func (e *Event) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s event %d of %q: %s", ErrInvalidArgument, e.Kind, e.Seq, truncate(e.Producer, 70), fmt.Sprintf(format, args...))
	}
	switch {
	case !ValidProducer(e.Producer):
		return bad("bad producer id")
	case e.Seq < 1 || e.Seq > MaxSeq:
		return bad("seq: want 1 to %d", uint64(MaxSeq))
	case e.Kind < Charge || e.Kind > Release:
		return bad("bad kind")
	case e.Key.IsZero():
		return bad("no key")
	case !e.ResetAt.IsZero() && (e.ResetAt.UnixMilli() <= 0 || e.ResetAt.UnixMilli()%1000 != 0 || e.ResetAt.UnixMilli() > MaxMS):
		return bad("reset_at %v: want a whole second", e.ResetAt)
	case e.Start.UnixMilli() < 0 || e.Start.UnixMilli() > MaxMS:
		return bad("start %v", e.Start)
	case !e.ResetAt.IsZero() && (!e.Start.Before(e.ResetAt) || e.ResetAt.Sub(e.Start) > e.Window+MaxResetAhead):
		return bad("reset_at %v: want after the start %v and at most the window %v and %v later", e.ResetAt, e.Start, e.Window, MaxResetAhead)
	case e.Units < 1 || e.Units > MaxLimit:
		return bad("units %d: want 1 to %d", e.Units, MaxLimit)
	case e.Kind != Refund && (e.RefProducer != "" || e.RefSeq != 0):
		return bad("only refunds name a charge")
	case e.Kind == Refund && e.RefProducer != "" && (e.RefProducer != e.Producer || e.RefSeq < 1 || e.RefSeq >= e.Seq):
		return bad("a refund names a charge of its own producer, numbered before it")
	case e.Kind == Refund && e.RefProducer == "" && e.RefSeq != 0:
		return bad("bad charge reference")
	case e.Kind != Charge && e.RefProducer == "" && e.ResetAt.IsZero():
		return bad("a %s of a reservation needs reset_at", e.Kind)
	case e.Slices > 0 && e.ResetAt.IsZero():
		return bad("a sub-window of a sliding window is named by reset_at")
	case e.Slices > 0 && e.ResetAt.Unix()%int64(max(time.Second, e.Window)/time.Second) != 0:
		return bad("reset_at %v: a sliding window's sub-windows end at multiples of %v", e.ResetAt, e.Window)
	}
	if err := validSlices(e.Window, e.Slices); err != nil {
		return bad("%v", err)
	}
	return validWindow(e.Window)
}

// MaxApply is the most events one Apply call takes.
const MaxApply = 4096

// Run names a run of events its caller may send again after a failure: the
// same Caller and Seq for the same events, a new Seq for other events.
type Run struct {
	// Caller is the process sending the run (an accountant's owner id;
	// ValidProducer). Each caller has its own reply keys on a primary.
	Caller string
	// Seq numbers the caller's runs, from 1; 0 with Caller "" is no run.
	Seq uint64
}

// ReplyLifetime is how long a primary keeps the answer of a named run's
// last call (Run): a retry later than that, of a call whose answer was
// lost, finds its events applied before (Duplicate) — they still take
// effect once.
const ReplyLifetime = time.Hour
