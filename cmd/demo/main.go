// Command demo runs the whole Tally pipeline on this machine for a few
// seconds: two Redis shards (a primary and a replica each), a NATS server
// with JetStream, the accountant, and the edge-checker in proxy mode in
// front of a small API that serves ETags and 304s. It drives a short burst
// of traffic from a few clients and prints what happened.
//
// Every process it starts is stopped when it ends, on success, on error and
// on Ctrl-C. It expects redis-server on PATH and the binaries in bin/
// (make demo builds them).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "tally-demo-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	st := stack.New(dir, "bin") // a key secret and NATS passwords of its own
	err = run(ctx, st)
	st.StopAll()
	switch {
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, "\ninterrupted: every process the demo started has been stopped")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo:", err)
		fmt.Fprintln(os.Stderr, "logs are in", dir)
		os.Exit(1)
	}
	_ = os.RemoveAll(dir)
}

func run(ctx context.Context, st *stack.Stack) error {
	step := func(s string) { fmt.Printf("  %-44s", s) }
	done := func() { fmt.Println("ok") }
	fmt.Println("Starting the pipeline:")

	step("redis shards s0, s1 (primary + replica)")
	shards, _, err := st.Shards(ctx, 2, 1)
	if err != nil {
		return err
	}
	done()
	step("nats-server with JetStream")
	nats, err := st.NATS(ctx)
	if err != nil {
		return err
	}
	done()
	step("demo API (ETags, 304 Not Modified)")
	api, err := demoAPI()
	if err != nil {
		return err
	}
	defer api.Close()
	done()

	cfg := deployment(shards, nats.Addr, "http://"+api.Addr)
	path, err := st.WriteConfig("tally", cfg)
	if err != nil {
		return err
	}
	step("accountant")
	if _, err := st.Accountant(ctx, "accountant", path, cfg.Accountant.AdminListen); err != nil {
		return err
	}
	done()
	step("edge-checker (proxy mode)")
	// Every request traced, its spans written to the edge's log.
	edge, err := st.Edge(ctx, "edge-checker", path, cfg.Edge.AdminListen, "OTEL_TRACES_EXPORTER=console",
		"OTEL_TRACES_SAMPLER=always_on")
	if err != nil {
		return err
	}
	done()

	fmt.Println("\nTraffic (policy \"core\": 10 requests per minute per client):")
	results := drive(ctx, "http://"+cfg.Edge.Listen)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// Stop the edge as a deploy would: it gives back the units it reserved
	// and did not use, and hands what is left to account for to JetStream;
	// the accountant applies it.
	em := scrape("http://" + cfg.Edge.AdminListen + "/metrics")
	edge.Stop()
	am := settle("http://" + cfg.Accountant.AdminListen + "/metrics")

	keys, err := limiter.NewKeySpace(cfg.KeyPrefix, st.Secret())
	if err != nil {
		return err
	}
	store, err := redisstore.NewStore(shards, keys, redisstore.Options{})
	if err != nil {
		return err
	}
	defer store.Close()
	fmt.Println()
	fmt.Printf("  %-8s %-34s %5s %7s %5s %5s %6s  %s\n", "client", "what it did", "sent", "allowed", "429", "304", "usage", "shard")
	for _, r := range results {
		k := keys.Key("core", "h:"+r.token)
		usage := "?"
		g, err := store.Take(ctx, k, time.Now(), limiter.TakeArgs{Window: time.Minute, Limit: 10, Producer: "demo"})
		if err == nil {
			usage = fmt.Sprintf("%d/10", g.Used)
		}
		fmt.Printf("  %-8s %-34s %5d %7d %5d %5d %6s  %s\n", r.name, r.what, r.sent, r.allowed, r.denied, r.notModified,
			usage, store.ShardName(store.ShardOf(k)))
	}
	fromCredit := em[`tally_edge_decisions_total{path="credit",result="allowed"}`]
	reserved := em[`tally_edge_decisions_total{path="reserve",result="allowed"}`]
	cached := em[`tally_edge_decisions_total{path="cache",result="denied"}`]
	deniedReserve := em[`tally_edge_decisions_total{path="reserve",result="denied"}`]
	fmt.Printf(`
Summary:
  edge-checker   allowed %v (%v from credit, %v after waiting for a reservation), denied %v (%v from memory)
                 reservations on the primaries %v; 304s taken back into its own credit %v
                 accounting events while serving: to JetStream %v, applied by the edge itself %v, dropped %v
  accountant     refunded %v, released %v (unused credit the edge gave back when it stopped), charged %v,
                 duplicates %v, late %v, dead-lettered %v
                 accounting lag %s
`,
		fromCredit+reserved, fromCredit, reserved, cached+deniedReserve, cached,
		em["tally_edge_reservations_total"], em["tally_edge_refunds_absorbed_total"],
		em[`tally_edge_accounting_events_total{outcome="published"}`], em[`tally_edge_accounting_events_total{outcome="applied_directly"}`],
		em[`tally_edge_accounting_events_total{outcome="dropped"}`],
		am[`tally_accountant_events_total{outcome="refunded"}`], am[`tally_accountant_events_total{outcome="released"}`],
		am[`tally_accountant_events_total{outcome="charged"}`], am[`tally_accountant_events_total{outcome="duplicate"}`],
		am[`tally_accountant_events_total{outcome="late"}`], am["tally_accountant_dead_letters_total"], lag(am))
	fmt.Println("\nUsage is read from the shard primaries after the edge stopped: what each client used,")
	fmt.Println("304s refunded.")
	return whereToLook(ctx, cfg, edge.LogFile(), st.NATSOptions("analytics"))
}

