package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/testutil"
)

// recorder is a Reseeder that remembers what was reserved for each holder,
// as an edge's table does, and which shards it was told were reseeded.
type recorder struct {
	mu       sync.Mutex
	claims   map[string]limiter.Claim // by key and holder
	reseeded []int
	// asked is closed when Claims is first called, which then waits for
	// release to be closed: the reseed lasts until then.
	asked, release chan struct{}
	once           sync.Once
}

func newRecorder() *recorder {
	r := &recorder{claims: map[string]limiter.Claim{}, asked: make(chan struct{}), release: make(chan struct{})}
	close(r.release)
	return r
}

// holdNextReseed makes the next reseed wait, once it has asked for the claims,
// until the test lets it go.
func (r *recorder) holdNextReseed() (asked <-chan struct{}, letGo func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked, r.release, r.once = make(chan struct{}), make(chan struct{}), sync.Once{}
	return r.asked, sync.OnceFunc(func() { close(r.release) })
}

// got records a grant for holder of producer.
func (r *recorder) got(k limiter.Key, producer, holder string, g limiter.Grant) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := k.String() + "/" + holder
	c := r.claims[id]
	c.Key, c.Window, c.ResetAt, c.Start, c.Holder, c.Producer, c.Reserved = k, minute, g.ResetAt, g.Start, holder, producer, g.Mine
	r.claims[id] = c
}

// sent records events of the holder's producer for its window.
func (r *recorder) sent(k limiter.Key, holder string, charged, given int64, from, to uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := k.String() + "/" + holder
	c := r.claims[id]
	c.Charged, c.GivenBack, c.From, c.To = charged, given, from, to
	r.claims[id] = c
}

func (r *recorder) Claims(_ int, now time.Time) []limiter.Claim {
	r.mu.Lock()
	asked, release := r.asked, r.release
	r.once.Do(func() { close(asked) })
	r.mu.Unlock()
	<-release
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []limiter.Claim
	for _, c := range r.claims {
		if c.ResetAt.Add(limiter.Linger(c.Window, c.Slices)).After(now) {
			out = append(out, c)
		}
	}
	return out
}

func (r *recorder) Reseeded(shard int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reseeded = append(r.reseeded, shard)
}

func (r *recorder) wasReseeded() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.reseeded...)
}

// reseedFixture is one shard (a primary and a replica) with a store on the
// real clock, and what it was given.
type reseedFixture struct {
	primary, replica *redistest.Server
	keys             *limiter.KeySpace
	store            *redisstore.Store
	rec              *recorder
}

func newReseedFixture(t *testing.T, cfg func(p, r *redistest.Server) []shard.Config) *reseedFixture {
	f := &reseedFixture{rec: newRecorder()}
	f.primary, f.replica = redistest.StartPair(t)
	var err error
	f.keys, err = limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	f.store = newStore(t, cfg(f.primary, f.replica), f.keys, redisstore.Options{EpochCheck: 20 * time.Millisecond, Log: testLog{t}})
	f.store.SetReseeder(f.rec)
	return f
}

// testLog writes what a store says to the test's log.
type testLog struct{ t *testing.T }

func (l testLog) Info(msg string, args ...any)  { l.t.Log(append([]any{"INFO", msg}, args...)...) }
func (l testLog) Warn(msg string, args ...any)  { l.t.Log(append([]any{"WARN", msg}, args...)...) }
func (l testLog) Error(msg string, args ...any) { l.t.Log(append([]any{"ERROR", msg}, args...)...) }

func plainShard(p, r *redistest.Server) []shard.Config {
	return []shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r)}}}
}

// reserve reserves units for holder of producer, and records it.
func (f *reseedFixture) reserve(t *testing.T, k limiter.Key, producer, holder string, units int64) limiter.Grant {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := f.store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Need: units, Want: units,
		Producer: producer, Holder: holder})
	require.NoError(t, err)
	require.Equal(t, units, g.Granted)
	f.rec.got(k, producer, holder, g)
	return g
}

// read is k's window on the primary, once the shard takes reads.
func (f *reseedFixture) read(t *testing.T, k limiter.Key) limiter.Grant {
	t.Helper()
	return eventually(t, func() (limiter.Grant, error) {
		return f.store.Take(context.Background(), k, time.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Producer: "reader"})
	})
}

