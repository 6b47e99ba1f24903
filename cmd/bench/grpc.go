package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/stack"
)

// Envoy's rate-limit service over gRPC, as Envoy calls it: Tally's edge
// (edge.rls), a no-op gRPC handler of the same protocol (the ceiling of the
// machine for this door), and envoyproxy/ratelimit's own gRPC port when
// given, driven by one generator: grpcConns connections, conns calls in
// flight, each asking for one descriptor of one of 1,000 keys, far from its
// limit.

const grpcConns = 4

// grpcResult is one gRPC target's throughput and cost.
type grpcResult struct {
	Target string             `json:"target"`
	Median float64            `json:"median_rps"`
	Min    float64            `json:"min_rps"`
	Max    float64            `json:"max_rps"`
	Runs   []float64          `json:"runs_rps"`
	P99    float64            `json:"p99_ms"` // median of the runs' p99
	CPU    map[string]float64 `json:"cpu_us_per_decision_by_process"`
	// Memory is the resident memory after the runs, MB by process (Redis
	// left out).
	Memory map[string]float64 `json:"rss_mb_by_process"`
}

// writeRLSRules writes the rate-limit service's rules: domain "bench", one
// rule far from being reached, like the "far" policy.
func (b *bench) writeRLSRules() (string, error) {
	dir := filepath.Join(b.stack.Dir, "rls")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	rules := fmt.Sprintf("domain: bench\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: %d\n", limiter.MaxLimit)
	return dir, os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(rules), 0o600)
}

// noopGRPC serves the gRPC reference: a rate-limit service that answers OK
// to every descriptor, nothing else.
func noopGRPC(listen string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, noopRLS{})
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
		<-sig
		gs.Stop()
	}()
	if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

type noopRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (noopRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return resp, nil
}

// grpcKeys is what a gRPC load asks for: n keys (descriptor values
// prefix0 … prefix<n-1>), each call's drawn as the HTTP loads draw theirs
// (keysTarget).
type grpcKeys struct {
	prefix string
	n      int
}

// request is the call number i of calls in flight w asks.
func (k grpcKeys) request(w int, i uint64) *rlsv3.RateLimitRequest {
	id := mix(uint64(w)<<40^i) % uint64(k.n)
	return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: k.prefix + strconv.FormatUint(id, 10)}}}}}
}

// grpcClosedLoop calls ShouldRateLimit at addr closed loop for d with conns
// calls in flight over grpcConns connections, over keys: Completed counts
// OK answers as status 200, OVER_LIMIT as 429 and errors as 500.
func grpcClosedLoop(ctx context.Context, addr string, keys grpcKeys, d time.Duration) (loadgen.Result, error) {
	clients, closeAll, err := grpcClients(addr)
	if err != nil {
		return loadgen.Result{}, err
	}
	defer closeAll()
	type tally struct {
		ok, over, failed uint64
		lat              *loadgen.Histogram
	}
	counts := make([]tally, conns)
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for w := range conns {
		counts[w].lat = loadgen.NewHistogram()
		wg.Go(func() {
			c := clients[w%grpcConns]
			for i := uint64(0); ctx.Err() == nil; i++ {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := c.ShouldRateLimit(cctx, keys.request(w, i))
				cancel()
				switch {
				case err != nil:
					counts[w].failed++
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					counts[w].ok++
				default:
					counts[w].over++
				}
				counts[w].lat.Record(time.Since(t0))
			}
		})
	}
	wg.Wait()
	res := loadgen.Result{Statuses: map[int]uint64{}, Latency: loadgen.NewHistogram(), Elapsed: time.Since(start)}
	for _, c := range counts {
		res.Statuses[200] += c.ok
		res.Statuses[429] += c.over
		res.Statuses[500] += c.failed
		res.Completed += c.ok + c.over + c.failed
		res.Latency.Merge(c.lat)
	}
	res.Sent = res.Completed
	return res, ctx.Err()
}

// doorKeys are the gRPC door's keys: the decision API's thousand.
var doorKeys = grpcKeys{"client-", keys}

