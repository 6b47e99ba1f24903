package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/loadgen"
)

// report is everything one run measured; it is written as Markdown with the
// raw figures as JSON and a latency chart (SVG) beside it.
type report struct {
	Date       string             `json:"date"`
	Machine    map[string]string  `json:"machine"`
	Command    string             `json:"command"`
	Duration   time.Duration      `json:"duration_ns"`
	Saturation []saturationResult `json:"saturation"`
	Latency    []latencyResult    `json:"latency"`
	Denied     []deniedResult     `json:"denied"`
	Hot        []hotResult        `json:"hot_key"`
	Accountant []accountantResult `json:"accountant"`
	Lag        []lagResult        `json:"lag"`
	RoundTrips roundTrips         `json:"idle_round_trips"`
	KeyCounts  []keyCountResult   `json:"key_counts"`
	GRPC       []grpcResult       `json:"grpc"`
	OpenKeys   []openKeysResult   `json:"open_loop_many_keys"`
	ShardKinds []shardKindResult  `json:"reservations_by_shard_kind"`
}

type roundTrips struct {
	JetStreamP50 float64 `json:"jetstream_publish_p50_ms"`
	JetStreamP99 float64 `json:"jetstream_publish_p99_ms"`
	RedisP50     float64 `json:"reservation_p50_ms"`
	RedisP99     float64 `json:"reservation_p99_ms"`
}

type runCost struct {
	// CPUPerRequest is CPU time in µs per request, by process group.
	CPUPerRequest        map[string]float64 `json:"cpu_us_per_request"`
	RedisCallsPerRequest float64            `json:"redis_calls_per_request"`
	MessagesPerRequest   float64            `json:"jetstream_messages_per_request"`
	// FromMemory is the share of requests the edges answered with no Redis
	// call on their path (from credit, or a window known to be full).
	FromMemory float64 `json:"answered_from_memory"`
}

type saturationResult struct {
	Target string    `json:"target"`
	Median float64   `json:"median_rps"`
	Min    float64   `json:"min_rps"`
	Max    float64   `json:"max_rps"`
	Runs   []float64 `json:"runs_rps"`
	Cost   runCost   `json:"cost"`
}

