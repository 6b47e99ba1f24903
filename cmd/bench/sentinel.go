package main

import (
	"context"
	"fmt"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

// shardKindResult is the reservation path on one kind of shard: sequential
// reservations through the store (a round trip each), and the decision
// API in mode exact (a reservation per request), closed loop.
type shardKindResult struct {
	Shard string `json:"shard"`
	// ReservationP50 and P99 are one reservation's round trip, ms.
	ReservationP50 float64 `json:"reservation_p50_ms"`
	ReservationP99 float64 `json:"reservation_p99_ms"`
	// Median, Min, Max and Runs are mode exact's requests/s; P99 the
	// median of the runs' p99, ms.
	Median float64   `json:"exact_median_rps"`
	Min    float64   `json:"exact_min_rps"`
	Max    float64   `json:"exact_max_rps"`
	Runs   []float64 `json:"exact_runs_rps"`
	P99    float64   `json:"exact_p99_ms"`
}

// shardKinds measures the reservation path on a shard of fixed addresses
// (the deployment's) and on a Sentinel shard (a primary, a replica, one
// sentinel) served by an edge of its own: nothing waits for a replica on
// either, since a primary that changes is re-seeded from what the edges
// hold.
func (b *bench) shardKinds(ctx context.Context) error {
	sc, procs, err := b.stack.SentinelShard(ctx, "s0", 1, 1, 5*time.Second)
	if err != nil {
		return err
	}
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
	}()
	// The Sentinel shard is named as the deployment's first: in mode exact
	// a check makes no accounting event, and the streams stay as they are.
	f := *b.cfg
	f.Redis.Shards = []shard.Config{sc}
	f.Edge = b.cfg.Edge
	f.Edge.APIListen, f.Edge.AdminListen = stack.FreeAddr(), stack.FreeAddr()
	path, err := b.stack.WriteConfig("edge-sentinel", &f)
	if err != nil {
		return err
	}
	edge, err := b.stack.Edge(ctx, "edge-sentinel", path, f.Edge.AdminListen)
	if err != nil {
		return err
	}
	defer edge.Stop()
	kinds := []struct {
		name   string
		shards []shard.Config
		t      target
	}{
		{"fixed addresses", b.shards, target{"tally mode: exact", b.apiAddrs[0], "far-exact", b.edges[0], nil}},
		{"Sentinel", []shard.Config{sc}, target{"tally mode: exact, Sentinel shard", f.Edge.APIListen, "far-exact", edge, nil}},
	}
	results := make([]shardKindResult, len(kinds))
	p99s := make([][]float64, len(kinds))
	for i, k := range kinds {
		results[i].Shard = k.name
		if results[i].ReservationP50, results[i].ReservationP99, err = b.reservationRoundTrips(ctx, k.shards); err != nil {
			return err
		}
		fmt.Printf("  %-16s a reservation: p50 %.3f ms, p99 %.3f ms\n", k.name, results[i].ReservationP50, results[i].ReservationP99)
	}
	for rep := range b.reps {
		for i, k := range kinds {
			if _, err := loadgen.ClosedLoop(ctx, b.loadTarget(k.t), conns, 0, b.warm); err != nil {
				return err
			}
			res, err := loadgen.ClosedLoop(ctx, b.loadTarget(k.t), conns, 0, b.satDur)
			if err != nil {
				return err
			}
			if res.Statuses[200] != res.Completed {
				return fmt.Errorf("%s: %d of %d responses were not 200 (%v)", k.t.name, res.Completed-res.Statuses[200], res.Completed, res.Statuses)
			}
			results[i].Runs = append(results[i].Runs, res.Throughput())
			p99s[i] = append(p99s[i], ms(res.Latency.Quantile(0.99)))
			fmt.Printf("  %-16s mode exact, rep %d: %8.0f req/s  p99 %.2f ms\n", k.name, rep+1, res.Throughput(), ms(res.Latency.Quantile(0.99)))
		}
	}
	for i := range results {
		results[i].Median = median(results[i].Runs)
		results[i].Min, results[i].Max = minMax(results[i].Runs)
		results[i].P99 = median(p99s[i])
	}
	b.report.ShardKinds = results
	return nil
}

// reservationRoundTrips times sequential reservations through a store of
// shards, as an edge makes them: p50 and p99, ms.
func (b *bench) reservationRoundTrips(ctx context.Context, shards []shard.Config) (p50, p99 float64, err error) {
	const n = 2000
	ks, _ := limiter.NewKeySpace(b.cfg.KeyPrefix, b.stack.Secret())
	store, err := redisstore.NewStore(shards, ks, redisstore.Options{})
	if err != nil {
		return 0, 0, err
	}
	defer store.Close()
	h := loadgen.NewHistogram()
	k := ks.Key("far", "reservation-round-trip")
	for i := range n + 100 {
		start := time.Now()
		if _, err := store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Hour, Limit: limiter.MaxLimit, Need: 1, Want: 1,
			Producer: "bench"}); err != nil {
			return 0, 0, err
		}
		if i >= 100 { // the first ones open connections and load the script
			h.Record(time.Since(start))
		}
	}
	return ms(h.Quantile(0.5)), ms(h.Quantile(0.99)), nil
}

// shardKindsMarkdown writes the reservation path on both kinds of shard.
func (r *report) shardKindsMarkdown(p func(string, ...any)) {
	if len(r.ShardKinds) == 0 {
		return
	}
	p("## Reservations on a Sentinel shard and on a shard of fixed addresses")
	p("")
	p("The reservation path on the deployment's shards (fixed addresses) and on a Sentinel shard (a primary, a")
	p("replica, one sentinel; an edge of its own): one reservation's round trip, sequential, through the store")
	p("as an edge makes it (2,000 after 100 of warm-up), and the decision API in mode exact (a reservation per")
	p("request), closed loop, %d connections, runs interleaved. Neither waits for a replica: a primary that", conns)
	p("changes is re-seeded from what the edges hold ([operations.md](operations.md#when-a-primary-changes)).")
	p("")
	p("| shard | reservation p50 ms | reservation p99 ms | mode exact req/s (median) | range | mode exact p99 ms |")
	p("|---|---|---|---|---|---|")
	for _, k := range r.ShardKinds {
		p("| %s | %.3f | %.3f | %.0f | %.0f – %.0f | %.2f |", k.Shard, k.ReservationP50, k.ReservationP99, k.Median, k.Min, k.Max, k.P99)
	}
	p("")
}
