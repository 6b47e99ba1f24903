package redisstore_test

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// bucketPolicy is a token bucket of burst units, refilled rate every
// second.
func bucketPolicy(burst, rate int64) limiter.Policy {
	return limiter.Policy{Name: "bucket"}.Bucket(burst, rate, time.Second)
}

// bucketTake reserves in p's period at at (the caller's clock) on the
// env's primary.
func (e *env) bucketTake(t *testing.T, p limiter.Policy, k limiter.Key, at time.Time, producer string, need, want int64) limiter.Grant {
	t.Helper()
	a := slideArgs(p, at, producer, need, want)
	a.Rate, a.Every = p.Rate, p.Every
	g, err := e.store.Take(context.Background(), k, at, a)
	require.NoError(t, err)
	return g
}

// A bucket grants at most what it holds: its burst at first, then what
// refills at its rate once the units reserved are no longer held (the
// period after theirs has ended), never what another edge holds. Every
// grant from t0 on fits the burst plus the rate times the time since.
func TestTokenBucketTakes(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(10, 2)
	k := e.keys.Key("bucket", "alice")
	sec := func(i float64) time.Time { return t0.Add(time.Duration(i * float64(time.Second))) }

	var granted int64
	take := func(at time.Time, producer string, need, want int64) limiter.Grant {
		g := e.bucketTake(t, p, k, at, producer, need, want)
		granted += g.Granted
		if bound := float64(p.Limit) + float64(p.Rate)*at.Sub(t0).Seconds(); float64(granted) > bound {
			t.Fatalf("%d granted by %v: more than %.1f", granted, at.Sub(t0), bound)
		}
		return g
	}
	g := take(sec(0), "edge-a", 1, 10)
	require.EqualValues(t, 10, g.Granted, "a new bucket is full")
	require.EqualValues(t, 10, g.Used)
	require.Equal(t, p.WindowAt(sec(0)).ResetAt, g.ResetAt, "credit lives as long as its period")
	require.Zero(t, take(sec(0), "edge-b", 1, 1).Granted, "the burst is reserved")
	g = take(sec(1), "edge-b", 1, 1)
	require.Zero(t, g.Granted, "the first period's units are held through the period after it")
	require.EqualValues(t, 10, g.Used)
	require.Zero(t, take(sec(2), "edge-b", 1, 1).Granted, "0.6 units refilled since the hold ended: not one")
	g = take(sec(2.2), "edge-b", 1, 10)
	require.EqualValues(t, 1, g.Granted, "1 unit refilled")
	require.EqualValues(t, 10, g.Used)
	// 9 spent at 2.2 s, the 1 just granted spent once its hold ends (4 s):
	// 7 at 4 s, 6.4 at 4.3 s, so 3 whole units are there.
	g = take(sec(4), "edge-a", 1, 10)
	require.EqualValues(t, 3, g.Granted)

	// A read (need 0) counts what is spent and held, and writes nothing.
	r := e.bucketTake(t, p, k, sec(4), "reader", 0, 0)
	require.True(t, r.Live)
	require.EqualValues(t, 10, r.Used)

	// The bucket's record lasts until what it counts has refilled.
	c := e.primary.Client()
	ttl, err := c.PTTL(context.Background(), k.BucketKey()).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 3*time.Second)
	require.Less(t, ttl, 3*time.Second+4*time.Second+slideGrace)
}

// Units an edge gives back while they are held (a release, as the edge
// sends when its period ends) are the bucket's again at once; given back
// after the hold ended, they are late: spent for good, and refilled at
// the rate.
func TestTokenBucketReleases(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(10, 1)
	k := e.keys.Key("bucket", "bob")
	sec := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	reset := func(i int) time.Time { return p.WindowAt(sec(i)).ResetAt }
	ev := func(seq uint64, i int, units int64) limiter.Event {
		return limiter.Event{Producer: "edge-a", Seq: seq, Kind: limiter.Release, Key: k, ResetAt: reset(i), Start: sec(i),
			Window: p.Window, Units: units, Slices: p.Slices}
	}

	require.EqualValues(t, 10, e.bucketTake(t, p, k, sec(0), "edge-a", 10, 10).Granted)
	e.clock.Set(sec(1))
	res := e.apply(t, ev(1, 0, 6))
	require.Equal(t, limiter.Applied, res[0].Outcome)
	require.EqualValues(t, 6, e.bucketTake(t, p, k, sec(1), "edge-b", 1, 10).Granted, "the 6 given back")

	e.clock.Set(sec(3))
	res = e.apply(t, ev(2, 1, 1))
	require.Equal(t, limiter.Late, res[0].Outcome, "period 1's hold ended with period 2")
}

// An edge whose clock runs behind reserves in a period another edge has
// moved past: the bucket counts the periods before and after it alike.
func TestTokenBucketLaggingEdge(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(10, 1)
	k := e.keys.Key("bucket", "carol")
	sec := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }

	require.EqualValues(t, 4, e.bucketTake(t, p, k, sec(1), "edge-a", 4, 4).Granted)
	require.EqualValues(t, 6, e.bucketTake(t, p, k, sec(0), "edge-late", 1, 10).Granted, "4 held ahead of it")
	require.Zero(t, e.bucketTake(t, p, k, sec(1), "edge-a", 1, 1).Granted)
}

