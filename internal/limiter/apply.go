package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// OpKind says what an Op does to a window.
type OpKind uint8

const (
	// OpCharge charges Cost to the window live at Start (lua/charge.lua).
	OpCharge OpKind = iota + 1
	// OpRefund gives an earlier charge back (lua/refund.lua).
	OpRefund
)

func (k OpKind) String() string {
	switch k {
	case OpCharge:
		return "charge"
	case OpRefund:
		return "refund"
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// MaxEventIDLen bounds event ids. Ids are hashed before they reach Redis.
const MaxEventIDLen = 256

// Op is one event's effect on one window.
type Op struct {
	Kind OpKind
	Key  Key
	// EventID identifies the request whose charge this is (for a refund: the
	// id of the charge to give back). 1 to MaxEventIDLen bytes.
	EventID string
	// Start is when the request started; it picks the window.
	Start time.Time
	// Cost is what a charge adds, 1 to MaxLimit. Refunds give back what the
	// charge recorded and ignore Cost.
	Cost int64
	// Window is the policy's window length, used when the op opens a window.
	Window time.Duration
}

// Outcome is what an Op did.
type Outcome uint8

// The values match the scripts' status codes.
const (
	// Applied: the charge was added, or the refund given back.
	Applied Outcome = iota + 1
	// Duplicate: the event took effect before; nothing changed.
	Duplicate
	// Late: the request's window has closed or been replaced; nothing changed.
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

// Result is what one Op did, and the window after it. A Late result has no
// window.
type Result struct {
	Outcome Outcome
	// Used is the window's count after the op (for a Duplicate charge: what
	// the first charge reported).
	Used           int64
	ResetAt, Start time.Time
	// Amount is the units added (charge) or given back (refund).
	Amount int64
	// Err is set, wrapping ErrInvalidArgument, when the op was refused; the
	// other fields are then zero.
	Err error
}

func (op Op) validate() error {
	switch {
	case op.Kind != OpCharge && op.Kind != OpRefund:
		return fmt.Errorf("%w: op kind %d", ErrInvalidArgument, op.Kind)
	case op.Key.IsZero():
		return fmt.Errorf("%w: %s: no key", ErrInvalidArgument, op.Kind)
	case op.EventID == "" || len(op.EventID) > MaxEventIDLen:
		return fmt.Errorf("%w: %s: event id of %d bytes: want 1 to %d", ErrInvalidArgument, op.Kind, len(op.EventID), MaxEventIDLen)
	case op.Start.UnixMilli() < 0:
		return fmt.Errorf("%w: %s: start %v before 1970", ErrInvalidArgument, op.Kind, op.Start)
	case op.Kind == OpCharge && (op.Cost < 1 || op.Cost > MaxLimit):
		return fmt.Errorf("%w: charge: cost %d: want 1 to %d", ErrInvalidArgument, op.Cost, MaxLimit)
	}
	return validWindow(op.Window)
}

func validWindow(w time.Duration) error {
	if w < MinWindow || w > MaxWindow {
		return fmt.Errorf("%w: window %v: want %v to %v", ErrInvalidArgument, w, MinWindow, MaxWindow)
	}
	return nil
}

// Apply runs ops on primary of shard i (see ShardOf) as one pipeline, with
// now read once for the batch. Every op must belong to shard i.
//
// An op refused for its arguments gets Result.Err and the others still run.
// Any other failure (connection loss, READONLY after a failover, a restart)
// returns an error: some ops may have taken effect, none twice, and the
// caller retries the whole batch, which is safe because every script is
// idempotent per event id. NOSCRIPT (an empty script cache after a restart,
// SCRIPT FLUSH or a promotion) is handled here by loading the scripts and
// rerunning the affected ops.
func (s *Store) Apply(ctx context.Context, i int, ops []Op) ([]Result, error) {
	n := s.shards[i]
	results := make([]Result, len(ops))
	cmds := make([]*redis.Cmd, len(ops))
	now := ms(s.opts.Clock.Now())
	tol, grace := s.opts.SkewTolerance.Milliseconds(), s.opts.Grace.Milliseconds()

	pending := make([]int, 0, len(ops))
	for j, op := range ops {
		if err := op.validate(); err != nil {
			results[j].Err = err
			continue
		}
		if got := s.ShardOf(op.Key); got != i {
			results[j].Err = fmt.Errorf("%w: key of shard %s applied on shard %s", ErrInvalidArgument, s.shards[got].name, n.name)
			continue
		}
		pending = append(pending, j)
	}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == 2 {
			return results, fmt.Errorf("limiter: apply on shard %s: scripts missing after reload", n.name)
		}
		pipe := n.primary.Pipeline()
		for _, j := range pending {
			op := ops[j]
			keys := []string{op.Key.String()}
			field := eventField(op.EventID)
			if op.Kind == OpCharge {
				cmds[j] = pipe.EvalSha(ctx, chargeScript.Hash(), keys,
					field, op.Cost, ms(op.Start), now, op.Window.Milliseconds(), tol, grace)
			} else {
				cmds[j] = pipe.EvalSha(ctx, refundScript.Hash(), keys,
					field, ms(op.Start), now, op.Window.Milliseconds(), tol, grace)
			}
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
		missing := pending[:0:0]
		for _, j := range pending {
			r, err := parseResult(cmds[j])
			switch {
			case err == nil:
				results[j] = r
			case redis.HasErrorPrefix(err, "NOSCRIPT"):
				missing = append(missing, j)
			case refused(err):
				results[j].Err = scriptErr(err)
			default:
				return results, fmt.Errorf("limiter: apply on shard %s: %w", n.name, err)
			}
		}
		if len(missing) > 0 {
			for _, sc := range []*redis.Script{chargeScript, refundScript} {
				if err := sc.Load(ctx, n.primary).Err(); err != nil {
					return results, fmt.Errorf("limiter: apply on shard %s: loading scripts: %w", n.name, err)
				}
			}
		}
		pending = missing
	}
	return results, nil
}

func parseResult(cmd *redis.Cmd) (Result, error) {
	v, err := cmd.Int64Slice()
	if err != nil {
		return Result{}, err
	}
	if len(v) != 5 || v[0] < int64(Applied) || v[0] > int64(Pending) {
		return Result{}, fmt.Errorf("unexpected script reply %v", v)
	}
	r := Result{Outcome: Outcome(v[0]), Used: v[1], Amount: v[4]}
	if r.Outcome != Late {
		r.ResetAt, r.Start = fromMS(v[2]), fromMS(v[3])
	}
	return r, nil
}

// Charge charges one event (Apply with one OpCharge). The Result's Err is
// returned as the error.
func (s *Store) Charge(ctx context.Context, k Key, eventID string, start time.Time, cost int64, window time.Duration) (Result, error) {
	return s.applyOne(ctx, Op{Kind: OpCharge, Key: k, EventID: eventID, Start: start, Cost: cost, Window: window})
}

// Refund refunds one event's charge (Apply with one OpRefund). start is the
// request's start, as in the charge.
func (s *Store) Refund(ctx context.Context, k Key, eventID string, start time.Time, window time.Duration) (Result, error) {
	return s.applyOne(ctx, Op{Kind: OpRefund, Key: k, EventID: eventID, Start: start, Window: window})
}

func (s *Store) applyOne(ctx context.Context, op Op) (Result, error) {
	if op.Key.IsZero() {
		return Result{}, fmt.Errorf("%w: %s: no key", ErrInvalidArgument, op.Kind)
	}
	rs, err := s.Apply(ctx, s.ShardOf(op.Key), []Op{op})
	if err != nil {
		return Result{}, err
	}
	return rs[0], rs[0].Err
}
