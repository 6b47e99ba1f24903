// Package metrics holds the small pieces Tally's processes share to expose
// measurements in the Prometheus text format: a duration histogram with
// second-scale buckets, safe for concurrent use, and the Go runtime's
// scheduling latency in the same buckets.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	rtmetrics "runtime/metrics"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Bounds are the upper bounds of the latency buckets, in seconds: fine
// below 10 ms, where accounting lag should be, coarse above.
var Bounds = []float64{0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Histogram counts durations in the Bounds buckets. The zero value is ready;
// it is safe for concurrent use.
type Histogram struct {
	counts [20]atomic.Uint64 // len(Bounds)+1: the last counts everything above
	sum    atomic.Int64
	n      atomic.Uint64
}

// Observe records d (negative counts as 0).
func (h *Histogram) Observe(d time.Duration) {
	d = max(0, d)
	s := d.Seconds()
	i := 0
	for i < len(Bounds) && s > Bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(int64(d))
	h.n.Add(1)
}

// Snapshot copies the counts.
func (h *Histogram) Snapshot() Snapshot {
	var s Snapshot
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
	}
	s.Sum, s.Count = time.Duration(h.sum.Load()), h.n.Load()
	return s
}

// Snapshot is a histogram's counts at one moment: Counts[i] counts the
// durations up to Bounds[i], the last one those above.
type Snapshot struct {
	Counts [20]uint64
	Sum    time.Duration
	Count  uint64
}

// Quantile estimates the q-quantile (0 to 1) by linear interpolation within
// its bucket; 0 when empty.
func (s Snapshot) Quantile(q float64) time.Duration {
	var total uint64
	for _, c := range s.Counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, c := range s.Counts {
		if seen+float64(c) >= rank && c > 0 {
			lo := 0.0
			if i > 0 {
				lo = Bounds[i-1]
			}
			hi := lo * 2
			if i < len(Bounds) {
				hi = Bounds[i]
			}
			return time.Duration((lo + (hi-lo)*(rank-seen)/float64(c)) * float64(time.Second))
		}
		seen += float64(c)
	}
	return time.Duration(Bounds[len(Bounds)-1] * float64(time.Second))
}

// WritePrometheus writes s as a Prometheus histogram called name.
func (s Snapshot) WritePrometheus(w io.Writer, name, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var cum uint64
	for i, c := range s.Counts {
		cum += c
		le := "+Inf"
		if i < len(Bounds) {
			le = fmt.Sprint(Bounds[i])
		}
		fmt.Fprintf(w, "%s_bucket{le=%q} %d\n", name, le, cum)
	}
	fmt.Fprintf(w, "%s_sum %g\n%s_count %d\n", name, s.Sum.Seconds(), name, s.Count)
}

// SchedLatency reads the Go runtime's scheduling latency histogram (how long
// goroutines stayed runnable before they ran, since the process started),
// moved into the Bounds buckets: each runtime bucket is counted in the first
// bucket whose bound is at or above its upper edge. Sum is estimated from
// the runtime buckets' midpoints.
func SchedLatency() Snapshot {
	var s Snapshot
	sample := []rtmetrics.Sample{{Name: "/sched/latencies:seconds"}}
	rtmetrics.Read(sample)
	if sample[0].Value.Kind() != rtmetrics.KindFloat64Histogram {
		return s
	}
	h := sample[0].Value.Float64Histogram()
	var sum float64
	for i, c := range h.Counts {
		if c == 0 {
			continue
		}
		lo, hi := h.Buckets[i], h.Buckets[i+1]
		j := 0
		for j < len(Bounds) && hi > Bounds[j] {
			j++
		}
		s.Counts[j] += c
		s.Count += c
		if !math.IsInf(hi, 1) && !math.IsInf(lo, -1) {
			sum += float64(c) * (lo + hi) / 2
		}
	}
	s.Sum = time.Duration(sum * float64(time.Second))
	return s
}

// WriteSchedLatency writes SchedLatency as go_sched_latencies_seconds.
func WriteSchedLatency(w io.Writer) {
	SchedLatency().WritePrometheus(w, "go_sched_latencies_seconds",
		"Time goroutines spent runnable before running: how long work waits for a CPU inside this process.")
}

// ParseText reads Prometheus text exposition (as /metrics writes it) into
// "name{labels}" → value; comments and lines without a number are skipped.
func ParseText(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		i := strings.LastIndexByte(line, ' ')
		if line == "" || line[0] == '#' || i < 0 {
			continue
		}
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}
