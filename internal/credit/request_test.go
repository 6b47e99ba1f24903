package credit

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

// fakeHealer is an operator's temporary terms and a backoff, by policy
// name: a lowered limit, a block, an early return.
type fakeHealer struct {
	mu       sync.Mutex
	limit    map[string]int64
	block    map[string]bool
	until    time.Time
	early    map[string]Backoff
	answered []limiter.Decision
}

func (f *fakeHealer) Terms(policy string, _ limiter.Digest, _ time.Time) (Temporary, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.block[policy] {
		return Temporary{Until: f.until, Block: true}, true
	}
	if l, ok := f.limit[policy]; ok {
		return Temporary{Limit: l, Until: f.until}, true
	}
	return Temporary{}, false
}

func (f *fakeHealer) Early(p limiter.Policy, _ limiter.Digest, _ time.Time) (Backoff, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	b, ok := f.early[p.Name]
	return b, ok
}

func (f *fakeHealer) Answered(_ limiter.Policy, _ limiter.Digest, _ time.Time, d limiter.Decision) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answered = append(f.answered, d)
}

// requestHarness is a core with a healer, and the limits of a request:
// "wide" (100 a minute) and "narrow" (2), mode exact, on the client's key.
type requestHarness struct {
	*harness
	heal           *fakeHealer
	wide, narrow   limiter.Policy
	wDg, nDg       limiter.Digest
	wideK, narrowK limiter.Key
}

