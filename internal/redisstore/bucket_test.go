package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

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
// the reservation with the key named, and nothing is written; a reseed time
// in the future, or not a number, empties nothing.
func TestTokenBucketRecordOfAnotherProgram(t *testing.T) {
	e := newEnv(t, redisstore.Options{Grace: slideGrace})
	p := bucketPolicy(10, 1)
	k := e.keys.Key("bucket", "mallory")
	c := e.primary.Client()
	ctx := context.Background()
	require.NoError(t, c.HSet(ctx, k.BucketKey(), "d", "lots").Err())
	a := slideArgs(p, t0, "edge-a", 1, 1)
	a.Rate, a.Every = p.Rate, p.Every
	_, err := e.store.Take(ctx, k, t0, a)
	require.ErrorContains(t, err, "unreadable bucket at "+k.BucketKey())
	n, err := c.Exists(ctx, k.SliceKey(p.WindowAt(t0).ResetAt)).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing written")

	for _, v := range []string{strconv.FormatInt(t0.Add(time.Hour).UnixMilli(), 10), "soon"} {
		other := e.keys.Key("bucket", "trent-"+v)
		require.NoError(t, c.Set(ctx, e.keys.RefillKey(), v, 0).Err())
		require.EqualValues(t, 10, e.bucketTake(t, p, other, t0, "edge-a", 1, 10).Granted, "refill time %q", v)
	}
}
