package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/stack"
)

// keyCountResult is the decision API's throughput and cost, closed loop,
// over a number of distinct keys, far from their limits.
type keyCountResult struct {
	Keys   int       `json:"keys"`
	Median float64   `json:"median_rps"`
	Min    float64   `json:"min_rps"`
	Max    float64   `json:"max_rps"`
	Runs   []float64 `json:"runs_rps"`
	P99    float64   `json:"p99_ms"` // median of the runs' p99
	// ScriptCalls and Commands are per decision, on every Redis node:
	// script calls, and commands of any kind (those run inside scripts
	// counted).
	ScriptCalls float64 `json:"script_calls_per_decision"`
	Commands    float64 `json:"redis_commands_per_decision"`
	// CPU is µs of CPU per decision of the edge, the accountant, NATS and
	// Redis together; EdgeRSS the edge's resident memory after the runs, MB.
	CPU     float64 `json:"cpu_us_per_decision"`
	EdgeRSS float64 `json:"edge_rss_mb"`
}

// openKeysResult is an open-loop run at a fixed rate over many keys.
type openKeysResult struct {
	Target   string  `json:"target"`
	Keys     int     `json:"keys"`
	Offered  float64 `json:"offered_rps"`
	Achieved float64 `json:"achieved_rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	CPU      float64 `json:"cpu_us_per_decision"`
	// ScriptCalls and Commands are per decision, on every Redis node
	// (those run inside scripts counted).
	ScriptCalls float64 `json:"script_calls_per_decision"`
	Commands    float64 `json:"redis_commands_per_decision"`
	// ByProcess is CPU µs per decision of each process (the load
	// generator's left out).
	ByProcess map[string]float64 `json:"cpu_us_per_decision_by_process"`
}

// keyCounts measures the decision API in mode auto closed loop over 1, 100,
// 10,000 and 1,000,000 keys (the same keys in every run of a count), each
// beside the no-op handler; then open loop at a moderate fixed rate over
// many keys, each seen less often than its reservation would cover.
func (b *bench) keyCounts(ctx context.Context) error {
	counts := []int{1, 100, 10_000, 1_000_000}
	if b.short {
		counts = []int{1, 10_000, 1_000_000}
	}
	edge := b.edges[0]
	auto := target{"tally mode: auto", b.apiAddrs[0], "far", edge}
	for _, n := range counts {
		lt := keysTarget(auto.addr, "far", fmt.Sprintf("k%d-", n), n)
		if _, err := loadgen.ClosedLoop(ctx, lt, conns, 0, b.warm); err != nil {
			return err
		}
		b.quiesce(ctx)
		r := keyCountResult{Keys: n}
		var p99s []float64
		var before, after sample
		var decisions uint64
		for rep := range b.reps {
			s0 := b.sample(ctx, b.processes(auto))
			stop := b.profileEdge(edge, fmt.Sprintf("keys-%d", n), rep)
			res, err := loadgen.ClosedLoop(ctx, lt, conns, 0, b.satDur)
			stop()
			if err != nil {
				return err
			}
			s1 := b.sample(ctx, b.processes(auto))
			if res.Statuses[200] != res.Completed {
				return fmt.Errorf("%d keys: %d of %d responses were not 200 (%v)", n, res.Completed-res.Statuses[200], res.Completed, res.Statuses)
			}
			if rep == 0 {
				before = s0
			}
			after, decisions = s1, decisions+res.Completed
			r.Runs = append(r.Runs, res.Throughput())
			p99s = append(p99s, ms(res.Latency.Quantile(0.99)))
			fmt.Printf("  %9d keys rep %d: %8.0f req/s  p99 %v\n", n, rep+1, res.Throughput(), res.Latency.Quantile(0.99).Round(time.Microsecond))
		}
		r.Median, r.P99 = median(r.Runs), median(p99s)
		r.Min, r.Max = minMax(r.Runs)
		c := cost(before, after, decisions)
		r.ScriptCalls = c.RedisCallsPerRequest
		r.Commands = float64(after.commands-before.commands) / float64(decisions)
		for name, us := range c.CPUPerRequest {
			if name != "load generator" {
				r.CPU += us
			}
		}
		r.EdgeRSS = float64(rss(edge.Pid())) / (1 << 20)
		b.report.KeyCounts = append(b.report.KeyCounts, r)
		fmt.Printf("  %9d keys: median %.0f req/s, %.3f script calls and %.2f Redis commands per decision, %.0f µs CPU, edge %.0f MB\n",
			n, r.Median, r.ScriptCalls, r.Commands, r.CPU, r.EdgeRSS)
	}

	// Open loop: a fixed, moderate rate over many keys.
	const rate, n = 2500.0, 10_000
	b.quiesce(ctx)
	for _, t := range []target{{"no-op net/http", b.noopProc.Addr, "far", nil}, auto} {
		lt := keysTarget(t.addr, "far", "open-", n)
		before := b.sample(ctx, b.processes(t))
		stop := func() {}
		if t.edge != nil {
			stop = b.profileEdge(t.edge, "open-loop", b.reps-1)
		}
		res, err := loadgen.OpenLoop(ctx, lt, rate, 256, time.Second, b.olDur)
		stop()
		if err != nil {
			return err
		}
		after := b.sample(ctx, b.processes(t))
		o := openKeysResult{Target: t.name, Keys: n, Offered: rate, Achieved: res.Throughput(),
			P50: ms(res.Latency.Quantile(0.5)), P99: ms(res.Latency.Quantile(0.99))}
		o.ByProcess = map[string]float64{}
		// What was sampled covers the warm-up's decisions too.
		c := cost(before, after, res.Completed+res.Warmup)
		o.ScriptCalls = c.RedisCallsPerRequest
		o.Commands = float64(after.commands-before.commands) / float64(res.Completed+res.Warmup)
		for name, us := range c.CPUPerRequest {
			if name != "load generator" {
				o.CPU += us
				o.ByProcess[name] = us
			}
		}
		b.report.OpenKeys = append(b.report.OpenKeys, o)
		fmt.Printf("  %-20s %.0f req/s over %d keys: p50 %.2f ms  p99 %.2f ms  %.3f script calls, %.2f Redis commands and %.0f µs CPU per decision (%s)\n",
			t.name, rate, n, o.P50, o.P99, o.ScriptCalls, o.Commands, o.CPU, byProcess(o.ByProcess))
	}
	return nil
}

// quiesce waits until what earlier runs left behind is done (idle credit
// given back, its events applied): until no Redis node has served a
// command for half a second beyond the background's trickle, at most 15 s.
// What a run costs is then its own.
func (b *bench) quiesce(ctx context.Context) {
	_, last := b.redisCalls(ctx)
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
		_, now := b.redisCalls(ctx)
		if now-last < 50 { // leases, replica probes, this loop's own INFO
			return
		}
		last = now
	}
}

// keysTarget drives the decision API of addr under policy with n keys
// (identities prefix0 … prefix<n-1>), each request's key drawn uniformly
// (a hash of the connection and the request's number): over many keys a
// key comes back only by chance, as it would from many clients.
func keysTarget(addr, policy, prefix string, n int) loadgen.Target {
	return loadgen.Target{Addr: addr, Request: func(conn int, i uint64) []byte {
		k := mix(uint64(conn)<<40^i) % uint64(n)
		return checkRequest(policy, prefix+strconv.FormatUint(k, 10))
	}}
}

// mix is splitmix64's finaliser: a cheap, well-spread hash.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// profileEdge takes a CPU profile of edge during the last run of a step,
// when -profile is set.
func (b *bench) profileEdge(edge *stack.Proc, name string, rep int) func() {
	if b.profile == "" || rep != b.reps-1 {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		secs := max(1, int(b.satDur.Seconds())-1)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", edge.AdminAddr, secs))
		if err != nil {
			fmt.Println("  profile:", err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		_ = os.MkdirAll(b.profile, 0o755)
		_ = os.WriteFile(filepath.Join(b.profile, "edge-"+name+".pprof"), body, 0o644)
	}()
	return func() { <-done }
}

// rss is a process's resident memory in bytes (/proc/<pid>/statm).
func rss(pid int) int64 {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// keysMarkdown writes the key-count section of the report.
func (r *report) keysMarkdown(p func(string, ...any)) {
	if len(r.KeyCounts) == 0 {
		return
	}
	p("## Cost by key count")
	p("")
	p("Decision API, mode auto, closed loop, %d connections, far from the limits, over a number of distinct keys", conns)
	p("(the same keys in every run of a count, warmed up first). Median of the runs and their range; p99 is the")
	p("median of the runs' p99. Script calls and Redis commands (those run inside scripts counted) are per")
	p("decision, on every Redis node; CPU is µs per decision of the edge, the accountant, NATS and Redis together.")
	p("")
	p("| keys | requests/s (median) | range | × 1 key | p99 ms | script calls | Redis commands | CPU µs | edge RSS MB |")
	p("|---|---|---|---|---|---|---|---|---|")
	hot := r.KeyCounts[0].Median
	for _, k := range r.KeyCounts {
		p("| %d | %.0f | %.0f – %.0f | %.2f | %.2f | %.3f | %.2f | %.0f | %.0f |", k.Keys, k.Median, k.Min, k.Max, k.Median/hot,
			k.P99, k.ScriptCalls, k.Commands, k.CPU, k.EdgeRSS)
	}
	p("")
	if len(r.OpenKeys) > 0 {
		p("Open loop at a fixed rate over many keys, each seen less often than a reservation would cover:")
		p("")
		p("| target | keys | offered req/s | achieved req/s | p50 ms | p99 ms | script calls | Redis commands | CPU µs per decision | of which, by process |")
		p("|---|---|---|---|---|---|---|---|---|---|")
		for _, o := range r.OpenKeys {
			p("| %s | %d | %.0f | %.0f | %.2f | %.2f | %.3f | %.2f | %.0f | %s |", o.Target, o.Keys, o.Offered, o.Achieved, o.P50, o.P99,
				o.ScriptCalls, o.Commands, o.CPU, byProcess(o.ByProcess))
		}
		p("")
	}
}

// byProcess lists CPU µs per decision by process, largest first.
func byProcess(m map[string]float64) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return m[names[i]] > m[names[j]] })
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s %.0f", n, m[n])
	}
	return strings.Join(parts, ", ")
}