// grpcDoor measures the gRPC door: the no-op gRPC handler, Tally's edge and
// envoyproxy/ratelimit (when given), interleaved run by run.
func (b *bench) grpcDoor(ctx context.Context) error {
	noopAddr := stack.FreeAddr()
	self, _ := os.Executable()
	noop, err := b.stack.Start(ctx, "noop-grpc", self, "noop-grpc", "-listen", noopAddr)
	if err != nil {
		return err
	}
	defer noop.Stop()
	if err := stack.WaitTCP(ctx, noopAddr); err != nil {
		return err
	}
	type gtarget struct {
		name, addr string
		procs      map[string][]*stack.Proc
		edge       *stack.Proc // profiled with -profile
	}
	auto := target{"tally", "", "", b.edges[0], nil}
	ts := []gtarget{
		{"no-op gRPC handler", noopAddr, map[string][]*stack.Proc{"no-op": {noop}}, nil},
		{"tally: Envoy's rate-limit service (gRPC)", b.rlsAddr, b.processes(auto), b.edges[0]},
	}
	serveAddr, serveProcs, err := b.startServe(ctx)
	if err != nil {
		return err
	}
	ts = append(ts, gtarget{serveName, serveAddr, serveProcs, nil})
	if b.reference != nil {
		ts = append(ts, gtarget{referenceName + " (gRPC)", b.referenceGRPC, b.reference.procs, nil})
	}
	runs := make([][]float64, len(ts))
	p99s := make([][]float64, len(ts))
	costs := make([]runCost, len(ts))
	for rep := range b.reps {
		for i, t := range ts {
			if _, err := grpcClosedLoop(ctx, t.addr, doorKeys, b.warm); err != nil {
				return err
			}
			before := b.sample(ctx, t.procs)
			stop := b.startProfile(target{name: "grpc", edge: t.edge}, rep)
			res, err := grpcClosedLoop(ctx, t.addr, doorKeys, b.satDur)
			stop()
			if err != nil {
				return err
			}
			after := b.sample(ctx, t.procs)
			if res.Statuses[200] != res.Completed {
				return fmt.Errorf("%s: %d of %d answers were not OK (%v)", t.name, res.Completed-res.Statuses[200], res.Completed, res.Statuses)
			}
			runs[i] = append(runs[i], res.Throughput())
			p99s[i] = append(p99s[i], ms(res.Latency.Quantile(0.99)))
			if rep == b.reps-1 {
				costs[i] = cost(before, after, res.Completed)
			}
			fmt.Printf("  %-42s rep %d: %8.0f decisions/s  p99 %v\n", t.name, rep+1, res.Throughput(), res.Latency.Quantile(0.99).Round(time.Microsecond))
		}
	}
	for i, t := range ts {
		lo, hi := minMax(runs[i])
		r := grpcResult{Target: t.name, Median: median(runs[i]), Min: lo, Max: hi, Runs: runs[i], P99: median(p99s[i]),
			CPU: costs[i].CPUPerRequest, Memory: memory(t.procs)}
		b.report.GRPC = append(b.report.GRPC, r)
		fmt.Printf("  %-42s median %.0f decisions/s (%.0f – %.0f), CPU µs per decision: %s, memory MB: %s\n", t.name, r.Median, lo, hi,
			byProcess(r.CPU), byProcess(r.Memory))
	}
	return nil
}

