package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBuckets(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<maxBits; v = v + 1 + v/97 {
		i := bucketOf(v)
		require.Less(t, i, numBuckets)
		require.GreaterOrEqual(t, i, prev, "buckets must be monotonic (v=%d)", v)
		prev = i
		lo, width := bucketRange(i)
		require.True(t, lo <= v && v < lo+width, "v=%d bucket %d [%d,+%d)", v, i, lo, width)
		if v >= 2*subCount {
			require.LessOrEqual(t, float64(width)/float64(lo), 1.0/subCount)
		} else {
			require.Equal(t, uint64(1), width)
		}
	}
	assert.Equal(t, numBuckets-1, bucketOf(math.MaxUint64))
}

func TestHistogramEmpty(t *testing.T) {
	h := NewHistogram()
	assert.Zero(t, h.Count())
	assert.Zero(t, h.Quantile(0))
	assert.Zero(t, h.Quantile(0.5))
	assert.Zero(t, h.Quantile(1))
	assert.Zero(t, h.Max())
	assert.Zero(t, h.Mean())

	var z Histogram
	assert.Zero(t, z.Quantile(0.99))
}

// exactQuantile returns the value of rank ceil(q*n) of sorted.
func exactQuantile(sorted []time.Duration, q float64) time.Duration {
	r := int(math.Ceil(q * float64(len(sorted))))
	r = max(r, 1)
	return sorted[r-1]
}

func TestHistogramQuantiles(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	h := NewHistogram()
	vals := make([]time.Duration, 200000)
	var sum time.Duration
	for i := range vals {
		// Log-normal around 2ms, spanning microseconds to seconds.
		v := time.Duration(math.Exp(rng.NormFloat64()*1.5) * float64(2*time.Millisecond))
		vals[i] = v
		sum += v
		h.Record(v)
	}
	slices.Sort(vals)
	require.Equal(t, uint64(len(vals)), h.Count())
	for _, q := range []float64{0, 0.001, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1} {
		want := exactQuantile(vals, q)
		got := h.Quantile(q)
		assert.InEpsilon(t, float64(want), float64(got), 0.02, "q=%v want %v got %v", q, want, got)
	}
	assert.Equal(t, vals[len(vals)-1], h.Max())
	assert.Equal(t, vals[len(vals)-1], h.Quantile(1))
	assert.InDelta(t, float64(sum/time.Duration(len(vals))), float64(h.Mean()), 1)
}

func TestHistogramUniform(t *testing.T) {
	h := NewHistogram()
	const n = 100000
	for i := 1; i <= n; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999} {
		want := time.Duration(math.Ceil(q*n)) * time.Microsecond
		assert.InEpsilon(t, float64(want), float64(h.Quantile(q)), 0.02, "q=%v", q)
	}
	assert.Equal(t, 100*time.Millisecond, h.Max())
}

func TestHistogramExactSmallAndClamped(t *testing.T) {
	h := NewHistogram()
	h.Record(-5)
	h.Record(5)
	h.Record(200)
	assert.Equal(t, time.Duration(0), h.Quantile(0))
	assert.Equal(t, time.Duration(5), h.Quantile(0.5))
	assert.Equal(t, time.Duration(200), h.Quantile(1))

	h.Record(time.Hour) // beyond the last bucket
	assert.Equal(t, time.Hour, h.Max())
	assert.LessOrEqual(t, h.Quantile(1), time.Hour)
	assert.Greater(t, h.Quantile(1), 15*time.Minute)
	assert.Equal(t, (time.Hour+205)/4, h.Mean())
}

func TestHistogramMerge(t *testing.T) {
	all, a, b := NewHistogram(), NewHistogram(), NewHistogram()
	for i := 1; i <= 10000; i++ {
		d := time.Duration(i*i) * time.Nanosecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	m := NewHistogram()
	m.Merge(a)
	m.Merge(b)
	m.Merge(nil)
	m.Merge(NewHistogram())
	assert.Equal(t, all.Count(), m.Count())
	assert.Equal(t, all.Max(), m.Max())
	assert.Equal(t, all.Mean(), m.Mean())
	for _, q := range []float64{0, 0.3, 0.5, 0.9, 0.99, 1} {
		assert.Equal(t, all.Quantile(q), m.Quantile(q), "q=%v", q)
	}
}

func TestHistogramConcurrent(t *testing.T) {
	h := NewHistogram()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 5000 {
				h.Record(time.Duration(g*5000+i) * time.Microsecond)
			}
		})
	}
	wg.Wait()
	assert.Equal(t, uint64(20000), h.Count())
	assert.Equal(t, 19999*time.Microsecond, h.Max())
	assert.InEpsilon(t, float64(10000*time.Microsecond), float64(h.Quantile(0.5)), 0.02)
}

func BenchmarkHistogramRecord(b *testing.B) {
	h := NewHistogram()
	for i := 0; b.Loop(); i++ {
		h.Record(time.Duration(i&0xfffff) * time.Microsecond)
	}
}
