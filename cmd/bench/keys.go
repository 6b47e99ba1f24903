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
	"sync"
	"time"

	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/stack"
)

// keyCountResult is a target's throughput and cost, closed loop, over a
// number of distinct keys, far from their limits.
type keyCountResult struct {
	Target string    `json:"target"`
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
	// ByCommand is Redis commands per decision by name, every node's.
	ByCommand map[string]float64 `json:"redis_commands_per_decision_by_name"`
	// CPU is µs of CPU per decision of the target's processes (Tally's
	// edge, accountant, NATS and Redis; a peer's service and Redis);
	// RSS the memory of the process that decides after the runs, MB.
	CPU float64 `json:"cpu_us_per_decision"`
	RSS float64 `json:"rss_mb"`
	// ByProcess is CPU µs per decision of each process (the load
	// generator's included, and not in CPU).
	ByProcess map[string]float64 `json:"cpu_us_per_decision_by_process"`
}

// openKeysResult is an open-loop run at a fixed rate over many keys.
type openKeysResult struct {
	Target   string  `json:"target"`
	Keys     int     `json:"keys"`
	Offered  float64 `json:"offered_rps"`
	Achieved float64 `json:"achieved_rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"` // the rounds' median
	// P99Min and P99Max are the rounds' range; P99Runs each round's.
	P99Min  float64   `json:"p99_min_ms"`
	P99Max  float64   `json:"p99_max_ms"`
	P99Runs []float64 `json:"p99_runs_ms"`
	CPU     float64   `json:"cpu_us_per_decision"`
	// ScriptCalls and Commands are per decision, on every Redis node
	// (those run inside scripts counted).
	ScriptCalls float64 `json:"script_calls_per_decision"`
	Commands    float64 `json:"redis_commands_per_decision"`
	// ByProcess is CPU µs per decision of each process (the load
	// generator's left out).
	ByProcess map[string]float64 `json:"cpu_us_per_decision_by_process"`
}

// The open loop over many keys: a moderate fixed rate, each key seen far
// less often than a reservation would cover.
const (
	openRate = 3000.0
	openKeys = 1_000_000
)

// The key counts' targets over gRPC: Envoy's rate-limit service, Tally's
// edge and envoyproxy/ratelimit's own port.
const (
	tallyGRPC     = "tally: Envoy's rate-limit service (gRPC)"
	tallySliding  = "tally: sliding window"
	tallyInFlight = "tally: concurrency limit"
	tallyBucket   = "tally: token bucket"
	tallyBeside   = "tally mode: auto, beside the sliding window, the concurrency limit and the token bucket"
	referenceGRPC = referenceName + " (gRPC)"
)

// keyTarget is a target of the key counts: one that answers the decision
// API (or a peer's HTTP endpoint), or, with grpc, Envoy's rate-limit
// service at addr.
type keyTarget struct {
	target
	grpc bool
	// profile names the target's edge profiles (keys-<n><profile>) when
	// several targets run on edges: "" for the first.
	profile string
	// keys begins the names of its keys ("k" when empty): a step whose
	// keys must be new to Redis and to every edge names its own.
	keys string
}

// closedLoop drives t closed loop over n keys for d.
func (b *bench) closedLoop(ctx context.Context, t keyTarget, n int, d time.Duration) (loadgen.Result, error) {
	if t.grpc {
		return grpcClosedLoop(ctx, t.addr, grpcKeys{fmt.Sprintf("g%d-", n), n}, d)
	}
	prefix := t.keys
	if prefix == "" {
		prefix = "k"
	}
	return loadgen.ClosedLoop(ctx, b.keysTarget(t.target, fmt.Sprintf("%s%d-", prefix, n), n), conns, 0, d)
}

// openLoop drives t at openRate over openKeys keys for b.olDur after a
// second of warm-up.
func (b *bench) openLoop(ctx context.Context, t keyTarget) (loadgen.Result, error) {
	if t.grpc {
		return grpcOpenLoop(ctx, t.addr, grpcKeys{"open-g", openKeys}, openRate, 256, time.Second, b.olDur)
	}
	return loadgen.OpenLoop(ctx, b.keysTarget(t.target, "open-", openKeys), openRate, 256, time.Second, b.olDur)
}

