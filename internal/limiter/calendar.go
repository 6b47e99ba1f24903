package limiter

import (
	"fmt"
	"time"
)

// Period is a period of the calendar a policy's windows may follow
// (Policy.Calendar): each window is one period of a time zone's calendar,
// from local midnight of its first day to local midnight of the next
// period's first day. Its length follows the calendar: a month lasts 28 to
// 31 days, a year 365 or 366, and a day on which the clocks change for
// daylight saving time 23 or 25 hours.
type Period string

const (
	Day Period = "day"
	// Week is the ISO week: from Monday.
	Week  Period = "week"
	Month Period = "month"
	Year  Period = "year"
)

// Validate reports whether p is a known period.
func (p Period) Validate() error {
	switch p {
	case Day, Week, Month, Year:
		return nil
	}
	return fmt.Errorf("%w: period %q: want day, week, month or year", ErrInvalidPolicy, p)
}

// Longest is the most a window of p can last, with a day to spare for
// zones whose clocks move by more than an hour: a bound, never a window's
// length (Policy.WindowAt gives that).
func (p Period) Longest() time.Duration {
	days, ok := periodDays[p]
	if !ok {
		return 0
	}
	return time.Duration(days[1]+1) * 24 * time.Hour
}

// Fits reports whether a window of p, in some time zone, can last d: its
// days' length (28 to 31 for a month, 365 or 366 for a year), give or take
// the three hours by which a zone's clocks have moved at most in a period.
func (p Period) Fits(d time.Duration) bool {
	const spare = 3 * time.Hour
	days, ok := periodDays[p]
	return ok && d >= time.Duration(days[0])*24*time.Hour-spare && d <= time.Duration(days[1])*24*time.Hour+spare
}

// periodDays are the fewest and most days a period has.
var periodDays = map[Period][2]int{Day: {1, 1}, Week: {7, 7}, Month: {28, 31}, Year: {365, 366}}

// span is the period of the calendar of loc (nil: UTC) that t falls in.
// Its bounds are local midnights, computed from the dates they begin, so
// that one period's reset is exactly the next one's start: when a midnight
// does not exist (clocks moved forward at midnight), time.Date's instant
// for it bounds both periods.
func (p Period) span(t time.Time, loc *time.Location) Span {
	if loc == nil {
		loc = time.UTC
	}
	lt := t.In(loc)
	at := func(shift int) Span {
		y, m, d := lt.Date()
		switch p {
		case Day:
			d += shift
			return Span{Start: midnight(y, m, d, loc), ResetAt: midnight(y, m, d+1, loc)}
		case Week:
			d += 7*shift - (int(lt.Weekday())+6)%7 // back to Monday
			return Span{Start: midnight(y, m, d, loc), ResetAt: midnight(y, m, d+7, loc)}
		case Month:
			m += time.Month(shift)
			return Span{Start: midnight(y, m, 1, loc), ResetAt: midnight(y, m+1, 1, loc)}
		case Year:
			y += shift
			return Span{Start: midnight(y, 1, 1, loc), ResetAt: midnight(y+1, 1, 1, loc)}
		}
		return Span{}
	}
	s := at(0)
	switch {
	case s.IsZero():
	case t.Before(s.Start):
		s = at(-1)
	case !t.Before(s.ResetAt):
		s = at(1)
	}
	return s
}

// midnight is the start of local day y-m-d in loc, as a whole second
// (time zones' offsets are whole seconds), in the form time.Unix returns.
func midnight(y int, m time.Month, d int, loc *time.Location) time.Time {
	return time.Unix(time.Date(y, m, d, 0, 0, 0, 0, loc).Unix(), 0)
}
