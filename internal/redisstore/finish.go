package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/lua"
)

var finishScript = redis.NewScript(lua.Finish)

// Finish finishes a request once on its window's primary at now (one
// atomic script call, lua/finish.lua): the first finish is recorded and
// gives a.Back of the request's units back to the window its response showed,
// out of what its producer holds there; every later finish of the same
// request, on any edge, is AlreadyFinished. Like Take, it is not retried on
// a connection error: after an error the finish may or may not have been
// made, and sending it again answers AlreadyFinished if it was.
func (s *Store) Finish(ctx context.Context, k limiter.Key, now time.Time, a limiter.FinishArgs) (limiter.FinishResult, error) {
	if err := a.Validate(k); err != nil {
		return limiter.FinishResult{}, err
	}
	var reset int64
	if !a.ResetAt.IsZero() {
		reset = ms(a.ResetAt)
	}
	i := s.ShardOf(k)
	if j, moving := s.previousOwner(k); moving && reset != 0 {
		// The window the response showed may be on the previous owner.
		w, err := parseCheck(s.run(ctx, s.shards[j].primary, checkScript, true, []string{k.String()}, ms(now)))
		if err != nil {
			return limiter.FinishResult{}, fmt.Errorf("limiter: finish on shard %s: %w", s.shards[j].name, err)
		}
		if w.Live && w.ResetAt.Equal(a.ResetAt) {
			i = j
		}
	}
	n := s.shards[i]
	if err := s.gate(ctx, i); err != nil {
		return limiter.FinishResult{}, err
	}
	keys := []string{k.WindowKey(a.ResetAt, a.Slices), s.keys.FinishKey(k.Digest(), a.Holder, reset), s.producerKey(a.Producer),
		s.keys.ReseedKey()}
	v, err := s.run(ctx, n.primary, finishScript, false, keys, ms(now), reset, a.N, a.Status, a.Units, a.Producer,
		a.ChargeSeq, ms(a.Start), a.Window.Milliseconds(), s.opts.Grace.Milliseconds(), s.opts.SkewTolerance.Milliseconds(),
		s.opts.ProducerTTL.Milliseconds(), a.Back, limiter.Linger(a.Window, a.Slices).Milliseconds()).Int64Slice()
	if err != nil {
		return limiter.FinishResult{}, fmt.Errorf("limiter: finish on shard %s: %w", n.name, scriptErr(err))
	}
	if len(v) != 4 {
		return limiter.FinishResult{}, fmt.Errorf("limiter: finish on shard %s: unexpected reply %v", n.name, v)
	}
	r := limiter.FinishResult{Outcome: limiter.FinishOutcome(v[0]), Used: v[1], Amount: v[3]}
	if v[2] != 0 {
		r.ResetAt = fromMS(v[2])
	}
	return r, nil
}
