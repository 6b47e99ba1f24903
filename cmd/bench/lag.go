package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

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

// lag: each of lagLoads — a share of auto's saturation on the decision API,
// while revalidations go through the proxy in mode exact (each answered
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
	// Each route under each load: the lighter ones separate the pipeline's
	// own latency from the wait for a core.
	for _, l := range lagLoads {
		r, err := b.lagRun(ctx, auto, l.share, l.side, b.apiAddrs[0], b.proxyAddr, b.cfg.Accountant.AdminListen, "tally_accountant_lag_seconds",
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
	for _, l := range lagLoads {
		r, err := b.lagRun(ctx, auto, l.share, l.side, f.Edge.APIListen, f.Edge.Listen, f.Edge.AdminListen, "tally_edge_accounting_lag_seconds",
			f.Edge.AdminListen, "")
		if err != nil {
			return err
		}
		r.Route = "direct"
		b.report.Lag = append(b.report.Lag, r)
	}
	return nil
}

// lagLoads are the loads of the lag runs: a share of auto's saturation on
// the decision API, and revalidations per second through the proxy (each
// a 304 refund: an accounting event). The last leaves the machine a core
// free (its report says how many were busy).
var lagLoads = []struct{ share, side float64 }{{0.5, 1000}, {0.25, 1000}, {0, 1000}, {0, 250}}

// lagRun measures accounting lag while the decision API takes share of
// auto's saturation (none when share is 0), sideRate revalidations per
// second go through the proxy in mode exact and one key bursts every
// second. It also reads how long goroutines waited for a CPU in the edge
// and the accountant (when there is one on the route) meanwhile.
func (b *bench) lagRun(ctx context.Context, auto, share, sideRate float64, api, proxy, metricsAddr, histogram, edgeAdmin, accAdmin string) (lagResult, error) {
	reval := make([][]byte, keys)
	for i := range reval {
		reval[i] = []byte("GET /repos/tally HTTP/1.1\r\nHost: bench\r\nAuthorization: client-" + strconv.Itoa(i) +
			"\r\nIf-None-Match: \"v1\"\r\n\r\n")
	}
	side := loadgen.Target{Addr: proxy, Request: func(conn int, i uint64) []byte { return reval[i%keys] }}
	// What the previous run left to apply is applied first: the cores this
	// run finds busy are its own.
	b.quiesce(ctx)
	burst := []byte("GET /repos/tally HTTP/1.1\r\nHost: bench\r\nAuthorization: burst\r\nIf-None-Match: \"v1\"\r\n\r\n")
	main := b.loadTarget(target{"", api, "far", nil, nil})
	before, edgeBefore, accBefore := metricsText(metricsAddr), metricsText(edgeAdmin), metricsText(accAdmin)
	busyBefore := machineCPU()
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
	busy := machineCPU().coresBusy(busyBefore)
	time.Sleep(200 * time.Millisecond)
	after := metricsText(metricsAddr)
	p50, p99, n := lagQuantiles(histogram, before, after)
	r := lagResult{Saturation: auto, Share: share, Offered: auto * share, SideRate: sideRate, Events: n, P50: p50, P99: p99, CoresBusy: busy}
	const sched = "go_sched_latencies_seconds"
	_, r.EdgeSchedP99, _ = lagQuantiles(sched, edgeBefore, metricsText(edgeAdmin))
	if accAdmin != "" {
		_, r.AccountantSchedP99, _ = lagQuantiles(sched, accBefore, metricsText(accAdmin))
	}
	if share > 0 {
		r.Achieved, r.RequestP99 = mainRes.Throughput(), ms(mainRes.Latency.Quantile(0.99))
	}
	fmt.Printf("  decision API at %.0f req/s (%.0f%% of auto's %.0f) + %.0f revalidations/s in mode exact + bursts: %d events, lag p50 %.2f ms, p99 %.2f ms; %.2f of %d cores busy; goroutines waited for a CPU p99 %.2f ms (edge), %.2f ms (accountant)\n",
		auto*share, 100*share, auto, sideRate, n, p50, p99, busy, runtime.NumCPU(), r.EdgeSchedP99, r.AccountantSchedP99)
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
