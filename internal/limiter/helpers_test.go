package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// t0 is the tests' starting time: 300 ms past a whole second, so windows do
// not start aligned. It is near the real time because Redis expires keys by
// its own clock (expiry is garbage collection, set at reset + grace).
var t0 = time.Now().Truncate(time.Second).Add(300 * time.Millisecond)

const minute = time.Minute

// env is one shard (a primary and a replica) with a Store over it, on a
// manual clock.
type env struct {
	primary, replica *redistest.Server
	clock            *limiter.ManualClock
	store            *limiter.Store
	keys             *limiter.KeySpace
}

func newEnv(t *testing.T, opts limiter.Options) *env {
	t.Helper()
	p, r := redistest.StartPair(t)
	e := &env{primary: p, replica: r, clock: limiter.NewManualClock(t0)}
	opts.Clock = e.clock
	e.store = newStore(t, e.config(), opts)
	var err error
	e.keys, err = limiter.NewKeySpace("tally", []byte("test-secret"))
	require.NoError(t, err)
	return e
}

// config is the env's shard: its primary and its replica.
func (e *env) config() []shard.Config {
	return []shard.Config{{Name: "s0", Primary: node(e.primary), Replicas: []shard.Node{node(e.replica)}}}
}

func newStore(t *testing.T, shards []shard.Config, opts limiter.Options) *limiter.Store {
	t.Helper()
	s, err := limiter.NewStore(shards, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func node(s *redistest.Server) shard.Node { return shard.Node{Addr: s.Addr} }

// primaryOnly is a second store over the same primary with no replicas:
// its checks read the primary.
func (e *env) primaryOnly(t *testing.T) *limiter.Store {
	return newStore(t, []shard.Config{{Name: "s0", Primary: node(e.primary)}}, limiter.Options{Clock: e.clock})
}

func (e *env) charge(t *testing.T, k limiter.Key, id string, start time.Time, cost int64) limiter.Result {
	t.Helper()
	r, err := e.store.Charge(context.Background(), k, id, start, cost, minute)
	require.NoError(t, err)
	return r
}

func (e *env) refund(t *testing.T, k limiter.Key, id string, start time.Time) limiter.Result {
	t.Helper()
	r, err := e.store.Refund(context.Background(), k, id, start, minute)
	require.NoError(t, err)
	return r
}

// checkReplica waits for the replica to catch up, then checks on it.
func (e *env) checkReplica(t *testing.T, k limiter.Key) limiter.Window {
	t.Helper()
	e.replica.WaitSynced(e.primary)
	w, err := e.store.Check(context.Background(), k)
	require.NoError(t, err)
	return w
}

func (e *env) open(t *testing.T, k limiter.Key) limiter.Window {
	t.Helper()
	w, _, err := e.store.Open(context.Background(), k, minute)
	require.NoError(t, err)
	return w
}
