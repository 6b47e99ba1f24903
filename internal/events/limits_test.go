package events_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// A temporary limit travels signed: the edges read only what someone with
// the deployment's secret wrote, for the key its subject names, with terms
// that hold together.
func TestTemporaryLimitsAreSigned(t *testing.T) {
	dg, err := limiter.ParseDigest(key)
	require.NoError(t, err)
	at := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	l := events.TemporaryLimit{Policy: "core", Key: dg, Limit: 5, Set: at, Expires: at.Add(time.Hour), By: "ops", Reason: "abuse"}
	ls := events.NewLimits([]byte("the deployment's derived key"))
	m, err := ls.Msg("tally.limits", l)
	require.NoError(t, err)
	require.Equal(t, "tally.limits."+key, m.Subject)
	got, err := ls.Read("tally.limits", m.Subject, m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, l.Key, got.Key)
	require.Equal(t, int64(5), got.Limit)
	require.True(t, got.Live(at))
	require.False(t, got.Live(at.Add(time.Hour)), "lifted at its expiry")
	require.True(t, got.Live(at.Add(-time.Second)), "set by a clock ahead: live at once")
	require.Equal(t, at.Add(time.Millisecond), events.After(&got, at.Add(-time.Minute)), "a follower is set after it")
	require.Equal(t, at.Add(time.Hour), events.After(&got, at.Add(time.Hour)))

	forger := events.NewLimits([]byte("someone else's key"))
	forged, err := forger.Msg("tally.limits", events.TemporaryLimit{Policy: "core", Key: dg, Block: true, Set: at, Expires: at.Add(time.Hour)})
	require.NoError(t, err)
	_, err = ls.Read("tally.limits", forged.Subject, forged.Header, forged.Data)
	require.ErrorIs(t, err, events.ErrBadLimit, "signed with another key")
	tampered := append([]byte(nil), m.Data...)
	tampered[len(tampered)-2] ^= 1
	_, err = ls.Read("tally.limits", m.Subject, m.Header, tampered)
	require.ErrorIs(t, err, events.ErrBadLimit, "changed after signing")
	_, err = ls.Read("tally.limits", "tally.limits.00000000000000000000000000000000", m.Header, m.Data)
	require.ErrorIs(t, err, events.ErrBadLimit, "another key's subject")

	for name, bad := range map[string]events.TemporaryLimit{
		"no expiry":         {Policy: "core", Key: dg, Limit: 5, Set: at},
		"too long":          {Policy: "core", Key: dg, Limit: 5, Set: at, Expires: at.Add(events.MaxTemporary + time.Second)},
		"no terms":          {Policy: "core", Key: dg, Set: at, Expires: at.Add(time.Hour)},
		"block and limit":   {Policy: "core", Key: dg, Limit: 5, Block: true, Set: at, Expires: at.Add(time.Hour)},
		"cleared with term": {Policy: "core", Key: dg, Limit: 5, Cleared: true, Set: at, Expires: at.Add(time.Hour)},
		"bad policy":        {Policy: "Core Policy", Key: dg, Limit: 5, Set: at, Expires: at.Add(time.Hour)},
	} {
		_, err := ls.Msg("tally.limits", bad)
		require.ErrorIs(t, err, events.ErrBadLimit, name)
	}
}
