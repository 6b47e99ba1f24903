package limiter

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// run calls sc on c by its hash (EVALSHA, or EVALSHA_RO when ro) and, when
// the node does not have it (NOSCRIPT: a restart, a fail-over to a node that
// never ran it, SCRIPT FLUSH), sends the script itself once, counting the
// reload.
func (s *Store) run(ctx context.Context, c *redis.Client, sc *redis.Script, ro bool, keys []string, args ...any) *redis.Cmd {
	var cmd *redis.Cmd
	if ro {
		cmd = c.EvalShaRO(ctx, sc.Hash(), keys, args...)
	} else {
		cmd = c.EvalSha(ctx, sc.Hash(), keys, args...)
	}
	if !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return cmd
	}
	s.reloads.Add(1)
	if ro {
		return sc.EvalRO(ctx, c, keys, args...)
	}
	return sc.Eval(ctx, c, keys, args...)
}

// ScriptReloads is how many times a node was sent a script it did not have
// cached (NOSCRIPT): a few after a Redis restart or fail-over; a steady rise
// means something flushes the script cache.
func (s *Store) ScriptReloads() uint64 { return s.reloads.Load() }