// reseeding waits until the reseed has asked for the claims, checks that the
// shard refuses writes meanwhile (ErrReseeding, at once), and lets the reseed
// go on.
func (f *reseedFixture) reseeding(t *testing.T, asked <-chan struct{}, letGo func()) {
	t.Helper()
	defer letGo()
	select {
	case <-asked:
	case <-time.After(20 * time.Second):
		t.Fatal("no reseed began 20 s after the primary changed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := f.store.Take(ctx, f.keys.Key("core", "during"), time.Now(), limiter.TakeArgs{Window: minute, Limit: 10, Need: 1,
		Want: 1, Producer: "probe"})
	require.ErrorIs(t, err, redisstore.ErrReseeding)
	require.True(t, f.store.Reseeding(0))
	_, err = f.store.Apply(ctx, 0, time.Now(), []limiter.Event{charge("probe", 1, f.keys.Key("core", "during"), time.Time{},
		time.Now(), 1)})
	require.ErrorIs(t, err, redisstore.ErrReseeding)
}

// untilReseeded takes a unit of a fresh key until the shard takes it,
// reporting whether a take was refused because the shard reseeded.
func (f *reseedFixture) untilReseeded(t *testing.T) (refused bool) {
	t.Helper()
	k := f.keys.Key("core", "probe-"+time.Now().String())
	deadline := time.Now().Add(20 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := f.store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: minute, Limit: 10, Need: 1, Want: 1, Producer: "probe"})
		cancel()
		if err == nil {
			return refused
		}
		if errors.Is(err, redisstore.ErrReseeding) {
			refused = true
		}
		require.True(t, time.Now().Before(deadline), "the shard takes no reservation 20 s after its primary changed: %v", err)
		time.Sleep(10 * time.Millisecond)
	}
}

// A primary without persistence restarts empty (its replica resyncs to
// nothing). The store learns it from its next connection, refuses writes
// while it re-asserts what it holds (ErrReseeding), and afterwards every
// window holds what its holders were given, with the reset they were
// shown; a release applied before the restart, and applied again from the
// stream, counts once.
func TestRestartedEmptyPrimaryIsReseeded(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	k1, k2 := f.keys.Key("core", "alice"), f.keys.Key("core", "bob")
	g1 := f.reserve(t, k1, "edge-a", "edge-a.1", 5)
	f.reserve(t, k1, "edge-b", "edge-b.7", 3)
	g2 := f.reserve(t, k2, "edge-a", "edge-a.2", 7)
	// edge-a gave 2 of k1 back (its event 1, applied before the restart).
	rel := release("edge-a", 1, k1, g1.ResetAt, 2)
	res, err := f.store.Apply(context.Background(), 0, time.Now(), []limiter.Event{rel})
	require.NoError(t, err)
	require.Equal(t, limiter.Applied, res.Results[0].Outcome)
	f.rec.sent(k1, "edge-a.1", 0, 2, 0, 1)
	require.EqualValues(t, 6, f.read(t, k1).Used)

	asked, letGo := f.rec.holdNextReseed()
	f.primary.Restart()
	f.reseeding(t, asked, letGo)
	f.untilReseeded(t)
	f.replica.WaitLinkUp()
	require.Equal(t, []int{0}, f.rec.wasReseeded())

	w1, w2 := f.read(t, k1), f.read(t, k2)
	require.EqualValues(t, 6, w1.Used, "k1: 5 and 3 reserved, 2 given back")
	require.Equal(t, g1.ResetAt, w1.ResetAt, "the reset the holders were shown")
	require.Equal(t, g1.Start, w1.Start)
	require.EqualValues(t, 7, w2.Used)
	require.Equal(t, g2.ResetAt, w2.ResetAt)
	// The release, read again from the stream, was counted by the reseed.
	res, err = f.store.Apply(context.Background(), 0, time.Now(), []limiter.Event{rel})
	require.NoError(t, err)
	require.Equal(t, limiter.Result{Outcome: limiter.Applied, Used: 6, ResetAt: g1.ResetAt, Amount: 2}, res.Results[0])
	require.EqualValues(t, 6, f.read(t, k1).Used)
	st := f.store.ReseedStats()
	require.EqualValues(t, 1, st.Reseeds)
	require.EqualValues(t, 3, st.Claims)
	require.EqualValues(t, 2, st.Opened, "k1 opened by its first claim, seeded by the second")
	require.Zero(t, st.Late)
	require.Zero(t, st.Conflicts)
	require.EqualValues(t, 1, f.store.Epoch(0))

	// A reservation beyond what is left is refused: the reseed gave back the
	// room the holders had spent.
	g, err := f.store.Take(context.Background(), k1, time.Now(), limiter.TakeArgs{Window: minute, Limit: 10, Need: 5, Want: 5,
		Producer: "edge-c"})
	require.NoError(t, err)
	require.Zero(t, g.Granted, "6 of 10 used: 5 more do not fit")
}

