package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/lua"
)

var finishScript = redis.NewScript(lua.Finish)

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
	// Status is the response's; only 304 gives units back.
	Status int
}

// FinishOutcome is what finishing did.
type FinishOutcome uint8

// The values match lua/finish.lua's.
const (
	// Finished: recorded; a 304's units given back (FinishResult.Amount).
	Finished FinishOutcome = 1
	// AlreadyFinished: the request was finished before; nothing changed.
	AlreadyFinished FinishOutcome = 2
	// FinishLate: the request's window has ended or been replaced.
	FinishLate FinishOutcome = 3
	// FinishPending: recorded; its charge event has not been applied yet and
	// will net to zero when it is.
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

// Finish finishes a request once on its window's primary at now (one
// atomic script call, lua/finish.lua): the first finish is recorded and, for
// a 304, gives the request's units back to the window its response showed,
// out of what its producer holds there; every later finish of the same
// request, on any edge, is AlreadyFinished. Like Take, it is not retried on
// a connection error: after an error the finish may or may not have been
// made, and sending it again answers AlreadyFinished if it was.
func (s *Store) Finish(ctx context.Context, k Key, now time.Time, a FinishArgs) (FinishResult, error) {
	if err := a.validate(k); err != nil {
		return FinishResult{}, err
	}
	var reset int64
	if !a.ResetAt.IsZero() {
		reset = ms(a.ResetAt)
	}
	n := s.shards[s.ShardOf(k)]
	keys := []string{k.String(), s.keys.FinishKey(k.Digest(), a.Holder, reset), s.producerKey(a.Producer)}
	v, err := s.run(ctx, n.primary, finishScript, false, keys, ms(now), reset, a.N, a.Status, a.Units, a.Producer,
		a.ChargeSeq, ms(a.Start), a.Window.Milliseconds(), s.opts.Grace.Milliseconds(), s.opts.SkewTolerance.Milliseconds(),
		s.opts.ProducerTTL.Milliseconds()).Int64Slice()
	if err != nil {
		return FinishResult{}, fmt.Errorf("limiter: finish on shard %s: %w", n.name, scriptErr(err))
	}
	if len(v) != 4 {
		return FinishResult{}, fmt.Errorf("limiter: finish on shard %s: unexpected reply %v", n.name, v)
	}
	r := FinishResult{Outcome: FinishOutcome(v[0]), Used: v[1], Amount: v[3]}
	if v[2] != 0 {
		r.ResetAt = fromMS(v[2])
	}
	return r, nil
}

func (a FinishArgs) validate(k Key) error {
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
	case a.ChargeSeq > MaxSeq || (a.ResetAt.IsZero() && a.ChargeSeq == 0):
		return bad("charge seq %d", a.ChargeSeq)
	case a.Start.UnixMilli() < 0 || a.Start.UnixMilli() > MaxMS:
		return bad("start %v", a.Start)
	case !a.ResetAt.IsZero() && (a.ResetAt.UnixMilli()%1000 != 0 || !a.Start.Before(a.ResetAt) ||
		a.ResetAt.Sub(a.Start) > a.Window+MaxResetAhead):
		return bad("reset_at %v for a start at %v", a.ResetAt, a.Start)
	}
	return validWindow(a.Window)
}

func hasPrefixDot(s, prefix string) bool {
	return len(s) > len(prefix)+1 && s[:len(prefix)] == prefix && s[len(prefix)] == '.'
}
