package backoff_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/backoff"
	"github.com/tallyhq/tally/internal/limiter"
)

var (
	t0   = time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	dg   = limiter.Digest{1}
	cfg  = backoff.Config{Factor: 2, Max: 10 * time.Minute}
	base = 30 * time.Second
)

// A client that keeps coming back before its Retry-After gets a longer one
// each time (base × factor^strikes, from the time it came back), up to the
// cap; each answer's wait is what it is denied for, and no longer.
func TestEarlyReturnsGrowTheWait(t *testing.T) {
	tb := backoff.NewTable(100)
	tb.Denied(dg, t0, t0.Add(base), cfg) // the window is full: retry at its reset
	now := t0.Add(time.Second)
	want := []time.Duration{60 * time.Second, 120 * time.Second, 240 * time.Second, 480 * time.Second, 600 * time.Second, 600 * time.Second}
	for i, w := range want {
		a, early := tb.Early(dg, now, cfg)
		require.True(t, early, "strike %d", i+1)
		require.Equal(t, i+1, a.Strikes)
		require.Equal(t, now.Add(w), a.Until, "strike %d", i+1)
		// Not a moment longer than it was told: at the time it was given,
		// the client is decided as usual again.
		_, early = tb.Early(dg, a.Until, cfg)
		require.False(t, early, "denied past the Retry-After given")
		now = now.Add(time.Second)
	}
}

// A client that waits as told is never counted against: at the time it was
// told it is decided as usual, and if the window denies it again it starts
// over with the window's own wait and no strikes.
func TestWaitingAsToldIsNeverAStrike(t *testing.T) {
	tb := backoff.NewTable(100)
	tb.Denied(dg, t0, t0.Add(base), cfg)
	a, early := tb.Early(dg, t0.Add(time.Second), cfg) // one strike
	require.True(t, early)
	_, early = tb.Early(dg, a.Until, cfg) // waited exactly as told
	require.False(t, early)
	tb.Denied(dg, a.Until, a.Until.Add(base), cfg) // the window is full again
	a, early = tb.Early(dg, a.Until.Add(time.Second), cfg)
	require.True(t, early)
	require.Equal(t, 1, a.Strikes, "the earlier strike was forgotten")

	// Admitted: forgotten altogether.
	tb.Allowed(dg)
	require.Zero(t, tb.Len())
	_, early = tb.Early(dg, a.Until.Add(-time.Second), cfg)
	require.False(t, early)
}

// Without a factor there is no backoff; a cap below the window's own wait
// never tells a client to come back before the window resets; the table forgets clients whose wait is over when it
// is full, and backs off no new client while it stays full.
func TestOffCapAndCapacity(t *testing.T) {
	tb := backoff.NewTable(1)
	tb.Denied(dg, t0, t0.Add(base), backoff.Config{})
	_, early := tb.Early(dg, t0.Add(time.Second), backoff.Config{})
	require.False(t, early)
	require.Zero(t, tb.Len())

	small := backoff.Config{Factor: 3, Max: 10 * time.Second}
	tb.Denied(dg, t0, t0.Add(base), small)
	a, early := tb.Early(dg, t0.Add(time.Second), small)
	require.True(t, early)
	require.Equal(t, t0.Add(base), a.Until, "never before the window's reset, the cap notwithstanding")
	require.Equal(t, t0.Add(base), a.Reset)

	other := limiter.Digest{2}
	tb.Denied(other, t0, t0.Add(base), small) // full, and dg's wait is not over
	_, early = tb.Early(other, t0.Add(time.Second), small)
	require.False(t, early, "not remembered: the table is full")
	tb.Denied(other, a.Until, a.Until.Add(base), small) // dg's wait is over: room
	_, early = tb.Early(other, a.Until.Add(time.Second), small)
	require.True(t, early)
	require.Equal(t, 1, tb.Len())
}

func TestConfig(t *testing.T) {
	require.NoError(t, backoff.Config{}.Validate())
	require.NoError(t, backoff.Config{Factor: 2}.WithDefaults().Validate())
	require.Equal(t, time.Hour, backoff.Config{Factor: 2}.WithDefaults().Max)
	for _, bad := range []backoff.Config{{Factor: 1}, {Factor: 11, Max: time.Minute}, {Factor: 2, Max: time.Millisecond}, {Max: time.Minute},
		{Factor: 2, Max: 1500 * time.Millisecond}} {
		require.Error(t, bad.Validate(), "%+v", bad)
	}
}
