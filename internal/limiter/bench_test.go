package limiter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

// benchEnv is a primary and a replica on the system clock, with 1,000 live
// windows: what an edge and an accountant see in steady state.
func benchEnv(b *testing.B) (*limiter.Store, []limiter.Key) {
	b.Helper()
	p, r := redistest.StartPair(b)
	st, err := limiter.NewStore([]shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r)}}}, limiter.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = st.Close() })
	ks, _ := limiter.NewKeySpace("tally", []byte("bench"))
	keys := make([]limiter.Key, 1000)
	for i := range keys {
		keys[i] = ks.Key("core", fmt.Sprintf("client-%d", i))
		if _, _, err := st.Open(context.Background(), keys[i], minute); err != nil {
			b.Fatal(err)
		}
	}
	r.WaitSynced(p)
	return st, keys
}

// BenchmarkCheckReplica: the edge's one read, on a replica, 8 concurrent
// callers per core.
func BenchmarkCheckReplica(b *testing.B) {
	st, keys := benchEnv(b)
	ctx := context.Background()
	var n atomic.Uint64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := st.Check(ctx, keys[n.Add(1)%uint64(len(keys))]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkChargePrimary: one charge per round trip, 8 concurrent callers
// per core.
func BenchmarkChargePrimary(b *testing.B) {
	st, keys := benchEnv(b)
	ctx := context.Background()
	var n atomic.Uint64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			if _, err := st.Charge(ctx, keys[i%uint64(len(keys))], fmt.Sprint("ev-", i), t0Now(), 1, minute); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkChargePipelined: charges applied in pipelined batches, as the
// accountant does, from one caller. ns/op is per charge.
func BenchmarkChargePipelined(b *testing.B) {
	for _, batch := range []int{16, 100} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			st, keys := benchEnv(b)
			ctx := context.Background()
			ops := make([]limiter.Op, 0, batch)
			b.ResetTimer()
			for i := range b.N {
				ops = append(ops, limiter.Op{Kind: limiter.OpCharge, Key: keys[i%len(keys)],
					EventID: fmt.Sprint("ev-", i), Start: t0Now(), Cost: 1, Window: minute})
				if len(ops) == batch || i == b.N-1 {
					if _, err := st.Apply(ctx, 0, ops); err != nil {
						b.Fatal(err)
					}
					ops = ops[:0]
				}
			}
		})
	}
}

// t0Now is the wall clock: benchmark windows are real.
func t0Now() time.Time { return time.Now() }
