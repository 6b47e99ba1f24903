package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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

func (e *Event) validate() error {
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
	}
	return validWindow(e.Window)
}

// MaxApply is the most events one Apply call takes.
const MaxApply = 4096

// Apply applies events on the primary of shard i (see ShardOf) at time now,
// in atomic script calls (lua/apply.lua) of at most Options.ScriptEvents
// events each. Every event's key must belong to shard i. A producer's events
// may come in any order (numbers skipped are remembered as gaps, up to 64),
// usually in the order of their numbers. Apply does not wait for replicas:
// HoldLease confirms everything applied before it (see Lease).
//
// An event refused for its fields gets Result.Err and the others still run.
// Any other failure (connection loss, READONLY after a failover, a
// restarting primary) returns an error: the events of some calls may have
// been applied, none twice, and running the same events again is always
// safe — though the events a lost call applied then come back Duplicate
// (ApplyRun says what they did). NOSCRIPT (an empty script cache after a
// restart, SCRIPT FLUSH or a promotion) is handled here.
func (s *Store) Apply(ctx context.Context, i int, now time.Time, evs []Event) (ApplyResult, error) {
	return s.ApplyRun(ctx, i, now, Run{}, evs)
}

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

// ApplyRun is Apply for a named run: when a call's answer is lost (a
// timeout after the primary ran it) and the same run is sent again, each
// call returns what it did the first time, so every event's result is
// what happened to it (Applied, Netted, ...) rather than Duplicate.
func (s *Store) ApplyRun(ctx context.Context, i int, now time.Time, run Run, evs []Event) (ApplyResult, error) {
	out := ApplyResult{Results: make([]Result, len(evs))}
	if len(evs) > MaxApply {
		return out, fmt.Errorf("%w: %d events: at most %d per call", ErrInvalidArgument, len(evs), MaxApply)
	}
	if run != (Run{}) && (!ValidProducer(run.Caller) || run.Seq < 1 || run.Seq > MaxSeq) {
		return out, fmt.Errorf("%w: run %d of %q", ErrInvalidArgument, run.Seq, truncate(run.Caller, 70))
	}
	for from := 0; from < len(evs); from += s.opts.ScriptEvents {
		to := min(from+s.opts.ScriptEvents, len(evs))
		reply := ""
		if run.Seq != 0 {
			reply = s.keys.ReplyKey(run.Caller, from/s.opts.ScriptEvents)
		}
		if err := s.apply(ctx, i, now, run.Seq, reply, evs[from:to], out.Results[from:to]); err != nil {
			return out, err
		}
	}
	return out, nil
}

// apply applies evs in one script call, filling results; call and reply
// are the call's number and reply key (0, "": none).
func (s *Store) apply(ctx context.Context, i int, now time.Time, call uint64, reply string, evs []Event, results []Result) error {
	n := s.shards[i]
	out := ApplyResult{Results: results}
	keys := make([]string, 0, 16)
	names := make([]string, 0, 4) // the producer ids of the producer keys, in order
	idx := make(map[string]int, 16)
	index := func(k string) int {
		if j, ok := idx[k]; ok {
			return j
		}
		keys = append(keys, k)
		idx[k] = len(keys)
		return len(keys)
	}
	valid := make([]int, 0, len(evs))
	for j := range evs {
		e := &evs[j]
		err := e.validate()
		if err == nil && s.ShardOf(e.Key) != i {
			err = fmt.Errorf("%w: event %d of %q: key of shard %s applied on shard %s", ErrInvalidArgument,
				e.Seq, e.Producer, s.shards[s.ShardOf(e.Key)].name, n.name)
		}
		if err != nil {
			out.Results[j].Err = err
			continue
		}
		valid = append(valid, j)
		if pk := s.producerKey(e.Producer); idx[pk] == 0 {
			index(pk)
			names = append(names, e.Producer)
		}
	}
	if len(valid) == 0 {
		return nil
	}
	np := len(keys)
	args := make([]any, 0, 7+np+10*len(valid))
	args = append(args, ms(now), np, s.opts.Grace.Milliseconds(), s.opts.SkewTolerance.Milliseconds(), s.opts.ProducerTTL.Milliseconds(),
		call, ReplyLifetime.Milliseconds())
	for _, id := range names {
		args = append(args, id)
	}
	for _, j := range valid {
		e := &evs[j]
		var reset int64
		if !e.ResetAt.IsZero() {
			reset = ms(e.ResetAt)
		}
		ref := 0
		if e.RefProducer != "" {
			ref = idx[s.producerKey(e.Producer)] // the same producer
		}
		args = append(args, idx[s.producerKey(e.Producer)], e.Seq, kindArg[e.Kind], index(e.Key.String()),
			reset, ms(e.Start), e.Window.Milliseconds(), e.Units, ref, e.RefSeq)
	}
	if reply != "" {
		keys = append(keys, reply)
	}

	for attempt := 0; ; attempt++ {
		v, err := n.primary.EvalSha(ctx, applyScript.Hash(), keys, args...).Int64Slice()
		if redis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			s.reloads.Add(1)
			if err := applyScript.Load(ctx, n.primary).Err(); err != nil {
				return fmt.Errorf("limiter: apply on shard %s: loading the script: %w", n.name, err)
			}
			continue
		}
		if err != nil {
			return fmt.Errorf("limiter: apply on shard %s: %w", n.name, scriptErr(err))
		}
		if len(v) != 4*len(valid) {
			return fmt.Errorf("limiter: apply on shard %s: %d values for %d events", n.name, len(v), len(valid))
		}
		for k, j := range valid {
			r := &out.Results[j]
			r.Outcome, r.Used, r.Amount = Outcome(v[4*k]), v[4*k+1], v[4*k+3]
			if v[4*k+2] != 0 {
				r.ResetAt = fromMS(v[4*k+2])
			}
		}
		return nil
	}
}

