package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
		if _, err := st.Take(context.Background(), keys[i], time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit,
			Need: 1, Want: 1, Producer: "bench", Holder: "bench.1"}); err != nil {
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
// request), and each opening a new window (a key seen for the first time);
// by the windows' one holder (compact windows, lua/window.lua) and by
// several (full windows). redis-µs/op is the primary's own time per script
// call (INFO commandstats), beside the round trip.
func BenchmarkTakePrimary(b *testing.B) {
	for _, fresh := range []bool{false, true} {
		for _, compact := range []bool{true, false} {
			name := "live"
			if fresh {
				name = "fresh"
			}
			holder := "bench.1"
			if compact {
				name += "/compact"
			} else {
				name += "/full"
				holder = "bench"
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
							limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1, Want: 1, Producer: "bench",
								Holder: holder})
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
}

// BenchmarkColdWindow: what a key seen once costs its shard, Tally's take
// opening a compact window (and, for comparison, 0.1.0's path: the script
// opening a hash) beside a synchronous limiter's INCRBY and PEXPIREAT (one
// pipeline per request), on the same primary and replica,
// 8 concurrent callers per core, every key new; and a key's next
// reservation in the window it opened (tally-take-again: take.lua;
// tally-take-own: own.lua, the holder knowing the window its own); a
// sliding window's sub-window (tally-slide: slide.lua; tally-slide-again:
// one its holder reserved in twice, slide.lua reading its span record
// first; tally-slide-own: the record alone) and a new token
// bucket (tally-bucket: bucket.lua; tally-bucket-take: take.lua), and one
// of a slow refill reserved in four seconds before (tally-bucket-again:
// bucket.lua reads and writes its record), and 10,000 buckets each reserved
// in again and again by one holder (tally-bucket-warm: its periods near
// now there, compact; bucket.lua, asked as an edge asks after its take).
// primary-µs/op and replica-µs/op are each server's CPU (INFO cpu, user
// and system) per request, client-µs/op this process's; commands/op the
// primary's commands per request (those a script runs counted).
func BenchmarkColdWindow(b *testing.B) {
	for _, name := range []string{"tally-take", "tally-take-again", "tally-take-own", "tally-take-full", "tally-slide", "tally-slide-again", "tally-slide-own", "tally-bucket",
		"tally-bucket-again", "tally-bucket-warm", "tally-bucket-take", "incrby+pexpireat"} {
		b.Run(name, func(b *testing.B) {
			p, r := redistest.StartPair(b)
			ks, _ := limiter.NewKeySpace("tally", []byte("limiter-bench-secret-0123456789abcdef"))
			st := newStore(b, []shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r)}}}, ks, redisstore.Options{})
			if err := st.LoadScripts(context.Background(), 0); err != nil { // the format read, as an edge starts
				b.Fatal(err)
			}
			if !st.Compact(0) {
				b.Fatal("a new deployment's windows are not compact")
			}
			pc := p.Client()
			var i atomic.Uint64
			const again = 10_000 // windows opened before, for tally-take-again
			key := func(n uint64) limiter.Key { return ks.Key("core", fmt.Sprintf("cold-%s-%d", b.Name(), n)) }
			// A sliding window of an hour in ten sub-windows, as make bench's.
			slide := limiter.Policy{Name: "slide", Algorithm: limiter.SlidingWindow, Limit: limiter.MaxLimit, Window: 6 * time.Minute,
				Slices: 10, Align: true}
			slideArgs := func(now time.Time) limiter.TakeArgs {
				return limiter.TakeArgs{Window: slide.Window, Limit: slide.Limit, Need: 1, Want: 1, Producer: "bench",
					Holder: "bench.1", Align: true, Opens: slide.WindowAt(now), Slices: slide.Slices}
			}
			// A token bucket of a billion a minute, as make bench's: its
			// units refill within a second, and it keeps no record. The
			// bucket reserved in before refills a thousand an hour, and
			// keeps one.
			bucket := limiter.Policy{Name: "bucket"}.Bucket(limiter.MaxLimit, limiter.MaxLimit, time.Minute)
			if name == "tally-bucket-again" {
				bucket = limiter.Policy{Name: "bucket"}.Bucket(1_000_000, 1000, time.Hour)
			}
			bucketArgs := func(now time.Time, fresh bool) limiter.TakeArgs {
				return limiter.TakeArgs{Window: bucket.Window, Limit: bucket.Limit, Need: 1, Want: 1, Producer: "bench", Holder: "bench.1",
					Align: true, Opens: bucket.WindowAt(now), Slices: bucket.Slices, Rate: bucket.Rate, Every: bucket.Every, Fresh: fresh}
			}
			if name == "tally-bucket-again" {
				// Every key's bucket reserved in once, its periods quiet since.
				for n := range uint64(b.N) {
					now := time.Now()
					if _, err := st.Take(context.Background(), key(n+1), now, bucketArgs(now, true)); err != nil {
						b.Fatal(err)
					}
				}
				time.Sleep(4 * limiter.BucketPeriod)
			}
			if name == "tally-bucket-warm" {
				key = func(n uint64) limiter.Key { return ks.Key("core", fmt.Sprintf("warm-%d", n%again)) }
				for n := range uint64(again) {
					now := time.Now()
					if _, err := st.Take(context.Background(), key(n), now, bucketArgs(now, true)); err != nil {
						b.Fatal(err)
					}
				}
			}
			if name == "tally-slide-again" || name == "tally-slide-own" {
				// Every key's sub-window reserved in twice: the second
				// wrote its span record.
				key = func(n uint64) limiter.Key { return ks.Key("core", fmt.Sprintf("slide-%d", n%again)) }
				for range 2 {
					for n := range uint64(again) {
						now := time.Now()
						if _, err := st.Take(context.Background(), key(n), now, slideArgs(now)); err != nil {
							b.Fatal(err)
						}
					}
				}
			}
			if name == "tally-take-again" || name == "tally-take-own" {
				key = func(n uint64) limiter.Key { return ks.Key("core", fmt.Sprintf("again-%d", n%again)) }
				for n := range uint64(again) {
					if _, err := st.Take(context.Background(), key(n), time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit,
						Need: 1, Want: 1, Producer: "bench", Holder: "bench.1", Fresh: true}); err != nil {
						b.Fatal(err)
					}
				}
			}
			p0, r0, c0, s0 := serverCPU(b, p), serverCPU(b, r), commandTotal(b, p), selfCPU(b)
			e0 := scriptMicros(b, p)
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					k := key(i.Add(1))
					var err error
					switch name {
					case "tally-take":
						_, err = st.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1,
							Want: 1, Producer: "bench", Holder: "bench.1", Fresh: true})
					case "tally-take-again": // a window the holder opened before: the script
						_, err = st.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1,
							Want: 1, Producer: "bench", Holder: "bench.1"})
					case "tally-take-own": // the same window, its holder knowing it its own: own.lua
						_, err = st.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1,
							Want: 1, Producer: "bench", Holder: "bench.1", Own: true})
					case "tally-slide", "tally-slide-again": // a sub-window: the script, which reads the span's
						now := time.Now()
						a := slideArgs(now)
						a.Fresh = name == "tally-slide" // a key the edge never reserved, as an edge says
						_, err = st.Take(ctx, k, now, a)
					case "tally-slide-own": // the holder's own sub-window, its span record holding: the record alone
						now := time.Now()
						a := slideArgs(now)
						a.Own = true
						_, err = st.Take(ctx, k, now, a)
					case "tally-bucket", "tally-bucket-again", "tally-bucket-take": // bucket.lua; without Fresh, take.lua
						now := time.Now()
						_, err = st.Take(ctx, k, now, bucketArgs(now, name != "tally-bucket-take"))
					case "tally-bucket-warm":
						now := time.Now()
						a := bucketArgs(now, false)
						a.Own = true
						_, err = st.Take(ctx, k, now, a)
					case "tally-take-full": // 0.1.0's path: the script, the hash
						_, err = st.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1,
							Want: 1, Producer: "bench", Holder: "bench"})
					default:
						reset := time.Now().Truncate(time.Second).Add(time.Hour)
						pipe := pc.Pipeline()
						pipe.IncrBy(ctx, k.String(), 1)
						pipe.PExpireAt(ctx, k.String(), reset.Add(time.Minute))
						_, err = pipe.Exec(ctx)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			s1 := selfCPU(b)
			r.WaitSynced(p)
			n := float64(b.N)
			b.ReportMetric((s1-s0)/n, "client-µs/op")
			b.ReportMetric((serverCPU(b, p)-p0)/n, "primary-µs/op")
			b.ReportMetric((serverCPU(b, r)-r0)/n, "replica-µs/op")
			b.ReportMetric(float64(commandTotal(b, p)-c0-2)/n, "commands/op") // less the INFOs that read it
			if e1 := scriptMicros(b, p); e1.calls > e0.calls {
				b.ReportMetric((e1.us-e0.us)/float64(e1.calls-e0.calls), "script-µs/call")
			}
		})
	}
}

