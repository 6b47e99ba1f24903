package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Take reserves units of k's window on its shard's primary at time now (the
// caller's clock, read once for the decision), opening the window
// limiter.TakeArgs.OpensAt names when none is live (by default at the whole
// second of now, resetting limiter.TakeArgs.Window after that). The
// reservation is all or nothing above Need and never takes the window past
// Limit. It is one atomic script call (lua/take.lua), or, for a key the
// caller knows no window of where windows may be compact, one SET ... NX
// (the script follows when a key was there).
//
// Take is not retried on a connection error: a retried reservation could
// be granted twice. After an error the reservation may or may not have
// been made (a primary that froze runs it when it wakes); the holder's next
// Take (or a read: Need and Want 0) tells by limiter.Grant.Mine.
func (s *Store) Take(ctx context.Context, k limiter.Key, now time.Time, a limiter.TakeArgs) (limiter.Grant, error) {
	r, err := s.newTake(k, now, a)
	if err != nil {
		return limiter.Grant{}, err
	}
	for {
		c, err := r.call(ctx)
		var v []int64
		if err == nil {
			v, err = s.shards[r.i].takes.do(ctx, c)
		}
		if g, err, again := r.result(v, err); !again {
			return g, err
		}
	}
}

// TakeAsync is Take without waiting: done gets its result, once, on one of
// the store's goroutines — never the caller's, so that the caller may hold
// a lock done takes. done must be short and must not block: it runs where
// the shard's next reservations are sent. The reservation is bounded by the
// client's read and write timeouts instead of a context.
func (s *Store) TakeAsync(k limiter.Key, now time.Time, a limiter.TakeArgs, done func(limiter.Grant, error)) {
	r, err := s.newTake(k, now, a)
	if err != nil {
		go done(limiter.Grant{}, err)
		return
	}
	r.done = done
	r.submit()
}

// takeReq is one reservation on its way: what it asks, and where.
type takeReq struct {
	s      *Store
	k      limiter.Key
	now    time.Time
	a      limiter.TakeArgs
	holder string
	owed   string
	opens  limiter.Span // the window the take opens when none is live
	i      int
	moving string // the key's owner, when i is its previous owner (resharding)
	moved  bool   // sent again to where a TALLYMOVED said the key went
	done   func(limiter.Grant, error)
	// span: the keys a sliding window's or a token bucket's take reads
	// besides its window and the reseed marker (spanKeys), built once.
	span []string
}

func (s *Store) newTake(k limiter.Key, now time.Time, a limiter.TakeArgs) (*takeReq, error) {
	if err := a.Validate(k); err != nil {
		return nil, err
	}
	opens, err := a.OpensAt(now)
	if err != nil {
		return nil, err
	}
	r := &takeReq{s: s, k: k, now: now, a: a, opens: opens, holder: a.Holder, i: s.ShardOf(k)}
	if r.holder == "" {
		r.holder = a.Producer
	}
	if j, ok := s.previousOwner(k); ok {
		// The key moves: its previous owner serves a live window it holds,
		// or marks the key moved (lua/take.lua).
		r.i, r.moving = j, s.shards[r.i].name
	}
	var owed []byte
	for i, o := range a.Owed {
		if i > 0 {
			owed = append(owed, ',')
		}
		owed = strconv.AppendUint(owed, o.Seq, 10)
		owed = append(owed, ':')
		owed = strconv.AppendInt(owed, o.Units, 10)
	}
	r.owed = string(owed)
	return r, nil
}

// call is r's next call to its shard, once the shard takes writes. The
// script's keys and arguments are built only if the script runs
// (takeCall.script): most cold takes are a SET or own.lua alone.
func (r *takeReq) call(ctx context.Context) (*takeCall, error) {
	s, a := r.s, r.a
	if err := s.gate(ctx, r.i); err != nil {
		return nil, err
	}
	c := &takeCall{ctx: ctx, key: r.k.WindowKey(r.opens.ResetAt, a.Slices), req: r, compact: s.shards[r.i].compact.Load()}
	simple := c.compact && a.Need > 0 && r.moving == "" && r.owed == "" && !a.Freeze && limiter.CompactHolder(r.holder, a.Producer)
	switch {
	case simple && a.Slices > 0 && a.Rate == 0:
		// A sliding window's sub-windows, compact: slide.lua counts the
		// others of its spans. Never the plain SET or own.lua, which
		// count one key.
		// With the shard's format level it keeps the window's span record
		// (none for a key this edge never reserved, TakeArgs.Fresh: its
		// first take reads none and writes none); for a holder whose last
		// reservation left the record true (TakeArgs.Own), the record
		// alone first, and every key only when it no longer holds.
		level := s.shards[r.i].level()
		if a.Fresh {
			level = ""
		}
		args := []any{ms(r.now), r.opens.Length().Milliseconds(), a.Limit, a.Need, a.Want, s.opts.Grace.Milliseconds(), r.holder,
			ms(r.opens.ResetAt), a.Slices, level}
		every := func() *shortCall {
			return &shortCall{script: slideScript, keys: append(r.shortKeys(c.key), r.k.SpanRecordKey()), args: args}
		}
		if a.Own && level != "" {
			c.short = &shortCall{script: slideScript, keys: []string{c.key, s.keys.ReseedKey(), r.k.SpanRecordKey()}, args: args,
				then: every}
		} else {
			c.short = every()
		}
	case simple && a.Rate > 0 && (a.Fresh || a.Own):
		// A token bucket none of whose periods near now this edge reserved
		// in, or whose last reservation bucket.lua made: bucket.lua
		// reserves while they are missing or compact, and the one reserved
		// in missing or the holder's own.
		c.short = &shortCall{script: bucketScript, keys: r.shortKeys(c.key), args: []any{ms(r.now), a.Limit, a.Need, a.Want,
			s.opts.Grace.Milliseconds(), r.holder, ms(r.opens.ResetAt), a.Rate, a.Every.Milliseconds(), spentArg(a)}}
	case simple && a.Slices == 0 && a.Fresh:
		start, reset := r.opens.Start, r.opens.ResetAt
		c.open = &opening{value: limiter.AppendCompact(make([]byte, 0, 48), a.Want, start, reset, r.holder), start: start,
			reset: reset, expires: reset.Add(s.opts.Grace), want: a.Want}
	case simple && a.Slices == 0 && a.Own:
		c.short = &shortCall{script: ownScript, keys: []string{c.key}, args: []any{ms(r.now), a.Limit, a.Need, a.Want, r.holder}}
	}
	return c, nil
}

// scriptArgs are lua/take.lua's keys and arguments for r's call, compact
// saying whether the shard's windows may be compact.
func (r *takeReq) scriptArgs(key string, compact bool) ([]string, []any) {
	s, a := r.s, r.a
	args := []any{ms(r.now), r.opens.Length().Milliseconds(), a.Limit, a.Need, a.Want, s.opts.Grace.Milliseconds(), r.holder,
		a.Producer, r.owed, r.moving, "", "", "", "", "", ms(r.opens.Start), ms(r.opens.ResetAt)}
	if a.Freeze {
		args[10], args[11], args[12] = a.Keep, a.Share, ms(a.ShareExpiry)
	}
	if compact {
		args[13] = "1"
	}
	if a.Align {
		args[14] = "1"
	}
	keys := append([]string{key, s.producerKey(a.Producer), s.keys.ReseedKey()}, r.spanKeys()...)
	if a.Slices > 0 {
		args = append(args, a.Slices)
	}
	if a.Rate > 0 {
		args = append(args, a.Rate, a.Every.Milliseconds(), spentArg(a))
	}
	return keys, args
}

// shortKeys are take.lua's keys less its KEYS[2] (the producer's): what
// slide.lua and bucket.lua are given, with room for slide.lua's span
// record after them.
func (r *takeReq) shortKeys(key string) []string {
	span := r.spanKeys()
	return append(append(make([]string, 0, 3+len(span)), key, r.s.keys.ReseedKey()), span...)
}

// spanKeys are the keys take.lua reads after its window, producer and
// reseed marker: a sliding window's other sub-windows of its spans, those
// before it nearest first, then those after; a token bucket's besides, its
// record, the two periods before the one before this, and when the shard
// last began a reseed. None for a window. Built once a take, whether a
// short script or take.lua, or both, is sent.
func (r *takeReq) spanKeys() []string {
	a := r.a
	if r.span != nil || a.Slices == 0 {
		return r.span
	}
	if a.Rate > 0 {
		r.span = append(r.k.BucketKeys(make([]string, 0, 6), r.opens.ResetAt), r.s.keys.RefillKey())
	} else {
		r.span = r.k.SpanKeys(make([]string, 0, 2*a.Slices-2), r.opens.ResetAt, r.opens.Length(), a.Slices)
	}
	return r.span
}

// spentArg is take.lua's ARGV[21] and bucket.lua's ARGV[10]: "1" when the
// caller spends what it is granted at once.
func spentArg(a limiter.TakeArgs) string {
	if a.Spent {
		return "1"
	}
	return ""
}

// result reads the reply to r's call: the grant, or an error, or again when
// the key has moved and r is to be sent to its owner (once).
func (r *takeReq) result(v []int64, err error) (g limiter.Grant, _ error, again bool) {
	if to, moved := movedTo(err); moved && !r.moved {
		j, ok := r.s.byName[to]
		if !ok {
			return g, fmt.Errorf("limiter: take on shard %s: the key moved to shard %q, which is not configured",
				r.s.shards[r.i].name, to), false
		}
		r.i, r.moving, r.moved = j, "", true
		return g, nil, true
	}
	n := r.s.shards[r.i]
	if err != nil {
		return g, fmt.Errorf("limiter: take on shard %s: %w", n.name, scriptErr(err)), false
	}
	if len(v) != 9 {
		return g, fmt.Errorf("limiter: take on shard %s: unexpected reply %v", n.name, v), false
	}
	g = limiter.Grant{Granted: v[0], Used: v[1], Opened: v[4] == 1, Applied: uint64(v[5]), Mine: v[6], Frozen: v[7], Own: v[8] == 1,
		Shard: r.i}
	if v[2] != 0 {
		g.Live, g.ResetAt, g.Start = true, fromMS(v[2]), fromMS(v[3])
	}
	return g, nil, false
}

// submit queues r's call on its shard, its answer to r.done; a shard that
// takes no writes now answers at once.
func (r *takeReq) submit() {
	c, err := r.call(context.Background())
	if err != nil {
		go r.finish(nil, err)
		return
	}
	c.async = r.finish
	r.s.shards[r.i].takes.queue(c)
}

// finish takes the reply to an asynchronous call in.
func (r *takeReq) finish(v []int64, err error) {
	g, err, again := r.result(v, err)
	if again {
		r.submit()
		return
	}
	r.done(g, err)
}
