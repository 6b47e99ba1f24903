package serve

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/limiter"
)

// SharedSecretKey is the Redis key that holds the shared key secret
// (limiter.SharedSecretKey).
func SharedSecretKey(prefix string) string { return limiter.SharedSecretKey(prefix) }

// SharedSecret returns the key secret kept in Redis for processes that
// were given none (envoyproxy/ratelimit's settings have no such thing),
// making it — 32 random bytes, in hex — when there is none yet: every
// process over the same Redis then keys identities alike, as they must to
// count together. Anyone who can read Redis can read it: set
// TALLY_KEY_SECRET to keep it out (docs/security.md).
func SharedSecret(ctx context.Context, cfg *config.File) (string, error) {
	if len(cfg.Redis.Shards) == 0 {
		return "", errors.New("no Redis shard")
	}
	sh := cfg.Redis.Shards[0]
	var c *redis.Client
	if s := sh.Sentinel; s != nil {
		c = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: s.Master, SentinelAddrs: s.Addrs,
			SentinelUsername: s.Username, SentinelPassword: s.Password, Username: sh.Primary.Username,
			Password: sh.Primary.Password, DB: sh.Primary.DB, TLSConfig: cfg.RedisTLS(), MaxRetries: -1})
	} else {
		c = redis.NewClient(&redis.Options{Addr: sh.Primary.Addr, Username: sh.Primary.Username, Password: sh.Primary.Password,
			DB: sh.Primary.DB, TLSConfig: cfg.RedisTLS(), MaxRetries: -1})
	}
	defer c.Close()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	key := SharedSecretKey(cfg.KeyPrefix)
	// Redis may not be up yet at start: try for a while, as the processes
	// wait for it.
	var err error
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		// SET NX GET: the value there, or ours when there was none.
		var v string
		v, err = c.SetArgs(cctx, key, hex.EncodeToString(b), redis.SetArgs{Mode: "NX", Get: true}).Result()
		cancel()
		var refused redis.Error
		switch {
		case errors.Is(err, redis.Nil):
			return hex.EncodeToString(b), nil
		case err == nil:
			return v, nil
		case errors.As(err, &refused):
			// Redis answered, and said no (an ACL without SET, a wrong
			// password): waiting will not change it.
			return "", fmt.Errorf("the shared key secret at %s: %w (set TALLY_KEY_SECRET)", key, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", fmt.Errorf("the shared key secret at %s: %w", key, err)
		case <-t.C:
		}
	}
}
