package redisstore_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/lua"
)

// documentedACL is the Redis user docs/operations.md gives Tally.
const documentedACL = "on >tally-password ~tally:* resetchannels -@all +evalsha +eval +evalsha_ro +eval_ro +script|load " +
	"+info +ping +wait +hmget +hget +hset +hdel +hgetall +hexists +exists +del +get +mget +set +getbit +setbit +pexpire +pexpireat +pttl"

// The documented user may run exactly what Tally sends and its scripts run:
// every command a script calls (read from the scripts themselves) is in it,
// and every command in it is one a script calls or one the store sends
// itself. A script that gains a command fails this until the ACL has it; a
// command nothing uses any more fails it until the ACL drops it.
func TestDocumentedACLIsWhatTheScriptsRun(t *testing.T) {
	sent := map[string]bool{"evalsha": true, "eval": true, "evalsha_ro": true, "eval_ro": true, "script|load": true, "info": true,
		"ping": true, "wait": true, "get": true, "pttl": true} // by the store, besides the scripts
	acl := map[string]bool{}
	for _, f := range strings.Fields(documentedACL) {
		if c, ok := strings.CutPrefix(f, "+"); ok {
			acl[c] = true
		}
	}
	called := map[string]bool{}
	re := regexp.MustCompile(`redis\.p?call\("([A-Za-z_]+)"`)
	for _, src := range []string{lua.Check, lua.Take, lua.Own, lua.Slide, lua.Bucket, lua.Apply, lua.Lease, lua.Finish, lua.Hold, lua.Epoch,
		lua.Reseed} {
		require.NotRegexp(t, `redis\.p?call\([^"]`, src, "a command named by a variable cannot be checked here")
		for _, m := range re.FindAllStringSubmatch(src, -1) {
			called[strings.ToLower(m[1])] = true
		}
	}
	require.NotEmpty(t, called)
	for c := range called {
		require.True(t, acl[c], "a script calls %s: the documented ACL lacks +%s", c, c)
	}
	for c := range acl {
		require.True(t, called[c] || sent[c], "the documented ACL allows %s, which nothing sends", c)
	}
}

// Everything Tally does on a primary runs as the least-privileged user the
// operations guide documents: every script (whose commands the ACL checks
// too), the lease and its WAIT, the start-up checks. Anything else is
// refused to that user.
func TestScriptsRunUnderTheDocumentedACL(t *testing.T) {
	ctx := context.Background()
	p := redistest.Start(t)
	require.NoError(t, p.Client().Do(ctx, append([]any{"ACL", "SETUSER", "tally"}, toAnySlice(strings.Fields(documentedACL))...)...).Err())
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	st := newStore(t, []shard.Config{{Name: "s0", Primary: shard.Node{Addr: p.Addr, Username: "tally", Password: "tally-password"}}},
		keys, redisstore.Options{})
	require.NoError(t, st.LoadScripts(ctx, 0))
	require.NoError(t, st.CheckEviction(ctx))
	k := keys.Key("core", "acl")
	now := time.Now()
	g, err := st.Take(ctx, k, now, limiter.TakeArgs{Window: minute, Limit: 10, Need: 2, Want: 2, Producer: "edge.a",
		Owed: []limiter.Owed{{Seq: 9, Units: 1}}})
	require.NoError(t, err)
	require.EqualValues(t, 2, g.Granted)
	res, err := st.ApplyRun(ctx, 0, now, limiter.Run{Caller: "accountant-1", Seq: 1}, []limiter.Event{
		charge("edge.a", 1, k, g.ResetAt, now, 1), refund("edge.a", 2, k, g.ResetAt, now, 1, "edge.a", 1),
		refund("edge.a", 4, k, g.ResetAt, now, 1, "edge.a", 3), release("edge.a", 5, k, g.ResetAt, 1)})
	require.NoError(t, err)
	for _, r := range res.Results {
		require.NoError(t, r.Err)
	}
	f, err := st.Finish(ctx, k, now, limiter.FinishArgs{ResetAt: g.ResetAt, Start: now, Window: minute, Producer: "edge.a",
		Holder: "edge.a", N: 0, Units: 1, Status: 304, Back: 1})
	require.NoError(t, err)
	require.Equal(t, limiter.Finished, f.Outcome)
	_, err = st.Finish(ctx, k, now, limiter.FinishArgs{Start: now, Window: minute, Producer: "edge.a", Holder: "edge.a",
		Units: 1, ChargeSeq: 7, Status: 304, Back: 1})
	require.NoError(t, err)
	_, err = st.Check(ctx, k)
	require.NoError(t, err)
	// A sliding window's reservations: slide.lua's short way, then
	// take.lua's, once another holder's sub-window is in the span; and a
	// token bucket's, with its record.
	slide := limiter.Policy{Name: "slide", Algorithm: limiter.SlidingWindow, Limit: 10, Window: minute, Slices: 3, Align: true}
	for _, holder := range []string{"edge.a.1", "edge.b.1"} {
		producer := holder[:len(holder)-2]
		g, err = st.Take(ctx, k, now, limiter.TakeArgs{Window: slide.Window, Limit: slide.Limit, Need: 1, Want: 2, Producer: producer,
			Holder: holder, Align: true, Opens: slide.WindowAt(now), Slices: slide.Slices})
		require.NoError(t, err, holder)
		require.EqualValues(t, 2, g.Granted, holder)
	}
	made, handedOn := st.ShortTakes()
	require.EqualValues(t, [2]uint64{1, 1}, [2]uint64{made, handedOn}, "slide.lua made the first, take.lua the second")
	// A token bucket's: bucket.lua's short way for the first, take.lua's
	// for the next.
	bucket := limiter.Policy{Name: "bucket", Limit: 10, Window: minute}.Bucket(10, 10, minute)
	for _, fresh := range []bool{true, false} {
		g, err = st.Take(ctx, keys.Key("core", "acl-bucket"), now, limiter.TakeArgs{Window: bucket.Window, Limit: bucket.Limit, Need: 1,
			Want: 1, Producer: "edge.a", Holder: "edge.a.1", Align: true, Opens: bucket.WindowAt(now), Slices: bucket.Slices, Rate: bucket.Rate,
			Every: bucket.Every, Fresh: fresh})
		require.NoError(t, err)
		require.EqualValues(t, 1, g.Granted)
	}
	made, handedOn = st.ShortTakes()
	require.EqualValues(t, [2]uint64{2, 1}, [2]uint64{made, handedOn}, "bucket.lua made the first")
	l, err := st.ConfirmApplied(ctx, 0, "accountant-1", time.Second)
	require.NoError(t, err)
	require.True(t, l.Held)
	require.NoError(t, st.FreeLease(ctx, 0, "accountant-1"))

	// The same user cannot do anything else.
	c := p.Client()
	require.NoError(t, c.Do(ctx, "AUTH", "tally", "tally-password").Err())
	for _, cmd := range [][]any{{"FLUSHALL"}, {"KEYS", "*"}, {"CONFIG", "SET", "maxmemory-policy", "allkeys-lru"}, {"SET", "other:x", "1"}} {
		require.ErrorContains(t, c.Do(ctx, cmd...).Err(), "NOPERM", "%v", cmd)
	}
}

func toAnySlice(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
