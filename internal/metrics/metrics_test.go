package metrics

import (
	"bytes"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHistogramQuantilesAndPrometheus(t *testing.T) {
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
	var b bytes.Buffer
	s.WritePrometheus(&b, "x_seconds", "help")
	out := b.String()
	for _, want := range []string{`x_seconds_bucket{le="0.0005"} 99`, `x_seconds_bucket{le="0.025"} 100`, `x_seconds_bucket{le="+Inf"} 100`, "x_seconds_count 100"} {
		if !strings.Contains(out, want) {
			t.Fatalf("missing %q in\n%s", want, out)
		}
	}
}

func TestSchedLatencyCountsRunnableGoroutines(t *testing.T) {
	before := SchedLatency()
	var wg sync.WaitGroup
	for range 1000 {
		wg.Go(runtime.Gosched)
	}
	wg.Wait()
	after := SchedLatency()
	// The runtime samples about one scheduling in eight.
	if after.Count < before.Count+50 {
		t.Fatalf("scheduling latency counted %d goroutine wake-ups, want at least 50 more than %d", after.Count, before.Count)
	}
	var sum uint64
	for _, c := range after.Counts {
		sum += c
	}
	if sum != after.Count {
		t.Fatalf("buckets hold %d, count says %d", sum, after.Count)
	}
}