// A store that starts on a Redis no Tally process has used adopts its
// epoch: nothing reseeds, and its first reservation is made at once. So does
// a second process; neither re-asserts anything.
func TestNewDeploymentIsNotReseeded(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	f.reserve(t, f.keys.Key("core", "alice"), "edge-a", "edge-a.1", 1)
	other := newStore(t, plainShard(f.primary, f.replica), f.keys, redisstore.Options{})
	_, err := other.Take(context.Background(), f.keys.Key("core", "bob"), time.Now(), limiter.TakeArgs{Window: minute, Limit: 10,
		Need: 1, Want: 1, Producer: "edge-b"})
	require.NoError(t, err)
	require.Zero(t, f.store.ReseedStats().Reseeds)
	require.Zero(t, other.ReseedStats().Reseeds)
	require.Empty(t, f.rec.wasReseeded())
}

// A dataset emptied under a running primary (FLUSHALL: no connection
// breaks) is found by the probe: the shard reseeds as after a restart.
func TestFlushedPrimaryIsReseeded(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	k := f.keys.Key("core", "alice")
	g := f.reserve(t, k, "edge-a", "edge-a.1", 9)
	asked, letGo := f.rec.holdNextReseed()
	require.NoError(t, f.primary.Client().FlushAll(context.Background()).Err())
	f.reseeding(t, asked, letGo)
	f.untilReseeded(t)
	w := f.read(t, k)
	require.EqualValues(t, 9, w.Used)
	require.Equal(t, g.ResetAt, w.ResetAt)
}

// A Sentinel shard whose primary dies with reservations its replica never
// got: the promoted replica reseeds, and holds them all afterwards.
func TestSentinelPromotionIsReseeded(t *testing.T) {
	var sentinels []string
	f := newReseedFixture(t, func(p, r *redistest.Server) []shard.Config {
		sentinels = p.StartSentinels(t, "s0", 1, 1, 300*time.Millisecond)
		return []shard.Config{{Name: "s0", Sentinel: &shard.Sentinel{Master: "s0", Addrs: sentinels}}}
	})
	k := f.keys.Key("core", "alice")
	f.reserve(t, k, "edge-a", "edge-a.1", 4)
	f.replica.WaitSynced(f.primary)
	// The replica misses what follows: it is frozen while the primary
	// reserves, and the primary dies before it wakes.
	f.replica.Pause()
	f.reserve(t, k, "edge-a", "edge-a.1", 6)
	f.reserve(t, k, "edge-b", "edge-b.1", 5)
	asked, letGo := f.rec.holdNextReseed()
	f.primary.Stop()
	f.replica.Resume()
	f.reseeding(t, asked, letGo)
	require.Equal(t, f.replica.Addr, redistest.SentinelPrimary(sentinels[0], "s0"), "the replica was promoted")
	f.untilReseeded(t)
	w := f.read(t, k)
	require.EqualValues(t, 15, w.Used, "every unit reserved, the ones the replica never got included")
	st := f.store.ReseedStats()
	require.EqualValues(t, 1, st.Reseeds)
	require.Zero(t, st.Opened, "the promoted replica held the window")
	require.Positive(t, f.store.ScriptReloads(), "the scripts loaded again on the new primary")
}

