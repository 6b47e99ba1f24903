package events

import (
	"math/rand/v2"
	"testing"
	"time"
)

// appendTime writes what AppendFormat writes with timeLayout, for every
// time: the calendar's edges (leap days, a century that is not a leap year,
// the first and last instants of a year), every zone, and random instants
// over years 0 to 9999 and beyond them.
func TestAppendTimeIsTheLayout(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	times := []time.Time{
		{},
		time.Unix(0, 0),
		time.Date(2000, 2, 29, 23, 59, 59, 999999999, time.UTC),
		time.Date(2100, 2, 28, 23, 59, 59, 999_999_000, time.UTC),
		time.Date(2100, 3, 1, 0, 0, 0, 1, time.UTC),
		time.Date(2026, 12, 31, 23, 59, 59, 123_456_789, time.UTC),
		time.Date(2027, 1, 1, 0, 0, 0, 0, berlin),
		time.Date(2026, 3, 29, 2, 30, 0, 500, berlin),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 6, 1, 0, 0, 0, 0, time.UTC),
		time.Date(999, 1, 2, 3, 4, 5, 6000, time.UTC),
	}
	r := rand.New(rand.NewPCG(1, 2))
	lo, hi := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(10100, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for range 200_000 {
		times = append(times, time.Unix(lo+r.Int64N(hi-lo), r.Int64N(1e9)))
	}
	for _, tm := range times {
		want := tm.UTC().AppendFormat(nil, timeLayout)
		if got := appendTime(nil, tm); string(got) != string(want) {
			t.Fatalf("appendTime(%v) = %s, want %s", tm, got, want)
		}
	}
}

func BenchmarkAppendTime(b *testing.B) {
	tm := time.Date(2026, 11, 27, 8, 30, 1, 123_456_789, time.UTC)
	buf := make([]byte, 0, 64)
	b.Run("appendTime", func(b *testing.B) {
		for b.Loop() {
			buf = appendTime(buf[:0], tm)
		}
	})
	b.Run("AppendFormat", func(b *testing.B) {
		for b.Loop() {
			buf = tm.UTC().AppendFormat(buf[:0], timeLayout)
		}
	})
}