var kindArg = [...]string{Charge: "c", Refund: "r", Release: "x"}

// Lease is what HoldLease or ConfirmApplied found.
type Lease struct {
	// Held reports that the caller holds the lease.
	Held bool
	// Replicated is how many replicas confirmed the renewal (ConfirmApplied
	// only), and Waited how many it asked for (Options.WaitReplicas; 0 for
	// HoldLease). Replicated < Waited means a failover now could lose some
	// of what the primary applied.
	Replicated, Waited int
}

// HoldLease takes or extends the lease that makes owner the active
// accountant of shard i, for ttl. Lease.Held is false when another owner
// holds it. The lease only saves duplicate work; Apply is exactly-once
// without it.
func (s *Store) HoldLease(ctx context.Context, i int, owner string, ttl time.Duration) (Lease, error) {
	return s.holdLease(ctx, i, owner, ttl, false)
}

// ConfirmApplied is HoldLease followed, on the same connection, by a wait
// for replicas (Redis WAIT, Options.WaitReplicas): replication keeps order,
// so when Lease.Replicated reaches Lease.Waited everything the primary
// applied before the call is on a replica, and a failover cannot lose it.
func (s *Store) ConfirmApplied(ctx context.Context, i int, owner string, ttl time.Duration) (Lease, error) {
	return s.holdLease(ctx, i, owner, ttl, true)
}

func (s *Store) holdLease(ctx context.Context, i int, owner string, ttl time.Duration, confirm bool) (Lease, error) {
	n := s.shards[i]
	out := Lease{}
	if confirm {
		out.Waited = n.wait
	}
	for attempt := 0; ; attempt++ {
		pipe := n.primary.Pipeline()
		cmd := pipe.EvalSha(ctx, leaseScript.Hash(), []string{s.keys.LeaseKey(n.name)}, "hold", owner, ttl.Milliseconds())
		var wait *redis.Cmd
		if out.Waited > 0 {
			wait = pipe.Do(ctx, "WAIT", n.wait, s.opts.WaitTimeout.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		v, err := cmd.Int64()
		if redis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			s.reloads.Add(1)
			if err := leaseScript.Load(ctx, n.primary).Err(); err != nil {
				return out, fmt.Errorf("limiter: lease on shard %s: loading the script: %w", n.name, err)
			}
			continue
		}
		if err != nil {
			return out, fmt.Errorf("limiter: lease on shard %s: %w", n.name, scriptErr(err))
		}
		out.Held = v == 1
		if wait != nil {
			out.Replicated, _ = wait.Int()
		}
		return out, nil
	}
}

// FreeLease gives up owner's lease on shard i, if it holds it.
func (s *Store) FreeLease(ctx context.Context, i int, owner string) error {
	n := s.shards[i]
	if err := s.run(ctx, n.primary, leaseScript, false, []string{s.keys.LeaseKey(n.name)}, "free", owner, 0).Err(); err != nil {
		return fmt.Errorf("limiter: lease on shard %s: %w", n.name, scriptErr(err))
	}
	return nil
}