// A primary that began a reseed lost the buckets' records with its data: a
// bucket with no record is taken as emptied when the reseed began, and
// refills from then at its rate (undershoot, once; never a burst more).
func TestTokenBucketAfterReseed(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(10, 2)
	k := e.keys.Key("bucket", "dave")
	require.NoError(t, e.primary.Client().Set(context.Background(), e.keys.RefillKey(), strconv.FormatInt(t0.UnixMilli(), 10), 0).Err())

	require.Zero(t, e.bucketTake(t, p, k, t0, "edge-a", 1, 10).Granted, "emptied at the reseed")
	g := e.bucketTake(t, p, k, t0.Add(1500*time.Millisecond), "edge-a", 1, 10)
	require.EqualValues(t, 3, g.Granted, "3 refilled at 2 a second")

	// A bucket of a fast rate that nothing is there of, reserved as an
	// edge reserves a key it never did (bucket.lua first): emptied at the
	// reseed too, never its burst at once.
	require.NoError(t, e.store.LoadScripts(context.Background(), 0))
	q := bucketPolicy(10, 10)
	fresh := func(name string, at time.Time) limiter.Grant {
		t.Helper()
		a := slideArgs(q, at, "edge-a", 1, 10)
		a.Rate, a.Every, a.Fresh = q.Rate, q.Every, true
		g, err := e.store.Take(context.Background(), e.keys.Key("bucket", name), at, a)
		require.NoError(t, err)
		return g
	}
	made, handedOn := e.store.ShortTakes()
	require.Zero(t, fresh("erin", t0).Granted, "emptied at the reseed")
	require.EqualValues(t, 5, fresh("frank", t0.Add(500*time.Millisecond)).Granted, "5 refilled at 10 a second")
	m, h := e.store.ShortTakes()
	require.Equal(t, [2]uint64{1, 1}, [2]uint64{m - made, h - handedOn}, "bucket.lua: one handed on (no room), one made")
}

// A caller that spends what it is granted at once (mode exact) holds
// nothing: a bucket of one unit refilled ten a second grants one every
// tenth of a second, a GCRA's exact bound; a refund of such a unit gives it
// back.
func TestTokenBucketSpentAtOnce(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(1, 10)
	p.Mode = limiter.ModeExact
	k := e.keys.Key("bucket", "erin")
	take := func(at time.Time) int64 {
		a := slideArgs(p, at, "edge-a", 1, 1)
		a.Rate, a.Every, a.Spent = p.Rate, p.Every, true
		g, err := e.store.Take(context.Background(), k, at, a)
		require.NoError(t, err)
		return g.Granted
	}
	var granted int64
	for i := range 25 { // 2.5 s in steps of 100 ms, across two period boundaries
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		granted += take(at)
		require.Zero(t, take(at.Add(50*time.Millisecond)), "half a unit refilled at %v", at.Sub(t0))
	}
	require.EqualValues(t, 25, granted, "one every tenth of a second")

	at := t0.Add(2500 * time.Millisecond)
	require.EqualValues(t, 1, take(at))
	e.clock.Set(at)
	res := e.apply(t, limiter.Event{Producer: "edge-a", Seq: 1, Kind: limiter.Refund, Key: k, ResetAt: p.WindowAt(at).ResetAt, Start: at,
		Window: p.Window, Units: 1, Slices: p.Slices})
	require.Equal(t, limiter.Applied, res[0].Outcome)
	require.EqualValues(t, 1, take(at.Add(10*time.Millisecond)), "the refunded unit is the bucket's again")
}

// A primary that restarts empty loses the buckets' records: once the shard
// has reseeded, a bucket that was drained is taken as emptied when the
// reseed began, and refills from then — it never grants a burst more.
func TestTokenBucketPrimaryRestartedEmpty(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	p := bucketPolicy(10, 1)
	p.Every = time.Minute // one unit a minute: nothing refills during the test
	k := f.keys.Key("bucket", "frank")
	take := func() limiter.Grant {
		now := time.Now()
		a := slideArgs(p, now, "edge-a", 1, 10)
		a.Rate, a.Every = p.Rate, p.Every
		return eventually(t, func() (limiter.Grant, error) { return f.store.Take(context.Background(), k, now, a) })
	}
	require.EqualValues(t, 10, take().Granted, "the burst")
	f.primary.Restart()
	f.untilReseeded(t)
	require.Zero(t, take().Granted, "the bucket the primary lost is taken as emptied at the reseed")
	at, err := f.primary.Client().Get(context.Background(), f.keys.RefillKey()).Int64()
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), time.UnixMilli(at), 30*time.Second, "the reseed recorded when it began")
}

