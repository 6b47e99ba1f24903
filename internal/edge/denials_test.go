package edge

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/limiter"
)

// The most denied clients of the last whole minute are shown (at most
// ten, each denied at least once a second), whatever number of other
// clients were denied beside them; a minute with no denials shows none.
func TestTopDenied(t *testing.T) {
	td := newTopDenied()
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	heavy := limiter.Digest{0xaa}
	for i := range 5000 {
		td.add("core", heavy, t0.Add(time.Duration(i)*time.Millisecond))
		// A flood of clients denied once each, more than are tracked.
		td.add("core", limiter.Digest{byte(i), byte(i >> 8), 1}, t0.Add(time.Duration(i)*time.Millisecond))
	}
	require.Empty(t, td.top(t0.Add(30*time.Second)), "the minute is not over")
	top := td.top(t0.Add(61 * time.Second))
	require.Len(t, top, 1, "the flood's clients, denied once each, are not named")
	require.Equal(t, heavy, top[0].digest, "the heavy client is kept whatever the flood")
	require.GreaterOrEqual(t, top[0].n, int64(5000))

	// Eleven heavy clients: the ten most denied are shown.
	t1 := t0.Add(5 * time.Minute)
	for c := range 11 {
		for range 100 + c {
			td.add("core", limiter.Digest{0xbb, byte(c)}, t1)
		}
	}
	top = td.top(t1.Add(time.Minute))
	require.Len(t, top, topShown)
	require.Equal(t, limiter.Digest{0xbb, 10}, top[0].digest)
	require.EqualValues(t, 110, top[0].n)
	require.Empty(t, td.top(t0.Add(3*time.Minute)), "a quiet minute shows none")
}

// A 429's message names the window as the client's limit has it: a
// calendar month in its zone, not the bound of its length.
func TestDenialNamesTheWindow(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	month := limiter.Policy{Name: "quota", Limit: 100, Calendar: limiter.Month, Location: berlin, Window: limiter.Month.Longest()}
	v := credit.Verdict{Policy: month, Decision: limiter.Decision{Resource: "quota", Limit: 100, Window: 28 * 24 * time.Hour,
		ResetAt: time.Now().Add(time.Hour)}}
	require.Contains(t, denial(v), `rate limit "quota" of 100 per calendar month (Europe/Berlin) exceeded`)
	v.Policy, v.Decision.Window = limiter.Policy{Name: "quota", Limit: 100, Window: time.Hour}, time.Hour
	require.Contains(t, denial(v), `of 100 per 1h0m0s exceeded`)
}