// reseed.lua, claim by claim (the reseed's epoch given).
func TestReseedClaims(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	ctx := context.Background()
	send := func(epoch string, cs ...limiter.Claim) {
		t.Helper()
		require.NoError(t, f.store.SendClaims(ctx, 0, epoch, cs))
	}
	fields := func(k limiter.Key) map[string]string {
		return f.primary.Client().HGetAll(ctx, k.String()).Val()
	}
	claim := func(k limiter.Key, g limiter.Grant, producer, holder string, reserved int64) limiter.Claim {
		return limiter.Claim{Key: k, Window: minute, ResetAt: g.ResetAt, Start: g.Start, Producer: producer, Holder: holder,
			Reserved: reserved}
	}
	const e1, e2 = "00000000000000e1", "00000000000000e2"

	t.Run("a window the primary holds gets back the reservations it lost", func(t *testing.T) {
		k := f.keys.Key("core", "held")
		g := f.reserve(t, k, "edge-a", "edge-a.1", 5)
		send(e1, claim(k, g, "edge-a", "edge-a.1", 8))
		require.EqualValues(t, 8, f.read(t, k).Used)
		send(e1, claim(k, g, "edge-a", "edge-a.1", 8))
		send(e2, claim(k, g, "edge-a", "edge-a.1", 6))
		require.EqualValues(t, 8, f.read(t, k).Used, "re-asserting again, or less, changes nothing")
		require.Equal(t, "8", fields(k)["c:edge-a"])
		// Events: the stream applies them again; a claim never counts them
		// in a window it did not open.
		c := claim(k, g, "edge-a", "edge-a.1", 8)
		c.GivenBack, c.From, c.To = 3, 0, 1
		send(e2, c)
		require.EqualValues(t, 8, f.read(t, k).Used)
		require.NotContains(t, fields(k), "v:edge-a")
	})

	t.Run("a window it lost is opened as its holders knew it, each producer's part once", func(t *testing.T) {
		k := f.keys.Key("core", "lost")
		g := f.reserve(t, k, "edge-a", "edge-a.1", 1)
		require.NoError(t, f.primary.Client().Del(ctx, k.String()).Err())
		a := claim(k, g, "edge-a", "edge-a.1", 10)
		a.Charged, a.GivenBack, a.From, a.To = 2, 3, 4, 9
		send(e1, a)
		w := f.read(t, k)
		require.EqualValues(t, 9, w.Used, "10 reserved, 2 charged, 3 given back")
		require.Equal(t, g.ResetAt, w.ResetAt)
		require.Equal(t, g.Start, w.Start)
		require.Equal(t, e1, fields(k)["h"])
		require.Equal(t, e1+":4:9", fields(k)["v:edge-a"])
		send(e1, a)
		require.EqualValues(t, 9, f.read(t, k).Used, "the same claim twice")
		send(e1, claim(k, g, "edge-b", "edge-b.3", 5))
		require.EqualValues(t, 14, f.read(t, k).Used, "another producer's part")
		// edge-a's events 5..9 are counted; 4 and 10 are not.
		res, err := f.store.Apply(ctx, 0, time.Now(), []limiter.Event{
			release("edge-a", 5, k, g.ResetAt, 3), release("edge-a", 4, k, g.ResetAt, 1),
			release("edge-a", 10, k, g.ResetAt, 2), release("edge-b", 6, k, g.ResetAt, 1)})
		require.NoError(t, err)
		require.Equal(t, []limiter.Outcome{limiter.Applied, limiter.Applied, limiter.Applied, limiter.Applied},
			outcomes(res.Results))
		require.EqualValues(t, 14, res.Results[0].Used, "event 5: counted by the reseed, applied then")
		require.EqualValues(t, 10, f.read(t, k).Used)
		res, err = f.store.Apply(ctx, 0, time.Now(), []limiter.Event{release("edge-a", 5, k, g.ResetAt, 3)})
		require.NoError(t, err)
		require.Equal(t, limiter.Duplicate, res.Results[0].Outcome, "and once")
	})

	t.Run("another live window of the key is left alone", func(t *testing.T) {
		k := f.keys.Key("core", "conflict")
		g := f.reserve(t, k, "edge-a", "edge-a.1", 2)
		c := claim(k, g, "edge-b", "edge-b.1", 7)
		c.ResetAt, c.Start = g.ResetAt.Add(-time.Second), g.Start.Add(-time.Second)
		before := f.store.ReseedStats().Conflicts
		send(e1, c)
		require.EqualValues(t, 2, f.read(t, k).Used)
		require.Equal(t, before+1, f.store.ReseedStats().Conflicts)
	})

	t.Run("a window that reset is not opened again", func(t *testing.T) {
		k := f.keys.Key("core", "over")
		now := time.Now()
		reset := now.Truncate(time.Second)
		send(e1, limiter.Claim{Key: k, Window: minute, ResetAt: reset, Start: reset.Add(-minute), Producer: "edge-a",
			Holder: "edge-a.1", Reserved: 4})
		require.Zero(t, f.primary.Client().Exists(ctx, k.String()).Val())
	})

	t.Run("frozen shares as their holders last had them, unless taken back", func(t *testing.T) {
		k := f.keys.Key("core", "frozen")
		g := f.reserve(t, k, "edge-a", "edge-a.1", 50)
		g = f.reserve(t, k, "edge-b", "edge-b.1", 50)
		expiry := time.Now().Add(time.Hour)
		hs, err := f.store.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: g.ResetAt, Holder: "edge-a.1", Producer: "edge-a",
			Frozen: 30, Expiry: expiry}})
		require.NoError(t, err)
		require.Equal(t, limiter.Held, hs[0].Outcome)
		a := claim(k, g, "edge-a", "edge-a.1", 50)
		a.Frozen, a.FrozenExpiry = 20, expiry // a report that lowered it to 20 was lost
		b := claim(k, g, "edge-b", "edge-b.1", 50)
		b.Frozen, b.FrozenExpiry = 25, expiry // a report that made it was lost
		send(e1, a, b)
		require.Equal(t, "20:"+ms(expiry)+":edge-a", fields(k)["z:edge-a.1"])
		require.Equal(t, "25:"+ms(expiry)+":edge-b", fields(k)["z:edge-b.1"])
		// A share taken back stays taken.
		require.NoError(t, f.primary.Client().HDel(ctx, k.String(), "z:edge-b.1").Err())
		require.NoError(t, f.primary.Client().HSet(ctx, k.String(), "t:edge-b.1", "1").Err())
		send(e2, b)
		require.NotContains(t, fields(k), "z:edge-b.1")
	})

	t.Run("bad claims are refused before anything is written", func(t *testing.T) {
		k := f.keys.Key("core", "bad")
		g := f.reserve(t, k, "edge-a", "edge-a.1", 1)
		for _, c := range []limiter.Claim{
			claim(k, g, "edge-a", "edge-b.1", 5), // a holder of another producer
			claim(k, g, "", "edge-a.1", 5),
			{Key: k, Window: minute, ResetAt: g.ResetAt.Add(time.Hour), Start: g.Start, Producer: "edge-a", Holder: "edge-a.1", Reserved: 5},
			{Key: k, Window: minute, ResetAt: g.ResetAt, Start: g.Start, Producer: "edge-a", Holder: "edge-a.1", Reserved: -1},
			{Key: k, Window: minute, ResetAt: g.ResetAt, Start: g.Start, Producer: "edge-a", Holder: "edge-a.1", From: 5, To: 4},
		} {
			require.ErrorIs(t, c.Validate(), limiter.ErrInvalidArgument)
			send(e1, c)
		}
		require.EqualValues(t, 1, f.read(t, k).Used)
	})
}

