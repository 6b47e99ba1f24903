package redisstore_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/lua"
)

// commandCalls is INFO commandstats: calls per command since the last
// CONFIG RESETSTAT.
func commandCalls(t testing.TB, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		require.NoError(t, err)
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// take.lua on a key with no window opens it compact: a read and one SET on
// the primary (inside the script call, the reseed marker not read), one
// SET replicated. (An edge that knows no window of the key sends the SET
// alone: TestFreshTakeOpensWithOneSet.)
func TestColdTakeIsOneWrite(t *testing.T) {
	e := newEnv(t, redisstore.Options{EpochCheck: time.Minute}) // no probe between the counts
	ctx := context.Background()
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1) // the connection open, the shard's format read
	require.True(t, e.store.Compact(0), "a new deployment's windows are compact")
	e.replica.WaitSynced(e.primary)
	require.NoError(t, e.primary.Client().ConfigResetStat(ctx).Err())
	require.NoError(t, e.replica.Client().ConfigResetStat(ctx).Err())

	k := e.keys.Key("core", "alice")
	g := e.take(t, k, 100, 1, 1)
	require.True(t, g.Opened)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 1, g.Mine)
	require.Equal(t, g.ResetAt, g.Start.Add(minute))
	e.replica.WaitSynced(e.primary)

	p, r := commandCalls(t, e.primary.Client()), commandCalls(t, e.replica.Client())
	require.EqualValues(t, 1, p["evalsha"], "primary: %v", p)
	require.EqualValues(t, 1, p["get"], "primary: %v", p)
	require.EqualValues(t, 1, p["set"], "primary: %v", p)
	require.EqualValues(t, 1, r["set"], "replica: %v", r)
	for _, c := range []string{"hmget", "hset", "hget", "hgetall", "pexpireat", "pexpire", "pttl", "del"} {
		require.Zero(t, p[c], "primary ran %s: %v", c, p)
		require.Zero(t, r[c], "replica ran %s: %v", c, r)
	}
	require.Zero(t, r["get"], "replica: %v", r)
	require.Zero(t, r["multi"], "one effect, not a transaction: %v", r)

	v, err := e.primary.Client().Get(ctx, k.String()).Result()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("1:%d:60:edge-a.1", g.ResetAt.Unix()), v)
	exp, err := e.primary.Client().PExpireTime(ctx, k.String()).Result()
	require.NoError(t, err)
	require.Equal(t, g.ResetAt.Add(60*time.Second).UnixMilli(), exp.Milliseconds(), "expires at reset + grace")
	w := e.checkReplica(t, k)
	require.True(t, w.Live)
	require.EqualValues(t, 1, w.Used)
	require.Equal(t, g.ResetAt, w.ResetAt)
	require.Equal(t, g.Start, w.Start)
}