// A bucket's record that is not one (another program wrote the key) fails
// the reservation with the key named, and nothing is written, whether the
// take went the short way first (bucket.lua hands it on) or not; a reseed
// time in the future, or not a number, empties nothing.
func TestTokenBucketRecordOfAnotherProgram(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(10, 1)
	k := e.keys.Key("bucket", "mallory")
	c := e.primary.Client()
	ctx := context.Background()
	require.NoError(t, e.store.LoadScripts(ctx, 0))
	// Strings that are not a record (record.lua), and a hash.
	records := []string{"lots", "", "1:2", "1:2:3:4", "-1:2:3", "1.5:2:3", "1:2:3 4:5", "1:2:3 4:5:6 ", "1:2:3  4:5:6",
		"1:2:3 4:5:6x", "12345678901234567:2:3", "1:2:3 4:5:6 7:8:9" + strings.Repeat(" 1:1:1", 11000), "hash"}
	for i, v := range records {
		for _, fresh := range []bool{true, false} {
			require.NoError(t, c.Del(ctx, k.BucketKey()).Err())
			if v == "hash" {
				require.NoError(t, c.HSet(ctx, k.BucketKey(), "d", "1").Err())
			} else {
				require.NoError(t, c.Set(ctx, k.BucketKey(), v, 0).Err())
			}
			a := slideArgs(p, t0, "edge-a", 1, 1)
			a.Rate, a.Every, a.Fresh = p.Rate, p.Every, fresh
			_, err := e.store.Take(ctx, k, t0, a)
			require.ErrorContains(t, err, "unreadable bucket at "+k.BucketKey(), "record %d", i)
			n, err := c.Exists(ctx, k.SliceKey(p.WindowAt(t0).ResetAt)).Result()
			require.NoError(t, err)
			require.Zero(t, n, "nothing written")
		}
	}
	made, handedOn := e.store.ShortTakes()
	require.Equal(t, [2]uint64{0, uint64(len(records))}, [2]uint64{made, handedOn}, "bucket.lua handed the fresh takes on")

	// Periods near now that are no period: bucket.lua, asked first (fresh,
	// or as the holder of the last one), counts nothing of them and writes
	// nothing; take.lua refuses them.
	require.NoError(t, c.Del(ctx, k.BucketKey()).Err())
	reset := p.WindowAt(t0).ResetAt
	for i, at := range []time.Time{reset, reset.Add(-time.Second), reset.Add(-2 * time.Second), reset.Add(-3 * time.Second), reset.Add(time.Second)} {
		for _, v := range []string{"lots", "1:2:3", "1:x:1:edge-a.1", "12345678901:1:1:edge-a.1"} {
			for _, own := range []bool{false, true} {
				require.NoError(t, c.Set(ctx, k.SliceKey(at), v, time.Minute).Err())
				a := slideArgs(p, t0, "edge-a", 1, 1)
				a.Rate, a.Every, a.Fresh, a.Own = p.Rate, p.Every, !own, own
				_, err := e.store.Take(ctx, k, t0, a)
				require.ErrorContains(t, err, "unreadable window at "+k.SliceKey(at), "period %d holding %q", i, v)
				if at != reset {
					n, err := c.Exists(ctx, k.SliceKey(reset)).Result()
					require.NoError(t, err)
					require.Zero(t, n, "nothing written")
				}
				require.Equal(t, v, c.Get(ctx, k.SliceKey(at)).Val(), "left as it was")
			}
		}
		require.NoError(t, c.Del(ctx, k.SliceKey(at)).Err())
	}
	made, handedOn = e.store.ShortTakes()
	require.Equal(t, [2]uint64{0, uint64(len(records) + 5*4*2)}, [2]uint64{made, handedOn}, "bucket.lua handed them on")

	for _, v := range []string{strconv.FormatInt(t0.Add(time.Hour).UnixMilli(), 10), "soon"} {
		other := e.keys.Key("bucket", "trent-"+v)
		require.NoError(t, c.Set(ctx, e.keys.RefillKey(), v, 0).Err())
		require.EqualValues(t, 10, e.bucketTake(t, p, other, t0, "edge-a", 1, 10).Granted, "refill time %q", v)
	}

	// The edge of the trust boundary: a well-formed record is believed.
	// A bucket emptied, its record then rewritten to say nothing was
	// spent, grants its burst again — what deleting the record would do.
	// Times from now: the periods' keys expire by Redis's clock.
	now := time.Now().Truncate(time.Second).Add(300 * time.Millisecond)
	forged := e.keys.Key("bucket", "forged")
	require.NoError(t, c.Del(ctx, e.keys.RefillKey()).Err())
	require.EqualValues(t, 10, e.bucketTake(t, p, forged, now, "edge-a", 1, 10).Granted)
	require.Zero(t, e.bucketTake(t, p, forged, now.Add(time.Second), "edge-a", 1, 10).Granted, "emptied")
	later := now.Add(5 * time.Second) // the periods near now: none of those reserved in
	require.NoError(t, c.Set(ctx, forged.BucketKey(), fmt.Sprintf("0:%d:%d", later.UnixMilli(), later.Truncate(time.Second).UnixMilli()),
		time.Minute).Err())
	require.EqualValues(t, 10, e.bucketTake(t, p, forged, later, "edge-a", 1, 10).Granted, "the forged record believed")

	// So is a well-formed compact period, which bucket.lua reads as
	// take.lua does: a period emptied by its holder, rewritten to count
	// nothing, grants the burst again to the holder's next take in it.
	period := e.keys.Key("bucket", "forged period")
	g, err := e.store.Take(ctx, period, later, func() limiter.TakeArgs {
		a := slideArgs(p, later, "edge-a", 1, 10)
		a.Rate, a.Every, a.Fresh = p.Rate, p.Every, true
		return a
	}())
	require.NoError(t, err)
	require.EqualValues(t, 10, g.Granted)
	require.True(t, g.Own)
	r := p.WindowAt(later).ResetAt
	require.NoError(t, c.SetArgs(ctx, period.SliceKey(r), fmt.Sprintf("0:%d:1:edge-a.1", r.Unix()), redis.SetArgs{KeepTTL: true}).Err())
	require.NoError(t, c.Del(ctx, period.BucketKey()).Err())
	a := slideArgs(p, later.Add(100*time.Millisecond), "edge-a", 1, 10)
	a.Rate, a.Every, a.Own = p.Rate, p.Every, true
	before, _ := e.store.ShortTakes()
	g, err = e.store.Take(ctx, period, later.Add(100*time.Millisecond), a)
	require.NoError(t, err)
	require.EqualValues(t, 10, g.Granted, "the forged period believed")
	after, _ := e.store.ShortTakes()
	require.Equal(t, before+1, after, "by bucket.lua")
}

