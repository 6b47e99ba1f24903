package accountant_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// An accountant that knows a calendar policy places its events by the
// calendar, whatever window they say: a service's charge placed by its
// start opens the day it started in, from midnight, not a window from its
// own second of the length it gave.
func TestCalendarEventsArePlacedByThePolicy(t *testing.T) {
	f := newFixture(t)
	k, other := f.keys.Key("core", "calendar"), f.keys.Key("core", "calendar-named")
	ev := started("svc-1", 1, k, time.Time{}, 2) // placed by its start, a window of 60 s
	day := limiter.Policy{Calendar: limiter.Day}.WindowAt(ev.StartedAt)
	named := started("svc-1", 2, other, day.ResetAt, 3) // named by its reset
	named.WindowSeconds = 86400
	f.publish([]events.Accounting{ev, named})
	f.start(func(c *accountant.Config) {
		c.Policies = map[string]limiter.Policy{"core": {Name: "core", Limit: 100, Calendar: limiter.Day, Location: time.UTC,
			Window: limiter.Day.Longest()}}
	})
	f.waitUsed(k, 2)
	f.waitUsed(other, 3)
	for _, key := range []limiter.Key{k, other} {
		v, err := f.primary.Client().HMGet(context.Background(), key.String(), "s", "r").Result()
		require.NoError(t, err)
		require.Equal(t, []any{strconv.FormatInt(day.Start.UnixMilli(), 10), strconv.FormatInt(day.ResetAt.UnixMilli(), 10)}, v,
			"the day's window, from its midnight")
	}
}

// An accountant applies a sliding window's events to the sub-window they
// name, under its own key, and dead-letters an event of a sliding policy
// that names no sub-window (or another cut of them): it would count where
// no reservation of the policy looks.
func TestSlidingEventsApplyToTheirSubWindow(t *testing.T) {
	f := newFixture(t)
	p := limiter.Policy{Name: "core", Algorithm: limiter.SlidingWindow, Limit: 100, Window: 10 * time.Second, Slices: 6, Align: true}
	k := f.keys.Key("core", "sliding")
	sub := p.WindowAt(time.Now())
	ev := started("svc-1", 1, k, sub.ResetAt, 2)
	ev.WindowSeconds, ev.Slices, ev.StartedAt = 10, 6, sub.Start
	whole := started("svc-1", 2, k, time.Time{}, 3) // the policy's terms misnamed: no sub-windows
	whole.WindowSeconds, whole.StartedAt = 10, sub.Start
	f.publish([]events.Accounting{ev})
	f.publish([]events.Accounting{whole})
	a := f.start(func(c *accountant.Config) { c.Policies = map[string]limiter.Policy{"core": p} })
	testutil.WaitFor(t, "the event applied, the other dead-lettered", func() bool {
		u, _ := f.primary.Client().HGet(context.Background(), k.SliceKey(sub.ResetAt), "u").Int64()
		return u == 2 && a.Stats().DeadLettered == 1
	})
	n, err := f.primary.Client().Exists(context.Background(), k.String()).Result()
	require.NoError(t, err)
	require.Zero(t, n, "nothing counted in the window key itself")
}