func ms(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// Anyone on Redis can write the reseed marker; no process sets one without
// an expiry or for longer than the longest reseed_for, and such a marker
// halts nothing. One that looks like a reseed's halts writes until it
// expires, as a reseed would (docs/security.md, A primary that changes).
func TestForgedReseedMarker(t *testing.T) {
	f := newReseedFixture(t, plainShard)
	ctx := context.Background()
	k := f.keys.Key("core", "alice")
	f.reserve(t, k, "edge-a", "edge-a.1", 1)
	rdb := f.primary.Client()
	take := func() error {
		_, err := f.store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: minute, Limit: 1000, Need: 1, Want: 1, Producer: "edge-a"})
		return err
	}
	require.NoError(t, rdb.Set(ctx, "tally:reseed", "0000000000000bad", 0).Err())
	time.Sleep(100 * time.Millisecond) // a few probes
	require.NoError(t, take(), "a marker without an expiry")
	require.NoError(t, rdb.Set(ctx, "tally:reseed", "0000000000000bad", 365*24*time.Hour).Err())
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, take(), "a marker beyond the longest reseed_for")
	require.NoError(t, rdb.Set(ctx, "tally:reseed", "0000000000000bad", 500*time.Millisecond).Err())
	testutil.WaitFor(t, "writes halted by the marker", func() bool { return errors.Is(take(), redisstore.ErrReseeding) })
	testutil.WaitFor(t, "writes again once it expired", func() bool { return take() == nil })
	require.Zero(t, f.store.ReseedStats().Reseeds, "no reseed began: the epoch record names this primary")
}