// fullEnv is an env whose shard's windows are never compact, as a
// deployment upgraded from 0.1.0 before its operator lets them be: every
// reservation is take.lua's.
func fullEnv(t *testing.T, opts redisstore.Options) *env {
	t.Helper()
	e := newEnv(t, opts)
	ctx := context.Background()
	pc := e.primary.Client()
	require.NoError(t, pc.Del(ctx, e.keys.FormatKey(), e.keys.EpochKey()).Err())
	run := regexpRunID(t, pc.Info(ctx, "server").Val())
	require.NoError(t, pc.Set(ctx, e.keys.EpochKey(), run+":00000000000000aa:a", 0).Err())
	opts.Clock = e.clock
	e.store = newStore(t, e.config(), e.keys, opts)
	return e
}

// A token bucket Redis holds nothing of opens the short way (bucket.lua):
// one EXISTS, one GET, the period compact in one SET and the record in one
// HSET. It decides as take.lua does: beside a shard whose windows are not
// compact (take.lua alone), every take — fresh, after a reseed, spent at
// once, short of room, on a record that is there — grants the same, writes
// the same record, and leaves a period that take.lua and apply.lua read to
// the same grants after it.
func TestTokenBucketOpensTheShortWay(t *testing.T) {
	ctx := context.Background()
	// Times from now, not from the package's start: the periods' keys
	// expire by Redis's clock, a few seconds after their reset.
	t0 := time.Now().Truncate(time.Second).Add(300 * time.Millisecond)
	// No epoch check between the counts of commands below.
	short, long := newEnv(t, redisstore.Options{Grace: slideGrace, EpochCheck: time.Minute}), fullEnv(t, redisstore.Options{Grace: slideGrace})
	require.NoError(t, short.store.LoadScripts(ctx, 0))
	require.True(t, short.store.Compact(0), "a new deployment's windows are compact")
	require.False(t, long.store.Compact(0))
	takes := func(made, handedOn uint64) {
		t.Helper()
		m, h := short.store.ShortTakes()
		require.Equal(t, [2]uint64{made, handedOn}, [2]uint64{m, h}, "short takes made, handed on")
	}
	// counted, when set, runs after the next take on the short shard,
	// before anything else reads it.
	var counted func()
	// own, when set, is the next take's TakeArgs.Own; producer, when set,
	// its producer (else edge-a).
	var own bool
	var producer string
	// both takes on both shards and requires the same grant and record;
	// the grant's Own is the short shard's (take.lua says false).
	both := func(p limiter.Policy, k limiter.Key, at time.Time, fresh, spent bool, need, want int64) limiter.Grant {
		t.Helper()
		a := slideArgs(p, at, cmp.Or(producer, "edge-a"), need, want)
		a.Rate, a.Every, a.Spent, a.Fresh, a.Own = p.Rate, p.Every, spent, fresh, own
		own, producer = false, ""
		gs, err := short.store.Take(ctx, k, at, a)
		require.NoError(t, err)
		if counted != nil {
			counted()
			counted = nil
		}
		gl, err := long.store.Take(ctx, k, at, a)
		require.NoError(t, err)
		require.False(t, gl.Own, "take.lua's bucket")
		gl.Own = gs.Own
		require.Equal(t, gl, gs, "the short way's grant at %v", at.Sub(t0))
		rs, rl := short.primary.Client().Get(ctx, k.BucketKey()).Val(), long.primary.Client().Get(ctx, k.BucketKey()).Val()
		require.Equal(t, rl, rs, "the short way's record at %v", at.Sub(t0))
		ts, tl := short.primary.Client().PTTL(ctx, k.BucketKey()).Val(), long.primary.Client().PTTL(ctx, k.BucketKey()).Val()
		require.InDelta(t, tl.Milliseconds(), ts.Milliseconds(), 1000, "the record's expiry")
		return gs
	}
	ms := func(d int) time.Time { return t0.Add(time.Duration(d) * time.Millisecond) }

	// A new bucket: the burst, one script call, four commands and two
	// writes, each one effect to replicate.
	p := bucketPolicy(10, 2)
	k := short.keys.Key("bucket", "new")
	short.replica.WaitSynced(short.primary)
	require.NoError(t, short.primary.Client().ConfigResetStat(ctx).Err())
	require.NoError(t, short.replica.Client().ConfigResetStat(ctx).Err())
	counted = func() {
		short.replica.WaitSynced(short.primary)
		pc, rc := commandCalls(t, short.primary.Client()), commandCalls(t, short.replica.Client())
		for _, c := range []string{"evalsha", "exists"} {
			require.EqualValues(t, 1, pc[c], "primary ran %s: %v", c, pc)
		}
		// The time of the last reseed (none) read, and not the record:
		// EXISTS counted none; the period and the record written.
		require.EqualValues(t, 1, pc["get"], "primary ran get: %v", pc)
		require.EqualValues(t, 2, pc["set"], "primary ran set: %v", pc)
		require.EqualValues(t, 2, rc["set"], "replica ran set: %v", rc)
		for _, c := range []string{"hgetall", "hmget", "hset", "hdel", "pexpire", "pexpireat"} {
			require.Zero(t, pc[c], "primary ran %s: %v", c, pc)
			require.Zero(t, rc[c], "replica ran %s: %v", c, rc)
		}
	}
	g := both(p, k, ms(0), true, false, 1, 6)
	require.EqualValues(t, 6, g.Granted)
	takes(1, 0)
	reset := p.WindowAt(ms(0)).ResetAt
	require.Equal(t, fmt.Sprintf("6:%d:1:edge-a.1", reset.Unix()), short.primary.Client().Get(ctx, k.SliceKey(reset)).Val())
	require.Equal(t, reset.Add(slideGrace+time.Second).UnixMilli(), short.primary.Client().PExpireTime(ctx, k.SliceKey(reset)).Val().Milliseconds(),
		"a period lives while the period after it holds it")
	// The bucket goes on through take.lua, which reads the compact period,
	// and through a release that apply.lua gives back to it.
	require.EqualValues(t, 4, both(p, k, ms(100), false, false, 1, 10).Granted)
	require.Zero(t, both(p, k, ms(1100), false, false, 1, 1).Granted, "held through the period after it")
	for _, e := range []*env{short, long} {
		e.clock.Set(ms(1200))
		res := e.apply(t, limiter.Event{Producer: "edge-a", Seq: 1, Kind: limiter.Release, Key: k, ResetAt: reset, Start: ms(0),
			Window: p.Window, Units: 3, Slices: p.Slices})
		require.Equal(t, limiter.Applied, res[0].Outcome)
	}
	require.EqualValues(t, 3, both(p, k, ms(1300), false, false, 1, 10).Granted, "the 3 given back")
	// 7 spent when period 0's hold ended (1.7 s after t0), 3 at 2.7 s; 4
	// refilled at 2 a second by 3.7 s.
	require.EqualValues(t, 4, both(p, k, ms(3700), false, false, 1, 10).Granted)
	// A take that says fresh where a period near now is: handed on.
	require.Zero(t, both(p, k, ms(3800), true, false, 1, 1).Granted)
	takes(1, 1)
	// Five quiet seconds on, the short way reads the record: what it
	// counts has refilled, and the burst is there.
	g = both(p, k, ms(8800), true, false, 1, 10)
	require.EqualValues(t, 10, g.Granted)
	takes(2, 1)

	// Spent at once: counted in the record, and refilled from there.
	q := bucketPolicy(2, 10)
	k = short.keys.Key("bucket", "spent")
	require.EqualValues(t, 2, both(q, k, ms(0), true, true, 1, 2).Granted)
	require.Zero(t, both(q, k, ms(50), false, true, 1, 1).Granted)
	require.EqualValues(t, 1, both(q, k, ms(150), false, true, 1, 1).Granted)
	takes(3, 1)

	// After a reseed began 400 ms ago: emptied then, 0.8 refilled since —
	// short of room, handed on, and take.lua opens the period empty; 1.2
	// refilled 200 ms later, 1 granted the short way.
	for _, e := range []*env{short, long} {
		require.NoError(t, e.primary.Client().Set(ctx, e.keys.RefillKey(), strconv.FormatInt(ms(-400).UnixMilli(), 10), 0).Err())
	}
	require.Zero(t, both(p, short.keys.Key("bucket", "reseeded"), ms(0), true, false, 1, 10).Granted)
	takes(3, 2)
	g = both(p, short.keys.Key("bucket", "refilled"), ms(200), true, false, 1, 10)
	require.EqualValues(t, 1, g.Granted)
	require.EqualValues(t, 10, g.Used, "8.8 spent and 1 held, rounded up")
	takes(4, 2)

	// A record with a period whose key is gone, its hold long ended: both
	// count it and write the record back alike.
	k = short.keys.Key("bucket", "old period")
	for _, e := range []*env{short, long} {
		require.NoError(t, e.primary.Client().Set(ctx, k.BucketKey(), fmt.Sprintf("1500:%d:0 %d:2:0", ms(-100).UnixMilli(),
			ms(-5000).Truncate(time.Second).UnixMilli()), time.Minute).Err())
	}
	g = both(p, k, ms(300), true, false, 1, 10)
	require.EqualValues(t, 7, g.Granted, "1.5 and the period's 2 counted, less 0.8 refilled: 2.7 spent")
	takes(5, 2)

	// While a reseed lasts, bucket.lua reserves nothing: take.lua refuses.
	require.NoError(t, short.primary.Client().Set(ctx, short.keys.ReseedKey(), "epoch", time.Minute).Err())
	a := slideArgs(p, ms(0), "edge-a", 1, 1)
	a.Rate, a.Every, a.Fresh = p.Rate, p.Every, true
	k = short.keys.Key("bucket", "during a reseed")
	_, err := short.store.Take(ctx, k, ms(0), a)
	require.ErrorIs(t, err, redisstore.ErrReseeding)
	require.Zero(t, short.primary.Client().Exists(ctx, k.BucketKey(), k.SliceKey(p.WindowAt(ms(0)).ResetAt)).Val(), "nothing written")
	takes(5, 3)
	require.NoError(t, short.primary.Client().Del(ctx, short.keys.ReseedKey()).Err())
	for _, e := range []*env{short, long} {
		require.NoError(t, e.primary.Client().Del(ctx, e.keys.RefillKey()).Err())
	}

	// One edge reserving in a bucket every few hundred milliseconds, as
	// its entry asks (Own after bucket.lua's take): bucket.lua makes every
	// take, reading the periods before, counting those whose hold ended,
	// and growing its own; every period stays compact, nothing is a hash.
	k = short.keys.Key("bucket", "warm")
	short.replica.WaitSynced(short.primary)
	require.NoError(t, short.primary.Client().ConfigResetStat(ctx).Err())
	require.NoError(t, short.replica.Client().ConfigResetStat(ctx).Err())
	g = both(p, k, ms(0), true, false, 1, 3)
	require.True(t, g.Own, "bucket.lua's take: the period is the holder's own")
	for i, at := range []int{300, 700, 1100, 1400, 2200, 2600, 3100, 3900, 4500} {
		own = g.Own
		g = both(p, k, ms(at), false, false, 1, 1)
		require.True(t, g.Own, "take %d at %d ms: bucket.lua's", i, at)
		require.EqualValues(t, 1, g.Granted, "take %d at %d ms", i, at)
	}
	// Take.lua's count (both shards' grants are the same). Periods turn at
	// 700, 1700, 2700, 3700 and 4700 ms, holding 4, 3, 2, 1 and 2 units;
	// each is counted in d when the period after it ends, d refilling at 2
	// a second: 4 at 1.7 s, 2 + 3 at 2.7 s, 3 + 2 at 3.7 s, 3.4 at 4.5 s.
	require.EqualValues(t, 2+1+4, g.Used, "this period's 2, the 1 before it, and 3.4 spent and not refilled, rounded up")
	takes(15, 3)
	short.replica.WaitSynced(short.primary)
	pc, rc := commandCalls(t, short.primary.Client()), commandCalls(t, short.replica.Client())
	// (The record is written with each: this bucket refills slower than
	// its periods hold.)
	for _, c := range []string{"hgetall", "hmget", "hset", "hdel", "pexpire", "pexpireat"} {
		require.Zero(t, pc[c], "primary ran %s: %v", c, pc)
		require.Zero(t, rc[c], "replica ran %s: %v", c, rc)
	}
	require.EqualValues(t, 10, pc["evalsha"], "one script call a take: %v", pc)
	for _, at := range []int{0, 1100, 2200, 3100, 4500} {
		r := p.WindowAt(ms(at)).ResetAt
		v := short.primary.Client().Get(ctx, k.SliceKey(r)).Val()
		require.Regexp(t, fmt.Sprintf(`^\d+:%d:1:edge-a\.1$`, r.Unix()), v, "the period at %d ms, compact", at)
	}
	// Another edge's take in the same period: its period is not edge-b's,
	// so take.lua makes it (and holds both edges' shares in a hash); then
	// edge-a's next take in that period is handed on, and so is one in the
	// next period (a hash before it).
	producer = "edge-b"
	g = both(p, k, ms(4600), true, false, 1, 1)
	require.False(t, g.Own)
	takes(15, 4)
	own = true
	both(p, k, ms(4700), false, false, 1, 1)
	takes(15, 5)
	own = true
	both(p, k, ms(5200), false, false, 1, 1)
	takes(15, 6)

	require.False(t, long.store.Compact(0), "take.lua alone all along")
	_, handedOn := long.store.ShortTakes()
	require.Zero(t, handedOn)
}