// grpcMarkdown writes the gRPC door's section of the report.
func (r *report) grpcMarkdown(p func(string, ...any)) {
	if len(r.GRPC) == 0 {
		return
	}
	p("## Behind Envoy: the gRPC door")
	p("")
	p("Envoy's rate-limit service (`ShouldRateLimit`) called as Envoy calls it: %d gRPC connections, %d calls in flight,", grpcConns, conns)
	p("one descriptor per call, 1,000 keys far from their limits; Tally's edge answering from envoyproxy/ratelimit")
	p("rules, `tally serve` (edge, accountant and an embedded NATS JetStream in one process, on a Redis primary and")
	p("replica of its own), a no-op gRPC handler of the same protocol, and %s's own gRPC port when the run was given it.", referenceName)
	p("Median of the runs and their range; CPU µs per decision by process, the load generator's included; resident")
	p("memory (MB) of the processes that decide, after the runs (Redis left out).")
	p("")
	p("| target | decisions/s (median) | range | × no-op gRPC | p99 ms | CPU µs per decision | memory MB |")
	p("|---|---|---|---|---|---|---|")
	base := r.GRPC[0].Median
	for _, g := range r.GRPC {
		p("| %s | %.0f | %.0f – %.0f | %.2f | %.2f | %s | %s |", g.Target, g.Median, g.Min, g.Max, g.Median/base, g.P99, byProcess(g.CPU),
			byProcess(g.Memory))
	}
	p("")
	// One process against three: the CPU and memory of Tally's own
	// processes (the load generator and Redis left out).
	var sep, one *grpcResult
	for i := range r.GRPC {
		switch r.GRPC[i].Target {
		case "tally: Envoy's rate-limit service (gRPC)":
			sep = &r.GRPC[i]
		case serveName:
			one = &r.GRPC[i]
		}
	}
	if sep != nil && one != nil {
		own := func(m map[string]float64) float64 {
			var sum float64
			for k, v := range m {
				if k != "load generator" && !strings.HasPrefix(k, "redis") && k != "no-op" {
					sum += v
				}
			}
			return sum
		}
		p("`tally serve` spent %.0f µs of CPU per decision in its one process, the separate processes %.0f (edge-checker,",
			own(one.CPU), own(sep.CPU))
		p("accountant and nats-server together); %.0f MB of memory against %.0f; %.0f decisions/s against %.0f.",
			own(one.Memory), own(sep.Memory), one.Median, sep.Median)
		p("")
	}
}

// grpcOpenLoop calls ShouldRateLimit at addr at rate calls a second for
// warmup and then d, over keys, with at most inFlight calls outstanding
// over grpcConns connections; each call's latency counts from when it was
// due, so that a slow answer delays no later measurement. Calls answered
// during the warm-up count in Warmup only.
func grpcOpenLoop(ctx context.Context, addr string, keys grpcKeys, rate float64, inFlight int, warmup, d time.Duration) (loadgen.Result, error) {
	clients, closeAll, err := grpcClients(addr)
	if err != nil {
		return loadgen.Result{}, err
	}
	defer closeAll()
	interval := time.Duration(float64(time.Second) / rate)
	first, last := uint64(warmup/interval), uint64((warmup+d)/interval)
	type tally struct {
		ok, warm, failed uint64
		lat              *loadgen.Histogram
	}
	counts := make([]tally, inFlight)
	var next atomic.Uint64
	start := time.Now()
	var wg sync.WaitGroup
	for w := range inFlight {
		counts[w].lat = loadgen.NewHistogram()
		wg.Go(func() {
			c := clients[w%grpcConns]
			for ctx.Err() == nil {
				k := next.Add(1) - 1
				if k >= last {
					return
				}
				due := start.Add(time.Duration(k) * interval)
				if wait := time.Until(due); wait > 0 {
					time.Sleep(wait)
				}
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := c.ShouldRateLimit(cctx, keys.request(w, k))
				cancel()
				switch {
				case err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK:
					counts[w].failed++
				case k < first:
					counts[w].warm++
				default:
					counts[w].ok++
					counts[w].lat.Record(time.Since(due))
				}
			}
		})
	}
	wg.Wait()
	res := loadgen.Result{Statuses: map[int]uint64{}, Latency: loadgen.NewHistogram(), Elapsed: max(d, time.Since(start.Add(warmup)))}
	for _, c := range counts {
		res.Statuses[200] += c.ok
		res.Errors += c.failed
		res.Completed += c.ok
		res.Warmup += c.warm
		res.Latency.Merge(c.lat)
	}
	res.Sent = res.Completed + res.Warmup + res.Errors
	if res.Errors > 0 {
		return res, fmt.Errorf("%d of %d calls failed or were not OK", res.Errors, res.Sent)
	}
	return res, ctx.Err()
}

// grpcClients dials addr grpcConns times: the clients a load spreads its
// calls over, and what closes them.
func grpcClients(addr string) ([]rlsv3.RateLimitServiceClient, func(), error) {
	clients := make([]rlsv3.RateLimitServiceClient, grpcConns)
	conns := make([]*grpc.ClientConn, 0, grpcConns)
	closeAll := func() {
		for _, cc := range conns {
			cc.Close()
		}
	}
	for i := range clients {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, cc)
		clients[i] = rlsv3.NewRateLimitServiceClient(cc)
	}
	return clients, closeAll, nil
}
