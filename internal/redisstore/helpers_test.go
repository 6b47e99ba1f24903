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
	store            *redisstore.Store
	keys             *limiter.KeySpace
}

func newEnv(t *testing.T, opts redisstore.Options) *env {
	t.Helper()
	p, r := redistest.StartPair(t)
	e := &env{primary: p, replica: r, clock: limiter.NewManualClock(t0)}
	var err error
	e.keys, err = limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	opts.Clock = e.clock
	e.store = newStore(t, e.config(), e.keys, opts)
	return e
}

// config is the env's shard: its primary and its replica.
func (e *env) config() []shard.Config {
	return []shard.Config{{Name: "s0", Primary: node(e.primary), Replicas: []shard.Node{node(e.replica)}}}
}

func newStore(t testing.TB, shards []shard.Config, keys *limiter.KeySpace, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.NewStore(shards, keys, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func node(s *redistest.Server) shard.Node { return shard.Node{Addr: s.Addr} }

// take reserves on the primary at the env's now, for producer "edge-a",
// with a one-minute window.
func (e *env) take(t *testing.T, k limiter.Key, limit, need, want int64) limiter.Grant {
	t.Helper()
	return e.takeAs(t, "edge-a", k, limit, need, want)
}

// takeAs is take for another producer, as its table entry 1 (the holder an
// edge names: a window it opens is compact, lua/window.lua).
func (e *env) takeAs(t *testing.T, producer string, k limiter.Key, limit, need, want int64) limiter.Grant {
	t.Helper()
	g, err := e.store.Take(context.Background(), k, e.clock.Now(),
		limiter.TakeArgs{Window: minute, Limit: limit, Need: need, Want: want, Producer: producer, Holder: producer + ".1"})
	require.NoError(t, err)
	return g
}

// apply applies events on shard 0 at the env's now.
func (e *env) apply(t *testing.T, evs ...limiter.Event) []limiter.Result {
	t.Helper()
	res, err := e.store.Apply(context.Background(), 0, e.clock.Now(), evs)
	require.NoError(t, err)
	for i, r := range res.Results {
		require.NoError(t, r.Err, "event %d", i)
	}
	return res.Results
}

// outcomes are the results' outcomes.
func outcomes(rs []limiter.Result) []limiter.Outcome {
	out := make([]limiter.Outcome, len(rs))
	for i, r := range rs {
		out[i] = r.Outcome
	}
	return out
}

// used is the window's count read on the primary at the env's now (0 when
// no window is live).
func (e *env) used(t *testing.T, k limiter.Key) int64 {
	t.Helper()
	g, err := e.store.Take(context.Background(), k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 1, Producer: "reader"})
	require.NoError(t, err)
	return g.Used
}

// checkReplica waits for the replica to catch up, then checks on it.
func (e *env) checkReplica(t *testing.T, k limiter.Key) limiter.Window {
	t.Helper()
	e.replica.WaitSynced(e.primary)
	w, err := e.store.Check(context.Background(), k)
	require.NoError(t, err)
	return w
}

// charge is a charge event of one minute's window, placed by its reset
// (reset set) or its start.
func charge(producer string, seq uint64, k limiter.Key, reset, start time.Time, units int64) limiter.Event {
	return limiter.Event{Producer: producer, Seq: seq, Kind: limiter.Charge, Key: k, ResetAt: reset, Start: start, Window: minute, Units: units}
}

// refund gives back units of the charge (refProducer, refSeq), or of a
// reservation in the window that resets at reset when refProducer is "".
func refund(producer string, seq uint64, k limiter.Key, reset, start time.Time, units int64, refProducer string, refSeq uint64) limiter.Event {
	return limiter.Event{Producer: producer, Seq: seq, Kind: limiter.Refund, Key: k, ResetAt: reset, Start: start, Window: minute,
		Units: units, RefProducer: refProducer, RefSeq: refSeq}
}

// release gives back units reserved in the window that resets at reset.
func release(producer string, seq uint64, k limiter.Key, reset time.Time, units int64) limiter.Event {
	return limiter.Event{Producer: producer, Seq: seq, Kind: limiter.Release, Key: k, ResetAt: reset, Start: reset.Add(-minute), Window: minute, Units: units}
}

// eventually retries f a bounded number of times: the first command after a
// restart may meet a pooled connection the server closed, and a primary
// that restarted reseeds before it takes writes (reseed.go, Options.ReseedFor).
func eventually[T any](t *testing.T, f func() (T, error)) T {
	t.Helper()
	var (
		v   T
		err error
	)
	for range 100 {
		if v, err = f(); err == nil {
			return v
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	return v
}