func newRequestHarness(t *testing.T) *requestHarness {
	wide := limiter.Policy{Name: "wide", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	heal := &fakeHealer{limit: map[string]int64{}, block: map[string]bool{}, early: map[string]Backoff{}}
	h := newHarness(t, wide, false, Config{}, func(d *Deps) { d.Healer = heal })
	r := &requestHarness{harness: h, heal: heal, wide: wide,
		narrow: limiter.Policy{Name: "narrow", Limit: 2, Window: time.Minute, Mode: limiter.ModeExact}}
	r.wideK, r.narrowK = h.keys.Key("wide", "client"), h.keys.Key("narrow", "client")
	r.wDg, r.nDg = r.wideK.Digest(), r.narrowK.Digest()
	return r
}

// request decides a request of cost under limits built by each (the
// harness's policies, or changed copies).
func (r *requestHarness) request(ls ...Limit) Outcome {
	r.t.Helper()
	r.reqs++
	out, err := r.core.DecideRequest(context.Background(), ls, r.clock.Now(), r.reqs, nil)
	require.NoError(r.t, err)
	r.core.Wait()
	require.Len(r.t, out.Verdicts, len(ls), "a verdict per limit")
	return out
}

func (r *requestHarness) both(cost int64) []Limit {
	return []Limit{{Policy: r.wide, Digest: r.wDg, Cost: cost}, {Policy: r.narrow, Digest: r.nDg, Cost: cost}}
}

// A request held to several limits is decided whole: allowed only when
// every limit allows it, and a denial by one limit gives back what the
// others charged, so that a denied request consumes nothing.
func TestRequestDeniedByOneLimitConsumesNothing(t *testing.T) {
	r := newRequestHarness(t)
	out := r.request(r.both(1)...)
	require.True(t, out.Allowed())
	require.Equal(t, -1, out.Denied)
	// Another edge fills the narrow window; this edge does not know yet.
	now := r.clock.Now()
	r.redis.set(r.narrowK, now, now.Add(time.Minute), 2, "edge.other.1", 1)
	out = r.request(r.both(1)...)
	require.False(t, out.Allowed())
	require.Equal(t, 1, out.Denied, "the narrow limit denied it")
	require.Equal(t, r.nDg, out.Denial().Key.Digest())
	require.Equal(t, PathReserve, out.Denial().Path)
	require.True(t, out.Verdicts[0].Allowed(), "the wide limit was decided first")
	// What the wide limit charged for the denied request goes back: an
	// accounting event of the unit.
	var refunded int64
	for _, e := range r.ledger.since(0) {
		if e.Kind == limiter.Refund && e.Key == r.wideK {
			refunded += e.Units
		}
	}
	require.EqualValues(t, 1, refunded, "what the wide limit charged for the denied request goes back")
	// Now that the narrow window is known full, the next request is denied
	// before the wide limit reserves anything.
	calls, events := r.redis.numCalls(), r.ledger.len()
	out = r.request(r.both(1)...)
	require.Equal(t, 1, out.Denied)
	require.Equal(t, PathCache, out.Denial().Path)
	require.Equal(t, calls, r.redis.numCalls(), "a window known full denies with no Redis call")
	require.Equal(t, events, r.ledger.len(), "and nothing to give back")
	require.Zero(t, out.Verdicts[0].Path, "the wide limit was not decided")
}

// An operator's block denies a client before anything is read or charged:
// limit 0, Retry-After when the block lifts, the reset the client's window
// has when the edge knows it (else the block's end). A temporary limit
// below the request's cost denies it the same way until it lifts; a cost
// beyond the configured limit is refused (no window read).
func TestRequestBlocksAndTemporaryLimits(t *testing.T) {
	r := newRequestHarness(t)
	until := r.clock.Now().Add(2 * time.Hour)
	r.heal.until = until
	wideOnly := func(cost int64) Limit { return Limit{Policy: r.wide, Digest: r.wDg, Cost: cost} }

	r.heal.block["wide"] = true
	calls := r.redis.numCalls()
	out := r.request(wideOnly(1))
	require.False(t, out.Allowed())
	require.False(t, out.Refused())
	v := out.Denial()
	require.Equal(t, PathBlocked, v.Path)
	require.True(t, v.Decided)
	require.Zero(t, v.Decision.Limit, "a block's limit is 0")
	require.Equal(t, until, v.Decision.RetryAt)
	require.Equal(t, until, v.Decision.ResetAt, "no window known: the block's end")
	require.Equal(t, calls, r.redis.numCalls(), "a block reads nothing")
	require.EqualValues(t, 1, r.core.Stats().Decisions[PathBlocked][0])

	r.heal.block["wide"] = false
	out = r.request(wideOnly(1))
	require.True(t, out.Allowed())
	reset := out.Verdicts[0].Decision.ResetAt
	r.heal.block["wide"] = true
	out = r.request(wideOnly(1))
	require.Equal(t, reset, out.Denial().Decision.ResetAt, "the window's reset, as the client saw it before")

	r.heal.block["wide"] = false
	r.heal.limit["wide"] = 3 // lowered, for a while
	out = r.request(wideOnly(5))
	require.Equal(t, PathBlocked, out.Denial().Path, "a cost beyond the temporary limit waits for it to lift")
	require.Equal(t, until, out.Denial().Decision.RetryAt)
	out = r.request(wideOnly(2))
	require.True(t, out.Allowed())
	require.EqualValues(t, 3, out.Verdicts[0].Decision.Limit, "decided by the temporary limit")
	out = r.request(wideOnly(2))
	require.False(t, out.Allowed(), "3 of the temporary 3 used")
	require.Equal(t, PathCache, out.Denial().Path, "known full once the reservation counted 3")

	delete(r.heal.limit, "wide")
	calls = r.redis.numCalls()
	out = r.request(wideOnly(101))
	require.True(t, out.Refused(), "a cost beyond the configured limit")
	require.Zero(t, out.Denial().Path)
	require.Equal(t, calls, r.redis.numCalls())
}

// Quota limits deny a request only all together; a limit in shadow mode
// never denies, and its verdict says what it would have done (a block's
// included).
func TestRequestQuotasAndShadows(t *testing.T) {
	r := newRequestHarness(t)
	quota := func(p limiter.Policy, dg limiter.Digest) Limit {
		return Limit{Policy: p, Digest: dg, Cost: 2, Quota: true}
	}
	out := r.request(quota(r.wide, r.wDg), quota(r.narrow, r.nDg))
	require.True(t, out.Allowed())
	out = r.request(quota(r.wide, r.wDg), quota(r.narrow, r.nDg))
	require.True(t, out.Allowed(), "the narrow quota is full, the wide one is not")
	require.False(t, out.Verdicts[1].Allowed())
	wide := r.wide
	wide.Limit = 4 // as a reload may lower it, and raise it again below: 4 of 4 used now
	events := r.ledger.len()
	out = r.request(quota(wide, r.wDg), quota(r.narrow, r.nDg))
	require.False(t, out.Allowed(), "every quota denies")
	require.Equal(t, 0, out.Denied, "the first quota that denied")
	require.Equal(t, events, r.ledger.len(), "nothing was charged, nothing given back")

	shadow := r.narrow
	shadow.Shadow = true
	out = r.request(Limit{Policy: r.wide, Digest: r.wDg, Cost: 1}, Limit{Policy: shadow, Digest: r.nDg, Cost: 1})
	require.True(t, out.Allowed(), "a shadow limit denies nothing, and the wide window is not full at its limit of 100")
	require.False(t, out.Verdicts[1].Allowed(), "it says it would have denied")

	r.heal.block["narrow"] = true
	r.heal.until = r.clock.Now().Add(time.Hour)
	out = r.request(Limit{Policy: r.wide, Digest: r.wDg, Cost: 1}, Limit{Policy: shadow, Digest: r.nDg, Cost: 1})
	require.True(t, out.Allowed())
	require.Equal(t, PathBlocked, out.Verdicts[1].Path, "what the block would have done")
	require.Zero(t, r.core.Stats().Decisions[PathBlocked][0], "a shadow block counts no denial")
}

// A client that comes back before the Retry-After it was told is denied by
// progressive backoff with nothing read; every decision by the window is
// told to the backoff.
func TestRequestBackoff(t *testing.T) {
	r := newRequestHarness(t)
	wideOnly := Limit{Policy: r.wide, Digest: r.wDg, Cost: 1}
	out := r.request(wideOnly)
	require.True(t, out.Allowed())
	require.Len(t, r.heal.answered, 1)
	require.True(t, r.heal.answered[0].Allowed)

	b := Backoff{Until: r.clock.Now().Add(8 * time.Second), Reset: r.clock.Now().Add(time.Minute), Strikes: 2}
	r.heal.early["wide"] = b
	calls := r.redis.numCalls()
	out = r.request(wideOnly)
	v := out.Denial()
	require.Equal(t, PathBackoff, v.Path)
	require.Equal(t, b.Until, v.Decision.RetryAt)
	require.Equal(t, b.Reset, v.Decision.ResetAt)
	require.Equal(t, 2, v.Decision.Strikes)
	require.EqualValues(t, r.wide.Limit, v.Decision.Used, "a backoff's denial never shows room")
	require.Equal(t, calls, r.redis.numCalls())
	require.Len(t, r.heal.answered, 1, "a backoff's denial is not the window's")
}
