package loadgen

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram layout: values are nanoseconds. Values below 2*subCount are
// counted exactly; above that, each power of two is split into subCount
// buckets of equal width, so a bucket is never wider than 1/subCount of the
// values it holds. Values of 2^maxBits ns (about 18 minutes) and more share
// the last bucket.
const (
	subBits    = 7
	subCount   = 1 << subBits
	maxBits    = 40
	numBuckets = 2*subCount + (maxBits-subBits-1)*subCount
)

// A Histogram records durations in log-linear buckets: durations below 256ns
// are recorded exactly, longer ones with a relative error below 0.4% up to
// about 18 minutes. Longer durations are counted in the last bucket, but Max
// and Mean stay exact.
//
// The zero value is an empty histogram ready to use. A Histogram is safe for
// concurrent use; it must not be copied after first use.
type Histogram struct {
	count  atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
	max    atomic.Int64  // nanoseconds
	counts [numBuckets]atomic.Uint64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return new(Histogram)
}

// bucketOf returns the index of the bucket holding v nanoseconds.
func bucketOf(v uint64) int {
	if v < 2*subCount {
		return int(v)
	}
	if v >= 1<<maxBits {
		v = 1<<maxBits - 1
	}
	shift := bits.Len64(v) - subBits - 1
	return (shift+1)*subCount + int(v>>shift) - subCount
}

// bucketRange returns the smallest value of bucket i and its width.
func bucketRange(i int) (lo, width uint64) {
	if i < 2*subCount {
		return uint64(i), 1
	}
	shift := i/subCount - 1
	m := uint64(i%subCount + subCount)
	return m << shift, 1 << shift
}

// Record adds d to the histogram. Negative durations are recorded as 0.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[bucketOf(uint64(d))].Add(1)
	h.count.Add(1)
	h.sum.Add(uint64(d))
	for {
		m := h.max.Load()
		if int64(d) <= m || h.max.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

// Merge adds every duration recorded in o to h. A nil o adds nothing.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil {
		return
	}
	for i := range o.counts {
		if c := o.counts[i].Load(); c != 0 {
			h.counts[i].Add(c)
		}
	}
	h.count.Add(o.count.Load())
	h.sum.Add(o.sum.Load())
	om := o.max.Load()
	for {
		m := h.max.Load()
		if om <= m || h.max.CompareAndSwap(m, om) {
			return
		}
	}
}

// Count returns the number of durations recorded.
func (h *Histogram) Count() uint64 {
	return h.count.Load()
}

// Max returns the longest duration recorded, or 0 if there is none.
func (h *Histogram) Max() time.Duration {
	return time.Duration(h.max.Load())
}

// Mean returns the mean of the durations recorded, or 0 if there is none.
func (h *Histogram) Mean() time.Duration {
	n := h.count.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns the duration below or at which a fraction q of the
// recorded durations fall: Quantile(0.5) is the median, Quantile(0.99) the
// 99th percentile and Quantile(1) the maximum. q is clamped to [0, 1].
// Quantile returns 0 if the histogram is empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.count.Load()
	if n == 0 {
		return 0
	}
	if !(q > 0) { // also NaN
		q = 0
	} else if q > 1 {
		q = 1
	}
	rank := uint64(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	} else if rank > n {
		rank = n
	}
	max := h.max.Load()
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			lo, width := bucketRange(i)
			v := int64(lo + (width-1)/2)
			if v > max {
				v = max
			}
			return time.Duration(v)
		}
	}
	// Only reached while Record runs concurrently and count is ahead of the
	// buckets.
	return time.Duration(max)
}