// A compact window stays compact while its holder alone reserves; another
// holder's reservation expands it into the full form with every share it
// held, and the limit holds throughout.
func TestCompactWindowAcrossHolders(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	k := e.keys.Key("core", "alice")
	kind := func() string { return e.primary.Client().Type(ctx, k.String()).Val() }
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1) // the shard's format read

	a := e.takeAs(t, "edge-a", k, 5, 1, 3)
	require.EqualValues(t, 3, a.Granted)
	a = e.takeAs(t, "edge-a", k, 5, 1, 1)
	require.EqualValues(t, 1, a.Granted)
	require.EqualValues(t, 4, a.Mine)
	require.False(t, a.Opened)
	require.Equal(t, "string", kind(), "its holder's own window stays compact")

	b := e.takeAs(t, "edge-b", k, 5, 2, 2)
	require.Zero(t, b.Granted, "one unit left, two needed")
	require.EqualValues(t, 4, b.Used)
	require.Zero(t, b.Mine)
	require.Equal(t, "string", kind(), "a take that gets nothing writes nothing")

	b = e.takeAs(t, "edge-b", k, 5, 1, 2)
	require.EqualValues(t, 1, b.Granted)
	require.EqualValues(t, 5, b.Used)
	require.EqualValues(t, 1, b.Mine)
	require.Equal(t, "hash", kind())
	f := e.primary.Client().HGetAll(ctx, k.String()).Val()
	require.Equal(t, "5", f["u"])
	require.Equal(t, "4", f["g:edge-a.1"])
	require.Equal(t, "4", f["c:edge-a"])
	require.Equal(t, "1", f["g:edge-b.1"])
	require.Equal(t, "1", f["c:edge-b"])
	require.Equal(t, strconv.FormatInt(a.ResetAt.UnixMilli(), 10), f["r"])
	require.Equal(t, strconv.FormatInt(a.Start.UnixMilli(), 10), f["s"])

	a = e.takeAs(t, "edge-a", k, 5, 1, 1)
	require.Zero(t, a.Granted, "the limit holds across the forms")
	require.EqualValues(t, 4, a.Mine, "what the first holder was given, kept by the expansion")

	// Once the window has ended its holder's next take replaces it, compact
	// again, accepting events from the old reset on.
	e.clock.Advance(minute)
	a = e.takeAs(t, "edge-a", k, 5, 1, 1)
	require.True(t, a.Opened)
	require.Equal(t, "string", kind())
	v := e.primary.Client().Get(ctx, k.String()).Val()
	back := (a.Start.UnixMilli() - b.ResetAt.UnixMilli()) / 1000
	require.Equal(t, fmt.Sprintf("1:%d:60:edge-a.1:%d", a.ResetAt.Unix(), back), v)

	// Its holder's release keeps it compact, with where it accepts events
	// from and what the holder was given.
	rs := e.apply(t, release("edge-a", 1, k, a.ResetAt, 1))
	require.EqualValues(t, 1, rs[0].Amount)
	require.Equal(t, fmt.Sprintf("0:%d:60:edge-a.1:%d:1", a.ResetAt.Unix(), back), e.primary.Client().Get(ctx, k.String()).Val())
	a = e.takeAs(t, "edge-a", k, 5, 1, 5)
	require.EqualValues(t, 5, a.Granted)
	require.EqualValues(t, 6, a.Mine)
	require.Equal(t, fmt.Sprintf("5:%d:60:edge-a.1:%d:6", a.ResetAt.Unix(), back), e.primary.Client().Get(ctx, k.String()).Val())
	// Another holder's take expands it: the event starts it accepts kept.
	b = e.takeAs(t, "edge-b", k, 5, 1, 1)
	require.Zero(t, b.Granted)
	rs = e.apply(t, release("edge-a", 2, k, a.ResetAt, 2))
	require.EqualValues(t, 3, rs[0].Used)
	b = e.takeAs(t, "edge-b", k, 5, 1, 1)
	require.EqualValues(t, 1, b.Granted)
	f = e.primary.Client().HGetAll(ctx, k.String()).Val()
	require.Equal(t, strconv.FormatInt(a.Start.UnixMilli()-back*1000, 10), f["p"])
	require.Equal(t, "6", f["g:edge-a.1"])
	require.Equal(t, "3", f["c:edge-a"])
	require.Equal(t, "4", f["u"])
}