// whereToLook shows what the telemetry of the run holds, and where it is
// in a deployment.
func whereToLook(ctx context.Context, cfg *config.File, edgeLog string, natsOpts []nats.Option) error {
	records, denial, err := decisions(ctx, cfg.NATS.URL, cfg.NATS.Streams.WithDefaults().Decisions.Name, natsOpts)
	if err != nil {
		return fmt.Errorf("reading the decisions stream: %w", err)
	}
	id, spans, err := aTrace(edgeLog)
	if err != nil {
		return err
	}
	fmt.Printf(`
Where to look:
  metrics     each process's /metrics (the figures above came from http://%s/metrics and
              http://%s/metrics); alert rules and a dashboard in deploy/
  decisions   %d records on the stream %s; the first denial:
              %s
              per window, from the stream alone: NATS_PASSWORD=… go run ./examples/decisions -nats <url> -user analytics (here %s)
  traces      every request was traced to the edge's log (OTEL_TRACES_EXPORTER=console); trace %s: %s.
              A request whose events go to the stream adds the publish span, and the accountant's
              process span continues it; set OTEL_EXPORTER_OTLP_ENDPOINT to send them to a collector.
Stopping everything.
`, cfg.Edge.AdminListen, cfg.Accountant.AdminListen, records, cfg.NATS.Streams.WithDefaults().Decisions.Name, denial,
		cfg.NATS.URL, id, strings.Join(spans, " → "))
	return nil
}

// deployment is the demo's configuration: two shards, one edge in proxy
// mode, one accountant, a policy of 10 requests per minute.
func deployment(shards []shard.Config, natsURL, upstream string) *config.File {
	f := &config.File{KeyPrefix: "tally", Redis: config.Redis{Shards: shards}}
	f.NATS.URL = natsURL
	f.Edge = config.Edge{Listen: stack.FreeAddr(), Upstream: upstream, AdminListen: stack.FreeAddr(), DefaultPolicy: "core",
		Identity: config.Identity{Header: "Authorization"}}
	f.Accountant.AdminListen = stack.FreeAddr()
	f.Policies = []config.Policy{{Name: "core", Limit: 10, Window: time.Minute}}
	return f
}

type clientResult struct {
	name, token, what                       string
	sent, allowed, denied, notModified, bad int
}

// drive sends a short burst: a light client, a heavy one that goes over its
// limit, one that revalidates with If-None-Match (304s are refunded), and
// one that mixes both.
func drive(ctx context.Context, base string) []*clientResult {
	clients := []*clientResult{
		{name: "alice", token: "tok-alice", what: "6 plain requests"},
		{name: "bob", token: "tok-bob", what: "15 requests, over the limit"},
		{name: "carol", token: "tok-carol", what: "1 request + 12 revalidations"},
		{name: "dave", token: "tok-dave", what: "8 requests + 6 revalidations"},
	}
	plan := map[string][]bool{ // true: conditional request
		"alice": repeat(false, 6),
		"bob":   repeat(false, 15),
		"carol": append([]bool{false}, repeat(true, 12)...),
		"dave":  append(repeat(false, 8), repeat(true, 6)...),
	}
	var wg sync.WaitGroup
	for _, c := range clients {
		wg.Go(func() {
			for _, cond := range plan[c.name] {
				if ctx.Err() != nil {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", base+"/repos/tally", nil)
				req.Header.Set("Authorization", c.token)
				if cond {
					req.Header.Set("If-None-Match", `"v1"`)
				}
				resp, err := http.DefaultClient.Do(req)
				c.sent++
				if err != nil {
					c.bad++
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					c.allowed++
				case 304:
					c.allowed++
					c.notModified++
				case 429:
					c.denied++
				default:
					c.bad++
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	return clients
}

func repeat(v bool, n int) []bool {
	out := make([]bool, n)
	for i := range out {
		out[i] = v
	}
	return out
}

// demoAPI serves an ETag for every path and 304 when it matches.
func demoAPI() (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Addr: ln.Addr().String(), ReadHeaderTimeout: 5 * time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("ETag", `"v1"`)
			if r.Header.Get("If-None-Match") == `"v1"` {
				w.WriteHeader(http.StatusNotModified)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"name":"tally","stars":42}` + "\n"))
		})}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

// scrape reads a Prometheus text page into "name{labels}" → value.
func scrape(url string) map[string]float64 {
	out, err := metrics.Scrape(url)
	if err != nil {
		return map[string]float64{}
	}
	return out
}

// settle waits (up to 5 s) until the accountant at url has applied what the
// stopping edge sent, and returns its metrics.
func settle(url string) map[string]float64 {
	var last map[string]float64
	for range 50 {
		m := scrape(url)
		if last != nil && m["tally_accountant_messages_total"] == last["tally_accountant_messages_total"] &&
			m["tally_accountant_messages_total"] > 0 {
			return m
		}
		last = m
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

// lag summarises the accountant's lag histogram.
func lag(m map[string]float64) string {
	n := m["tally_accountant_lag_seconds_count"]
	if n == 0 {
		return "(no events)"
	}
	return fmt.Sprintf("average %.1f ms over %v events (an event's creation at the edge → its effect in Redis)",
		m["tally_accountant_lag_seconds_sum"]/n*1000, n)
}
