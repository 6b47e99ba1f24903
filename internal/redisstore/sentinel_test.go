package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// Whoever can talk to a sentinel names the shard's primary: sentinels with
// a password, and a store that cannot authenticate with them makes no
// reservation anywhere and fails within its caller's deadline
// (docs/security.md, Who names the primary).
func TestSentinelNeedsItsPassword(t *testing.T) {
	p := redistest.Start(t)
	sentinels := p.StartSentinelsWith(t, "s0", 1, 0, time.Second, "sentinel-secret")
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	k := keys.Key("api", "h:sentinel-auth")
	take := func(password string) error {
		store := newStore(t, []shard.Config{{Name: "s0", Sentinel: &shard.Sentinel{Master: "s0", Addrs: sentinels,
			Password: password}}}, keys, redisstore.Options{})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		began := time.Now()
		_, err := store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: 10, Need: 1, Want: 1, Producer: "edge-a"})
		require.Less(t, time.Since(began), 2*time.Second, "held past its deadline")
		return err
	}
	require.Error(t, take(""))
	require.Error(t, take("wrong"))
	require.Zero(t, p.Client().Exists(context.Background(), k.String()).Val(), "a reservation made without the password")
	require.NoError(t, take("sentinel-secret"))
	require.EqualValues(t, 1, p.Client().Exists(context.Background(), k.String()).Val())
}