// Every script reads a compact window, and each change it cannot hold
// expands it first: refunds and releases (only what their producer holds),
// finishes, frozen shares, a reseed's claims; reads on replicas and inspect
// see it as it is.
func TestCompactWindowEverywhere(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	kind := func(k limiter.Key) string { return e.primary.Client().Type(ctx, k.String()).Val() }
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1) // the shard's format read

	t.Run("its producer's releases, refunds and charges keep it compact; another's expand it", func(t *testing.T) {
		k := e.keys.Key("core", "releases")
		val := func() string { return e.primary.Client().Get(ctx, k.String()).Val() }
		g := e.takeAs(t, "edge-a", k, 10, 1, 4)
		r := g.ResetAt.Unix()
		rs := e.apply(t, release("billing", 1, k, g.ResetAt, 3))
		require.Equal(t, limiter.Applied, rs[0].Outcome)
		require.Zero(t, rs[0].Amount, "billing holds nothing in the window")
		require.Equal(t, fmt.Sprintf("4:%d:60:edge-a.1", r), val(), "nothing given back, nothing changed")

		rs = e.apply(t, release("edge-a", 1, k, g.ResetAt, 3))
		require.Equal(t, limiter.Applied, rs[0].Outcome)
		require.EqualValues(t, 3, rs[0].Amount)
		require.EqualValues(t, 1, rs[0].Used)
		require.Equal(t, fmt.Sprintf("1:%d:60:edge-a.1::4", r), val(), "the count, and what edge-a.1 was given")
		exp := e.primary.Client().PExpireTime(ctx, k.String()).Val()
		require.Equal(t, g.ResetAt.Add(60*time.Second).UnixMilli(), exp.Milliseconds(), "the expiry kept")
		require.EqualValues(t, 1, e.used(t, k))
		require.Equal(t, limiter.Window{Live: true, Used: 1, ResetAt: g.ResetAt, Start: g.Start}, e.checkReplica(t, k))

		// The holder's next reservations, by take.lua and by own.lua: what
		// it was given keeps counting from 4.
		g = e.takeAs(t, "edge-a", k, 10, 1, 2)
		require.EqualValues(t, 2, g.Granted)
		require.EqualValues(t, 3, g.Used)
		require.EqualValues(t, 6, g.Mine)
		require.True(t, g.Own)
		require.Equal(t, fmt.Sprintf("3:%d:60:edge-a.1::6", r), val())
		require.NoError(t, e.store.LoadScripts(ctx, 0))
		made, _ := e.store.ShortTakes()
		g, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 10, Need: 1, Want: 1,
			Producer: "edge-a", Holder: "edge-a.1", Own: true})
		require.NoError(t, err)
		madeNow, _ := e.store.ShortTakes()
		require.Equal(t, made+1, madeNow, "own.lua made it")
		require.EqualValues(t, 1, g.Granted)
		require.EqualValues(t, 4, g.Used)
		require.EqualValues(t, 7, g.Mine)
		require.True(t, g.Own)
		require.Equal(t, fmt.Sprintf("4:%d:60:edge-a.1::7", r), val())

		// A refund of a reservation, then a charge, both edge-a's.
		rs = e.apply(t, refund("edge-a", 2, k, g.ResetAt, g.Start, 9, "", 0))
		require.EqualValues(t, 4, rs[0].Amount, "at most what edge-a holds")
		require.Equal(t, fmt.Sprintf("0:%d:60:edge-a.1::7", r), val())
		rs = e.apply(t, charge("edge-a", 3, k, g.ResetAt, g.Start, 3))
		require.EqualValues(t, 3, rs[0].Used)
		require.Equal(t, fmt.Sprintf("3:%d:60:edge-a.1::7", r), val())

		// billing's charge: the full form, with what each holds and what
		// edge-a.1 was given.
		rs = e.apply(t, charge("billing", 10, k, g.ResetAt, g.Start, 2))
		require.EqualValues(t, 5, rs[0].Used)
		require.Equal(t, "hash", kind(k))
		f := e.primary.Client().HGetAll(ctx, k.String()).Val()
		require.Equal(t, "5", f["u"])
		require.Equal(t, "3", f["c:edge-a"])
		require.Equal(t, "2", f["c:billing"])
		require.Equal(t, "7", f["g:edge-a.1"])
		rs = e.apply(t, release("edge-a", 4, k, g.ResetAt, 9))
		require.EqualValues(t, 3, rs[0].Amount, "edge-a gives back only its own")
		require.EqualValues(t, 2, rs[0].Used)
		g = e.takeAs(t, "edge-a", k, 10, 1, 1)
		require.EqualValues(t, 8, g.Mine)
		require.False(t, g.Own)
	})
	t.Run("a charge and a release in one call", func(t *testing.T) {
		k := e.keys.Key("core", "both")
		g := e.takeAs(t, "edge-a", k, 10, 1, 2)
		rs := e.apply(t, charge("edge-a", 5, k, g.ResetAt, g.Start, 3), release("edge-a", 6, k, g.ResetAt, 4))
		require.EqualValues(t, 5, rs[0].Used)
		require.EqualValues(t, 4, rs[1].Amount)
		require.EqualValues(t, 1, rs[1].Used)
		require.Equal(t, fmt.Sprintf("1:%d:60:edge-a.1::2", g.ResetAt.Unix()), e.primary.Client().Get(ctx, k.String()).Val())
		rs = e.apply(t, charge("billing", 11, k, g.ResetAt, g.Start, 1), release("edge-a", 7, k, g.ResetAt, 1))
		require.EqualValues(t, 1, rs[1].Amount)
		f := e.primary.Client().HGetAll(ctx, k.String()).Val()
		require.Equal(t, "1", f["u"])
		require.Equal(t, "0", f["c:edge-a"])
		require.Equal(t, "1", f["c:billing"])
		require.Equal(t, "2", f["g:edge-a.1"])
	})
	t.Run("a charge", func(t *testing.T) {
		k := e.keys.Key("core", "charges")
		g := e.takeAs(t, "edge-a", k, 10, 1, 2)
		rs := e.apply(t, charge("billing", 2, k, g.ResetAt, g.Start, 5))
		require.Equal(t, limiter.Applied, rs[0].Outcome)
		require.EqualValues(t, 7, rs[0].Used)
		f := e.primary.Client().HGetAll(ctx, k.String()).Val()
		require.Equal(t, "5", f["c:billing"])
		require.Equal(t, "2", f["c:edge-a"])
	})
	t.Run("a read on a replica and inspect", func(t *testing.T) {
		k := e.keys.Key("core", "reads")
		g := e.takeAs(t, "edge-a", k, 10, 1, 6)
		w := e.checkReplica(t, k)
		require.Equal(t, limiter.Window{Live: true, Used: 6, ResetAt: g.ResetAt, Start: g.Start}, w)
		d, err := e.store.Inspect(ctx, k, limiter.Policy{Window: minute}, e.clock.Now())
		require.NoError(t, err)
		require.True(t, d.Live)
		require.EqualValues(t, 6, d.Used)
		require.Equal(t, g.ResetAt, d.ResetAt)
		require.Equal(t, []redisstore.Holding{{Who: "edge-a", Units: 6}}, d.Holders)
		e.clock.Advance(minute)
		w = e.checkReplica(t, k)
		require.False(t, w.Live, "a compact window whose reset has passed reads as absent")
		e.clock.Set(t0)
	})
	t.Run("a frozen share", func(t *testing.T) {
		k := e.keys.Key("core", "frozen")
		g := e.takeAs(t, "edge-a", k, 10, 1, 8)
		res, err := e.store.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: g.ResetAt, Holder: "edge-a.1", Producer: "edge-a",
			Frozen: 0, Expiry: t0.Add(time.Second)}})
		require.NoError(t, err)
		require.Equal(t, limiter.Held, res[0].Outcome)
		require.Equal(t, "string", kind(k), "nothing to record: still compact")
		res, err = e.store.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: g.ResetAt, Holder: "edge-a.1", Producer: "edge-a",
			Frozen: 5, Expiry: t0.Add(time.Second)}})
		require.NoError(t, err)
		require.Equal(t, limiter.Held, res[0].Outcome)
		require.Equal(t, "hash", kind(k))
		f := e.primary.Client().HGetAll(ctx, k.String()).Val()
		require.Equal(t, "8", f["u"])
		require.Equal(t, "8", f["g:edge-a.1"])
		require.True(t, strings.HasPrefix(f["z:edge-a.1"], "5:"), f["z:edge-a.1"])
	})
	t.Run("a frozen share after a release", func(t *testing.T) {
		k := e.keys.Key("core", "frozen-after-release")
		g := e.takeAs(t, "edge-a", k, 10, 1, 8)
		e.apply(t, release("edge-a", 20, k, g.ResetAt, 3))
		require.Equal(t, fmt.Sprintf("5:%d:60:edge-a.1::8", g.ResetAt.Unix()), e.primary.Client().Get(ctx, k.String()).Val())
		res, err := e.store.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: g.ResetAt, Holder: "edge-a.1", Producer: "edge-a",
			Frozen: 2, Expiry: t0.Add(time.Second)}})
		require.NoError(t, err)
		require.Equal(t, limiter.Held, res[0].Outcome)
		f := e.primary.Client().HGetAll(ctx, k.String()).Val()
		require.Equal(t, "5", f["u"])
		require.Equal(t, "8", f["g:edge-a.1"], "what it was given")
		require.Equal(t, "5", f["c:edge-a"], "what its producer holds")
	})
	t.Run("a value that is no window fails the call and is left alone", func(t *testing.T) {
		k := e.keys.Key("core", "garbage")
		require.NoError(t, e.primary.Client().Set(ctx, k.String(), "hello", 0).Err())
		_, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 5, Need: 2, Want: 2,
			Producer: "edge-b", Holder: "edge-b.1"})
		require.ErrorContains(t, err, "unreadable window")
		require.Equal(t, "hello", e.primary.Client().Get(ctx, k.String()).Val())

		// A compact window's shape with a holder that names no producer
		// (no "<producer>.<n>"), live or ended: no window either, on the
		// cold path and on a replica's read.
		now := e.clock.Now().Unix()
		for _, v := range []string{fmt.Sprintf("1:%d:60:intruder", now+30), fmt.Sprintf("1:%d:60:intruder", now-30),
			fmt.Sprintf("1:%d:60:edge-b.1:", now+30), fmt.Sprintf("1:%d:60:edge-b.1:3:", now+30),
			fmt.Sprintf("1:%d:60:edge-b.1::1234567890123456", now+30), fmt.Sprintf("1:%d:60:edge-b.1:3:4:5", now+30)} {
			require.NoError(t, e.primary.Client().Set(ctx, k.String(), v, 0).Err())
			_, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 5, Need: 2, Want: 2,
				Producer: "edge-b", Holder: "edge-b.1"})
			require.ErrorContains(t, err, "unreadable window", v)
			require.Equal(t, v, e.primary.Client().Get(ctx, k.String()).Val())
			require.ErrorContains(t, e.primary.Client().EvalRO(ctx, lua.Check, []string{k.String()}, e.clock.Now().UnixMilli()).Err(),
				"unreadable window", v)
			_, err = e.store.Inspect(ctx, k, limiter.Policy{Window: minute}, e.clock.Now())
			require.ErrorContains(t, err, "is no window", v)
		}
	})
}

