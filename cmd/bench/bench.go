package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

const (
	keys  = 1000 // distinct clients, uniform
	conns = 32   // concurrent clients in closed loop
)

// bench is one benchmark run: the processes and the durations.
type bench struct {
	stack          *stack.Stack
	short          bool
	reps           int
	satDur, olDur  time.Duration
	warm           time.Duration
	shards         []shard.Config
	redis          []*stack.Proc
	nats           *stack.Proc
	acc            *stack.Proc
	edges          []*stack.Proc
	sampled        *stack.Proc // an edge that records 10% of allowed decisions
	sampledAPI     string
	traced         *stack.Proc // an edge that traces every request (OTLP to sink)
	tracedAPI      string
	sink           *traceSink
	noopProc       *stack.Proc
	cfg            *config.File
	cfgPath        string
	apiAddrs       []string // decision API of each edge
	proxyAddr      string   // the first edge's proxy
	upstream       *http.Server
	js             jetstream.JetStream
	nc             *nats.Conn
	rdb            []*redis.Client
	started        time.Time
	report         *report
	requestsPolicy map[string][][]byte // policy → request bytes per key
	profile        string              // directory for CPU profiles, or ""
	only           string              // run only the steps whose names contain it
}

func newBench(bin string, short bool) (*bench, error) {
	dir, err := os.MkdirTemp("", "tally-bench-")
	if err != nil {
		return nil, err
	}
	b := &bench{stack: stack.New(dir, bin), short: short,
		reps: 5, satDur: 6 * time.Second, olDur: 6 * time.Second, warm: 2 * time.Second, report: &report{}}
	if short {
		b.reps, b.satDur, b.olDur, b.warm = 1, 3*time.Second, 2*time.Second, time.Second
	}
	return b, nil
}

// policies of the benchmark: far from their limits (auto and exact), full
// after one request (the denied path), a hot key, and refunds (exact, so
// that every 304 goes through the accountant).
func policies() []config.Policy {
	return []config.Policy{
		{Name: "far", Limit: limiter.MaxLimit, Window: time.Hour},
		{Name: "far-exact", Limit: limiter.MaxLimit, Window: time.Hour, Mode: limiter.ModeExact},
		{Name: "tight", Limit: 1, Window: time.Hour},
		{Name: "tight-exact", Limit: 1, Window: time.Hour, Mode: limiter.ModeExact},
		{Name: "hot", Limit: 500, Window: 5 * time.Second},
		{Name: "hot-async", Limit: 500, Window: 5 * time.Second, Mode: limiter.ModeAsync},
		{Name: "refunds", Limit: limiter.MaxLimit, Window: time.Hour, Mode: limiter.ModeExact},
	}
}

func (b *bench) run(ctx context.Context, out string) error {
	b.started = time.Now()
	fmt.Println("Starting: 2 Redis shards (primary + replica), NATS, the accountant, an edge-checker, the no-op reference")
	var err error
	var procs []*stack.Proc
	if b.shards, procs, err = b.stack.Shards(ctx, 2, 1); err != nil {
		return err
	}
	b.redis = procs
	for _, p := range procs {
		b.rdb = append(b.rdb, redis.NewClient(&redis.Options{Addr: p.Addr, DisableIdentity: true}))
	}
	if b.nats, err = b.stack.NATS(ctx); err != nil {
		return err
	}
	if b.nc, err = nats.Connect(b.nats.Addr, b.stack.NATSOptions("operator")...); err != nil {
		return err
	}
	defer b.nc.Close()
	if b.js, err = jetstream.New(b.nc); err != nil {
		return err
	}
	if err := b.startUpstream(); err != nil {
		return err
	}
	defer b.upstream.Close()
	b.cfg = b.deployment()
	if b.cfgPath, err = b.stack.WriteConfig("tally", b.cfg); err != nil {
		return err
	}
	if b.acc, err = b.stack.Accountant(ctx, "accountant", b.cfgPath, b.cfg.Accountant.AdminListen); err != nil {
		return err
	}
	if err := b.startEdges(ctx, 1); err != nil {
		return err
	}
	sf := *b.cfg
	sf.Edge.APIListen, sf.Edge.AdminListen = stack.FreeAddr(), stack.FreeAddr()
	sf.Edge.Decisions.SampleAllowed = 0.1
	path, err := b.stack.WriteConfig("edge-sampled", &sf)
	if err != nil {
		return err
	}
	if b.sampled, err = b.stack.Edge(ctx, "edge-sampled", path, sf.Edge.AdminListen); err != nil {
		return err
	}
	b.sampledAPI = sf.Edge.APIListen
	defer func() {
		if b.sink != nil {
			_ = b.sink.srv.Close()
		}
	}()
	if err := b.startTraced(ctx); err != nil {
		return err
	}
	noopAddr := stack.FreeAddr()
	self, _ := os.Executable()
	if b.noopProc, err = b.stack.Start(ctx, "noop", self, "noop", "-listen", noopAddr); err != nil {
		return err
	}
	b.noopProc.Addr = noopAddr
	if err := stack.WaitTCP(ctx, noopAddr); err != nil {
		return err
	}
	b.buildRequests()

	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"round trips on the idle machine", b.roundTrips},
		{"saturation, closed loop (no-op, exact, auto)", b.saturation},
		{"latency, open loop at 25/50/75/90% of saturation", b.latency},
		{"the denied path (windows full)", b.denied},
		{"one hot key offered 5x its limit from 1, 2 and 4 edges, modes auto and async", b.hotKey},
		{"accountant throughput, with and without WAIT", b.accountantThroughput},
		{"accounting lag at half load, with a burst on one key", b.lag},
	}
	for _, s := range steps {
		if b.only != "" && !strings.Contains(s.name, b.only) {
			continue
		}
		fmt.Printf("\n== %s\n", s.name)
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	b.report.Duration = time.Since(b.started)
	return b.report.write(out, b)
}

