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
