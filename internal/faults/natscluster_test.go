package faults

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/stack"
)

// NATS is a cluster of three servers (deploy/nats/cluster.conf), every
// stream with three replicas. The server that leads the accounting stream
// dies (SIGKILL) under load; the others elect a new leader, and the edge,
// the accountant and the suite's own connection move to a server that is
// up by themselves. The dead server comes back later and catches up.
// Nothing is lost or applied twice: every window holds exactly what its
// clients were allowed net of refunds (an event whose publish timed out
// while the stream had no leader is applied by the edge itself, and the
// copy the stream may hold all the same is recognised by its number).
// docs/operations.md has the bounds.
func TestNATSClusterLeaderKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("the cluster runs the whole pipeline as processes")
	}
	c := newClusterOf(t, clusterOptions{shards: fixedShards(1), natsServers: 3})
	r := c.start(t, nil)
	leader := c.streamLeader(t, c.streams.Accounting.Name, "")
	var elected time.Duration
	r.fault(func() {
		killed := time.Now()
		leader.Kill()
		c.streamLeader(t, c.streams.Accounting.Name, leader.Name)
		elected = time.Since(killed)
		time.Sleep(downFor)
		require.NoError(t, c.stack.Restart(context.Background(), leader), "restart %s", leader.Name)
	})
	r.finish(t)
	t.Logf("%s led the accounting stream and was killed: a new leader after %v; it came back %v later; "+
		"decision records: %v published, %v dropped", leader.Name, elected.Round(time.Millisecond), downFor,
		r.edge[`tally_edge_decision_records_total{outcome="published"}`],
		r.edge[`tally_edge_decision_records_total{outcome="dropped"}`])
	require.Zero(t, r.edge[`tally_edge_decision_records_total{outcome="dropped"}`],
		"decision records dropped: those JetStream could not take during the election are published again")
	require.Empty(t, r.verify(t), "dead letters")
	for _, tg := range r.l.targets {
		require.LessOrEqual(t, tg.charged(), tg.policy.Limit, "%s allowed past its limit", tg.identity)
	}
}

// streamLeader waits (up to 30 s) until the stream name has a leader other
// than not, and returns its server.
func (c *cluster) streamLeader(t *testing.T, name, not string) *stack.Proc {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s, err := c.js.Stream(ctx, name)
		if err == nil {
			var info, ierr = s.Info(ctx)
			if ierr == nil && info.Cluster != nil && info.Cluster.Leader != "" && info.Cluster.Leader != not {
				cancel()
				for _, p := range c.natsServers {
					if p.Name == info.Cluster.Leader {
						return p
					}
				}
				t.Fatalf("the leader %q of %s is none of the cluster's servers", info.Cluster.Leader, name)
			}
		}
		cancel()
		require.True(t, time.Now().Before(deadline), "%s has no leader (other than %q) after 30 s: %v", name, not, err)
		time.Sleep(50 * time.Millisecond)
	}
}
