package limiter_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

func zone(t testing.TB, name string) *time.Location {
	t.Helper()
	l, err := time.LoadLocation(name)
	require.NoError(t, err)
	return l
}

// at parses an RFC 3339 time: the expected bounds are written with the
// offset in force, independently of the code under test.
func at(t testing.TB, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	require.NoError(t, err)
	return v
}

func calendar(period limiter.Period, loc *time.Location) limiter.Policy {
	return limiter.Policy{Name: "quota", Limit: 100, Calendar: period, Location: loc, Window: period.Longest()}
}

// WindowAt places a window where its policy says: at the second of the
// request, at a multiple of its length, or on the calendar of its zone — a
// month from its first day to the next month's, a day of 23 or 25 hours
// when the clocks change.
func TestWindowAt(t *testing.T) {
	berlin, ny, utc := zone(t, "Europe/Berlin"), zone(t, "America/New_York"), time.UTC
	for _, tc := range []struct {
		name        string
		p           limiter.Policy
		t           string
		start, next string
		length      time.Duration
	}{
		{"first request: its second", limiter.Policy{Window: time.Minute}, "2026-11-26T10:00:10.3Z",
			"2026-11-26T10:00:10Z", "2026-11-26T10:01:10Z", time.Minute},
		{"clock: a multiple of the window", limiter.Policy{Window: time.Hour, Align: true}, "2026-11-26T10:20:34.5Z",
			"2026-11-26T10:00:00Z", "2026-11-26T11:00:00Z", time.Hour},
		{"day, UTC", calendar(limiter.Day, nil), "2026-11-26T23:59:59.999Z",
			"2026-11-26T00:00:00Z", "2026-11-27T00:00:00Z", 24 * time.Hour},
		{"day, Berlin, in UTC's previous day", calendar(limiter.Day, berlin), "2026-11-26T23:30:00Z",
			"2026-11-27T00:00:00+01:00", "2026-11-28T00:00:00+01:00", 24 * time.Hour},
		{"day of 23 hours: spring forward", calendar(limiter.Day, berlin), "2026-03-29T12:00:00+02:00",
			"2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23 * time.Hour},
		{"spring forward, before the change", calendar(limiter.Day, berlin), "2026-03-29T01:59:59+01:00",
			"2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23 * time.Hour},
		{"spring forward, its last second", calendar(limiter.Day, berlin), "2026-03-29T23:59:59+02:00",
			"2026-03-29T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 23 * time.Hour},
		{"the day after spring forward, at its midnight", calendar(limiter.Day, berlin), "2026-03-30T00:00:00+02:00",
			"2026-03-30T00:00:00+02:00", "2026-03-31T00:00:00+02:00", 24 * time.Hour},
		{"day of 25 hours: fall back, first 02:30", calendar(limiter.Day, berlin), "2026-10-25T02:30:00+02:00",
			"2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", 25 * time.Hour},
		{"fall back, second 02:30", calendar(limiter.Day, berlin), "2026-10-25T02:30:00+01:00",
			"2026-10-25T00:00:00+02:00", "2026-10-26T00:00:00+01:00", 25 * time.Hour},
		{"day of 23 hours, New York", calendar(limiter.Day, ny), "2026-03-08T12:00:00-04:00",
			"2026-03-08T00:00:00-05:00", "2026-03-09T00:00:00-04:00", 23 * time.Hour},
		{"January's last second", calendar(limiter.Month, berlin), "2026-01-31T23:59:59+01:00",
			"2026-01-01T00:00:00+01:00", "2026-02-01T00:00:00+01:00", 31 * 24 * time.Hour},
		{"February's first second", calendar(limiter.Month, berlin), "2026-02-01T00:00:00+01:00",
			"2026-02-01T00:00:00+01:00", "2026-03-01T00:00:00+01:00", 28 * 24 * time.Hour},
		{"February 28th, UTC", calendar(limiter.Month, utc), "2026-02-28T23:59:59Z",
			"2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{"February 29th of a leap year", calendar(limiter.Month, berlin), "2028-02-29T23:59:59+01:00",
			"2028-02-01T00:00:00+01:00", "2028-03-01T00:00:00+01:00", 29 * 24 * time.Hour},
		{"March 1st after a leap day", calendar(limiter.Month, berlin), "2028-03-01T00:00:00+01:00",
			"2028-03-01T00:00:00+01:00", "2028-04-01T00:00:00+02:00", 31*24*time.Hour - time.Hour},
		{"October: 31 days and an hour", calendar(limiter.Month, berlin), "2026-10-15T12:00:00+02:00",
			"2026-10-01T00:00:00+02:00", "2026-11-01T00:00:00+01:00", 31*24*time.Hour + time.Hour},
		{"December into January", calendar(limiter.Month, berlin), "2026-12-31T23:59:59+01:00",
			"2026-12-01T00:00:00+01:00", "2027-01-01T00:00:00+01:00", 31 * 24 * time.Hour},
		{"ISO week: a Sunday", calendar(limiter.Week, berlin), "2026-03-29T12:00:00+02:00",
			"2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 7*24*time.Hour - time.Hour},
		{"ISO week: its Monday's midnight", calendar(limiter.Week, utc), "2026-11-30T00:00:00Z",
			"2026-11-30T00:00:00Z", "2026-12-07T00:00:00Z", 7 * 24 * time.Hour},
		{"ISO week across a new year", calendar(limiter.Week, utc), "2026-01-01T08:00:00Z",
			"2025-12-29T00:00:00Z", "2026-01-05T00:00:00Z", 7 * 24 * time.Hour},
		{"leap year", calendar(limiter.Year, berlin), "2028-06-01T00:00:00+02:00",
			"2028-01-01T00:00:00+01:00", "2029-01-01T00:00:00+01:00", 366 * 24 * time.Hour},
		{"year, its last second", calendar(limiter.Year, utc), "2026-12-31T23:59:59Z",
			"2026-01-01T00:00:00Z", "2027-01-01T00:00:00Z", 365 * 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.p.WindowAt(at(t, tc.t))
			require.True(t, at(t, tc.start).Equal(s.Start), "start %v, want %s", s.Start, tc.start)
			require.True(t, at(t, tc.next).Equal(s.ResetAt), "reset %v, want %s", s.ResetAt, tc.next)
			require.Equal(t, tc.length, s.Length())
			require.Equal(t, tc.length, tc.p.LengthAt(at(t, tc.t)))
			// The window that ends at that reset is the same one.
			require.Equal(t, s, tc.p.Ending(s.ResetAt))
			require.Zero(t, s.Start.Nanosecond())
		})
	}
}

// A calendar policy's windows follow each other on a manual clock: each
// opens at its predecessor's reset, lasts its period, and holds every
// instant of it — also where a zone's clocks jump at midnight, or a day was
// skipped.
func TestCalendarWindowsTileOnAManualClock(t *testing.T) {
	for _, tc := range []struct {
		zone   string
		period limiter.Period
		from   string
		step   time.Duration
		n      int
	}{
		{"Europe/Berlin", limiter.Day, "2026-03-27T00:00:00Z", 17 * time.Minute, 900},
		{"Europe/Berlin", limiter.Day, "2026-10-23T00:00:00Z", 17 * time.Minute, 900},
		{"America/Santiago", limiter.Day, "2026-04-03T00:00:00Z", 13 * time.Minute, 900}, // clocks change at midnight
		{"America/Santiago", limiter.Day, "2026-09-04T00:00:00Z", 13 * time.Minute, 900},
		{"America/Havana", limiter.Day, "2026-03-07T00:00:00Z", 13 * time.Minute, 900},
		{"Pacific/Apia", limiter.Day, "2011-12-28T00:00:00Z", 13 * time.Minute, 900}, // December 30th 2011 never was
		{"Europe/Berlin", limiter.Week, "2026-03-01T00:00:00Z", 3 * time.Hour, 600},
		{"Europe/Berlin", limiter.Month, "2026-01-01T00:00:00Z", 11 * time.Hour, 2400},
		{"Australia/Lord_Howe", limiter.Month, "2026-01-01T00:00:00Z", 11 * time.Hour, 2400}, // 30-minute changes
		{"Europe/Berlin", limiter.Year, "2025-06-01T00:00:00Z", 97 * time.Hour, 300},
	} {
		t.Run(tc.zone+"/"+string(tc.period), func(t *testing.T) {
			p := calendar(tc.period, zone(t, tc.zone))
			clock := limiter.NewManualClock(at(t, tc.from))
			cur := p.WindowAt(clock.Now())
			windows := 1
			for i := 0; i < tc.n; i++ {
				clock.Advance(tc.step)
				now := clock.Now()
				s := p.WindowAt(now)
				require.True(t, s.Contains(now), "%v not in %v to %v", now, s.Start, s.ResetAt)
				require.Positive(t, s.Length())
				require.LessOrEqual(t, s.Length(), p.Window)
				if s != cur {
					require.Equal(t, cur.ResetAt, s.Start, "a window opens at its predecessor's reset")
					cur = s
					windows++
				}
				// Every second of the window places it: its first and its last.
				require.Equal(t, s, p.WindowAt(s.Start))
				require.Equal(t, s, p.WindowAt(s.ResetAt.Add(-time.Second)))
				require.Equal(t, s, p.Ending(s.ResetAt))
			}
			require.Greater(t, windows, 1)
		})
	}
}

func TestCalendarPolicyValidate(t *testing.T) {
	ok := calendar(limiter.Month, zone(t, "Europe/Berlin"))
	require.NoError(t, ok.Validate())
	require.Equal(t, "calendar month (Europe/Berlin)", ok.Per())
	require.Equal(t, "calendar day (UTC)", calendar(limiter.Day, nil).Per())
	for name, mutate := range map[string]func(p *limiter.Policy){
		"unknown period":         func(p *limiter.Policy) { p.Calendar = "fortnight" },
		"a length of its own":    func(p *limiter.Policy) { p.Window = time.Hour },
		"aligned to a length":    func(p *limiter.Policy) { p.Align = true },
		"another period's bound": func(p *limiter.Policy) { p.Window = limiter.Day.Longest() },
	} {
		t.Run(name, func(t *testing.T) {
			p := ok
			mutate(&p)
			require.ErrorIs(t, p.Validate(), limiter.ErrInvalidPolicy)
		})
	}
}

// An entry of a calendar policy names its window by the period: by its
// reset, with that period's length, or, placed by its start, by the reset
// of the period the start falls in.
func TestCalendarEntryPlaced(t *testing.T) {
	p := calendar(limiter.Month, zone(t, "Europe/Berlin"))
	feb, mar := at(t, "2026-02-01T00:00:00+01:00"), at(t, "2026-03-01T00:00:00+01:00")
	reset, window := limiter.Entry{Policy: p, ResetAt: mar, Start: at(t, "2026-02-14T09:00:00+01:00")}.Placed()
	require.True(t, reset.Equal(mar))
	require.Equal(t, 28*24*time.Hour, window)
	reset, window = limiter.Entry{Policy: p, Start: at(t, "2026-01-31T23:59:59+01:00")}.Placed()
	require.True(t, reset.Equal(feb))
	require.Equal(t, 31*24*time.Hour, window)
	ev := limiter.Entry{Kind: limiter.Charge, Policy: p, Units: 1, Start: at(t, "2026-02-28T23:00:00+01:00")}.Event("edge", 1)
	require.True(t, ev.ResetAt.Equal(mar))
	require.Equal(t, 28*24*time.Hour, ev.Window)
	// Other policies' entries say what they said.
	reset, window = limiter.Entry{Policy: limiter.Policy{Window: time.Hour}, Start: feb}.Placed()
	require.True(t, reset.IsZero())
	require.Equal(t, time.Hour, window)
}

// A period fits the lengths its windows take in any zone, and no other.
func TestPeriodFits(t *testing.T) {
	h := time.Hour
	for _, c := range []struct {
		p    limiter.Period
		d    time.Duration
		fits bool
	}{
		{limiter.Day, 24 * h, true}, {limiter.Day, 23 * h, true}, {limiter.Day, 25 * h, true}, {limiter.Day, 5 * h, false}, {limiter.Day, 48 * h, false},
		{limiter.Week, 7 * 24 * h, true}, {limiter.Week, 7*24*h - h, true}, {limiter.Week, 8 * 24 * h, false},
		{limiter.Month, 28 * 24 * h, true}, {limiter.Month, 31*24*h + h, true}, {limiter.Month, 27 * 24 * h, false}, {limiter.Month, 32 * 24 * h, false},
		{limiter.Year, 365 * 24 * h, true}, {limiter.Year, 366 * 24 * h, true}, {limiter.Year, 367 * 24 * h, false},
		{limiter.Period("fortnight"), 14 * 24 * h, false},
	} {
		require.Equal(t, c.fits, c.p.Fits(c.d), "%s of %v", c.p, c.d)
	}
}