// A deployment upgraded from 0.1.0 keeps the full form until the operator
// says every process reads compact windows: a 0.1.0 edge (its own scripts)
// and a new one reserve in the same windows, exactly. Afterwards new windows
// open compact, and the windows of the old form are still read and changed.
func TestRollingUpgradeFromFullWindows(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, redisstore.Options{EpochCheck: 20 * time.Millisecond})
	// What 0.1.0 left on the primary: its epoch record, and no format record.
	pc := e.primary.Client()
	require.NoError(t, pc.Del(ctx, "tally:windows", "tally:epoch").Err())
	run := regexpRunID(t, pc.Info(ctx, "server").Val())
	require.NoError(t, pc.Set(ctx, "tally:epoch", run+":00000000000000aa:a", 0).Err())
	e.store = newStore(t, e.config(), e.keys, redisstore.Options{Clock: e.clock, EpochCheck: 20 * time.Millisecond})

	old := redis.NewScript(readOld(t, "window.lua") + "\n" + readOld(t, "take.lua"))
	oldTake := func(k limiter.Key, need, want int64) []int64 {
		t.Helper()
		v, err := old.Run(ctx, pc, []string{k.String(), "tally:producer:{00000000000000000000000000000000}", "tally:reseed"},
			e.clock.Now().UnixMilli(), minute.Milliseconds(), 10, need, want, 60000, "edge-old.1", "edge-old", "", "").Int64Slice()
		require.NoError(t, err)
		return v
	}
	k := e.keys.Key("core", "shared")
	newTake := func(k limiter.Key, need, want int64) limiter.Grant { return e.takeAs(t, "edge-new", k, 10, need, want) }

	// The new edge opens the window: the full form, which the old edge reads.
	g := newTake(k, 1, 3)
	require.True(t, g.Opened)
	require.False(t, e.store.Compact(0))
	require.Equal(t, "hash", pc.Type(ctx, k.String()).Val())
	v := oldTake(k, 1, 4)
	require.EqualValues(t, 4, v[0])
	require.EqualValues(t, 7, v[1])
	g = newTake(k, 1, 5)
	require.EqualValues(t, 3, g.Granted, "what is left")
	require.EqualValues(t, 6, g.Mine)
	v = oldTake(k, 1, 1)
	require.Zero(t, v[0], "full")
	k2 := e.keys.Key("core", "opened-by-old")
	oldTake(k2, 1, 2)
	g = newTake(k2, 1, 9)
	require.EqualValues(t, 8, g.Granted, "the new edge reads the old edge's window")
	require.EqualValues(t, 10, g.Used)

	// Every process upgraded: the operator lets windows be compact.
	was, err := e.store.MakeCompact(ctx)
	require.NoError(t, err)
	require.Equal(t, []bool{false}, was)
	other := newStore(t, e.config(), e.keys, redisstore.Options{Clock: e.clock, EpochCheck: 20 * time.Millisecond})
	require.Eventually(t, func() bool {
		_, err := other.Take(ctx, e.keys.Key("core", "probe"), e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 10,
			Producer: "edge-x"})
		return err == nil && other.Compact(0)
	}, 10*time.Second, 10*time.Millisecond, "another process learns it from its probe")
	k3 := e.keys.Key("core", "after")
	newTake(k3, 1, 1)
	require.Equal(t, "string", pc.Type(ctx, k3.String()).Val())
	require.Zero(t, newTake(k, 1, 1).Granted, "a window of the old form still counts")
	_, err = old.Run(ctx, pc, []string{k3.String(), "tally:producer:{00000000000000000000000000000000}", "tally:reseed"},
		e.clock.Now().UnixMilli(), minute.Milliseconds(), 10, 1, 1, 60000, "edge-old.1", "edge-old", "", "").Result()
	require.ErrorContains(t, err, "WRONGTYPE", "why the switch waits for every process: 0.1.0 cannot read a compact window")
}

