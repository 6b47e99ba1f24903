package limiter_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/lua"
)

// Invariant 8 under load: 64 goroutines × 1,000 events, a third of them
// duplicates sent concurrently from other goroutines, singly and in
// pipelined batches: the count is exactly the number of distinct events.
func TestConcurrentChargesCountDistinctEvents(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "hot-key")
	const workers, perWorker, distinct = 64, 1000, 48000
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for g := range workers {
		wg.Go(func() {
			ops := make([]limiter.Op, 0, 100)
			flush := func() error {
				rs, err := e.store.Apply(ctx, 0, ops)
				if err == nil {
					for _, r := range rs {
						if r.Err != nil {
							return r.Err
						}
					}
				}
				ops = ops[:0]
				return err
			}
			for i := range perWorker {
				id := fmt.Sprintf("ev-%d", (g*perWorker+i)%distinct)
				op := limiter.Op{Kind: limiter.OpCharge, Key: k, EventID: id, Start: t0, Cost: 1, Window: minute}
				if g%2 == 0 { // half the workers send one at a time
					if _, err := e.store.Charge(ctx, k, id, t0, 1, minute); err != nil {
						errs <- err
						return
					}
					continue
				}
				if ops = append(ops, op); len(ops) == cap(ops) {
					if err := flush(); err != nil {
						errs <- err
						return
					}
				}
			}
			if len(ops) > 0 {
				if err := flush(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	w, err := e.primaryOnly(t).Check(ctx, k)
	require.NoError(t, err)
	require.EqualValues(t, distinct, w.Used)
}

// Invariant 8: a bad call returns an error and writes nothing, whether Go
// or the script catches it.
func TestBadArgumentsWriteNothing(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	k := e.keys.Key("core", "alice")

	t.Run("refused in Go", func(t *testing.T) {
		cases := map[string]limiter.Op{
			"no kind":           {Key: k, EventID: "e", Start: t0, Cost: 1, Window: minute},
			"no key":            {Kind: limiter.OpCharge, EventID: "e", Start: t0, Cost: 1, Window: minute},
			"empty event id":    {Kind: limiter.OpCharge, Key: k, Start: t0, Cost: 1, Window: minute},
			"long event id":     {Kind: limiter.OpCharge, Key: k, EventID: strings.Repeat("x", 257), Start: t0, Cost: 1, Window: minute},
			"start before 1970": {Kind: limiter.OpCharge, Key: k, EventID: "e", Start: time.Unix(-5, 0), Cost: 1, Window: minute},
			"zero cost":         {Kind: limiter.OpCharge, Key: k, EventID: "e", Start: t0, Window: minute},
			"negative cost":     {Kind: limiter.OpCharge, Key: k, EventID: "e", Start: t0, Cost: -1, Window: minute},
			"huge cost":         {Kind: limiter.OpCharge, Key: k, EventID: "e", Start: t0, Cost: limiter.MaxLimit + 1, Window: minute},
			"zero window":       {Kind: limiter.OpRefund, Key: k, EventID: "e", Start: t0},
			"sub-second window": {Kind: limiter.OpCharge, Key: k, EventID: "e", Start: t0, Cost: 1, Window: time.Millisecond},
		}
		for name, op := range cases {
			t.Run(name, func(t *testing.T) {
				good := limiter.Op{Kind: limiter.OpCharge, Key: e.keys.Key("core", "bob-"+name), EventID: "ok", Start: t0, Cost: 1, Window: minute}
				rs, err := e.store.Apply(ctx, 0, []limiter.Op{op, good})
				require.NoError(t, err)
				require.ErrorIs(t, rs[0].Err, limiter.ErrInvalidArgument)
				require.Equal(t, limiter.Applied, rs[1].Outcome, "the good op in the batch still runs")
				n, err := rdb.Exists(ctx, k.String()).Result()
				require.NoError(t, err)
				require.Zero(t, n)
			})
		}
		_, _, err := e.store.Open(ctx, k, 0)
		require.ErrorIs(t, err, limiter.ErrInvalidArgument)
	})

	t.Run("refused by the script", func(t *testing.T) {
		// An existing window with one charge; every bad call must leave it,
		// its expiry and the rest of the database exactly as they were.
		e.charge(t, k, "e1", t0, 3)
		now := fmt.Sprint(t0.UnixMilli())
		field := "e:" + strings.Repeat("ab", 16)
		scripts := map[string]struct {
			src  string
			args []string
		}{
			"check":  {lua.Check, []string{now}},
			"open":   {lua.Open, []string{now, "60000", "60000"}},
			"charge": {lua.Charge, []string{field, "1", now, now, "60000", "2000", "60000"}},
			"refund": {lua.Refund, []string{field, now, now, "60000", "2000", "60000"}},
		}
		bad := []string{"", "-1", "1.5", "1e3", "0x10", " 1", "abc", "9999999999999999"}
		// The good calls work, so that the bad ones below fail for their
		// one bad argument alone.
		for name, sc := range scripts {
			require.NoError(t, rdb.Eval(ctx, sc.src, []string{"probe:" + name}, toAny(sc.args)...).Err(), name)
		}
		before := state(t, rdb, k)
		for name, sc := range scripts {
			for i := range sc.args {
				values := bad
				if name == "charge" || name == "refund" {
					if i == 0 {
						values = []string{"", "e:", "e:" + strings.Repeat("AB", 16), "x:" + strings.Repeat("ab", 16), field + "0", "alice"}
					}
				}
				for _, v := range values {
					args := append([]string(nil), sc.args...)
					args[i] = v
					err := rdb.Eval(ctx, sc.src, []string{k.String()}, toAny(args)...).Err()
					require.Error(t, err, "%s ARGV[%d]=%q", name, i+1, v)
					require.Contains(t, err.Error(), "tally: invalid", "%s ARGV[%d]=%q", name, i+1, v)
					require.Equal(t, before, state(t, rdb, k), "%s ARGV[%d]=%q wrote", name, i+1, v)
				}
			}
			// Missing arguments.
			err := rdb.Eval(ctx, sc.src, []string{k.String()}, toAny(sc.args[:len(sc.args)-1])...).Err()
			require.Error(t, err, name)
			require.Equal(t, before, state(t, rdb, k))
		}
		// The zero-length window and zero cost are refused by range.
		for _, args := range [][]string{
			{now, "0", "60000"},
			{now, "999", "60000"},
			{now, "60000", "999"},
		} {
			require.Error(t, rdb.Eval(ctx, lua.Open, []string{k.String()}, toAny(args)...).Err())
		}
		require.Error(t, rdb.Eval(ctx, lua.Charge, []string{k.String()}, field, "0", now, now, "60000", "2000", "60000").Err())
		require.Equal(t, before, state(t, rdb, k))
	})
}

// dump is the key's full state: fields and expiry.
func dump(t *testing.T, rdb *redis.Client, k limiter.Key) string {
	t.Helper()
	ctx := context.Background()
	h, err := rdb.HGetAll(ctx, k.String()).Result()
	require.NoError(t, err)
	exp, err := rdb.PExpireTime(ctx, k.String()).Result()
	require.NoError(t, err)
	return fmt.Sprintf("%v exp=%v", h, exp)
}

// state is the key's full state and the number of keys in the database.
func state(t *testing.T, rdb *redis.Client, k limiter.Key) string {
	t.Helper()
	n, err := rdb.DBSize(context.Background()).Result()
	require.NoError(t, err)
	return fmt.Sprintf("%s keys=%d", dump(t, rdb, k), n)
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// Invariant 9: no identity reaches Redis or another client's window.
func TestKeySafety(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	rdb := e.primary.Client()
	alice := e.keys.Key("core", "alice")
	e.charge(t, alice, "alice-1", t0, 2)
	before := dump(t, rdb, alice)

	evil := []string{
		"alice:exp", "alice:", ":alice", "{alice}", "{alice}:exp", "alice}", "{", "}",
		"alice\x00", "\x00alice", "alice\n", "Alice", "alice ",
		"аlice",                      // Cyrillic a
		"ａｌｉｃｅ",                      // full-width
		"alice\u200b", "a\u0301lice", // zero-width space, combining accent
		strings.Repeat("alice", 2048), // 10 KB
		strings.Repeat("{", 10240),
	}
	keyRE := regexp.MustCompile(`^tally:\{[0-9a-f]{32}\}$`)
	seen := map[string]string{alice.String(): "alice"}
	for i, id := range evil {
		for _, resource := range []string{"core", "core:alice", "search"} {
			k := e.keys.Key(resource, id)
			require.Regexp(t, keyRE, k.String())
			prev, dup := seen[k.String()]
			require.False(t, dup, "%q collides with %q", id, prev)
			seen[k.String()] = id
			r := e.charge(t, k, fmt.Sprintf("evil-%d", i), t0, 1)
			require.Equal(t, limiter.Applied, r.Outcome)
			require.EqualValues(t, 1, r.Used, "a fresh window for %q", id)
		}
	}
	// The resource and identity are length-prefixed: moving bytes between
	// them gives another key.
	require.NotEqual(t, e.keys.Key("core", "alice").String(), e.keys.Key("corea", "lice").String())
	require.NotEqual(t, e.keys.Key("", "corealice").String(), e.keys.Key("corealice", "").String())
	require.NotEqual(t, e.keys.Key("x", "\x01y").String(), e.keys.Key("x\x02", "y").String())
	require.Equal(t, before, dump(t, rdb, alice), "alice's window is untouched")

	// Nothing stored names an identity.
	keys, err := rdb.Keys(ctx, "*").Result()
	require.NoError(t, err)
	for _, key := range keys {
		require.Regexp(t, keyRE, key)
		require.NotContains(t, key, "alice")
	}

	// A different secret gives different keys; digests round-trip.
	other, err := limiter.NewKeySpace("tally", []byte("other"))
	require.NoError(t, err)
	require.NotEqual(t, alice.String(), other.Key("core", "alice").String())
	back, err := e.keys.KeyFromDigest(alice.Digest())
	require.NoError(t, err)
	require.Equal(t, alice, back)
	for _, d := range []string{"", "alice", strings.Repeat("A", 32), strings.Repeat("a", 31) + "}", strings.Repeat("a", 33)} {
		_, err := e.keys.KeyFromDigest(d)
		require.ErrorIs(t, err, limiter.ErrInvalidKey, "%q", d)
	}
	for _, p := range []string{"", "Tally", "a{b}", "a:b", strings.Repeat("a", 33)} {
		_, err := limiter.NewKeySpace(p, nil)
		require.ErrorIs(t, err, limiter.ErrInvalidKey, "%q", p)
	}
}

// The scripts keep working after SCRIPT FLUSH, a restart and a promotion:
// NOSCRIPT is recovered from on primaries (pipelined) and replicas.
func TestScriptsSurviveFlushRestartAndPromotion(t *testing.T) {
	e := newEnv(t, limiter.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	e.open(t, k)
	e.charge(t, k, "e1", t0, 1)
	require.True(t, e.checkReplica(t, k).Live)

	// SCRIPT FLUSH on both nodes.
	require.NoError(t, e.primary.Client().ScriptFlush(ctx).Err())
	require.NoError(t, e.replica.Client().ScriptFlush(ctx).Err())
	require.EqualValues(t, 2, e.charge(t, k, "e2", t0, 1).Used)
	require.EqualValues(t, 2, e.checkReplica(t, k).Used)
	require.NoError(t, e.primary.Client().ScriptFlush(ctx).Err())
	require.True(t, e.open(t, k).Live)

	// The replica restarts (empty cache, resynced data).
	e.replica.Restart()
	require.EqualValues(t, 2, eventually(t, func() (limiter.Window, error) { return e.store.Check(ctx, k) }).Used)

	// The primary restarts empty; the replica resyncs from it (to empty).
	e.primary.Restart()
	e.replica.WaitLinkUp()
	r := eventually(t, func() (limiter.Result, error) { return e.store.Charge(ctx, k, "e3", t0, 1, minute) })
	require.Equal(t, limiter.Applied, r.Outcome)
	require.EqualValues(t, 1, r.Used, "the restarted primary lost its data (no persistence in tests)")
	require.EqualValues(t, 1, e.checkReplica(t, k).Used)

	// The replica is promoted; a store pointed at it as primary charges on.
	e.replica.WaitSynced(e.primary)
	e.replica.Promote()
	promoted := newStore(t, []shard.Config{{Name: "s0", Primary: node(e.replica)}}, limiter.Options{Clock: e.clock})
	r, err := promoted.Charge(ctx, k, "e4", t0, 1, minute)
	require.NoError(t, err)
	require.Equal(t, limiter.Applied, r.Outcome)
	require.EqualValues(t, 2, r.Used, "the promoted replica has the window")
	r, err = promoted.Charge(ctx, k, "e3", t0, 1, minute)
	require.NoError(t, err)
	require.Equal(t, limiter.Duplicate, r.Outcome, "event records replicated too")
	w, opened, err := promoted.Open(ctx, e.keys.Key("core", "bob"), minute)
	require.NoError(t, err)
	require.True(t, opened)
	require.True(t, w.Live)
}

// eventually retries f a bounded number of times: the first command after a
// restart may meet a pooled connection the server closed.
func eventually[T any](t *testing.T, f func() (T, error)) T {
	t.Helper()
	var (
		v   T
		err error
	)
	for range 20 {
		if v, err = f(); err == nil {
			return v
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	return v
}

// Replica selection: a dead replica is skipped, a replica whose link is down
// is skipped after a probe, and when none is up the read policy decides.
func TestReplicaSelection(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t)
	r1, r2 := p.StartReplica(t), p.StartReplica(t)
	clock := limiter.NewManualClock(t0)
	cfg := []shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r1), node(r2)}}}
	keys, err := limiter.NewKeySpace("tally", nil)
	require.NoError(t, err)
	k := keys.Key("core", "alice")
	st := newStore(t, cfg, limiter.Options{Clock: clock})
	failing := newStore(t, cfg, limiter.Options{Clock: clock, ReadPolicy: shard.ReadFail})
	_, err = st.Charge(ctx, k, "e1", t0, 4, minute)
	require.NoError(t, err)
	r1.WaitSynced(p)
	r2.WaitSynced(p)

	// r1 dies: every check still answers, and r1 is taken out of rotation.
	r1.Stop()
	for range 4 {
		w, err := st.Check(ctx, k)
		require.NoError(t, err)
		require.EqualValues(t, 4, w.Used)
	}
	assert.False(t, st.ReplicaUp(0, 0))
	assert.True(t, st.ReplicaUp(0, 1))

	// r2's link to the primary goes down: it would serve counts that no
	// longer move. A probe takes it out; reads go to the primary.
	require.NoError(t, r2.Client().Do(ctx, "REPLICAOF", "127.0.0.1", "1").Err())
	st.ProbeReplicas(ctx)
	assert.False(t, st.ReplicaUp(0, 1))
	_, err = st.Charge(ctx, k, "e2", t0, 1, minute)
	require.NoError(t, err)
	w, err := st.Check(ctx, k)
	require.NoError(t, err)
	require.EqualValues(t, 5, w.Used, "read from the primary")

	// With the fail policy, the same situation is an error.
	failing.ProbeReplicas(ctx)
	_, err = failing.Check(ctx, k)
	require.ErrorIs(t, err, limiter.ErrNoReplica)

	// r2 rejoins: a probe puts it back, after the cooldown reads use it.
	require.NoError(t, r2.Client().Do(ctx, "REPLICAOF", "127.0.0.1", fmt.Sprint(p.Port)).Err())
	r2.WaitLinkUp()
	r2.WaitSynced(p)
	failing.ProbeReplicas(ctx)
	w, err = failing.Check(ctx, k)
	require.NoError(t, err)
	require.EqualValues(t, 5, w.Used)

	// A dead replica comes back into rotation after its cooldown.
	clock.Advance(shard.DefaultCooldown)
	assert.True(t, st.ReplicaUp(0, 0), "tried again after the cooldown")
}
