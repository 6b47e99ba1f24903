package metrics

import (
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for range 98 {
		h.Observe(400 * time.Microsecond) // bucket ≤ 0.5 ms
	}
	h.Observe(20 * time.Millisecond) // bucket 15–25 ms
	h.Observe(-time.Second)          // counts as 0
	s := h.Snapshot()
	if s.Count != 100 {
		t.Fatalf("count %d, want 100", s.Count)
	}
	if q := s.Quantile(0.5); q <= 0 || q > 500*time.Microsecond {
		t.Fatalf("p50 %v, want within the first bucket", q)
	}
	if q := s.Quantile(0.995); q <= 15*time.Millisecond || q > 25*time.Millisecond {
		t.Fatalf("p99.5 %v, want within 15–25 ms", q)
	}
}