// A primary that comes back without its data gets its format record back
// from the processes that knew it.
func TestFormatRecordSurvivesAnEmptiedPrimary(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, redisstore.Options{EpochCheck: 20 * time.Millisecond, ReseedFor: 100 * time.Millisecond})
	e.take(t, e.keys.Key("core", "a"), 10, 1, 1)
	require.True(t, e.store.Compact(0))
	require.NoError(t, e.primary.Client().FlushAll(ctx).Err())
	require.Eventually(t, func() bool {
		return regexp.MustCompile("^spans:[0-9a-f]{16}$").MatchString(e.primary.Client().Get(ctx, "tally:windows").Val())
	}, 10*time.Second, 10*time.Millisecond)
}

func readOld(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/v0.1.0/" + name)
	require.NoError(t, err)
	return string(b)
}

func regexpRunID(t *testing.T, info string) string {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			return v
		}
	}
	t.Fatal("no run_id in INFO server")
	return ""
}

// A take of a key its caller knows no window of (TakeArgs.Fresh) opens it
// with one SET ... NX and no script; when a window is there after all, the
// script makes the reservation as any other. Alone and in pipelines.
func TestFreshTakeOpensWithOneSet(t *testing.T) {
	e := newEnv(t, redisstore.Options{EpochCheck: time.Minute})
	ctx := context.Background()
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1)
	fresh := func(k limiter.Key, producer string, limit, want int64) (limiter.Grant, error) {
		return e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: limit, Need: 1, Want: want,
			Producer: producer, Holder: producer + ".7", Fresh: true})
	}
	require.NoError(t, e.primary.Client().ConfigResetStat(ctx).Err())
	k := e.keys.Key("core", "fresh")
	g, err := fresh(k, "edge-a", 10, 3)
	require.NoError(t, err)
	require.Equal(t, limiter.Grant{Granted: 3, Live: true, Used: 3, ResetAt: g.Start.Add(minute), Start: t0.Truncate(time.Second),
		Opened: true, Mine: 3, Frozen: -1, Own: true}, g)
	p := commandCalls(t, e.primary.Client())
	require.EqualValues(t, 1, p["set"], "%v", p)
	require.Zero(t, p["evalsha"], "%v", p)
	require.Equal(t, fmt.Sprintf("3:%d:60:edge-a.7", g.ResetAt.Unix()), e.primary.Client().Get(ctx, k.String()).Val())

	// Another edge that knows no window of the key either: the script.
	g, err = fresh(k, "edge-b", 10, 9)
	require.NoError(t, err)
	require.EqualValues(t, 7, g.Granted)
	require.EqualValues(t, 10, g.Used)
	require.False(t, g.Opened)
	require.EqualValues(t, 1, commandCalls(t, e.primary.Client())["evalsha"])

	// Many at once, in pipelines: each key's limit holds, and every
	// caller's grant is what the window counts for it.
	const callers, keys = 48, 6
	grants := make([]limiter.Grant, callers)
	errs := make([]error, callers)
	done := make(chan int)
	for i := range callers {
		go func() {
			grants[i], errs[i] = fresh(e.keys.Key("core", fmt.Sprintf("busy-%d", i%keys)), fmt.Sprintf("edge-%d", i), 5, 2)
			done <- i
		}()
	}
	for range callers {
		<-done
	}
	sum := map[int]int64{}
	opened := map[int]int{}
	for i, g := range grants {
		require.NoError(t, errs[i])
		sum[i%keys] += g.Granted
		require.Equal(t, g.Granted, g.Mine)
		if g.Opened {
			opened[i%keys]++
		}
	}
	for j := range keys {
		require.EqualValues(t, 5, sum[j], "key %d", j)
		require.Equal(t, 1, opened[j], "key %d opened once", j)
		require.EqualValues(t, 5, e.used(t, e.keys.Key("core", fmt.Sprintf("busy-%d", j))))
	}
}

