package faults

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

// sentinelDown is how long the sentinels wait for a primary's answer before
// they consider it down (down-after-milliseconds).
const sentinelDown = 500 * time.Millisecond

// A shard is a Sentinel master: a primary, two replicas, three sentinels.
// Its primary dies (SIGKILL) under load and does not come back. Sentinel
// promotes a replica; the edge and the accountant follow it through the
// sentinels, with nothing edited. Reservations wait for a replica to
// confirm them (WAIT), and the accountant deletes events from the stream
// only once a replica holds them, so the promoted replica has everything
// the edge was told it reserved and everything the accountant applied:
// afterwards every window holds exactly what its clients were allowed, and
// none was allowed past its limit. docs/operations.md has the bounds.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("the failover runs the whole pipeline as processes")
	}
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		t.Fatal("redis-sentinel not found on PATH: run `make test` (it installs Debian's redis-sentinel) or `apt-get install redis-sentinel`")
	}
	c := newClusterOf(t, clusterOptions{shards: func(ctx context.Context, s *stack.Stack) ([]shard.Config, []*stack.Proc, error) {
		sc, procs, err := s.SentinelShard(ctx, "s0", 2, 3, sentinelDown)
		return []shard.Config{sc}, procs, err
	}})
	sentinels := c.cfg.Redis.Shards[0].Sentinel.Addrs
	old := c.redis[0]
	r := c.start(t, nil)
	probe := c.keys.Key(far.Name, "h:failover-probe")
	var promoted, reserving time.Duration
	r.fault(func() {
		killed := time.Now()
		old.Kill()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for {
			if p := redistest.SentinelPrimary(sentinels[0], "s0"); p != "" && p != old.Addr {
				promoted = time.Since(killed)
				break
			}
			require.NoError(t, ctx.Err(), "no replica promoted in 30 s")
			time.Sleep(20 * time.Millisecond)
		}
		// A reservation through the sentinels, as the edge makes them.
		for {
			tctx, tcancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err := c.store.Take(tctx, probe, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: 10, Need: 1, Want: 1,
				Producer: "fault-suite"})
			tcancel()
			if err == nil {
				reserving = time.Since(killed)
				break
			}
			require.NoError(t, ctx.Err(), "no reservation through the sentinels in 30 s: %v", err)
			time.Sleep(20 * time.Millisecond)
		}
	})
	r.finish(t)
	t.Logf("primary killed: a replica promoted after %v, reservations made again after %v (down-after %v)",
		promoted.Round(time.Millisecond), reserving.Round(time.Millisecond), sentinelDown)
	require.Empty(t, r.verify(t), "dead letters")
	for _, tg := range r.l.targets {
		require.LessOrEqual(t, tg.charged(), tg.policy.Limit, "%s allowed past its limit", tg.identity)
	}
	t.Logf("edge: %v reservations not confirmed by a replica in time", r.edge["tally_edge_unreplicated_reservations_total"])
}
