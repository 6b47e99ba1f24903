package credit

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Benchmarks of the core alone, on the fakes: what one decision costs in
// CPU and allocations, without HTTP, Redis or NATS. The limit is one no
// key reaches, so every decision is an admission: from credit on a hot
// key; over many keys, each key's first decision of its window reserves
// (a fake call, no network).
//
//	go test -run X -bench . -benchmem ./internal/credit/

func benchHarness(b *testing.B, keys int) (*harness, []limiter.Digest) {
	return benchHarnessOf(b, keys, max(keys, 1000))
}

// benchHarnessOf is benchHarness with a table of its own size: over more
// keys than it holds, keys are evicted and come back.
func benchHarnessOf(b *testing.B, keys, table int) (*harness, []limiter.Digest) {
	b.Helper()
	t := &testing.T{}
	p := limiter.Policy{Name: "api", Limit: limiter.MaxLimit, Window: time.Hour}
	h := newHarness(t, p, true, Config{Keys: table})
	// The wall clock: a key's rate, and so the size of its reservations,
	// is measured over real time.
	var err error
	h.core, err = New(Config{Keys: table}, Deps{Reserver: h.redis, Ledger: h.ledger, Keys: h.keys,
		Producer: "edge.bench", FailOpen: true})
	if err != nil {
		b.Fatal(err)
	}
	dgs := make([]limiter.Digest, keys)
	for i := range dgs {
		dgs[i] = h.keys.Key("api", fmt.Sprint("client-", i)).Digest()
	}
	return h, dgs
}

func benchDecide(b *testing.B, keys int) {
	h, dgs := benchHarness(b, keys)
	benchDecideOn(b, h, dgs)
}

func benchDecideOn(b *testing.B, h *harness, dgs []limiter.Digest) {
	ctx := context.Background()
	var n atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := h.core.Decide(ctx, h.policy, 1, dgs[i%uint64(len(dgs))], time.Now(), i); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.StopTimer()
	h.core.Wait()
}

func BenchmarkDecideOneKey(b *testing.B)   { benchDecide(b, 1) }
func BenchmarkDecide100kKeys(b *testing.B) { benchDecide(b, 100_000) }

// BenchmarkDecideEvicted: a million keys through the default table of
// 100,000: most decisions are a key's that was evicted and comes back.
func BenchmarkDecideEvicted(b *testing.B) {
	h, dgs := benchHarnessOf(b, 1_000_000, 100_000)
	benchDecideOn(b, h, dgs)
}

// BenchmarkEntryMemory: the edge's heap per known key, after one decision
// each of 200,000 keys (a key seen once: an entry, its window, its
// reservation spent), the store answering without keeping anything. b.N is
// ignored: the figure is per key.
func BenchmarkEntryMemory(b *testing.B) {
	const n = 200_000
	h, dgs := benchHarness(b, n)
	var err error
	h.core, err = New(Config{Keys: n}, Deps{Reserver: grantAll{h.redis}, Ledger: h.ledger, Keys: h.keys,
		Producer: "edge.bench", FailOpen: true})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	scanBefore := scanBytes()
	for i, dg := range dgs {
		if _, err := h.core.Decide(ctx, h.policy, 1, dg, time.Now(), uint64(i+1)); err != nil {
			b.Fatal(err)
		}
	}
	h.core.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/n, "heap-B/key")
	// What the collector scans per key: the words of each object up to its
	// last pointer, the whole heap's (before was measured empty).
	b.ReportMetric(float64(scanBytes()-scanBefore)/n, "scan-B/key")
	// A whole collection's time with the table live, per key: what each
	// cycle costs while the edge remembers n keys.
	const cycles = 5
	start := time.Now()
	for range cycles {
		runtime.GC()
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/cycles/n, "gc-ns/key")
	runtime.KeepAlive(h)
}

// grantAll grants every reservation in full in a window opened now, and
// keeps nothing.
type grantAll struct{ *fakeRedis }

func (grantAll) Take(_ context.Context, _ limiter.Key, now time.Time, a limiter.TakeArgs) (limiter.Grant, error) {
	s := now.Truncate(time.Second)
	return limiter.Grant{Granted: a.Want, Live: true, Used: a.Want, ResetAt: s.Add(a.Window), Start: s, Opened: true,
		Mine: a.Want, Frozen: -1}, nil
}

func (g grantAll) TakeAsync(k limiter.Key, now time.Time, a limiter.TakeArgs, done func(limiter.Grant, error)) {
	go done(g.Take(context.Background(), k, now, a))
}

// scanBytes is the heap the collector scans (runtime/metrics).
func scanBytes() uint64 {
	s := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