// deployment is the benchmark's configuration.
func (b *bench) deployment() *config.File {
	f := &config.File{KeyPrefix: "tally", Redis: config.Redis{Shards: b.shards}}
	f.NATS.URL = b.nats.Addr
	f.Accountant.AdminListen = stack.FreeAddr()
	f.Policies = policies()
	f.Edge = config.Edge{Upstream: "http://" + b.upstream.Addr, DefaultPolicy: "refunds",
		Identity: config.Identity{Header: "Authorization"}, Pprof: b.profile != ""}
	return f
}

// startEdges starts edges until there are n.
func (b *bench) startEdges(ctx context.Context, n int) error {
	for len(b.edges) < n {
		i := len(b.edges)
		f := *b.cfg
		f.Edge.APIListen, f.Edge.AdminListen = stack.FreeAddr(), stack.FreeAddr()
		if i == 0 {
			f.Edge.Listen = stack.FreeAddr()
			b.proxyAddr = f.Edge.Listen
		}
		path, err := b.stack.WriteConfig(fmt.Sprintf("edge-%d", i), &f)
		if err != nil {
			return err
		}
		p, err := b.stack.Edge(ctx, fmt.Sprintf("edge-%d", i), path, f.Edge.AdminListen)
		if err != nil {
			return err
		}
		b.edges = append(b.edges, p)
		b.apiAddrs = append(b.apiAddrs, f.Edge.APIListen)
	}
	return nil
}

// stopEdges stops edges beyond the first n.
func (b *bench) stopEdges(n int) {
	for len(b.edges) > n {
		last := len(b.edges) - 1
		b.edges[last].Stop()
		b.edges, b.apiAddrs = b.edges[:last], b.apiAddrs[:last]
	}
}