// A bucket whose units refill within a second of their hold's end writes
// no record while it would count nothing else: a new bucket's reservation
// is then one write, its period, replicated as one SET; spent at once, or
// slower, it writes its record. However takes come (three edges, the short
// way and take.lua, at random steps of time, a few units or the burst), no
// stretch of time between two takes is granted more than the burst and the
// rate over it, and once it has had time to refill the whole burst is
// there.
func TestTokenBucketOfAFastRateWritesNoRecord(t *testing.T) {
	ctx := context.Background()
	// Times from now: the periods' keys expire by Redis's clock.
	t0 := time.Now().Truncate(time.Second).Add(300 * time.Millisecond)
	e := newEnv(t, redisstore.Options{Grace: slideGrace, EpochCheck: time.Minute}) // no epoch check between the counts
	require.NoError(t, e.store.LoadScripts(ctx, 0))
	c := e.primary.Client()
	p := bucketPolicy(10, 10)
	fresh := func(k limiter.Key, at time.Time, spent bool, want int64) limiter.Grant {
		t.Helper()
		a := slideArgs(p, at, "edge-a", 1, want)
		a.Rate, a.Every, a.Fresh, a.Spent = p.Rate, p.Every, true, spent
		g, err := e.store.Take(ctx, k, at, a)
		require.NoError(t, err)
		return g
	}
	k := e.keys.Key("bucket", "fast")
	e.replica.WaitSynced(e.primary)
	require.NoError(t, e.replica.Client().ConfigResetStat(ctx).Err())
	require.NoError(t, c.ConfigResetStat(ctx).Err())
	g := fresh(k, t0, false, 10)
	require.EqualValues(t, 10, g.Granted)
	require.EqualValues(t, 10, g.Used)
	require.True(t, g.Own, "the period is the holder's own: its next take may go the short way")
	// Nothing near now, no reseed: one EXISTS, the reseed time read, the
	// period written, and nothing else.
	pc := commandCalls(t, c)
	delete(pc, "config|resetstat")
	require.Equal(t, map[string]int64{"evalsha": 1, "exists": 1, "get": 1, "set": 1}, pc, "the primary's commands")
	reset := p.WindowAt(t0).ResetAt
	require.Equal(t, fmt.Sprintf("10:%d:1:edge-a.1", reset.Unix()), c.Get(ctx, k.SliceKey(reset)).Val())
	require.Equal(t, reset.Add(slideGrace+time.Second).UnixMilli(), c.PExpireTime(ctx, k.SliceKey(reset)).Val().Milliseconds())
	require.Zero(t, c.Exists(ctx, k.BucketKey()).Val(), "no record")
	e.replica.WaitSynced(e.primary)
	rc := commandCalls(t, e.replica.Client())
	require.EqualValues(t, 1, rc["set"], "the replica's writes: %v", rc)
	require.Zero(t, rc["multi"], "the replica's writes: %v", rc)
	require.EqualValues(t, 1, rc["set"]+rc["multi"]+rc["exec"]+rc["hset"]+rc["del"]+rc["pexpireat"], "the replica's writes: %v", rc)
	// Spent at once, the units are counted in a record.
	spent := e.keys.Key("bucket", "fast spent")
	require.EqualValues(t, 1, fresh(spent, t0, true, 1).Granted)
	require.NotEmpty(t, c.Get(ctx, spent.BucketKey()).Val())
	// Slower: 10 units take five seconds to refill.
	slow := e.keys.Key("bucket", "slow")
	q := bucketPolicy(10, 2)
	a := slideArgs(q, t0, "edge-a", 1, 10)
	a.Rate, a.Every, a.Fresh = q.Rate, q.Every, true
	_, err := e.store.Take(ctx, slow, t0, a)
	require.NoError(t, err)
	require.NotEmpty(t, c.Get(ctx, slow.BucketKey()).Val())

	rnd := rand.New(rand.NewPCG(7, 11))
	type grant struct {
		at time.Time
		n  int64
	}
	steps := []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, 1200 * time.Millisecond,
		2500 * time.Millisecond, 3100 * time.Millisecond, 4500 * time.Millisecond}
	for run := range 12 {
		// Fast, as fast as the rule allows for the burst, and slower.
		p := []limiter.Policy{bucketPolicy(10, 10), bucketPolicy(10, 4), bucketPolicy(10, 2), bucketPolicy(30, 20)}[run%4]
		k := e.keys.Key("bucket", fmt.Sprintf("fast-%d", run))
		at := t0.Add(time.Duration(run) * time.Hour)
		var grants []grant
		last := map[string]time.Time{}
		for op := range 120 {
			at = at.Add(steps[rnd.IntN(len(steps))] + time.Duration(rnd.IntN(200))*time.Millisecond)
			edge := fmt.Sprintf("edge-%d", rnd.IntN(3))
			want := 1 + rnd.Int64N(3)
			if rnd.IntN(2) == 0 {
				want = p.Limit
			}
			if op < 2 {
				// The burst just before a period's reset, and again just
				// after the three seconds a period is read for.
				at = t0.Truncate(time.Second).Add(time.Duration(run)*time.Hour + time.Duration(op)*3100*time.Millisecond + 950*time.Millisecond)
				want = p.Limit
			}
			a := slideArgs(p, at, edge, 1, want)
			a.Rate, a.Every = p.Rate, p.Every
			a.Fresh = last[edge].IsZero() || at.Sub(last[edge]) >= 4*limiter.BucketPeriod
			g, err := e.store.Take(ctx, k, at, a)
			require.NoError(t, err)
			last[edge] = at
			grants = append(grants, grant{at, g.Granted})
			for i := range grants {
				var sum int64
				for _, h := range grants[i:] {
					sum += h.n
				}
				if bound := float64(p.Limit) + float64(p.Rate)*at.Sub(grants[i].at).Seconds(); float64(sum) > bound {
					t.Fatalf("run %d op %d: %d granted from %v to %v, more than %.1f", run, op, sum, grants[i].at.Sub(t0), at.Sub(t0), bound)
				}
			}
		}
		// Quiet long enough for the burst to refill after the last hold.
		at = at.Add(4*limiter.BucketPeriod + time.Duration(p.Limit)*time.Second/time.Duration(p.Rate))
		a := slideArgs(p, at, "edge-a", 1, p.Limit)
		a.Rate, a.Every, a.Fresh = p.Rate, p.Every, true
		g, err := e.store.Take(ctx, k, at, a)
		require.NoError(t, err)
		require.Equal(t, p.Limit, g.Granted, "run %d: the burst once refilled", run)
	}
}

