package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// benchEnv is a primary and a replica on the system clock, with 1,000 live
// windows: what edges and an accountant see in steady state.
func benchEnv(b *testing.B) (*redisstore.Store, []limiter.Key) {
	b.Helper()
	p, r := redistest.StartPair(b)
	ks, _ := limiter.NewKeySpace("tally", []byte("limiter-bench-secret-0123456789abcdef"))
	st := newStore(b, []shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r)}}}, ks, redisstore.Options{})
	keys := make([]limiter.Key, 1000)
	for i := range keys {
		keys[i] = ks.Key("core", fmt.Sprintf("client-%d", i))
		if _, err := st.Take(context.Background(), keys[i], time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1, Want: 1, Producer: "bench"}); err != nil {
			b.Fatal(err)
		}
	}
	r.WaitSynced(p)
	return st, keys
}

// BenchmarkCheckReplica: one read on a replica, 8 concurrent callers per
// core.
func BenchmarkCheckReplica(b *testing.B) {
	st, keys := benchEnv(b)
	var i atomic.Uint64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := st.Check(context.Background(), keys[i.Add(1)%1000]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkTakePrimary: one reservation per call on the primary (what
// mode: exact does per request), 8 concurrent callers per core.
func BenchmarkTakePrimary(b *testing.B) {
	st, keys := benchEnv(b)
	var i atomic.Uint64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_, err := st.Take(context.Background(), keys[i.Add(1)%1000], time.Now(),
				limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1, Want: 1, Producer: "bench"})
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkApply: accounting events in one script call per run, one caller
// (the accountant's shape); ns/op is per event.
func BenchmarkApply(b *testing.B) {
	for _, n := range []int{16, 256} {
		for _, named := range []bool{false, true} { // a named run keeps its answer for a retry
			b.Run(fmt.Sprintf("events=%d/run=%v", n, named), func(b *testing.B) {
				st, keys := benchEnv(b)
				var seq uint64
				run := make([]limiter.Event, n)
				var r limiter.Run
				b.ResetTimer()
				for done := 0; done < b.N; done += n {
					now := time.Now()
					for j := range run {
						seq++
						run[j] = limiter.Event{Producer: "bench", Seq: seq, Kind: limiter.Charge, Key: keys[seq%1000],
							Start: now, Window: time.Hour, Units: 1}
					}
					if named {
						r = limiter.Run{Caller: "bench-accountant", Seq: r.Seq + 1}
					}
					if _, err := st.ApplyRun(context.Background(), 0, now, r, run); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