// keyCounts measures the decision API in mode auto closed loop over 1, 100,
// 10,000 and 1,000,000 keys (the same keys in every run of a count), and
// Envoy's rate-limit service over gRPC, with envoyproxy/ratelimit beside
// each when given; then each, and the no-op handler, open loop at a
// moderate fixed rate over a million keys.
func (b *bench) keyCounts(ctx context.Context) error {
	counts := []int{1, 100, 10_000, 1_000_000}
	if b.short {
		counts = []int{1, 10_000, 1_000_000}
	}
	auto := target{"tally mode: auto", b.apiAddrs[0], "far", b.edges[0], nil}
	targets := []keyTarget{{target: auto}}
	if b.reference != nil {
		targets = append(targets, keyTarget{target: *b.reference})
	}
	targets = append(targets, keyTarget{target: target{tallyGRPC, b.rlsAddr, "", b.edges[0], nil}, grpc: true})
	if b.reference != nil {
		targets = append(targets, keyTarget{target: target{referenceGRPC, b.referenceGRPC, "", nil, b.reference.procs}, grpc: true})
	}
	for _, n := range counts {
		rs, err := b.keyCount(ctx, targets, n)
		if err != nil {
			return err
		}
		b.report.KeyCounts = append(b.report.KeyCounts, rs...)
	}

	b.quiesce(ctx)
	// The open loop runs in rounds too, interleaved: one run's p99 is its
	// 60 slowest of 18,000 requests, and the shared machine moves it.
	ol := append([]keyTarget{{target: target{"no-op net/http", b.noopProc.Addr, "far", nil, nil}}}, targets...)
	runs := make([]openRuns, len(ol))
	for rep := range b.reps {
		for i, t := range ol {
			before := b.sample(ctx, b.processes(t.target))
			stop := func() {}
			if t.edge != nil {
				name := "open-loop"
				if t.grpc {
					name = "open-loop-grpc"
				}
				stop = b.profileEdge(t.edge, name, rep)
			}
			res, err := b.openLoop(ctx, t)
			stop()
			if err != nil {
				return fmt.Errorf("%s, open loop: %w", t.name, err)
			}
			after := b.sample(ctx, b.processes(t.target))
			runs[i].add(res, before, after)
			fmt.Printf("  %-42s %.0f req/s over %d keys, rep %d: p50 %.2f ms  p99 %.2f ms\n", t.name, openRate, openKeys, rep+1,
				ms(res.Latency.Quantile(0.5)), ms(res.Latency.Quantile(0.99)))
		}
	}
	for i, t := range ol {
		o := runs[i].result(t.name)
		b.report.OpenKeys = append(b.report.OpenKeys, o)
		fmt.Printf("  %-42s %.0f req/s over %d keys: p50 %.2f ms  p99 %.2f ms (%.2f – %.2f)  %.3f script calls, %.2f Redis commands and %.0f µs CPU per decision (%s)\n",
			t.name, openRate, openKeys, o.P50, o.P99, o.P99Min, o.P99Max, o.ScriptCalls, o.Commands, o.CPU, byProcess(o.ByProcess))
	}
	return nil
}

// openRuns are one target's open-loop rounds: its latencies by round, and
// what its processes spent over all of them.
type openRuns struct {
	p50, p99, achieved []float64
	decisions          uint64
	cpu                map[string]float64 // µs, all rounds
	calls, commands    float64            // all rounds
}

// add takes in one round, res, sampled before and after.
func (o *openRuns) add(res loadgen.Result, before, after sample) {
	n := res.Completed + res.Warmup // what was sampled covers the warm-up too
	o.p50 = append(o.p50, ms(res.Latency.Quantile(0.5)))
	o.p99 = append(o.p99, ms(res.Latency.Quantile(0.99)))
	o.achieved = append(o.achieved, res.Throughput())
	c := cost(before, after, n)
	if o.cpu == nil {
		o.cpu = map[string]float64{}
	}
	for name, us := range c.CPUPerRequest {
		o.cpu[name] += us * float64(n)
	}
	o.calls += c.RedisCallsPerRequest * float64(n)
	o.commands += float64(after.commands - before.commands)
	o.decisions += n
}