// A policy aligned to the clock opens its windows at multiples of their
// length since the Unix epoch — by the edge's SET, by take.lua in either
// form — and a take in the next period opens the next window.
func TestAlignedWindows(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	ctx := context.Background()
	e.take(t, e.keys.Key("core", "warm"), 100, 1, 1)
	// 20 min 34.5 s into an hour, ahead of Redis's clock (keys expire by it).
	at := time.Now().Truncate(time.Hour).Add(2*time.Hour + 1234*time.Second + 500*time.Millisecond)
	wantStart := time.Unix(at.Unix()-at.Unix()%60, 0)
	for _, tc := range []struct {
		name          string
		holder        string
		fresh         bool
		window        time.Duration
		start, resetT time.Time
	}{
		{"the edge's SET", "edge-a.1", true, time.Minute, wantStart, wantStart.Add(time.Minute)},
		{"take.lua, compact", "edge-a.1", false, time.Minute, wantStart, wantStart.Add(time.Minute)},
		{"take.lua, full", "edge-a", false, time.Minute, wantStart, wantStart.Add(time.Minute)},
		{"an hour", "edge-a.1", true, time.Hour, time.Unix(at.Unix()-at.Unix()%3600, 0), time.Unix(at.Unix()-at.Unix()%3600+3600, 0)},
	} {
		k := e.keys.Key("core", "aligned-"+tc.name)
		g, err := e.store.Take(ctx, k, at, limiter.TakeArgs{Window: tc.window, Limit: 10, Need: 1, Want: 1, Producer: "edge-a",
			Holder: tc.holder, Fresh: tc.fresh, Align: true})
		require.NoError(t, err, tc.name)
		require.True(t, g.Opened, tc.name)
		require.Equal(t, tc.start, g.Start, tc.name)
		require.Equal(t, tc.resetT, g.ResetAt, tc.name)
		// The next period opens the next window, aligned.
		g, err = e.store.Take(ctx, k, tc.resetT.Add(100*time.Millisecond), limiter.TakeArgs{Window: tc.window, Limit: 10, Need: 1,
			Want: 1, Producer: "edge-a", Holder: tc.holder, Align: true})
		require.NoError(t, err, tc.name)
		require.True(t, g.Opened, tc.name)
		require.Equal(t, tc.resetT, g.Start, tc.name)
		require.Equal(t, tc.resetT.Add(tc.window), g.ResetAt, tc.name)
	}
}