type latencyResult struct {
	Target   string  `json:"target"`
	Label    string  `json:"load"`
	Offered  float64 `json:"offered_rps"`
	Achieved float64 `json:"achieved_rps"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	Errors   uint64  `json:"errors"`
}

type deniedResult struct {
	Target               string  `json:"target"`
	Throughput           float64 `json:"rps"`
	Denied               uint64  `json:"denied"`
	Completed            uint64  `json:"completed"`
	RedisCallsPerRequest float64 `json:"redis_calls_per_request"`
	Cost                 runCost `json:"cost"`
}

type hotResult struct {
	Mode             string  `json:"mode"`
	Edges            int     `json:"edges"`
	Limit            int     `json:"limit"`
	Window           string  `json:"window"`
	Offered          float64 `json:"offered_per_window"`
	AllowedPerWindow []int   `json:"allowed_per_window"`
	Denied           int     `json:"denied"`
}

type accountantResult struct {
	Wait      bool    `json:"wait_for_replica"`
	Events    int     `json:"events"`
	PerSecond float64 `json:"events_per_second"`
}

type lagResult struct {
	Route      string  `json:"route"`
	Saturation float64 `json:"scenario_saturation_rps"`
	Share      float64 `json:"share_of_saturation"`
	Offered    float64 `json:"offered_rps"`
	Achieved   float64 `json:"achieved_rps"`
	SideRate   float64 `json:"revalidations_per_second"`
	Events     uint64  `json:"events"`
	P50        float64 `json:"lag_p50_ms"`
	P99        float64 `json:"lag_p99_ms"`
	RequestP99 float64 `json:"request_p99_ms"`
	// CoresBusy is how many of the machine's cores were busy, on average,
	// over the run (/proc/stat: every process, the load generator's too).
	CoresBusy float64 `json:"cores_busy"`
	// EdgeSchedP99 and AccountantSchedP99 are the 99th percentiles of the
	// time goroutines stayed runnable before they ran, in ms (the Go
	// runtime's /sched/latencies).
	EdgeSchedP99       float64 `json:"edge_sched_latency_p99_ms"`
	AccountantSchedP99 float64 `json:"accountant_sched_latency_p99_ms,omitempty"`
}

func (r *report) write(out string, b *bench) error {
	r.Date = time.Now().UTC().Format("2006-01-02 15:04 UTC")
	r.Command = "make bench"
	if b.short {
		r.Command = "make bench BENCHFLAGS=-short"
	}
	r.Machine = machine(b.stack.Bin)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	base := strings.TrimSuffix(out, filepath.Ext(out))
	chart := base + "-latency.svg"
	if err := r.chart(chart); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	var md strings.Builder
	r.markdown(&md, filepath.Base(chart), string(raw))
	if err := os.WriteFile(out, []byte(md.String()), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nWrote %s and %s (%v).\n", out, chart, r.Duration.Round(time.Second))
	return nil
}

// render writes the report at path again from the raw figures it holds
// (its "Raw figures" section), with this build's text and targets.
func render(path string) error {
	md, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	const open, end = "## Raw figures\n\n```json\n", "\n```"
	_, rest, ok := strings.Cut(string(md), open)
	raw, _, ok2 := strings.Cut(rest, end)
	if !ok || !ok2 {
		return fmt.Errorf("%s has no raw figures", path)
	}
	var r report
	if err := json.Unmarshal([]byte(raw), &r); err != nil {
		return fmt.Errorf("%s: raw figures: %w", path, err)
	}
	base := strings.TrimSuffix(path, filepath.Ext(path))
	chart := base + "-latency.svg"
	if err := r.chart(chart); err != nil {
		return err
	}
	var out strings.Builder
	r.markdown(&out, filepath.Base(chart), raw)
	return os.WriteFile(path, []byte(out.String()), 0o644)
}

func machine(bin string) map[string]string {
	m := map[string]string{"go": runtime.Version(), "cpus": fmt.Sprint(runtime.NumCPU())}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m["cpu"] = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		m["memory"] = strings.TrimSpace(strings.TrimPrefix(strings.SplitN(string(b), "\n", 2)[0], "MemTotal:"))
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("redis-server", "--version").Output(); err == nil {
		m["redis"] = strings.TrimSpace(string(out))
	}
	if out, err := exec.Command(filepath.Join(bin, "nats-server"), "--version").Output(); err == nil {
		m["nats"] = strings.TrimSpace(string(out))
	}
	return m
}

func (r *report) chart(path string) error {
	byTarget := map[string][]loadgen.Point{}
	var order []string
	for _, l := range r.Latency {
		if _, ok := byTarget[l.Target]; !ok {
			order = append(order, l.Target)
		}
		byTarget[l.Target] = append(byTarget[l.Target], loadgen.Point{X: l.Offered, Y: l.P99})
	}
	c := loadgen.Chart{Title: "p99 latency against offered load (open loop, decision API, 1,000 keys)",
		XLabel: "offered load (requests/s)", YLabel: "p99 latency (ms)", LogY: true}
	for _, t := range order {
		pts := byTarget[t]
		sort.Slice(pts, func(i, j int) bool { return pts[i].X < pts[j].X })
		c.Series = append(c.Series, loadgen.Series{Name: t, Points: pts})
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return c.WriteSVG(f)
}

func (r *report) sat(name string) saturationResult {
	for _, s := range r.Saturation {
		if s.Target == name {
			return s
		}
	}
	return saturationResult{}
}

func (r *report) lat(target, label string) latencyResult {
	for _, l := range r.Latency {
		if l.Target == target && l.Label == label {
			return l
		}
	}
	return latencyResult{}
}

func (r *report) markdown(w *strings.Builder, chart, raw string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	noop, exact, auto := r.sat("no-op net/http"), r.sat("tally mode: exact"), r.sat("tally mode: auto")
	p("# Performance")
	p("")
	p("Measured by `%s` (cmd/bench) on %s, in %v. Every figure below comes from that one run, on one", r.Command, r.Date, r.Duration.Round(time.Second))
	p("machine shared by every process: the load generator, the edge-checker(s), the accountant, NATS and four")
	p("Redis servers (two shards, a primary and a replica each). Ratios compare targets driven by the same")
	p("generator in the same run; absolute figures depend on the machine.")
	p("")
	p("Machine: %s, %s CPUs, %s; %s; %s; Go %s; Linux %s.", r.Machine["cpu"], r.Machine["cpus"], r.Machine["memory"],
		r.Machine["redis"], r.Machine["nats"], strings.TrimPrefix(r.Machine["go"], "go"), r.Machine["kernel"])
	p("")
	p("## Targets")
	p("")
	p("| target | measured | |")
	p("|---|---|---|")
	check := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**missed**"
	}
	rn, re := auto.Median/noop.Median, auto.Median/exact.Median
	p("| decision API throughput ≥ 0.7× the no-op handler | %.2f× | %s |", rn, check(rn >= 0.7))
	p("| decision API throughput ≥ 2× mode: exact | %.2f× | %s |", re, check(re >= 2))
	a50, e50 := r.lat("tally mode: auto", "50%"), r.lat("tally mode: exact", "auto's 50%")
	p("| p99 at half of saturation ≤ mode: exact's p99 at the same load | %.2f ms vs %.2f ms | %s |", a50.P99, e50.P99, check(a50.P99 <= e50.P99))
	over, under, asyncOne, asyncMany := 0, 0, 0, 0
	for _, h := range r.Hot {
		for _, n := range h.AllowedPerWindow[:max(0, len(h.AllowedPerWindow)-1)] { // the last window is cut by the run's end
			switch {
			case h.Mode == "async" && h.Edges == 1:
				asyncOne = max(asyncOne, n-h.Limit)
			case h.Mode == "async":
				asyncMany = max(asyncMany, n-h.Limit)
			default:
				over = max(over, n-h.Limit)
				under = max(under, h.Limit-n)
			}
		}
	}
	p("| allowed per window ≤ limit, 1, 2 and 4 edges (hot key, 5× offered, mode auto) | largest overshoot %d | %s |", over, check(over <= 0))
	p("| mode async, one edge: allowed per window ≤ limit | largest overshoot %d | %s |", asyncOne, check(asyncOne <= 0))
	p("| mode async, 2 and 4 edges: overshoot measured (no target) | largest %d of 500 | measured |", asyncMany)
	p("| undershoot ≤ 1%% of the limit | largest %d of 500 | %s |", under, check(under <= 5))
	var denied runCost
	for _, d := range r.Denied {
		if strings.HasSuffix(d.Target, "auto") {
			denied = d.Cost
		}
	}
	p("| zero Redis calls for keys answered from memory (far from the limit, or over it) | %.2f%% of requests far from the limit and %.2f%% of denied ones answered with no Redis call on their path; in the background %.4f and %.4f script calls per request (reservations renewed for busy keys, rereads of full windows) | %s |",
		100*auto.Cost.FromMemory, 100*denied.FromMemory, auto.Cost.RedisCallsPerRequest, denied.RedisCallsPerRequest,
		check(auto.Cost.FromMemory > 0.99 && denied.FromMemory > 0.99))
	for _, l := range r.Lag {
		switch {
		case l.Share == 0 && l.SideRate < 1000:
			p("| accounting lag p99 ≤ 10 ms at a load that leaves a core free (%.0f revalidations/s, each a refund event, and bursts: %.1f of %s cores busy), route %s | %.2f ms (p50 %.2f ms) | %s |",
				l.SideRate, l.CoresBusy, r.Machine["cpus"], l.Route, l.P99, l.P50, check(l.P99 <= 10))
		case l.Share == 0.5:
			p("| accounting lag at half of saturation (%.1f of %s cores busy), route %s: measured (no target) | p99 %.2f ms (p50 %.2f ms) | measured |",
				l.CoresBusy, r.Machine["cpus"], l.Route, l.P99, l.P50)
		}
	}
	r.keyTargets(p, check)
	if fa := r.sat(forwardAuthTarget); fa.Median > 0 {
		p("| forward-auth (Traefik's call, mode auto) beside the decision API and the no-op handler: measured (no target) | %.2f× the no-op, %.2f× the decision API | measured |",
			fa.Median/noop.Median, fa.Median/auto.Median)
	}
	if len(r.GRPC) > 1 {
		g := r.GRPC[1].Median / r.GRPC[0].Median
		p("| Envoy's rate-limit service (gRPC) ≥ 0.8× a no-op gRPC handler | %.2f× | %s |", g, check(g >= 0.8))
	}
	p("")
	p("## Throughput at saturation")
	p("")
	p("Decision API (`POST /v1/check`), closed loop, %d connections, %d keys chosen uniformly, far from their", conns, keys)
	p("limits. Median of the runs (interleaved, so that the shared machine's noise falls on every target), and")
	p("their range. Mode auto runs with the default configuration, which records every decision on the")
	p("decisions stream; the row after it records a tenth of allowed decisions (`edge.decisions.sample_allowed: 0.1`),")
	p("and the last traces every request (`OTEL_TRACES_SAMPLER=always_on`: a server span per request and a")
	p("producer span per accounting message, exported over OTLP/HTTP to a sink in the benchmark's process): the")
	p("upper bound of what tracing costs; a ratio sampler pays a share of it. The forward-auth row is the same")
	p("decision asked as Traefik asks it (`GET /auth/traefik` with the original request in `X-Forwarded-*`")
	p("headers, the client's `Authorization` copied), on the first edge, whose route `/far` is the policy `far`.")
	p("")
	p("| target | requests/s (median) | range | × no-op | × exact |")
	p("|---|---|---|---|---|")
	for _, s := range r.Saturation {
		p("| %s | %.0f | %.0f – %.0f | %.2f | %.2f |", s.Target, s.Median, s.Min, s.Max, s.Median/noop.Median, s.Median/exact.Median)
	}
	p("")
	r.keysMarkdown(p)
	r.grpcMarkdown(p)
	r.shardKindsMarkdown(p)
	p("## Latency against offered load")
	p("")
	p("Open loop (latency counted from each request's scheduled send time), at shares of each target's")
	p("saturation, and mode exact at the loads auto was measured at.")
	p("")
	p("![p99 latency against offered load](%s)", chart)
	p("")
	p("| target | load | offered req/s | achieved req/s | p50 ms | p99 ms | p99.9 ms |")
	p("|---|---|---|---|---|---|---|")
	for _, l := range r.Latency {
		p("| %s | %s | %.0f | %.0f | %.2f | %.2f | %.2f |", l.Target, l.Label, l.Offered, l.Achieved, l.P50, l.P99, l.P999)
	}
	p("")
	p("## What a request costs")
	p("")
	p("From the last saturation run of each target, after its warm-up: CPU time per request of each process (µs); the share of")
	p("requests the edge answered with no Redis call on their path; Redis script calls per request on all four")
	p("nodes, background work included (reservations made ahead of need, rereads of full windows, the")
	p("accountant's lease); JetStream messages per request (accounting and decisions streams). The denied rows")
	p("keep every window full.")
	p("")
	groups := []string{"load generator", "no-op", "edge-checker", "accountant", "nats-server", "redis (4)"}
	p("| run | %s | answered from memory | Redis calls / request | JetStream messages / request |", strings.Join(groups, " | "))
	p("|---|%s---|---|---|", strings.Repeat("---|", len(groups)))
	row := func(name string, c runCost) {
		var cells []string
		for _, g := range groups {
			if v, ok := c.CPUPerRequest[g]; ok {
				cells = append(cells, fmt.Sprintf("%.1f", v))
			} else {
				cells = append(cells, "–")
			}
		}
		mem := "–"
		if _, edge := c.CPUPerRequest["edge-checker"]; edge {
			mem = fmt.Sprintf("%.2f%%", 100*c.FromMemory)
		}
		p("| %s | %s | %s | %.4f | %.4f |", name, strings.Join(cells, " | "), mem, c.RedisCallsPerRequest, c.MessagesPerRequest)
	}
	for _, s := range r.Saturation {
		row(s.Target+", allowed", s.Cost)
	}
	for _, d := range r.Denied {
		row(d.Target+", denied", d.Cost)
	}
	p("")
	p("## One hot key offered five times its limit")
	p("")
	p("Policy: %d per %s, modes auto and async; offered %.0f requests per window, open loop, split evenly over the edges.", 500, "5s", 2500.0)
	p("Allowed requests counted per window from the responses' `X-RateLimit-Reset`; the last window is cut short")
	p("by the end of the run.")
	p("")
	p("| mode | edges | allowed per window | limit | denied |")
	p("|---|---|---|---|---|")
	for _, h := range r.Hot {
		p("| %s | %d | %v | %d | %d |", h.Mode, h.Edges, h.AllowedPerWindow, h.Limit, h.Denied)
	}
	p("")
	p("## Accounting")
	p("")
	p("The accountant applying events published straight to the accounting stream (as a service would), in")
	p("batches of 512 over both shards, with and without waiting for a replica (Redis `WAIT`) before it")
	p("deletes applied events from the stream:")
	p("")
	p("| WAIT for a replica | events | applied per second |")
	p("|---|---|---|")
	for _, a := range r.Accountant {
		p("| %v | %d | %.0f |", a.Wait, a.Events, a.PerSecond)
	}
	p("")
	p("Accounting lag (an event's creation at the edge to its effect in Redis): the decision API at a share of")
	p("mode auto's saturation (half, a quarter, none), while revalidations go through the proxy in mode exact")
	p("(each answered 304: each refund an accounting event; 1,000 a second, and 250 in the last run, a load that")
	p("leaves the machine a core free) and one key sends a burst of 80 back-to-back revalidations every second.")
	p("On both routes of accounting events: `stream` (the default: JetStream, then the accountant) and `direct`")
	p("(the edge applies its events on the primary itself). Cores busy are the machine's, load generator included.")
	p("")
	p("The last two columns are the 99th percentile of the time goroutines waited for a CPU while runnable")
	p("(the Go runtime's scheduling latency), in the edge and in the accountant, over the same run.")
	p("")
	p("| route | decision API load | revalidations/s | cores busy | decision API req/s | events | lag p50 ms | lag p99 ms | decision API p99 ms | edge: waited for a CPU, p99 ms | accountant: waited for a CPU, p99 ms |")
	p("|---|---|---|---|---|---|---|---|---|---|---|")
	for _, l := range r.Lag {
		load, achieved, reqP99 := "none", "–", "–"
		if l.Share > 0 {
			load, achieved, reqP99 = fmt.Sprintf("%.0f%%", 100*l.Share), fmt.Sprintf("%.0f", l.Achieved), fmt.Sprintf("%.2f", l.RequestP99)
		}
		acc := "–"
		if l.Route == "stream" {
			acc = fmt.Sprintf("%.2f", l.AccountantSchedP99)
		}
		p("| %s | %s | %.0f | %.2f | %s | %d | %.2f | %.2f | %s | %.2f | %s |", l.Route, load, l.SideRate, l.CoresBusy, achieved, l.Events,
			l.P50, l.P99, reqP99, l.EdgeSchedP99, acc)
	}
	p("")
	p("On the idle machine, before the runs: a JetStream publish to its acknowledgement takes p50 %.3f ms,",
		r.RoundTrips.JetStreamP50)
	p("p99 %.3f ms; a reservation on a primary p50 %.3f ms, p99 %.3f ms. Under load every hop of the accounting",
		r.RoundTrips.JetStreamP99, r.RoundTrips.RedisP50, r.RoundTrips.RedisP99)
	p("path (the edge's outbox, NATS, the accountant, Redis) also waits for one of the two cores the eleven")
	p("processes of this benchmark share.")
	p("")
	p("## Raw figures")
	p("")
	p("```json")
	p("%s", raw)
	p("```")
}
