package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// run calls sc on c by its hash (EVALSHA, or EVALSHA_RO when ro) and, when
// the node does not have it (NOSCRIPT: a restart, a fail-over to a node that
// never ran it, SCRIPT FLUSH), loads it (reload) and calls it again, once.
// Every script call goes through run, or through reload when it is part of
// a pipeline.
func (s *Store) run(ctx context.Context, c *redis.Client, sc *redis.Script, ro bool, keys []string, args ...any) *redis.Cmd {
	for attempt := 0; ; attempt++ {
		var cmd *redis.Cmd
		if ro {
			cmd = c.EvalShaRO(ctx, sc.Hash(), keys, args...)
		} else {
			cmd = c.EvalSha(ctx, sc.Hash(), keys, args...)
		}
		if attempt > 0 || !noScript(cmd.Err()) {
			return cmd
		}
		if err := s.reload(ctx, c, sc); err != nil {
			return cmd
		}
	}
}

// noScript reports whether err says the node does not have the script.
func noScript(err error) bool { return redis.HasErrorPrefix(err, "NOSCRIPT") }

// reload sends sc to c (SCRIPT LOAD) after a NOSCRIPT, counting it.
func (s *Store) reload(ctx context.Context, c *redis.Client, sc *redis.Script) error {
	s.reloads.Add(1)
	if err := sc.Load(ctx, c).Err(); err != nil {
		return fmt.Errorf("loading the script: %w", err)
	}
	return nil
}

// ScriptReloads is how many times a node was sent a script it did not have
// cached (NOSCRIPT): a few after a Redis restart or fail-over; a steady rise
// means something flushes the script cache.
func (s *Store) ScriptReloads() uint64 { return s.reloads.Load() }

// ShortTakes is how many reservations the short scripts made whole
// (lua/own.lua: the window was its holder's own compact one; lua/slide.lua:
// a sliding window's sub-windows were compact or missing; lua/bucket.lua:
// no period of a token bucket near now was in Redis) and how many they
// handed on to take.lua (the window was something else by then: another
// edge reserved in it, it ended, it is gone, or a sub-window is full).
func (s *Store) ShortTakes() (made, handedOn uint64) { return s.shortMade.Load(), s.shortHanded.Load() }

// LoadScripts sends every script the primaries run to shard i's primary
// (SCRIPT LOAD), so that its first calls need no second round trip, and
// asks it whether it changed (reseed.go): what an edge does before it
// reports ready. An error means the primary could not be reached, or
// refused (an ACL without a command the scripts run), or that the shard
// reseeds.
func (s *Store) LoadScripts(ctx context.Context, i int) error {
	n := s.shards[i]
	// One by one on the client's own connections (not a pipeline's), so
	// that the connection the first requests use is open already.
	for _, sc := range []*redis.Script{takeScript, ownScript, slideScript, bucketScript, applyScript, finishScript, leaseScript, checkScript, holdScript,
		epochScript, reseedScript} {
		if err := sc.Load(ctx, n.primary).Err(); err != nil {
			return fmt.Errorf("limiter: loading the scripts on shard %s's primary: %w", n.name, err)
		}
	}
	if err := s.check(ctx, i, n.primary); err != nil {
		return fmt.Errorf("limiter: asking shard %s's primary whether it changed: %w", n.name, err)
	}
	return nil
}