// result is the rounds' medians, the p99's range, and the cost per
// decision over all of them (the load generator's left out).
func (o *openRuns) result(target string) openKeysResult {
	lo, hi := minMax(o.p99)
	r := openKeysResult{Target: target, Keys: openKeys, Offered: openRate, Achieved: median(o.achieved), P50: median(o.p50),
		P99: median(o.p99), P99Min: lo, P99Max: hi, P99Runs: o.p99, ByProcess: map[string]float64{}}
	if o.decisions == 0 {
		return r
	}
	n := float64(o.decisions)
	r.ScriptCalls, r.Commands = o.calls/n, o.commands/n
	for name, us := range o.cpu {
		if name != "load generator" {
			r.CPU += us / n
			r.ByProcess[name] = us / n
		}
	}
	return r
}

// slidingBeside measures a sliding window, a concurrency limit (two
// sub-windows of its lease, its requests never finished: the decision API's
// checks alone) and a token bucket far from their limits beside the fixed
// window, on one key
// (every decision from memory) and over a million (a reservation a
// decision), closed loop, interleaved. They run last, each on a new edge of
// its own, the fixed window too: their sub-windows, a key each, stay in
// Redis for the span's length, and must not weigh on the measurements
// against the reference; and an edge's table holds 100,000 keys, so
// targets that shared one would evict each other's entries, and a fixed
// window on the first edge would find the entries of the steps before.
// Their keys are named apart from the steps before ("a"): the fixed
// window's would otherwise be windows another edge opened, which a new
// edge reserves in as another holder, through take.lua and a hash.
func (b *bench) slidingBeside(ctx context.Context) error {
	if err := b.startEdges(ctx, 5); err != nil {
		return err
	}
	defer b.stopEdges(1)
	fixed := keyTarget{target: target{tallyBeside, b.apiAddrs[1], "far", b.edges[1], nil}, keys: "a"}
	sliding := keyTarget{target: target{tallySliding, b.apiAddrs[2], "far-sliding", b.edges[2], nil}, profile: "-sliding", keys: "a"}
	inflight := keyTarget{target: target{tallyInFlight, b.apiAddrs[3], "far-concurrency", b.edges[3], nil}, profile: "-concurrency", keys: "a"}
	bucket := keyTarget{target: target{tallyBucket, b.apiAddrs[4], "far-bucket", b.edges[4], nil}, profile: "-bucket", keys: "a"}
	for _, n := range []int{1, 1_000_000} {
		rs, err := b.keyCount(ctx, []keyTarget{fixed, sliding, inflight, bucket}, n)
		if err != nil {
			return err
		}
		b.report.KeyCounts = append(b.report.KeyCounts, rs...)
	}
	return nil
}

