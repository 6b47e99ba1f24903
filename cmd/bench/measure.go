package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/stack"
)

// sample is what a run cost: CPU per process group, Redis script calls and
// stream messages.
type sample struct {
	at        time.Time
	cpu       map[string]time.Duration
	self      time.Duration
	calls     int64
	commands  int64            // every command, those run inside scripts included
	byCommand map[string]int64 // commands by name, every node's
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
	// Commands are counted on the target's own Redis servers when it names
	// them (a process group "redis (n)"), so that what another target's
	// processes do meanwhile is not its.
	var addrs []string
	for name, ps := range procs {
		if strings.HasPrefix(name, "redis") {
			for _, p := range ps {
				addrs = append(addrs, p.Addr)
			}
		}
	}
	s.calls, s.commands, s.byCommand = b.redisCommands(ctx, addrs...)
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

// redisCalls counts the script calls all Redis nodes have served, and
// every command (those scripts ran included).
func (b *bench) redisCalls(ctx context.Context) (scripts, commands int64) {
	scripts, commands, _ = b.redisCommands(ctx)
	return scripts, commands
}

// redisCommands is redisCalls on the nodes at addrs (every node without
// any), and the commands by name.
func (b *bench) redisCommands(ctx context.Context, addrs ...string) (scripts, commands int64, byName map[string]int64) {
	byName = map[string]int64{}
	for _, c := range b.rdb {
		if len(addrs) > 0 && !slices.Contains(addrs, c.Options().Addr) {
			continue
		}
		info, err := c.Info(ctx, "commandstats").Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			line = strings.TrimSpace(line)
			name, rest, ok := strings.Cut(line, ":calls=")
			if !ok || !strings.HasPrefix(name, "cmdstat_") {
				continue
			}
			v, _ := strconv.ParseInt(rest[:max(0, strings.IndexByte(rest, ','))], 10, 64)
			commands += v
			byName[strings.TrimPrefix(name, "cmdstat_")] += v
			switch name {
			case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_evalsha_ro", "cmdstat_eval_ro":
				scripts += v
			}
		}
	}
	return scripts, commands, byName
}

// add sums what happened between before and after into s (several runs of
// one target, others run between them).
func (s *sample) add(before, after sample) {
	if s.cpu == nil {
		s.cpu, s.byCommand, s.streamSeq = map[string]time.Duration{}, map[string]int64{}, map[string]uint64{}
	}
	for k, v := range after.cpu {
		s.cpu[k] += v - before.cpu[k]
	}
	s.self += after.self - before.self
	s.calls += after.calls - before.calls
	s.commands += after.commands - before.commands
	for k, v := range after.byCommand {
		s.byCommand[k] += v - before.byCommand[k]
	}
	for k, v := range after.streamSeq {
		s.streamSeq[k] += v - before.streamSeq[k]
	}
	s.fromMemory += after.fromMemory - before.fromMemory
	s.decided += after.decided - before.decided
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
	for _, t := range []target{{"tally mode: exact", b.apiAddrs[0], "tight-exact", b.edges[0], nil}, {"tally mode: auto", b.apiAddrs[0], "tight", b.edges[0], nil}} {
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

// cpuTimes are the machine's CPU times since boot (/proc/stat), in ticks.
type cpuTimes struct{ busy, total float64 }

func machineCPU() cpuTimes {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	f := strings.Fields(line)
	var t cpuTimes
	for i, v := range f[1:] {
		n, _ := strconv.ParseFloat(v, 64)
		t.total += n
		if i != 3 && i != 4 { // idle, iowait
			t.busy += n
		}
	}
	return t
}

// coresBusy is the average number of busy cores between before and t.
func (t cpuTimes) coresBusy(before cpuTimes) float64 {
	if t.total <= before.total {
		return 0
	}
	return (t.busy - before.busy) / (t.total - before.total) * float64(runtime.NumCPU())
}
