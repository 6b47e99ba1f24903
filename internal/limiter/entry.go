package limiter

import "time"

// Entry is one thing left to account for, as an edge's decision core hands
// it to its outbox before it is numbered: the charge of an admission made
// without a reservation, the refund of a 304, credit given back unused. The
// outbox numbers it (Event's Producer and Seq) and either publishes it
// (package events) or applies it on the primary.
type Entry struct {
	// Kind is Charge, Refund (a 304) or Release.
	Kind   EventKind
	Key    Key
	Policy Policy
	Units  int64
	// ResetAt names the window the response showed (zero: the entry is
	// placed by Start, a request admitted without knowing its window).
	ResetAt time.Time
	// Start is when the request started (a release: when its window did).
	Start time.Time
	// Time is when the entry was made: accounting lag counts from it.
	Time        time.Time
	RequestID   string
	TraceParent string
	// ChargeSeq, on a refund, is the sequence of the charge (an entry of the
	// same producer) it gives back; 0 when the request was charged by a
	// reservation.
	ChargeSeq uint64
}

// Event is the window operation e becomes once numbered as seq of
// producer.
func (e Entry) Event(producer string, seq uint64) Event {
	reset, window := e.Placed()
	ev := Event{Producer: producer, Seq: seq, Kind: e.Kind, Key: e.Key, ResetAt: reset, Start: e.Start,
		Window: window, Units: e.Units, Slices: e.Policy.Slices}
	if e.Kind == Refund && e.ChargeSeq != 0 {
		ev.RefProducer, ev.RefSeq = producer, e.ChargeSeq
	}
	return ev
}

// Placed is the window the entry names, and its length, as its event says
// them: ResetAt and the policy's length; for a calendar policy the length
// of the period that ends at ResetAt, and, for an entry placed by its
// start, the reset of the period its start falls in (a calendar window is
// known from the clock: its event opens no window of another length).
func (e Entry) Placed() (resetAt time.Time, window time.Duration) {
	if e.Policy.Slices > 0 && e.ResetAt.IsZero() {
		// A sliding window's sub-windows are aligned to the clock: the one
		// the start falls in.
		return e.Policy.WindowAt(e.Start).ResetAt, e.Policy.Window
	}
	if e.Policy.Calendar == "" {
		return e.ResetAt, e.Policy.Window
	}
	if e.ResetAt.IsZero() {
		s := e.Policy.WindowAt(e.Start)
		return s.ResetAt, s.Length()
	}
	// A window opened before the policy's terms changed may have begun
	// before the period: it lasts at least from the entry's start.
	since := (e.ResetAt.Sub(e.Start) + time.Second - 1).Truncate(time.Second)
	return e.ResetAt, max(e.Policy.Ending(e.ResetAt).Length(), since)
}