// bucket.lua and take.lua decide alike over random runs: takes at random
// steps of time (within a period, across one, after quiet seconds), the
// short way asked as an edge asks it (none of its takes in four periods)
// and at random besides, and releases of what was granted, on a shard
// whose windows are compact and one of take.lua alone: the same grants,
// the same records, the same outcomes of every event.
func TestTokenBucketShortWayDecidesAsTakeLua(t *testing.T) {
	ctx := context.Background()
	opts := redisstore.Options{Grace: time.Minute} // nothing expires while the test runs
	short, long := newEnv(t, opts), fullEnv(t, opts)
	require.NoError(t, short.store.LoadScripts(ctx, 0))
	rnd := rand.New(rand.NewPCG(29, 3))
	steps := []time.Duration{50 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, 1200 * time.Millisecond,
		2500 * time.Millisecond, 4500 * time.Millisecond, 7 * time.Second}
	for i, c := range []struct {
		p             limiter.Policy
		spent, greedy bool // greedy: wants up to the burst, else a few units
	}{{bucketPolicy(10, 2), false, true}, {bucketPolicy(10, 2), true, true}, {bucketPolicy(4, 1), false, true},
		{bucketPolicy(3, 10), true, true}, {limiter.Policy{Name: "bucket"}.Bucket(20, 5, time.Minute), false, true},
		{limiter.Policy{Name: "bucket"}.Bucket(100, 30, time.Minute), false, false},
		{limiter.Policy{Name: "bucket"}.Bucket(100, 30, time.Minute), true, false},
		{bucketPolicy(10, 10), false, true}, {bucketPolicy(20, 40), false, false}} { // fast: records skipped
		k := short.keys.Key("bucket", fmt.Sprintf("random-%d", i))
		at, last, own := t0, time.Time{}, false
		granted := map[time.Time]int64{} // by period reset: granted and not given back
		var seq uint64
		for op := range 60 {
			at = at.Add(steps[rnd.IntN(len(steps))])
			reset := c.p.WindowAt(at).ResetAt
			if rnd.IntN(4) == 0 && len(granted) > 0 {
				// A release of part of what a period near now was granted.
				var r time.Time
				for p := range granted {
					if r.IsZero() || p.After(r) {
						r = p
					}
				}
				if granted[r] == 0 {
					continue
				}
				units := 1 + rnd.Int64N(granted[r])
				seq++
				ev := limiter.Event{Producer: "edge-a", Seq: seq, Kind: limiter.Release, Key: k, ResetAt: r,
					Start: r.Add(-c.p.Window), Window: c.p.Window, Units: units, Slices: c.p.Slices}
				var out [2]limiter.Outcome
				for j, e := range []*env{short, long} {
					e.clock.Set(at)
					out[j] = e.apply(t, ev)[0].Outcome
				}
				require.Equal(t, out[1], out[0], "case %d op %d: the release's outcome", i, op)
				if out[0] == limiter.Applied {
					granted[r] -= units
				}
				continue
			}
			need := 1 + rnd.Int64N(min(3, c.p.Limit))
			want := need + rnd.Int64N(min(c.p.Limit, 3)-need+1)
			if c.greedy {
				want = need + rnd.Int64N(c.p.Limit-need+1)
			}
			a := slideArgs(c.p, at, "edge-a", need, want)
			a.Rate, a.Every, a.Spent = c.p.Rate, c.p.Every, c.spent
			a.Fresh = last.IsZero() || at.Sub(last) >= 4*limiter.BucketPeriod || rnd.IntN(5) == 0
			a.Own = own || rnd.IntN(5) == 0 // as an edge asks, and at random besides
			gs, err := short.store.Take(ctx, k, at, a)
			require.NoError(t, err)
			gl, err := long.store.Take(ctx, k, at, a)
			require.NoError(t, err)
			require.False(t, gl.Own, "take.lua's bucket")
			own, gl.Own = gs.Own, gs.Own
			require.Equal(t, gl, gs, "case %d op %d at %v: the grant", i, op, at.Sub(t0))
			require.Equal(t, long.primary.Client().Get(ctx, k.BucketKey()).Val(), short.primary.Client().Get(ctx, k.BucketKey()).Val(),
				"case %d op %d: the record", i, op)
			last = at
			if !c.spent {
				granted[reset] += gs.Granted
			}
		}
	}
	require.False(t, long.store.Compact(0), "take.lua alone all along")
	if m, h := long.store.ShortTakes(); m+h != 0 {
		t.Fatalf("the shard of take.lua alone tried %d short takes", m+h)
	}
	made, handedOn := short.store.ShortTakes()
	t.Logf("bucket.lua made %d takes and handed %d on", made, handedOn)
	require.Positive(t, made, "takes the short way")
	require.Positive(t, handedOn, "takes handed on")
}
