// Package metrics holds the small pieces Tally's processes share for
// measurements they keep themselves: a duration histogram with second-scale
// buckets, safe for concurrent use (an accountant's lag, reported in its
// statistics), and a reader of the Prometheus text format (for the demo, the
// benchmark and the tests). What the binaries export goes through the
// OpenTelemetry SDK (internal/telemetry).
package metrics

import (
	"bufio"
	"io"
	"net/http"
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

// Scrape reads the Prometheus text at url (an admin listener's /metrics).
func Scrape(url string) (map[string]float64, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return ParseText(resp.Body)
}
