package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/loadgen"
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
	ratelimitBin   string              // an envoyproxy/ratelimit binary, or ""
	reference      *target             // envoyproxy/ratelimit, when its binary is given
	referenceGRPC  string              // its gRPC address
	rlsDir         string              // the rate-limit service's rules
	rlsAddr        string              // the first edge's rate-limit service (gRPC)
	faAddr         string              // the first edge's forward-auth listener
	faRequests     [][]byte            // Traefik's forward-auth calls, one per key
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
		{Name: "far-sliding", Limit: limiter.MaxLimit, Window: time.Hour, Algorithm: limiter.SlidingWindow, Slices: 10},
		{Name: "far-concurrency", Limit: limiter.MaxLimit, Algorithm: limiter.Concurrency, Lease: 30 * time.Minute},
		{Name: "far-bucket", Limit: limiter.MaxLimit, Window: time.Minute, Algorithm: limiter.TokenBucket},
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
	if b.rlsDir, err = b.writeRLSRules(); err != nil {
		return err
	}
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
	if b.ratelimitBin != "" {
		fmt.Println("Starting", referenceName, "from", b.ratelimitBin, "with a Redis primary and replica of its own")
		if err := b.startReference(ctx, b.ratelimitBin); err != nil {
			return err
		}
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
		{"key counts: 1, 100, 10k and 1M keys, closed loop; 3,000/s over 1M keys, open loop", b.keyCounts},
		{"algorithms beside the fixed window: sliding window, concurrency limit, token bucket over 1 and 1M keys", b.slidingBeside},
		{"Envoy's rate-limit service over gRPC, beside a no-op gRPC handler", b.grpcDoor},
		{"reservations on a Sentinel shard and on a shard of fixed addresses, mode exact", b.shardKinds},
		{"the denied path (windows full)", b.denied},
		{"one hot key offered 5x its limit from 1, 2 and 4 edges, modes auto and async", b.hotKey},
		{"accountant throughput, with and without WAIT", b.accountantThroughput},
		{"accounting lag under several loads, with a burst on one key", b.lag},
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
	f.Routes = []config.Route{{Path: "/far", Policy: "far"}} // the forward-auth target's
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
			f.Edge.RLS = config.RLS{Listen: stack.FreeAddr(), Config: b.rlsDir}
			b.rlsAddr = f.Edge.RLS.Listen
			f.Edge.ForwardAuth = config.ForwardAuth{Listen: stack.FreeAddr(), Gateways: []string{"127.0.0.1"}}
			b.faAddr = f.Edge.ForwardAuth.Listen
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
	b.faRequests = make([][]byte, keys)
	for i := range b.faRequests {
		b.faRequests[i] = forwardAuthRequest("client-" + strconv.Itoa(i))
	}
}

// forwardAuthRequest is Traefik's ForwardAuth call about a client's GET
// /far: the original request in X-Forwarded-* headers, the client's
// credentials copied.
func forwardAuthRequest(identity string) []byte {
	return []byte("GET /auth/traefik HTTP/1.1\r\nHost: bench\r\nX-Forwarded-Method: GET\r\nX-Forwarded-Proto: http\r\n" +
		"X-Forwarded-Host: api.bench\r\nX-Forwarded-Uri: /far\r\nX-Forwarded-For: 192.0.2.1\r\nAuthorization: Bearer " + identity + "\r\n\r\n")
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
	edge               *stack.Proc // nil: the no-op reference, or a peer
	// procs, for a peer, are the processes whose CPU its runs account for.
	procs map[string][]*stack.Proc
}

// targets are the no-op reference, mode exact and mode auto (the first
// edge, the default configuration), and mode auto on an edge that records
// a tenth of allowed decisions.
func (b *bench) targets() []target {
	return []target{
		{"no-op net/http", b.noopProc.Addr, "far", nil, nil},
		{"tally mode: exact", b.apiAddrs[0], "far-exact", b.edges[0], nil},
		{"tally mode: auto", b.apiAddrs[0], "far", b.edges[0], nil},
		{"tally mode: auto, 10% of allowed decisions recorded", b.sampledAPI, "far", b.sampled, nil},
		{"tally mode: auto, every request traced", b.tracedAPI, "far", b.traced, nil},
		{forwardAuthTarget, b.faAddr, "", b.edges[0], nil},
	}
}

// forwardAuthTarget is the forward-auth door under mode auto, as Traefik
// asks it.
const forwardAuthTarget = "tally forward-auth (Traefik's call), mode: auto"

func (b *bench) loadTarget(t target) loadgen.Target {
	reqs := b.requestsPolicy[t.policy]
	if t.name == forwardAuthTarget {
		reqs = b.faRequests
	}
	return loadgen.Target{Addr: t.addr, Request: func(conn int, i uint64) []byte {
		return reqs[(uint64(conn)*7919+i*104729)%keys]
	}}
}

// processes are the processes whose CPU a run accounts for.
func (b *bench) processes(t target) map[string][]*stack.Proc {
	if t.procs != nil {
		return t.procs
	}
	if t.edge == nil {
		return map[string][]*stack.Proc{"no-op": {b.noopProc}}
	}
	return map[string][]*stack.Proc{"edge-checker": {t.edge}, "accountant": {b.acc}, "nats-server": {b.nats}, "redis (4)": b.redis}
}