// Every script that writes to windows refuses while a reseed's marker lasts,
// whichever connection its call came on: a call that passed its process's
// own check before the process learnt of the reseed (here: a store that
// does not probe) still lands after what the edges re-assert.
func TestScriptsWaitForTheReseed(t *testing.T) {
	p := redistest.Start(t)
	keys, err := limiter.NewKeySpace("tally", []byte("limiter-tests-secret-0123456789abcdef"))
	require.NoError(t, err)
	st := newStore(t, []shard.Config{{Name: "s0", Primary: node(p)}}, keys, redisstore.Options{EpochCheck: time.Minute})
	ctx := context.Background()
	k := keys.Key("core", "alice")
	now := time.Now()
	args := limiter.TakeArgs{Window: minute, Limit: 100, Need: 1, Want: 1, Producer: "edge-a"}
	g, err := st.Take(ctx, k, now, args)
	require.NoError(t, err)
	require.NoError(t, p.Client().Set(ctx, "tally:reseed", "00000000000000e1", 3*time.Second).Err())

	_, err = st.Take(ctx, k, now, args)
	require.ErrorIs(t, err, redisstore.ErrReseeding, "a reservation")
	_, err = st.Apply(ctx, 0, now, []limiter.Event{release("edge-a", 1, k, g.ResetAt, 1)})
	require.ErrorIs(t, err, redisstore.ErrReseeding, "an accounting event")
	_, err = st.Hold(ctx, 0, []limiter.Hold{{Key: k, ResetAt: g.ResetAt, Holder: "edge-a", Producer: "edge-a", Frozen: 1,
		Expiry: now.Add(time.Second)}})
	require.ErrorIs(t, err, redisstore.ErrReseeding, "a report of frozen credit")
	_, err = st.Finish(ctx, k, now, limiter.FinishArgs{ResetAt: g.ResetAt, Start: now, Window: minute, Producer: "edge-a",
		Holder: "edge-a", Units: 1, Status: 304, Back: 1})
	require.ErrorIs(t, err, redisstore.ErrReseeding, "a finish")
	require.False(t, redisstore.Permanent(err), "transient: the edge decides without it, the accountant retries")

	require.NoError(t, p.Client().Del(ctx, "tally:reseed").Err())
	r := eventually(t, func() (limiter.Grant, error) {
		return st.Take(ctx, k, now, limiter.TakeArgs{Window: minute, Limit: 100, Producer: "reader"})
	})
	require.EqualValues(t, 1, r.Used, "nothing was written meanwhile")
	require.Equal(t, map[string]string{"u": "1", "s": fmt.Sprint(g.Start.UnixMilli()), "r": fmt.Sprint(g.ResetAt.UnixMilli())},
		map[string]string{"u": p.Client().HGet(ctx, k.String(), "u").Val(), "s": p.Client().HGet(ctx, k.String(), "s").Val(),
			"r": p.Client().HGet(ctx, k.String(), "r").Val()})
	require.Empty(t, p.Client().HGet(ctx, k.String(), "z:edge-a").Val(), "no frozen share recorded")
	_, err = st.Take(ctx, k, now, args)
	require.NoError(t, err)
}
