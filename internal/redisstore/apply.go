package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
)

// Apply applies events on the primary of shard i (see ShardOf) at time now,
// in atomic script calls (lua/apply.lua) of at most Options.ScriptEvents
// events each. Every event's key must belong to shard i. A producer's events
// may come in any order (numbers skipped are remembered as gaps, up to 64),
// usually in the order of their numbers. Apply does not wait for replicas:
// HoldLease confirms everything applied before it (see Lease).
//
// An event refused for its fields gets limiter.Result.Err and the others still run.
// Any other failure (connection loss, READONLY after a failover, a
// restarting primary) returns an error: the events of some calls may have
// been applied, none twice, and running the same events again is always
// safe — though the events a lost call applied then come back Duplicate
// (ApplyRun says what they did). NOSCRIPT (an empty script cache after a
// restart, SCRIPT FLUSH or a promotion) is handled here.
func (s *Store) Apply(ctx context.Context, i int, now time.Time, evs []limiter.Event) (limiter.ApplyResult, error) {
	return s.ApplyRun(ctx, i, now, limiter.Run{}, evs)
}

// ApplyRun is Apply for a named run: when a call's answer is lost (a
// timeout after the primary ran it) and the same run is sent again, each
// call returns what it did the first time, so every event's result is
// what happened to it (Applied, Netted, ...) rather than Duplicate.
func (s *Store) ApplyRun(ctx context.Context, i int, now time.Time, run limiter.Run, evs []limiter.Event) (limiter.ApplyResult, error) {
	out := limiter.ApplyResult{Results: make([]limiter.Result, len(evs))}
	if len(evs) > limiter.MaxApply {
		return out, fmt.Errorf("%w: %d events: at most %d per call", limiter.ErrInvalidArgument, len(evs), limiter.MaxApply)
	}
	if run != (limiter.Run{}) && (!limiter.ValidProducer(run.Caller) || run.Seq < 1 || run.Seq > limiter.MaxSeq) {
		return out, fmt.Errorf("%w: run %d of %q", limiter.ErrInvalidArgument, run.Seq, truncate(run.Caller, 70))
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
func (s *Store) apply(ctx context.Context, i int, now time.Time, call uint64, reply string, evs []limiter.Event, results []limiter.Result) error {
	n := s.shards[i]
	if err := s.gate(ctx, i); err != nil {
		return err
	}
	out := limiter.ApplyResult{Results: results}
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
		err := e.Validate()
		if err == nil && !s.Holds(i, e.Key) {
			err = fmt.Errorf("%w: event %d of %q: key of shard %s applied on shard %s", limiter.ErrInvalidArgument,
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
	args := make([]any, 0, 7+np+11*len(valid))
	args = append(args, ms(now), np, s.opts.Grace.Milliseconds(), s.opts.SkewTolerance.Milliseconds(), s.opts.ProducerTTL.Milliseconds(),
		call, limiter.ReplyLifetime.Milliseconds())
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
		args = append(args, idx[s.producerKey(e.Producer)], e.Seq, kindArg[e.Kind], index(e.Key.WindowKey(e.ResetAt, e.Slices)),
			reset, ms(e.Start), e.Window.Milliseconds(), e.Units, ref, e.RefSeq, limiter.Linger(e.Window, e.Slices).Milliseconds())
	}
	if reply != "" {
		keys = append(keys, reply)
	}
	keys = append(keys, s.keys.ReseedKey())

	v, err := s.run(ctx, n.primary, applyScript, false, keys, args...).Int64Slice()
	if err != nil {
		return fmt.Errorf("limiter: apply on shard %s: %w", n.name, scriptErr(err))
	}
	if len(v) != 4*len(valid) {
		return fmt.Errorf("limiter: apply on shard %s: %d values for %d events", n.name, len(v), len(valid))
	}
	for k, j := range valid {
		r := &out.Results[j]
		r.Outcome, r.Used, r.Amount = limiter.Outcome(v[4*k]), v[4*k+1], v[4*k+3]
		if v[4*k+2] != 0 {
			r.ResetAt = fromMS(v[4*k+2])
		}
	}
	return nil
}

var kindArg = [...]string{limiter.Charge: "c", limiter.Refund: "r", limiter.Release: "x"}

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
// It confirms nothing applied on a primary the shard had before a change:
// the caller compares Epoch before and after.
func (s *Store) ConfirmApplied(ctx context.Context, i int, owner string, ttl time.Duration) (Lease, error) {
	return s.holdLease(ctx, i, owner, ttl, true)
}

func (s *Store) holdLease(ctx context.Context, i int, owner string, ttl time.Duration, confirm bool) (Lease, error) {
	n := s.shards[i]
	out := Lease{}
	if err := s.gate(ctx, i); err != nil {
		return out, err
	}
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
		if noScript(err) && attempt == 0 {
			if err := s.reload(ctx, n.primary, leaseScript); err != nil {
				return out, fmt.Errorf("limiter: lease on shard %s: %w", n.name, err)
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
	if err := s.gate(ctx, i); err != nil {
		return err
	}
	if err := s.run(ctx, n.primary, leaseScript, false, []string{s.keys.LeaseKey(n.name)}, "free", owner, 0).Err(); err != nil {
		return fmt.Errorf("limiter: lease on shard %s: %w", n.name, scriptErr(err))
	}
	return nil
}