// startUpstream runs the API behind the proxy: an ETag on every answer,
// 304 when it matches.
func (b *bench) startUpstream() error {
	addr := stack.FreeAddr()
	b.upstream = &http.Server{Addr: addr, ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"v1"`)
			if r.Header.Get("If-None-Match") == `"v1"` {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			_, _ = w.Write([]byte("{}\n"))
		})}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() { _ = b.upstream.Serve(ln) }()
	return nil
}

// buildRequests prepares the raw requests: for each policy, one per key.
func (b *bench) buildRequests() {
	b.requestsPolicy = map[string][][]byte{}
	for _, p := range policies() {
		reqs := make([][]byte, keys)
		for i := range reqs {
			reqs[i] = checkRequest(p.Name, "client-"+strconv.Itoa(i))
		}
		b.requestsPolicy[p.Name] = reqs
	}
}

func checkRequest(policy, identity string) []byte {
	body := `{"policy":"` + policy + `","identity":"` + identity + `"}`
	return []byte("POST /v1/check HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}

// target is one thing to drive: the no-op reference or an edge's decision
// API under a policy.
type target struct {
	name, addr, policy string
	edge               *stack.Proc // nil: the no-op reference
}

// targets are the no-op reference, mode exact and mode auto (the first
// edge, the default configuration), and mode auto on an edge that records
// a tenth of allowed decisions.
func (b *bench) targets() []target {
	return []target{
		{"no-op net/http", b.noopProc.Addr, "far", nil},
		{"tally mode: exact", b.apiAddrs[0], "far-exact", b.edges[0]},
		{"tally mode: auto", b.apiAddrs[0], "far", b.edges[0]},
		{"tally mode: auto, 10% of allowed decisions recorded", b.sampledAPI, "far", b.sampled},
		{"tally mode: auto, every request traced", b.tracedAPI, "far", b.traced},
	}
}

func (b *bench) loadTarget(t target) loadgen.Target {
	reqs := b.requestsPolicy[t.policy]
	return loadgen.Target{Addr: t.addr, Request: func(conn int, i uint64) []byte {
		return reqs[(uint64(conn)*7919+i*104729)%keys]
	}}
}

// processes are the processes whose CPU a run accounts for.
func (b *bench) processes(t target) map[string][]*stack.Proc {
	if t.edge == nil {
		return map[string][]*stack.Proc{"no-op": {b.noopProc}}
	}
	return map[string][]*stack.Proc{"edge-checker": {t.edge}, "accountant": {b.acc}, "nats-server": {b.nats}, "redis (4)": b.redis}
}

// sample is what a run cost: CPU per process group, Redis script calls and
// stream messages.
type sample struct {
	at        time.Time
	cpu       map[string]time.Duration
	self      time.Duration
	calls     int64
	streamSeq map[string]uint64
	// decisions of the edges, by path: "credit" and "cache" (from memory),
	// and every path.
	fromMemory, decided float64
}

func (b *bench) sample(ctx context.Context, procs map[string][]*stack.Proc) sample {
	s := sample{at: time.Now(), cpu: map[string]time.Duration{}, self: stack.CPUOf(os.Getpid()), streamSeq: map[string]uint64{}}
	for name, ps := range procs {
		for _, p := range ps {
			s.cpu[name] += p.CPU()
		}
	}
	s.calls = b.redisCalls(ctx)
	for _, e := range procs["edge-checker"] {
		for k, v := range metricsText(e.AdminAddr) {
			if !strings.HasPrefix(k, "tally_edge_decisions_total{") {
				continue
			}
			s.decided += v
			if strings.Contains(k, `path="credit"`) || strings.Contains(k, `path="cache"`) {
				s.fromMemory += v
			}
		}
	}
	st := events.Streams{}.WithDefaults()
	for _, name := range []string{st.Accounting.Name, st.Decisions.Name} {
		if str, err := b.js.Stream(ctx, name); err == nil {
			if info, err := str.Info(ctx); err == nil {
				s.streamSeq[name] = info.State.LastSeq
			}
		}
	}
	return s
}

// redisCalls counts the script calls all Redis nodes have served.
func (b *bench) redisCalls(ctx context.Context) int64 {
	var n int64
	for _, c := range b.rdb {
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_evalsha_ro:", "cmdstat_eval_ro:"} {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd+"calls="); ok {
					v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
					n += v
				}
			}
		}
	}
	return n
}

// cost turns two samples around a run into per-request figures.
func cost(before, after sample, requests uint64) runCost {
	c := runCost{CPUPerRequest: map[string]float64{}}
	if requests == 0 {
		return c
	}
	for name, d := range after.cpu {
		c.CPUPerRequest[name] = float64(d-before.cpu[name]) / float64(time.Microsecond) / float64(requests)
	}
	c.CPUPerRequest["load generator"] = float64(after.self-before.self) / float64(time.Microsecond) / float64(requests)
	c.RedisCallsPerRequest = float64(after.calls-before.calls) / float64(requests)
	if n := after.decided - before.decided; n > 0 {
		c.FromMemory = (after.fromMemory - before.fromMemory) / n
	}
	for name, seq := range after.streamSeq {
		c.MessagesPerRequest += float64(seq-before.streamSeq[name]) / float64(requests)
	}
	return c
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func minMax(xs []float64) (lo, hi float64) {
	for i, x := range xs {
		if i == 0 || x < lo {
			lo = x
		}
		if i == 0 || x > hi {
			hi = x
		}
	}
	return lo, hi
}

// saturation: closed loop, conns clients, keys uniform; reps interleaved so
// that noise on the shared machine spreads over every target.
func (b *bench) saturation(ctx context.Context) error {
	ts := b.targets()
	tputs := make([][]float64, len(ts))
	costs := make([]runCost, len(ts))
	for rep := range b.reps {
		for i, t := range ts {
			// Warm up apart from the measured run, so that the costs below
			// are those of the steady state: a key's first reservation (and
			// the one after an idle key gave its credit back) is not in them.
			if _, err := loadgen.ClosedLoop(ctx, b.loadTarget(t), conns, 0, b.warm); err != nil {
				return err
			}
			before := b.sample(ctx, b.processes(t))
			stopProfile := b.startProfile(t, rep)
			res, err := loadgen.ClosedLoop(ctx, b.loadTarget(t), conns, 0, b.satDur)
			stopProfile()
			if err != nil {
				return err
			}
			after := b.sample(ctx, b.processes(t))
			if res.Statuses[200] != res.Completed {
				return fmt.Errorf("%s: %d of %d responses were not 200 (%v)", t.name, res.Completed-res.Statuses[200], res.Completed, res.Statuses)
			}
			tputs[i] = append(tputs[i], res.Throughput())
			c := cost(before, after, res.Completed)
			if rep == b.reps-1 {
				costs[i] = c
			}
			fmt.Printf("  %-20s rep %d: %8.0f req/s  p50 %v  p99 %v\n", t.name, rep+1, res.Throughput(),
				res.Latency.Quantile(0.5).Round(time.Microsecond), res.Latency.Quantile(0.99).Round(time.Microsecond))
		}
	}
	for i, t := range ts {
		lo, hi := minMax(tputs[i])
		b.report.Saturation = append(b.report.Saturation, saturationResult{Target: t.name, Median: median(tputs[i]),
			Min: lo, Max: hi, Runs: tputs[i], Cost: costs[i]})
	}
	return nil
}

// latency: open loop at shares of each target's saturation, and mode exact
// at the offered loads where auto was measured.
func (b *bench) latency(ctx context.Context) error {
	ts := b.targets()[:3]
	shares := []float64{0.25, 0.5, 0.75, 0.9}
	run := func(t target, rate float64, label string) error {
		res, err := loadgen.OpenLoop(ctx, b.loadTarget(t), rate, 256, time.Second, b.olDur)
		if err != nil {
			return err
		}
		l := latencyResult{Target: t.name, Offered: rate, Label: label, Achieved: res.Throughput(),
			P50: ms(res.Latency.Quantile(0.5)), P99: ms(res.Latency.Quantile(0.99)), P999: ms(res.Latency.Quantile(0.999)),
			Errors: res.Errors}
		b.report.Latency = append(b.report.Latency, l)
		fmt.Printf("  %-20s %-12s %7.0f req/s offered: p50 %.2f ms  p99 %.2f ms  p99.9 %.2f ms\n", t.name, label, rate, l.P50, l.P99, l.P999)
		return nil
	}
	for i, t := range ts {
		sat := b.report.Saturation[i].Median
		for _, share := range shares {
			if err := run(t, sat*share, fmt.Sprintf("%.0f%%", share*100)); err != nil {
				return err
			}
		}
	}
	auto := b.report.Saturation[2].Median
	for _, share := range []float64{0.25, 0.5} {
		if err := run(ts[1], auto*share, fmt.Sprintf("auto's %.0f%%", share*100)); err != nil {
			return err
		}
	}
	return nil
}

// denied: every window full; Redis calls per denied request.
func (b *bench) denied(ctx context.Context) error {
	for _, t := range []target{{"tally mode: exact", b.apiAddrs[0], "tight-exact", b.edges[0]}, {"tally mode: auto", b.apiAddrs[0], "tight", b.edges[0]}} {
		// Fill every window.
		if _, err := loadgen.ClosedLoop(ctx, b.loadTarget(t), conns, 0, time.Second); err != nil {
			return err
		}
		before := b.sample(ctx, b.processes(t))
		res, err := loadgen.ClosedLoop(ctx, b.loadTarget(t), conns, 0, b.olDur)
		if err != nil {
			return err
		}
		after := b.sample(ctx, b.processes(t))
		c := cost(before, after, res.Completed)
		b.report.Denied = append(b.report.Denied, deniedResult{Target: t.name, Throughput: res.Throughput(),
			Denied: res.Statuses[429], Completed: res.Completed, RedisCallsPerRequest: c.RedisCallsPerRequest, Cost: c})
		fmt.Printf("  %-20s %8.0f req/s, %d of %d denied, %.4f Redis calls per request\n", t.name, res.Throughput(),
			res.Statuses[429], res.Completed, c.RedisCallsPerRequest)
	}
	return nil
}

// hotKey: one key offered 5x its limit (500 per 5 s) for a little over two
// windows, split over 1, 2 and 4 edges, in mode auto and in mode async;
// allowed counted per window from the responses' X-RateLimit-Reset.
func (b *bench) hotKey(ctx context.Context) error {
	const limit, window, offered = 500, 5 * time.Second, 500.0 // req/s: 5x the limit's rate
	dur := 2*window + 2*time.Second
	for _, run := range []struct {
		policy string
		edges  int
	}{{"hot", 1}, {"hot", 2}, {"hot", 4}, {"hot-async", 1}, {"hot-async", 2}, {"hot-async", 4}} {
		n := run.edges
		if err := b.startEdges(ctx, n); err != nil {
			return err
		}
		identity := fmt.Sprintf("%s-%d-edges", run.policy, n)
		req := checkRequest(run.policy, identity)
		var mu sync.Mutex
		perWindow := map[int64]int{}
		var denied int
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				t := loadgen.Target{Addr: b.apiAddrs[i], Request: func(int, uint64) []byte { return req },
					Observe: func(_ int, _ uint64, status int, header []byte) {
						reset := headerInt(header, "X-Ratelimit-Reset")
						mu.Lock()
						defer mu.Unlock()
						switch status {
						case 200:
							perWindow[reset]++
						case 429:
							denied++
						}
					}}
				_, errs[i] = loadgen.OpenLoop(ctx, t, offered/float64(n), 16, 0, dur)
			})
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		mode := "auto"
		if run.policy == "hot-async" {
			mode = "async"
		}
		h := hotResult{Mode: mode, Edges: n, Limit: limit, Window: window.String(), Offered: offered * window.Seconds()}
		var resets []int64
		for r := range perWindow {
			resets = append(resets, r)
		}
		sort.Slice(resets, func(i, j int) bool { return resets[i] < resets[j] })
		for _, r := range resets {
			h.AllowedPerWindow = append(h.AllowedPerWindow, perWindow[r])
		}
		h.Denied = denied
		b.report.Hot = append(b.report.Hot, h)
		fmt.Printf("  mode %s, %d edge(s): allowed per window %v (limit %d, offered %.0f per window)\n", mode, n, h.AllowedPerWindow, limit, h.Offered)
	}
	b.stopEdges(1)
	return nil
}

// startProfile, with -profile, records CPU profiles of the edge and of the
// load generator during the last run of a Tally target; the returned
// function waits for them.
func (b *bench) startProfile(t target, rep int) func() {
	if b.profile == "" || rep != b.reps-1 || t.edge == nil {
		return func() {}
	}
	name := strings.ReplaceAll(strings.TrimPrefix(t.name, "tally mode: "), " ", "-")
	secs := int(b.satDur.Seconds()) - 1
	var wg sync.WaitGroup
	wg.Go(func() {
		time.Sleep(b.warm)
		resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", t.edge.AdminAddr, secs))
		if err != nil {
			fmt.Println("  profile:", err)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		_ = os.MkdirAll(b.profile, 0o755)
		_ = os.WriteFile(filepath.Join(b.profile, "edge-"+name+".pprof"), body, 0o644)
	})
	wg.Go(func() {
		time.Sleep(b.warm)
		f, err := os.Create(filepath.Join(b.profile, "loadgen-"+name+".pprof"))
		if err != nil {
			return
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return
		}
		time.Sleep(time.Duration(secs) * time.Second)
		pprof.StopCPUProfile()
	})
	return wg.Wait
}

// roundTrips measures, on the idle machine, one JetStream publish to its
// acknowledgement and one reservation on a primary: the floor under every
// hop of the accounting path.
func (b *bench) roundTrips(ctx context.Context) error {
	const n = 2000
	st, err := b.js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "BENCH_RTT", Subjects: []string{"bench.rtt"},
		Storage: jetstream.FileStorage, MaxMsgs: 10000})
	if err != nil {
		return err
	}
	defer func() { _ = b.js.DeleteStream(ctx, st.CachedInfo().Config.Name) }()
	js := loadgen.NewHistogram()
	for range n {
		start := time.Now()
		if _, err := b.js.Publish(ctx, "bench.rtt", []byte(`[{}]`)); err != nil {
			return err
		}
		js.Record(time.Since(start))
	}
	ks, _ := limiter.NewKeySpace("tally", b.stack.Secret())
	store, err := redisstore.NewStore(b.shards, ks, redisstore.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	rd := loadgen.NewHistogram()
	k := ks.Key("far", "round-trip")
	for range n {
		start := time.Now()
		if _, err := store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1, Want: 1, Producer: "bench"}); err != nil {
			return err
		}
		rd.Record(time.Since(start))
	}
	b.report.RoundTrips = roundTrips{JetStreamP50: ms(js.Quantile(0.5)), JetStreamP99: ms(js.Quantile(0.99)),
		RedisP50: ms(rd.Quantile(0.5)), RedisP99: ms(rd.Quantile(0.99))}
	fmt.Printf("  JetStream publish to ack: p50 %.3f ms, p99 %.3f ms; a reservation on a primary: p50 %.3f ms, p99 %.3f ms\n",
		b.report.RoundTrips.JetStreamP50, b.report.RoundTrips.JetStreamP99, b.report.RoundTrips.RedisP50, b.report.RoundTrips.RedisP99)
	return nil
}

// headerInt finds a header's integer value in a raw header block.
func headerInt(block []byte, name string) int64 {
	for _, line := range strings.Split(string(block), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.EqualFold(strings.TrimSpace(k), name) {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// accountantThroughput publishes accounting events straight to the stream
// (as a service would) and times how fast the accountant applies them, with
// and without waiting for a replica (Redis WAIT) before it deletes them from
// the stream.
func (b *bench) accountantThroughput(ctx context.Context) error {
	n := 100_000
	if b.short {
		n = 20_000
	}
	for _, wait := range []bool{true, false} {
		if !wait { // restart the accountant without WAIT
			f := *b.cfg
			f.Redis.WaitReplicas = -1
			path, err := b.stack.WriteConfig("tally-nowait", &f)
			if err != nil {
				return err
			}
			b.acc.Stop()
			if b.acc, err = b.stack.Accountant(ctx, "accountant-nowait", path, f.Accountant.AdminListen); err != nil {
				return err
			}
		}
		rate, err := b.applyEvents(ctx, n, fmt.Sprintf("bench-wait-%v", wait))
		if err != nil {
			return err
		}
		b.report.Accountant = append(b.report.Accountant, accountantResult{Wait: wait, Events: n, PerSecond: rate})
		fmt.Printf("  WAIT %-5v: %d events applied at %.0f events/s\n", wait, n, rate)
	}
	// Back to the configured accountant.
	b.acc.Stop()
	var err error
	b.acc, err = b.stack.Accountant(ctx, "accountant-again", b.cfgPath, b.cfg.Accountant.AdminListen)
	return err
}

// applyEvents publishes n charge events in batches of 512 over both shards
// and returns the rate at which the accountant applied them.
func (b *bench) applyEvents(ctx context.Context, n int, producer string) (float64, error) {
	ks, _ := limiter.NewKeySpace("tally", b.stack.Secret())
	m := shard.NewMap([]string{b.shards[0].Name, b.shards[1].Name})
	byShard := map[string][]events.Accounting{}
	seq := map[string]uint64{}
	start := time.Now()
	base := metricValue(b.cfg.Accountant.AdminListen, "tally_accountant_messages_total")
	msgs := 0
	flush := func(sh string) error {
		batch := byShard[sh]
		if len(batch) == 0 {
			return nil
		}
		msg, err := events.AccountingMsg("tally.accounting", sh, batch, nil)
		if err != nil {
			return err
		}
		if _, err := b.js.PublishMsgAsync(msg); err != nil {
			return err
		}
		msgs++
		byShard[sh] = byShard[sh][:0]
		return nil
	}
	for i := range n {
		k := ks.Key("far", "client-"+strconv.Itoa(i%keys))
		sh := b.shards[m.Pick(k.Hash())].Name
		seq[sh]++
		byShard[sh] = append(byShard[sh], events.Accounting{Kind: events.Started, Producer: producer, Seq: seq[sh], KeyID: ks.KeyID(),
			Source: "bench", Time: time.Now(), Key: k.Digest().String(), Policy: "far", Limit: limiter.MaxLimit,
			WindowSeconds: 3600, Units: 1, StartedAt: time.Now()})
		if len(byShard[sh]) == 512 {
			if err := flush(sh); err != nil {
				return 0, err
			}
		}
	}
	for sh := range byShard {
		if err := flush(sh); err != nil {
			return 0, err
		}
	}
	select {
	case <-b.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		return 0, fmt.Errorf("publishes not acknowledged in 30s")
	}
	for time.Since(start) < 2*time.Minute {
		if metricValue(b.cfg.Accountant.AdminListen, "tally_accountant_messages_total")-base >= float64(msgs) {
			return float64(n) / time.Since(start).Seconds(), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return 0, fmt.Errorf("the accountant did not apply %d events in 2 minutes", n)
}

// lag: half of auto's saturation on the decision API, while 1,000
// revalidations per second go through the proxy in mode exact (each answered
// 304, each refund an accounting event) and one key sends a burst of 80
// back-to-back revalidations every second. Lag: an event's creation at the
// edge to its effect in Redis. Measured on both routes of accounting events:
// through JetStream and the accountant (the accountant's histogram), and
// applied by the edge itself (the edge's).
func (b *bench) lag(ctx context.Context) error {
	auto := b.report.sat("tally mode: auto").Median
	if auto == 0 { // run alone (-only): measure it
		res, err := loadgen.ClosedLoop(ctx, b.loadTarget(b.targets()[2]), conns, b.warm, b.satDur)
		if err != nil {
			return err
		}
		auto = res.Throughput()
		time.Sleep(3 * time.Second) // the credit of that run is given back (idle_release) before measuring
	}
	// Each route at half load, then with no decision API load: the second
	// run separates the pipeline's own latency from the wait for a core.
	for _, share := range []float64{0.5, 0} {
		r, err := b.lagRun(ctx, auto, share, b.apiAddrs[0], b.proxyAddr, b.cfg.Accountant.AdminListen, "tally_accountant_lag_seconds",
			b.edges[0].AdminAddr, b.cfg.Accountant.AdminListen)
		if err != nil {
			return err
		}
		r.Route = "stream"
		b.report.Lag = append(b.report.Lag, r)
	}

	// The same on an edge that applies its events itself.
	f := *b.cfg
	f.Edge.APIListen, f.Edge.AdminListen, f.Edge.Listen = stack.FreeAddr(), stack.FreeAddr(), stack.FreeAddr()
	f.Edge.Outbox.Route = "direct"
	path, err := b.stack.WriteConfig("edge-direct", &f)
	if err != nil {
		return err
	}
	p, err := b.stack.Edge(ctx, "edge-direct", path, f.Edge.AdminListen)
	if err != nil {
		return err
	}
	defer p.Stop()
	for _, share := range []float64{0.5, 0} {
		r, err := b.lagRun(ctx, auto, share, f.Edge.APIListen, f.Edge.Listen, f.Edge.AdminListen, "tally_edge_accounting_lag_seconds",
			f.Edge.AdminListen, "")
		if err != nil {
			return err
		}
		r.Route = "direct"
		b.report.Lag = append(b.report.Lag, r)
	}
	return nil
}

// lagRun measures accounting lag while the decision API takes share of
// auto's saturation (none when share is 0), 1,000 revalidations per second
// go through the proxy in mode exact and one key bursts every second.
// It also reads how long goroutines waited for a CPU in the edge and the
// accountant (when there is one on the route) meanwhile.
func (b *bench) lagRun(ctx context.Context, auto, share float64, api, proxy, metricsAddr, histogram, edgeAdmin, accAdmin string) (lagResult, error) {
	const sideRate = 1000.0
	reval := make([][]byte, keys)
	for i := range reval {
		reval[i] = []byte("GET /repos/tally HTTP/1.1\r\nHost: bench\r\nAuthorization: client-" + strconv.Itoa(i) +
			"\r\nIf-None-Match: \"v1\"\r\n\r\n")
	}
	side := loadgen.Target{Addr: proxy, Request: func(conn int, i uint64) []byte { return reval[i%keys] }}
	burst := []byte("GET /repos/tally HTTP/1.1\r\nHost: bench\r\nAuthorization: burst\r\nIf-None-Match: \"v1\"\r\n\r\n")
	main := b.loadTarget(target{"", api, "far", nil})
	before, edgeBefore, accBefore := metricsText(metricsAddr), metricsText(edgeAdmin), metricsText(accAdmin)
	dur := 2 * b.olDur
	var wg sync.WaitGroup
	var mainRes loadgen.Result
	var mainErr, sideErr error
	if share > 0 {
		wg.Go(func() { mainRes, mainErr = loadgen.OpenLoop(ctx, main, auto*share, 256, time.Second, dur) })
	}
	wg.Go(func() { _, sideErr = loadgen.OpenLoop(ctx, side, sideRate, 64, time.Second, dur) })
	wg.Go(func() {
		end := time.Now().Add(dur + time.Second)
		for time.Now().Before(end) && ctx.Err() == nil {
			_, _ = loadgen.ClosedLoop(ctx, loadgen.Target{Addr: proxy, Request: func(int, uint64) []byte { return burst }}, 1, 0, 80*time.Millisecond)
			time.Sleep(time.Second)
		}
	})
	wg.Wait()
	if mainErr != nil {
		return lagResult{}, mainErr
	}
	if sideErr != nil {
		return lagResult{}, sideErr
	}
	time.Sleep(200 * time.Millisecond)
	after := metricsText(metricsAddr)
	p50, p99, n := lagQuantiles(histogram, before, after)
	r := lagResult{Saturation: auto, Share: share, Offered: auto * share, SideRate: sideRate, Events: n, P50: p50, P99: p99}
	const sched = "go_sched_latencies_seconds"
	_, r.EdgeSchedP99, _ = lagQuantiles(sched, edgeBefore, metricsText(edgeAdmin))
	if accAdmin != "" {
		_, r.AccountantSchedP99, _ = lagQuantiles(sched, accBefore, metricsText(accAdmin))
	}
	if share > 0 {
		r.Achieved, r.RequestP99 = mainRes.Throughput(), ms(mainRes.Latency.Quantile(0.99))
	}
	fmt.Printf("  decision API at %.0f req/s (%.0f%% of auto's %.0f) + %.0f revalidations/s in mode exact + bursts: %d events, lag p50 %.2f ms, p99 %.2f ms; goroutines waited for a CPU p99 %.2f ms (edge), %.2f ms (accountant)\n",
		auto*share, 100*share, auto, sideRate, n, p50, p99, r.EdgeSchedP99, r.AccountantSchedP99)
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// metricsText reads an admin endpoint's /metrics into "name{labels}" → value
// (empty when it cannot be read).
func metricsText(addr string) map[string]float64 {
	out, err := metrics.Scrape("http://" + addr + "/metrics")
	if err != nil {
		return map[string]float64{}
	}
	return out
}

func metricValue(addr, name string) float64 { return metricsText(addr)[name] }

// lagQuantiles estimates the median and 99th percentile (ms) of what a
// histogram observed between two readings, by linear interpolation within
// buckets.
func lagQuantiles(name string, before, after map[string]float64) (p50, p99 float64, n uint64) {
	type bucket struct{ le, count float64 }
	var bs []bucket
	for k, v := range after {
		le, ok := strings.CutPrefix(k, name+`_bucket{le="`)
		if !ok {
			continue
		}
		le = strings.TrimSuffix(le, `"}`)
		bound := math.Inf(1)
		if le != "+Inf" {
			bound, _ = strconv.ParseFloat(le, 64)
		}
		bs = append(bs, bucket{bound, v - before[k]})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0, 0, 0
	}
	total := bs[len(bs)-1].count
	q := func(f float64) float64 {
		rank := f * total
		lo, prev := 0.0, 0.0
		for _, b := range bs {
			if b.count >= rank {
				hi := b.le
				if math.IsInf(hi, 1) {
					hi = lo * 2
				}
				frac := 0.0
				if b.count > prev {
					frac = (rank - prev) / (b.count - prev)
				}
				return (lo + (hi-lo)*frac) * 1000
			}
			lo, prev = b.le, b.count
		}
		return lo * 1000
	}
	return q(0.5), q(0.99), uint64(total)
}

// startTraced starts an edge with the default configuration that traces
// every request (OTEL_TRACES_SAMPLER=always_on) and exports its spans over
// OTLP/HTTP to a sink in this process, which reads and discards them: the
// cost of tracing, as a collector on the same machine would see it.
func (b *bench) startTraced(ctx context.Context) error {
	sink, err := startTraceSink()
	if err != nil {
		return err
	}
	b.sink = sink
	f := *b.cfg
	f.Edge.APIListen, f.Edge.AdminListen = stack.FreeAddr(), stack.FreeAddr()
	path, err := b.stack.WriteConfig("edge-traced", &f)
	if err != nil {
		return err
	}
	b.traced, err = b.stack.Edge(ctx, "edge-traced", path, f.Edge.AdminListen, "OTEL_TRACES_EXPORTER=otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+sink.addr, "OTEL_TRACES_SAMPLER=always_on", "OTEL_SERVICE_NAME=tally-edge-bench")
	b.tracedAPI = f.Edge.APIListen
	return err
}

// traceSink stands in for an OpenTelemetry collector: it accepts OTLP/HTTP
// exports and counts their bytes.
type traceSink struct {
	addr          string
	srv           *http.Server
	exports, size atomic.Int64
}

func startTraceSink() (*traceSink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &traceSink{addr: ln.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		s.exports.Add(1)
		s.size.Add(n)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}
