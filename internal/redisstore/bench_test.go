package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	st, keys, _ := benchEnvWithPrimary(b)
	return st, keys
}

func benchEnvWithPrimary(b *testing.B) (*redisstore.Store, []limiter.Key, *redistest.Server) {
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
	return st, keys, p
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

// BenchmarkTakePrimary: one reservation per call on the primary, 8
// concurrent callers per core: in live windows (what mode exact does per
// request), and each opening a new window (a key seen for the first time).
// redis-µs/op is the primary's own time per script call (INFO
// commandstats), beside the round trip.
func BenchmarkTakePrimary(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		name := "live"
		if fresh {
			name = "fresh"
		}
		b.Run(name, func(b *testing.B) {
			st, keys, primary := benchEnvWithPrimary(b)
			var i atomic.Uint64
			ks, _ := limiter.NewKeySpace("tally", []byte("limiter-bench-secret-0123456789abcdef"))
			before := scriptMicros(b, primary)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					n := i.Add(1)
					k := keys[n%1000]
					if fresh {
						k = ks.Key("core", fmt.Sprintf("fresh-%s-%d", b.Name(), n))
					}
					_, err := st.Take(context.Background(), k, time.Now(),
						limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1, Want: 1, Producer: "bench"})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			after := scriptMicros(b, primary)
			if calls := after.calls - before.calls; calls > 0 {
				b.ReportMetric((after.us-before.us)/float64(calls), "redis-µs/op")
			}
		})
	}
}

type scriptStats struct {
	calls int64
	us    float64
}

// scriptMicros reads the primary's EVALSHA count and time.
func scriptMicros(b *testing.B, p *redistest.Server) (st scriptStats) {
	info, err := p.Client().Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
			f := strings.Split(rest, ",")
			st.calls, _ = strconv.ParseInt(f[0], 10, 64)
			st.us, _ = strconv.ParseFloat(strings.TrimPrefix(f[1], "usec="), 64)
		}
	}
	return st
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
