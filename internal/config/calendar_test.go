package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

// calendarFile is a file whose one policy's window lines are windows.
func calendarFile(windows string) []byte {
	return []byte(`redis:
  shards:
    - name: s0
      primary: {addr: "127.0.0.1:7000"}
nats:
  url: nats://127.0.0.1:4222
edge:
  listen: 127.0.0.1:8080
  upstream: http://127.0.0.1:9000
policies:
  - name: quota
    limit: 100000
` + windows)
}

// A calendar policy reads as its period in its zone, and becomes a
// limiter policy whose windows are that zone's periods.
func TestCalendarPolicy(t *testing.T) {
	cfg, err := Parse(calendarFile("    windows: calendar\n    period: month\n    time_zone: Europe/Berlin\n"), withSecret)
	require.NoError(t, err)
	p := cfg.PolicyMap()["quota"]
	require.Equal(t, limiter.Month, p.Calendar)
	require.Equal(t, "Europe/Berlin", p.Location.String())
	require.NoError(t, p.Validate())
	feb := p.WindowAt(time.Date(2026, 2, 10, 12, 0, 0, 0, time.UTC))
	require.Equal(t, 28*24*time.Hour, feb.Length())
	require.Equal(t, "2026-02-01T00:00:00+01:00", feb.Start.In(p.Location).Format(time.RFC3339))

	// UTC by default; the same terms read again are equal (a reload
	// changes nothing).
	cfg, err = Parse(calendarFile("    windows: calendar\n    period: week\n"), withSecret)
	require.NoError(t, err)
	require.Equal(t, time.UTC, cfg.PolicyMap()["quota"].Location)
	a, _ := Parse(calendarFile("    windows: calendar\n    period: day\n    time_zone: Asia/Tokyo\n"), withSecret)
	b, _ := Parse(calendarFile("    windows: calendar\n    period: day\n    time_zone: Asia/Tokyo\n"), withSecret)
	limits, _ := a.Changes(b)
	require.Empty(t, limits)
	c, _ := Parse(calendarFile("    windows: calendar\n    period: month\n    time_zone: Asia/Tokyo\n"), withSecret)
	limits, _ = a.Changes(c)
	require.Equal(t, []string{"changed policy quota: 100000 per calendar day (Asia/Tokyo) → 100000 per calendar month (Asia/Tokyo)"}, limits)
}

// check-config says what is wrong with a calendar policy, at its line.
func TestCalendarPolicyProblems(t *testing.T) {
	for _, tc := range []struct {
		name, windows string
		want          []Problem
	}{
		{"an unknown zone", "    windows: calendar\n    period: month\n    time_zone: Europe/Berln\n",
			[]Problem{{15, "policies[0].time_zone", `"Europe/Berln": unknown time zone: want an IANA name (Europe/Berlin, America/New_York, UTC)`}}},
		{"the machine's zone", "    windows: calendar\n    period: day\n    time_zone: Local\n",
			[]Problem{{15, "policies[0].time_zone", `"Local": the machine's zone differs between machines: name an IANA time zone (Europe/Berlin, UTC)`}}},
		{"an unknown period", "    windows: calendar\n    period: quarter\n",
			[]Problem{{14, "policies[0].period", `"quarter": want day, week, month or year`}}},
		{"no period", "    windows: calendar\n",
			[]Problem{{11, "policies[0].period", "missing: windows: calendar needs period: day, week, month or year"}}},
		{"a window of its own", "    window: 720h\n    windows: calendar\n    period: month\n",
			[]Problem{{13, "policies[0].window", "720h0m0s: a calendar window lasts its period (month), leave window out"}}},
		{"a period without the calendar", "    window: 1h\n    period: month\n    time_zone: UTC\n",
			[]Problem{{14, "policies[0].period", `"month": a period is for windows: calendar (windows: first_request)`},
				{15, "policies[0].time_zone", `"UTC": a time zone is for windows: calendar (windows: first_request)`}}},
		{"a period with clock windows", "    window: 1h\n    windows: clock\n    period: day\n",
			[]Problem{{15, "policies[0].period", `"day": a period is for windows: calendar (windows: clock)`}}},
		{"an unknown kind of windows", "    window: 1h\n    windows: monthly\n",
			[]Problem{{14, "policies[0].windows", `"monthly": want first_request, clock or calendar`}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(calendarFile(tc.windows), withSecret)
			require.Equal(t, tc.want, got)
			_, err := Parse(calendarFile(tc.windows), withSecret)
			require.ErrorIs(t, err, ErrInvalid)
			require.True(t, strings.Contains(err.Error(), tc.want[0].Field), err.Error())
		})
	}
}