// keyCount runs each target closed loop over n keys: a warm-up of each
// that sees them, then the runs, the targets' interleaved (each round runs
// every target once), so that what else the machine does weighs on them
// alike. A target's cost is summed over its own runs.
func (b *bench) keyCount(ctx context.Context, targets []keyTarget, n int) ([]keyCountResult, error) {
	for _, t := range targets {
		if _, err := b.closedLoop(ctx, t, n, b.warm); err != nil {
			return nil, err
		}
	}
	b.quiesce(ctx)
	rs := make([]keyCountResult, len(targets))
	p99s := make([][]float64, len(targets))
	sums := make([]sample, len(targets))
	decisions := make([]uint64, len(targets))
	for rep := range b.reps {
		for i, t := range targets {
			s0 := b.sample(ctx, b.processes(t.target))
			stop := func() {}
			if t.edge != nil && !t.grpc {
				stop = b.profileEdge(t.edge, fmt.Sprintf("keys-%d%s", n, t.profile), rep)
			}
			res, err := b.closedLoop(ctx, t, n, b.satDur)
			stop()
			if err != nil {
				return nil, err
			}
			s1 := b.sample(ctx, b.processes(t.target))
			if res.Statuses[200] != res.Completed {
				return nil, fmt.Errorf("%s, %d keys: %d of %d responses were not 200 (%v)", t.name, n, res.Completed-res.Statuses[200], res.Completed, res.Statuses)
			}
			sums[i].add(s0, s1)
			decisions[i] += res.Completed
			rs[i].Runs = append(rs[i].Runs, res.Throughput())
			p99s[i] = append(p99s[i], ms(res.Latency.Quantile(0.99)))
			fmt.Printf("  %-42s %9d keys rep %d: %8.0f req/s  p99 %v\n", t.name, n, rep+1, res.Throughput(), res.Latency.Quantile(0.99).Round(time.Microsecond))
		}
	}
	for i, t := range targets {
		r := &rs[i]
		r.Target, r.Keys = t.name, n
		r.Median, r.P99 = median(r.Runs), median(p99s[i])
		r.Min, r.Max = minMax(r.Runs)
		c := cost(sample{}, sums[i], decisions[i])
		r.ScriptCalls = c.RedisCallsPerRequest
		r.Commands = float64(sums[i].commands) / float64(decisions[i])
		r.ByCommand = map[string]float64{}
		for name, v := range sums[i].byCommand {
			if per := float64(v) / float64(decisions[i]); per >= 0.005 {
				r.ByCommand[name] = per
			}
		}
		r.ByProcess = c.CPUPerRequest
		for name, us := range c.CPUPerRequest {
			if name != "load generator" {
				r.CPU += us
			}
		}
		decider := t.edge
		if decider == nil {
			decider = t.procs["ratelimit"][0]
		}
		r.RSS = float64(rss(decider.Pid())) / (1 << 20)
		fmt.Printf("  %-42s %9d keys: median %.0f req/s, %.3f script calls and %.2f Redis commands per decision (%s), %.0f µs CPU (%s), %.0f MB\n",
			t.name, n, r.Median, r.ScriptCalls, r.Commands, byCommand(r.ByCommand), r.CPU, byProcess(r.ByProcess), r.RSS)
	}
	return rs, nil
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

// keysTarget drives t with n keys (identities prefix0 … prefix<n-1>), each
// request's key drawn uniformly (a hash of the connection and the
// request's number): over many keys a key comes back only by chance, as it
// would from many clients. Tally and the no-op handler get decision-API
// requests under t's policy; a peer its own.
func (b *bench) keysTarget(t target, prefix string, n int) loadgen.Target {
	request := func(id string) []byte { return checkRequest(t.policy, id) }
	if t.procs != nil {
		request = referenceRequest
	}
	return loadgen.Target{Addr: t.addr, Request: func(conn int, i uint64) []byte {
		k := mix(uint64(conn)<<40^i) % uint64(n)
		return request(prefix + strconv.FormatUint(k, 10))
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

// profileEdge takes a CPU profile of edge, and one of what it allocated,
// during the last run of a step,
// when -profile is set.
func (b *bench) profileEdge(edge *stack.Proc, name string, rep int) func() {
	if b.profile == "" || rep != b.reps-1 {
		return func() {}
	}
	var wg sync.WaitGroup
	secs := max(1, int(b.satDur.Seconds())-1)
	// CPU, and what was allocated over the same seconds; and, in the open
	// loop, an execution trace (what a slow request waited for).
	kinds := map[string]string{"profile": "edge-" + name + ".pprof", "allocs": "edge-" + name + ".allocs.pprof"}
	if strings.HasPrefix(name, "open-loop") {
		kinds["trace"] = "edge-" + name + ".trace"
	}
	for kind, file := range kinds {
		wg.Go(func() {
			resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", edge.AdminAddr, kind, secs))
			if err != nil {
				fmt.Println("  profile:", err)
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			_ = os.MkdirAll(b.profile, 0o755)
			_ = os.WriteFile(filepath.Join(b.profile, file), body, 0o644)
		})
	}
	return wg.Wait
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
	p("Decision API, mode auto, closed loop, %d connections, and Envoy's rate-limit service over gRPC (%d connections,", conns, grpcConns)
	p("%d calls in flight, one descriptor per call), far from the limits, over a number of distinct keys", conns)
	p("(the same keys in every run of a count, warmed up first), and %s beside each when the run", referenceName)
	p("was given its binary (`make bench BENCHFLAGS=-ratelimit=PATH`), the targets' runs interleaved (each round runs")
	p("every target once). Median of the runs and their range; × 1 key")
	p("is against the same target's median over one key; p99 is the median of the runs' p99. Script calls and Redis")
	p("commands (those run inside scripts counted) are per decision, on every Redis node; CPU is µs per decision of")
	p("the target's processes together (Tally: the edge, the accountant, NATS and four Redis servers; %s:", referenceName)
	p("the service, its Redis primary and replica), the load generator's apart; RSS is the deciding process's.")
	p("Last, on one key and over a million, %s (a policy of an hour in 10 sub-windows, far from its limit) and", tallySliding)
	p("%s (a lease of 30 minutes, its requests never finished: decision API checks alone, far from its limit)", tallyInFlight)
	p("and %s (a billion a minute, far from its limit), beside the fixed window (%s), the four", tallyBucket, tallyBeside)
	p("interleaved, each on a new edge of its own (an edge's table holds 100,000 keys: targets sharing one")
	p("would evict each other's entries) and over keys no step before used: their sub-windows stay in Redis")
	p("for the span's length, so they run after the measurements against %s.", referenceName)
	p("")
	p("| target | keys | requests/s (median) | range | × 1 key | p99 ms | script calls | Redis commands | by name | CPU µs | of which, by process (µs) | RSS MB |")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|")
	hot := map[string]float64{}
	for _, k := range r.KeyCounts {
		if _, ok := hot[k.Target]; !ok {
			hot[k.Target] = k.Median
		}
		p("| %s | %d | %.0f | %.0f – %.0f | %.2f | %.2f | %.3f | %.2f | %s | %.0f | %s | %.0f |", k.Target, k.Keys, k.Median, k.Min, k.Max,
			k.Median/hot[k.Target], k.P99, k.ScriptCalls, k.Commands, byCommand(k.ByCommand), k.CPU, byProcess(k.ByProcess), k.RSS)
	}
	p("")
	if len(r.OpenKeys) > 0 {
		p("Open loop at a fixed rate over many keys, each seen less often than a reservation would cover (rounds interleaved;")
		p("medians, the p99's range in brackets, CPU and commands over all rounds):")
		p("")
		p("| target | keys | offered req/s | achieved req/s | p50 ms | p99 ms | script calls | Redis commands | CPU µs per decision | of which, by process |")
		p("|---|---|---|---|---|---|---|---|---|---|")
		for _, o := range r.OpenKeys {
			p("| %s | %d | %.0f | %.0f | %.2f | %.2f [%.2f – %.2f] | %.3f | %.2f | %.0f | %s |", o.Target, o.Keys, o.Offered, o.Achieved, o.P50,
				o.P99, o.P99Min, o.P99Max, o.ScriptCalls, o.Commands, o.CPU, byProcess(o.ByProcess))
		}
		p("")
	}
	r.historyMarkdown(p)
}

// keyTargets writes the targets over many keys, against envoyproxy/ratelimit
// in the same run, over HTTP (the decision API against its JSON endpoint)
// and over gRPC (Envoy's rate-limit service, both): over 1M keys 1.5× its
// decisions per second at 0.8× its CPU per decision, and at a fixed rate
// over 1M keys a p99 at most its and 0.8× its CPU per decision, over both;
// over HTTP, over 10k keys 2× and over 1 and 100 keys 2.3× (over gRPC
// those are measured).
func (r *report) keyTargets(p func(string, ...any), check func(bool) string) {
	for _, alg := range [][2]string{{tallySliding, "sliding window"}, {tallyInFlight, "concurrency limit"}, {tallyBucket, "token bucket"}} {
		other, fixed := r.keyPair(alg[0], tallyBeside)
		for _, n := range []int{1, 1_000_000} {
			t, ok1 := other[n]
			f, ok2 := fixed[n]
			if !ok1 || !ok2 || f.Median == 0 {
				continue
			}
			lo, hi := roundRatios(t, f)
			p("| %s over %d keys ≥ 0.9× the fixed window's decisions per second (decision API, far from the limits) | %.2f× (%.0f against %.0f req/s; rounds %.2f – %.2f) | %s |",
				alg[1], n, t.Median/f.Median, t.Median, f.Median, lo, hi, check(t.Median >= 0.9*f.Median))
		}
	}
	for _, pair := range [][3]string{{"tally mode: auto", referenceName, "decision API"}, {tallyGRPC, referenceGRPC, "gRPC rate-limit service"}} {
		mine, peer := r.keyPair(pair[0], pair[1])
		for _, n := range []int{1, 100, 10_000, 1_000_000} {
			t, ok1 := mine[n]
			ref, ok2 := peer[n]
			if !ok1 || !ok2 || ref.Median == 0 {
				continue
			}
			lo, hi := roundRatios(t, ref)
			want := map[int]float64{1: 2.3, 100: 2.3, 10_000: 2, 1_000_000: 1.5}[n]
			if pair[0] == tallyGRPC && n != 1_000_000 { // over gRPC the targets are a million keys'
				p("| %s over %d keys against %s's decisions per second: measured (no target) | %.2f× (%.0f against %.0f req/s; rounds %.2f – %.2f) | measured |",
					pair[2], n, pair[1], t.Median/ref.Median, t.Median, ref.Median, lo, hi)
				continue
			}
			p("| %s over %d keys ≥ %.1f× %s's decisions per second | %.2f× (%.0f against %.0f req/s; rounds %.2f – %.2f) | %s |",
				pair[2], n, want, pair[1], t.Median/ref.Median, t.Median, ref.Median, lo, hi, check(t.Median >= want*ref.Median))
			if n == 1_000_000 {
				p("| %s over %d keys: CPU per decision ≤ 0.8× %s's (whole stack) | %.0f µs against %.0f µs (%.2f×) | %s |",
					pair[2], n, pair[1], t.CPU, ref.CPU, t.CPU/ref.CPU, check(t.CPU <= 0.8*ref.CPU))
			}
		}
		tally, other := r.openPair(pair[0], pair[1])
		if tally == nil {
			continue
		}
		if other == nil {
			p("| %s, %.0f req/s over %d keys: p99 and CPU per decision against %s's | p99 %.2f ms, %.0f µs; %s not measured in this run | not measured |",
				pair[2], tally.Offered, tally.Keys, referenceName, tally.P99, tally.CPU, referenceName)
			continue
		}
		p("| %s, %.0f req/s over %d keys: p99 ≤ %s's (medians of the rounds) | %.2f ms [%.2f – %.2f] against %.2f ms [%.2f – %.2f] | %s |", pair[2],
			tally.Offered, tally.Keys, pair[1], tally.P99, tally.P99Min, tally.P99Max, other.P99, other.P99Min, other.P99Max,
			check(tally.P99 <= other.P99))
		p("| %s, %.0f req/s over %d keys: CPU per decision ≤ 0.8× %s's (service and Redis) | %.0f µs against %.0f µs (%.2f×) | %s |", pair[2],
			tally.Offered, tally.Keys, pair[1], tally.CPU, other.CPU, tally.CPU/other.CPU, check(tally.CPU <= 0.8*other.CPU))
	}
}

// keyPair is the key-count results of two targets, by key count.
func (r *report) keyPair(a, b string) (map[int]keyCountResult, map[int]keyCountResult) {
	ra, rb := map[int]keyCountResult{}, map[int]keyCountResult{}
	for _, k := range r.KeyCounts {
		switch k.Target {
		case a:
			ra[k.Keys] = k
		case b:
			rb[k.Keys] = k
		}
	}
	return ra, rb
}

// openPair is the open-loop results of two targets over many keys (nil
// when not measured).
func (r *report) openPair(a, b string) (ra, rb *openKeysResult) {
	for i := range r.OpenKeys {
		switch r.OpenKeys[i].Target {
		case a:
			ra = &r.OpenKeys[i]
		case b:
			rb = &r.OpenKeys[i]
		}
	}
	return ra, rb
}

// roundRatios are the lowest and highest of t's runs against ref's, round
// by round (the runs are interleaved).
func roundRatios(t, ref keyCountResult) (lo, hi float64) {
	ratios := make([]float64, 0, len(t.Runs))
	for i := range min(len(t.Runs), len(ref.Runs)) {
		ratios = append(ratios, t.Runs[i]/ref.Runs[i])
	}
	return minMax(ratios)
}

// firstMeasured is the decision API against envoyproxy/ratelimit's /json as
// first measured side by side, on 2026-11-25 (3 interleaved rounds, closed
// loop, 32 connections; medians and the rounds' range), per key count: what
// the key-count figures of each run are set beside.
var firstMeasured = map[int]struct{ ratio, lo, hi, cpu float64 }{
	1:         {2.39, 2.13, 2.51, 0.32},
	100:       {2.59, 2.00, 2.74, 0.30},
	10_000:    {1.20, 0.95, 1.49, 0.87},
	1_000_000: {0.77, 0.71, 0.91, 1.44},
}

// historyMarkdown sets this run's decision API against envoyproxy/ratelimit
// beside the first such measurement (firstMeasured), when the run measured
// the reference.
func (r *report) historyMarkdown(p func(string, ...any)) {
	mine, peer := r.keyPair("tally mode: auto", referenceName)
	if len(peer) == 0 {
		return
	}
	p("The decision API against %s's `/json` in this run, beside the first time the two were measured side by", referenceName)
	p("side (2026-11-25, 3 rounds; the same generator and reference build, envoyproxy/ratelimit f2fb157):")
	p("")
	p("| keys | Tally / reference, 2026-11-25 | Tally / reference, this run | CPU per decision, Tally / reference, 2026-11-25 | this run |")
	p("|---|---|---|---|---|")
	for _, n := range []int{1, 100, 10_000, 1_000_000} {
		t, ok1 := mine[n]
		ref, ok2 := peer[n]
		then, ok3 := firstMeasured[n]
		if !ok1 || !ok2 || !ok3 || ref.Median == 0 || ref.CPU == 0 {
			continue
		}
		lo, hi := roundRatios(t, ref)
		p("| %d | %.2f× [%.2f – %.2f] | %.2f× [%.2f – %.2f] | %.2f× | %.2f× |", n, then.ratio, then.lo, then.hi, t.Median/ref.Median, lo, hi,
			then.cpu, t.CPU/ref.CPU)
	}
	tally, other := r.openPair("tally mode: auto", referenceName)
	if tally != nil && other != nil && other.P99 > 0 && other.CPU > 0 {
		p("| open loop, %.0f/s over %d keys | p99 9.5 against 3.3 ms | p99 %.2f against %.2f ms | 1.37× (327 against 219 µs) | %.2f× (%.0f against %.0f µs) |",
			tally.Offered, tally.Keys, tally.P99, other.P99, tally.CPU/other.CPU, tally.CPU, other.CPU)
	}
	p("")
}

// byCommand lists Redis commands per decision by name, most first.
func byCommand(m map[string]float64) string { return largestFirst(m, "%s %.2f") }

// byProcess lists CPU µs per decision by process, largest first.
func byProcess(m map[string]float64) string { return largestFirst(m, "%s %.0f") }

// largestFirst lists m's names and values in format, largest value first
// (names in order among equal values).
func largestFirst(m map[string]float64, format string) string {
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return m[names[i]] > m[names[j]] || m[names[i]] == m[names[j]] && names[i] < names[j]
	})
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf(format, n, m[n])
	}
	return strings.Join(parts, ", ")
}