// selfCPU is this process's CPU time so far, µs (user and system): the
// client's side of what a benchmark sends.
func selfCPU(b *testing.B) float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e3
}

// serverCPU is a Redis server's CPU time so far, µs (INFO cpu).
func serverCPU(b *testing.B, s *redistest.Server) float64 {
	info, err := s.Client().Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var us float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				sec, _ := strconv.ParseFloat(v, 64)
				us += sec * 1e6
			}
		}
	}
	return us
}

// commandTotal is how many commands a server ran (INFO commandstats).
func commandTotal(b *testing.B, s *redistest.Server) int64 {
	var n int64
	for _, calls := range commandCalls(b, s.Client()) {
		n += calls
	}
	return n
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

// BenchmarkTakeSentinel: BenchmarkTakePrimary/live on a Sentinel shard (a
// primary, a replica, one sentinel): a reservation there is the same call
// as on a shard of fixed addresses (a reseed, not a WAIT, keeps what a
// failover would lose: reseed.go).
func BenchmarkTakeSentinel(b *testing.B) {
	p, r := redistest.StartPair(b)
	sentinels := p.StartSentinels(b, "s0", 1, 1, time.Second)
	r.WaitLinkUp()
	ks, _ := limiter.NewKeySpace("tally", []byte("limiter-bench-secret-0123456789abcdef"))
	st := newStore(b, []shard.Config{{Name: "s0", Sentinel: &shard.Sentinel{Master: "s0", Addrs: sentinels}}}, ks, redisstore.Options{})
	keys := make([]limiter.Key, 1000)
	for i := range keys {
		keys[i] = ks.Key("core", fmt.Sprintf("client-%d", i))
	}
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

// BenchmarkReseed: claims re-asserted in pipelines of 128, as a reseed sends
// an edge's table: into windows the primary holds (seeded) and into
// windows it lost (opened). ns/op is per window.
func BenchmarkReseed(b *testing.B) {
	for _, lost := range []bool{false, true} {
		name := "seeded"
		if lost {
			name = "opened"
		}
		b.Run(name, func(b *testing.B) {
			st, keys, primary := benchEnvWithPrimary(b)
			ctx := context.Background()
			g, err := st.Take(ctx, keys[0], time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Producer: "bench"})
			if err != nil {
				b.Fatal(err)
			}
			claims := make([]limiter.Claim, 128)
			before := scriptMicros(b, primary)
			b.ResetTimer()
			for done := 0; done < b.N; done += len(claims) {
				if lost {
					b.StopTimer()
					if err := primary.Client().FlushDB(ctx).Err(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				for j := range claims {
					claims[j] = limiter.Claim{Key: keys[(done+j)%len(keys)], Window: time.Hour, ResetAt: g.ResetAt, Start: g.Start,
						Holder: "bench", Producer: "bench", Reserved: int64(done/len(claims) + 2), GivenBack: 1, From: 1, To: 9}
				}
				if err := st.SendClaims(ctx, 0, "00000000000000be", claims); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			after := scriptMicros(b, primary)
			if calls := after.calls - before.calls; calls > 0 {
				b.ReportMetric((after.us-before.us)/float64(calls), "redis-µs/op")
			}
		})
	}
}

// BenchmarkWindowMemory: a primary's memory per window, 1,000,000 windows
// opened on an empty primary — Tally's compact windows (as a cold take
// opens them), its full windows (0.1.0's hash), and a synchronous limiter's
// counters (envoyproxy/ratelimit's key layout: domain, descriptor, the
// window's start) — by INFO memory's used_memory and by MEMORY USAGE of one
// key. b.N is ignored: the figures are per window.
func BenchmarkWindowMemory(b *testing.B) {
	const n, workers = 1_000_000, 16
	for _, form := range []string{"compact", "full", "incrby"} {
		b.Run(form, func(b *testing.B) {
			p, r := redistest.StartPair(b)
			ks, _ := limiter.NewKeySpace("tally", []byte("limiter-bench-secret-0123456789abcdef"))
			st := newStore(b, []shard.Config{{Name: "s0", Primary: node(p), Replicas: []shard.Node{node(r)}}}, ks, redisstore.Options{})
			if err := st.LoadScripts(context.Background(), 0); err != nil {
				b.Fatal(err)
			}
			ctx, pc := context.Background(), p.Client()
			used := func() int64 {
				info := pc.Info(ctx, "memory").Val()
				for _, line := range strings.Split(info, "\n") {
					if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
						m, _ := strconv.ParseInt(v, 10, 64)
						return m
					}
				}
				b.Fatal("no used_memory")
				return 0
			}
			before := used()
			now := time.Now()
			ref := func(i int) string {
				return fmt.Sprintf("bench_remote_address_10.%d.%d.%d_%d", i>>16, i>>8&255, i&255, now.Unix()/60*60)
			}
			var sample atomic.Value
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := w; i < n; i += workers {
						k := ks.Key("core", fmt.Sprintf("10.%d.%d.%d", i>>16, i>>8&255, i&255))
						var err error
						switch form {
						case "compact", "full":
							holder := "edge.4f1c9a0b12d3e5f6.1"
							if form == "full" {
								holder = "edge.4f1c9a0b12d3e5f6"
							}
							_, err = st.Take(ctx, k, now, limiter.TakeArgs{Window: time.Minute, Limit: 100, Need: 1, Want: 1,
								Producer: "edge.4f1c9a0b12d3e5f6", Holder: holder, Fresh: true})
							sample.Store(k.String())
						default:
							pipe := pc.Pipeline()
							pipe.IncrBy(ctx, ref(i), 1)
							pipe.Expire(ctx, ref(i), time.Minute)
							_, err = pipe.Exec(ctx)
							sample.Store(ref(i))
						}
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(used()-before)/n, "used_memory-B/window")
			b.ReportMetric(float64(pc.MemoryUsage(ctx, sample.Load().(string)).Val()), "MEMORY-USAGE-B/key")
		})
	}
}
