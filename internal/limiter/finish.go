package limiter

import (
	"fmt"
	"time"
)

// FinishArgs describe a request being finished: how it was admitted and
// charged, and the status of its response.
type FinishArgs struct {
	// ResetAt is the window the response showed; zero when the request was
	// admitted without knowledge of its window (fail open), which needs
	// ChargeSeq.
	ResetAt time.Time
	// Start is when the request started; Window the policy's length.
	Start  time.Time
	Window time.Duration
	// Holder admitted the request (an edge's table entry: Producer, a dot
	// and more), as its N-th admission (from 0) in the window.
	Producer, Holder string
	N                uint64
	// Units is what the request was charged; ChargeSeq the number of the
	// Producer's accounting event that charged it, or 0 for a reservation.
	Units     int64
	ChargeSeq uint64
	// Status is the response's.
	Status int
	// Back is what to give back of Units: all of them for a 304; what an
	// estimate charged beyond the request's actual cost; else 0. A charge
	// event not yet applied nets whole whenever Back is above 0
	// (FinishPending): the caller charges again what the request keeps.
	Back int64
	// Slices, above 0, says the window is a sub-window of a sliding window
	// of that many (Policy.Slices), named by ResetAt, which must be set: a
	// finish applies to it while it is in a span, until Linger after its
	// reset.
	Slices int
}

// FinishOutcome is what finishing did.
type FinishOutcome uint8

// The values match lua/finish.lua's.
const (
	// Finished: recorded; FinishArgs.Back given back (FinishResult.Amount).
	Finished FinishOutcome = 1
	// AlreadyFinished: the request was finished before; nothing changed.
	AlreadyFinished FinishOutcome = 2
	// FinishLate: the request's window has ended or been replaced.
	FinishLate FinishOutcome = 3
	// FinishPending: recorded; its charge event has not been applied yet and
	// will net to zero when it is (whole, whatever Back was).
	FinishPending FinishOutcome = 5
)

func (o FinishOutcome) String() string {
	switch o {
	case Finished:
		return "finished"
	case AlreadyFinished:
		return "already finished"
	case FinishLate:
		return "late"
	case FinishPending:
		return "pending"
	}
	return fmt.Sprintf("FinishOutcome(%d)", uint8(o))
}

// FinishResult is what Finish did and the window after it.
type FinishResult struct {
	Outcome FinishOutcome
	// Amount is what was given back (at most Units; at most what the
	// producer holds in the window); Used and ResetAt are the window after
	// it, when something was.
	Amount  int64
	Used    int64
	ResetAt time.Time
}

// MaxFinishN bounds FinishArgs.N.
const MaxFinishN = 1<<32 - 1

func (a FinishArgs) Validate(k Key) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: finish: %s", ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	switch {
	case k.IsZero():
		return bad("no key")
	case !ValidProducer(a.Producer):
		return bad("producer %q", truncate(a.Producer, 70))
	case !validID(a.Holder, MaxHolderLen) || (a.Holder != a.Producer && !hasPrefixDot(a.Holder, a.Producer)):
		return bad("holder %q of producer %q", truncate(a.Holder, 70), a.Producer)
	case a.N > MaxFinishN:
		return bad("n %d", a.N)
	case a.Status < 100 || a.Status > 599:
		return bad("status %d", a.Status)
	case a.Units < 1 || a.Units > MaxLimit:
		return bad("units %d", a.Units)
	case a.Back < 0 || a.Back > a.Units:
		return bad("back %d of %d units", a.Back, a.Units)
	case a.ChargeSeq > MaxSeq || (a.ResetAt.IsZero() && a.ChargeSeq == 0):
		return bad("charge seq %d", a.ChargeSeq)
	case a.Start.UnixMilli() < 0 || a.Start.UnixMilli() > MaxMS:
		return bad("start %v", a.Start)
	case !a.ResetAt.IsZero() && (a.ResetAt.UnixMilli()%1000 != 0 || !a.Start.Before(a.ResetAt) ||
		a.ResetAt.Sub(a.Start) > a.Window+MaxResetAhead):
		return bad("reset_at %v for a start at %v", a.ResetAt, a.Start)
	case a.Slices > 0 && a.ResetAt.IsZero():
		return bad("a sub-window of a sliding window is named by reset_at")
	}
	if err := validSlices(a.Window, a.Slices); err != nil {
		return bad("%v", err)
	}
	return validWindow(a.Window)
}

func hasPrefixDot(s, prefix string) bool {
	return len(s) > len(prefix)+1 && s[:len(prefix)] == prefix && s[len(prefix)] == '.'
}
