package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/lua"
)

var holdScript = redis.NewScript(lua.Hold)

// Hold records, on shard i's primary, the shares of credit holders will
// not spend (lua/hold.lua), in one pipeline. A share lowered on a primary
// that dies before its replica saw it comes back as the holder last had it
// recorded, before anyone can take it back: a reseed re-asserts it
// (reseed.go). An error means none is known to be recorded: the caller keeps
// what it froze.
func (s *Store) Hold(ctx context.Context, i int, hs []limiter.Hold) ([]limiter.HoldResult, error) {
	n := s.shards[i]
	if len(hs) == 0 {
		return nil, nil
	}
	if err := s.gate(ctx, i); err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		pipe := n.primary.Pipeline()
		cmds := make([]*redis.Cmd, len(hs))
		for j, h := range hs {
			cmds[j] = pipe.EvalSha(ctx, holdScript.Hash(), []string{h.Key.String(), s.keys.ReseedKey()}, ms(s.opts.Clock.Now()), ms(h.ResetAt),
				h.Holder, h.Producer, h.Expected, h.Frozen, ms(h.Expiry), s.opts.Grace.Milliseconds())
		}
		_, _ = pipe.Exec(ctx)
		// A node without the script answers every call of the pipeline
		// NOSCRIPT, having run none: load it and send them again.
		if noScript(cmds[0].Err()) && attempt == 0 {
			if err := s.reload(ctx, n.primary, holdScript); err != nil {
				return nil, fmt.Errorf("limiter: hold on shard %s: %w", n.name, err)
			}
			continue
		}
		out := make([]limiter.HoldResult, len(hs))
		for j, c := range cmds {
			v, err := c.Int64Slice()
			if err != nil {
				return nil, fmt.Errorf("limiter: hold on shard %s: %w", n.name, scriptErr(err))
			}
			if len(v) != 2 {
				return nil, fmt.Errorf("limiter: hold on shard %s: unexpected reply %v", n.name, v)
			}
			out[j] = limiter.HoldResult{Outcome: limiter.HoldOutcome(v[0]), Have: v[1]}
		}
		return out, nil
	}
}
