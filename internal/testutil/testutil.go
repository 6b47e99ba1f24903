// Package testutil holds the helpers the tests of several packages share:
// waiting for a condition with a bound, and a log destination tests read
// while a server writes to it. It is imported by tests only.
package testutil

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// WaitFor polls cond every 20 ms until it holds, failing t after 30 s:
// for what a server does in the background (apply, publish, converge). The
// bound is generous: a machine whose cores are busy with other work (a CI
// runner, the whole suite at once) takes several times what an idle one
// does, and the bound is only reached by a test that fails.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitForWithin(t, what, 30*time.Second, cond)
}

// WaitForWithin is WaitFor with its own bound.
func WaitForWithin(t testing.TB, what string, limit time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(limit); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", limit, what)
		}
	}
}

// Buffer is a bytes.Buffer safe for concurrent writers: a log destination
// a test reads while the code under test writes.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String is what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Calendar dates for tests of calendar windows. Redis expires keys by its
// own clock, so the dates a test opens windows at must lie ahead of now:
// these find them from now, so that the tests run the same whatever the
// day.

// MonthStart is the first midnight of the month months after t's, in loc.
func MonthStart(t time.Time, loc *time.Location, months int) time.Time {
	y, m, _ := t.In(loc).Date()
	return time.Date(y, m+time.Month(months), 1, 0, 0, 0, 0, loc)
}

// NextFebruary is the first midnight of the first February that begins
// after t, in loc.
func NextFebruary(t time.Time, loc *time.Location) time.Time {
	for y := t.In(loc).Year(); ; y++ {
		if f := time.Date(y, time.February, 1, 0, 0, 0, 0, loc); f.After(t) {
			return f
		}
	}
}

// NextDayOf is the first midnight, after t, in loc, of a day that lasts
// hours hours (23 or 25 where clocks change for summer time), failing tb
// when none comes within two years.
func NextDayOf(tb testing.TB, t time.Time, loc *time.Location, hours int) time.Time {
	tb.Helper()
	y, m, d := t.In(loc).Date()
	for i := 1; i <= 731; i++ {
		day := time.Date(y, m, d+i, 0, 0, 0, 0, loc)
		if time.Date(y, m, d+i+1, 0, 0, 0, 0, loc).Sub(day) == time.Duration(hours)*time.Hour {
			return day
		}
	}
	tb.Fatalf("no day of %d hours in %v within two years of %v", hours, loc, t)
	return time.Time{}
}