// A holder's next reservation in its own compact window, live, is
// lua/own.lua: five arguments, a GET and a SET, one effect replicated.
// Whatever else the window has become by then (another holder's
// reservation expanded it, it ended, it is gone, the node lost its
// scripts), own.lua writes nothing and take.lua decides, as it would have
// alone; and a grant says whether the window is still the holder's own.
func TestOwnWindowTakesTheShortWay(t *testing.T) {
	e := newEnv(t, redisstore.Options{EpochCheck: time.Minute})
	ctx := context.Background()
	rdb := e.primary.Client()
	require.NoError(t, e.store.LoadScripts(ctx, 0)) // as an edge does before it is ready
	take := func(k limiter.Key, holder string, now time.Time, limit, want int64, own bool) limiter.Grant {
		t.Helper()
		producer, _, _ := strings.Cut(holder, ".")
		g, err := e.store.Take(ctx, k, now, limiter.TakeArgs{Window: minute, Limit: limit, Need: 1, Want: want,
			Producer: producer, Holder: holder, Own: own})
		require.NoError(t, err)
		return g
	}
	short := func() (uint64, uint64) { return e.store.ShortTakes() }

	k := e.keys.Key("core", "own")
	g := take(k, "edge-a.1", t0, 10, 2, false)
	require.True(t, g.Opened)
	require.True(t, g.Own, "a window the holder opened compact is its own")

	// Its own window: own.lua alone.
	e.replica.WaitSynced(e.primary)
	require.NoError(t, rdb.ConfigResetStat(ctx).Err())
	require.NoError(t, e.replica.Client().ConfigResetStat(ctx).Err())
	g = take(k, "edge-a.1", t0, 10, 3, true)
	require.Equal(t, limiter.Grant{Granted: 3, Live: true, Used: 5, ResetAt: g.Start.Add(minute), Start: t0.Truncate(time.Second),
		Mine: 5, Frozen: -1, Own: true}, g)
	made, handed := short()
	require.EqualValues(t, 1, made)
	require.Zero(t, handed)
	e.replica.WaitSynced(e.primary)
	p, r := commandCalls(t, rdb), commandCalls(t, e.replica.Client())
	for _, c := range []string{"evalsha", "get", "set"} {
		require.EqualValues(t, 1, p[c], "primary ran %s: %v", c, p)
	}
	require.EqualValues(t, 1, r["set"], "replica: %v", r)
	for _, c := range []string{"hmget", "hset", "hget", "exists", "pexpireat", "pttl", "del", "multi"} {
		require.Zero(t, p[c], "primary ran %s: %v", c, p)
		require.Zero(t, r[c], "replica ran %s: %v", c, r)
	}
	require.Equal(t, fmt.Sprintf("5:%d:60:edge-a.1", g.ResetAt.Unix()), rdb.Get(ctx, k.String()).Val())
	ttl := rdb.PExpireTime(ctx, k.String()).Val()
	require.Equal(t, g.ResetAt.Add(60*time.Second).UnixMilli(), ttl.Milliseconds(), "the expiry kept")

	// Up to the limit, and then nothing: still its own window.
	g = take(k, "edge-a.1", t0, 10, 9, true)
	require.EqualValues(t, 5, g.Granted)
	require.EqualValues(t, 10, g.Used)
	g = take(k, "edge-a.1", t0, 10, 1, true)
	require.Zero(t, g.Granted)
	require.True(t, g.Own)
	made, _ = short()
	require.EqualValues(t, 3, made)

	// Another holder's window: handed on, and take.lua expands it.
	k2 := e.keys.Key("core", "shared")
	take(k2, "edge-a.1", t0, 10, 2, false)
	g = take(k2, "edge-b.1", t0, 10, 3, true)
	require.EqualValues(t, 3, g.Granted)
	require.EqualValues(t, 5, g.Used)
	require.False(t, g.Own)
	_, handed = short()
	require.EqualValues(t, 1, handed)
	require.Equal(t, "hash", rdb.Type(ctx, k2.String()).Val())
	// A holder's name is compared whole, never as a pattern: "edge-a.1",
	// read as a Lua pattern, would match "edga.1".
	k3 := e.keys.Key("core", "pattern")
	take(k3, "edga.1", t0, 10, 2, false)
	_, handed0 := short()
	g = take(k3, "edge-a.1", t0, 10, 1, true)
	require.False(t, g.Own)
	require.EqualValues(t, 3, g.Used)
	require.EqualValues(t, 1, g.Mine, "edga.1's units stay edga.1's")
	_, handed = short()
	require.Equal(t, handed0+1, handed)
	// A full window, its first holder's: handed on; the hash counts both.
	g = take(k2, "edge-a.1", t0, 10, 1, true)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 6, g.Used)
	require.EqualValues(t, 3, g.Mine)
	require.False(t, g.Own)
	_, handed = short()
	require.EqualValues(t, 3, handed)

	// A window that ended: handed on; take.lua opens the next, compact.
	later := t0.Add(2 * minute)
	g = take(k, "edge-a.1", later, 10, 4, true)
	require.True(t, g.Opened)
	require.EqualValues(t, 4, g.Used)
	require.True(t, g.Own)
	// A key that is gone: handed on; take.lua opens a window.
	require.NoError(t, rdb.Del(ctx, k.String()).Err())
	g = take(k, "edge-a.1", later, 10, 2, true)
	require.True(t, g.Opened)
	require.EqualValues(t, 2, g.Used)
	_, handed = short()
	require.EqualValues(t, 5, handed)

	// A node that lost its scripts: take.lua decides, and own.lua is
	// loaded again for the next take.
	require.NoError(t, rdb.ScriptFlush(ctx).Err())
	g = take(k, "edge-a.1", later, 10, 1, true)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 3, g.Used)
	made0, _ := short()
	g = take(k, "edge-a.1", later, 10, 1, true)
	require.EqualValues(t, 4, g.Used)
	made, _ = short()
	require.Equal(t, made0+1, made, "own.lua again after the reload")

	// Many at once, in pipelines: each window's count is every grant.
	const keys = 32
	ks := make([]limiter.Key, keys)
	for i := range ks {
		ks[i] = e.keys.Key("core", fmt.Sprint("many-", i))
		take(ks[i], "edge-a.1", t0, 100, 1, false)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4*keys)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = e.store.Take(ctx, ks[i%keys], t0, limiter.TakeArgs{Window: minute, Limit: 100, Need: 2, Want: 2,
				Producer: "edge-a", Holder: "edge-a.1", Own: true})
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	for _, k := range ks {
		g := take(k, "edge-a.1", t0, 100, 1, true)
		require.EqualValues(t, 10, g.Used, "1 + 4 × 2 + 1")
		require.EqualValues(t, 10, g.Mine)
	}
}
