package faults

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	tallymetrics "github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

// Policies: far from their limits, in modes auto and exact (in which every
// 304 is refunded through the accounting stream, so the stream carries
// events all along), and a small limit that the load reaches, for denials.
var (
	far   = config.Policy{Name: "far", Limit: limiter.MaxLimit, Window: time.Hour}
	exact = config.Policy{Name: "exact", Limit: limiter.MaxLimit, Window: time.Hour, Mode: limiter.ModeExact}
	tight = config.Policy{Name: "tight", Limit: 40, Window: time.Hour}
	// loose: mode async, which may let a window go over its limit when
	// several edges admit from what they know.
	loose = config.Policy{Name: "loose", Limit: 30, Window: time.Hour, Mode: limiter.ModeAsync}
	// hot: a key busy enough for an edge to hold seconds of it as credit.
	hot = config.Policy{Name: "hot", Limit: 20_000, Window: time.Hour}
)

// routes: path prefix → policy and cost; /heavy costs 3 units of far.
var routes = []config.Route{
	{Path: "/exact", Policy: exact.Name},
	{Path: "/tight", Policy: tight.Name},
	{Path: "/heavy", Policy: far.Name, Cost: 3},
	{Path: "/async", Policy: loose.Name},
	{Path: "/hot", Policy: hot.Name},
	{Path: "/hotx", Policy: hot.Name, Cost: 100},
	{Path: "/busy", Policy: busy.Name},
}

// cluster is the deployment every scenario runs against: started once, each
// scenario with keys of its own and an edge of its own.
type cluster struct {
	stack *stack.Stack
	redis []*stack.Proc // per shard: the primary, then its replica
	nats  *stack.Proc   // the NATS server, or the first of a cluster's
	// natsServers are every NATS server.
	natsServers []*stack.Proc
	acc         *stack.Proc
	accounts    int // accountants started, for their names
	cfg         *config.File
	cfgPath     string
	upstream    string // the API's address
	streams     events.Streams
	// identities are every identity the load sent, for the scan that no
	// process wrote one down.
	identities []string
	// broken: a scenario left the deployment in a state the next ones
	// cannot start from (a process it killed did not come back, or the
	// accounting stream did not empty).
	broken bool

	keys  *limiter.KeySpace
	store *redisstore.Store // reads windows on the primaries
	rdb   []*redis.Client
	nc    *nats.Conn
	js    jetstream.JetStream
}

// newCluster starts the deployment: two shards of fixed addresses, a
// primary and a replica each, and one NATS server; everything is stopped
// when t ends.
func newCluster(t *testing.T) *cluster {
	return newClusterOf(t, clusterOptions{shards: fixedShards(2)})
}

// fixedShards starts n shards of fixed addresses, a primary and a replica
// each. The primaries fsync every write, so that one killed and restarted
// has lost nothing it acknowledged.
func fixedShards(n int) func(context.Context, *stack.Stack) ([]shard.Config, []*stack.Proc, error) {
	return func(ctx context.Context, s *stack.Stack) ([]shard.Config, []*stack.Proc, error) {
		return s.ShardsWith(ctx, n, 1, stack.RedisOptions{Durable: true})
	}
}

// clusterOptions say what a deployment runs on.
type clusterOptions struct {
	// shards starts the Redis shards.
	shards func(context.Context, *stack.Stack) ([]shard.Config, []*stack.Proc, error)
	// natsServers: 0 or 1 runs one NATS server; more, a cluster of them
	// whose streams have three replicas.
	natsServers int
}

// newClusterOf starts the deployment o describes. The stack's directory
// (logs, data) is kept when t fails.
func newClusterOf(t *testing.T, o clusterOptions) *cluster {
	dir, err := os.MkdirTemp("", "tally-faults-")
	require.NoError(t, err)
	c := &cluster{stack: stack.New(dir, bin)}
	t.Cleanup(func() {
		c.stack.StopAll()
		if t.Failed() {
			t.Logf("logs and data kept in %s", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	ctx := context.Background()
	configs, procs, err := o.shards(ctx, c.stack)
	require.NoError(t, err)
	c.redis = procs
	c.cfg = &config.File{KeyPrefix: "tally", Redis: config.Redis{Shards: configs}}
	if o.natsServers > 1 {
		c.natsServers, err = c.stack.NATSCluster(ctx, o.natsServers)
		require.NoError(t, err)
		c.nats = c.natsServers[0]
		c.cfg.NATS.URL = stack.URLs(c.natsServers)
		c.cfg.NATS.Streams.Replicas = 3
	} else {
		c.nats, err = c.stack.NATS(ctx)
		require.NoError(t, err)
		c.natsServers = []*stack.Proc{c.nats}
		c.cfg.NATS.URL = c.nats.Addr
	}
	c.upstream = startUpstream(t)

	c.cfg.Policies = []config.Policy{far, exact, tight, loose, hot, busy}
	c.cfg.Routes = routes
	c.cfg.Accountant.AdminListen = stack.FreeAddr()
	c.cfgPath, err = c.stack.WriteConfig("tally", c.cfg)
	require.NoError(t, err)
	c.streams = c.cfg.NATS.Streams.WithDefaults()

	c.keys, err = limiter.NewKeySpace(c.cfg.KeyPrefix, c.stack.Secret())
	require.NoError(t, err)
	c.store, err = redisstore.NewStore(configs, c.keys, redisstore.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.store.Close() })
	for _, s := range configs {
		if s.Failover() {
			continue
		}
		r := redis.NewClient(&redis.Options{Addr: s.Primary.Addr, DisableIdentity: true})
		t.Cleanup(func() { _ = r.Close() })
		c.rdb = append(c.rdb, r)
	}
	// The suite's own connection outlives NATS restarts.
	c.nc, err = nats.Connect(c.cfg.NATS.URL, append(c.stack.NATSOptions("operator"), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond))...)
	require.NoError(t, err)
	t.Cleanup(c.nc.Close)
	c.js, err = jetstream.New(c.nc)
	require.NoError(t, err)
	c.startAccountant(t)
	return c
}

// startUpstream runs the API behind the proxy: an ETag on every answer, 304
// when the request revalidates it.
func startUpstream(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		if r.Header.Get("If-None-Match") != "" {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = w.Write([]byte("{}\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// primary and replica are shard i's Redis processes.
func (c *cluster) primary(i int) *stack.Proc { return c.redis[2*i] }
func (c *cluster) replica(i int) *stack.Proc { return c.redis[2*i+1] }

// killAndRestart kills p, waits, and starts it again on its port and data.
func (c *cluster) killAndRestart(t *testing.T, p *stack.Proc, wait time.Duration) {
	c.broken = true
	p.Kill()
	time.Sleep(wait)
	require.NoError(t, c.stack.Restart(context.Background(), p), "restart %s", p.Name)
	c.broken = false
}

// startAccountant starts an accountant with the deployment's configuration.
func (c *cluster) startAccountant(t *testing.T) {
	c.accounts++
	var err error
	c.acc, err = c.stack.Accountant(context.Background(), fmt.Sprintf("accountant-%d", c.accounts), c.cfgPath,
		c.cfg.Accountant.AdminListen)
	require.NoError(t, err)
	c.broken = false
}

// stopAccountant stops the accountant, gracefully or (kill) as a crash
// would; the next scenarios need startAccountant first.
func (c *cluster) stopAccountant(kill bool) {
	c.broken = true
	if kill {
		c.acc.Kill()
		return
	}
	c.acc.Stop()
}

// edge is one edge-checker in proxy mode.
type edge struct {
	*stack.Proc
	proxy string
}

// startEdge starts an edge named name; mut may change its configuration.
func (c *cluster) startEdge(t *testing.T, name string, mut func(*config.File)) *edge {
	f := *c.cfg
	f.Edge = config.Edge{Listen: stack.FreeAddr(), Upstream: "http://" + c.upstream, AdminListen: stack.FreeAddr(),
		DefaultPolicy: far.Name, Identity: config.Identity{Header: "Authorization"}}
	if mut != nil {
		mut(&f)
	}
	path, err := c.stack.WriteConfig(name, &f)
	require.NoError(t, err)
	p, err := c.stack.Edge(context.Background(), name, path, f.Edge.AdminListen)
	require.NoError(t, err)
	return &edge{Proc: p, proxy: f.Edge.Listen}
}

// targets are a scenario's keys: most far from their limits (cost 1, and
// a few of cost 3), some in mode exact, a few with a small limit. Each
// kind has at least n keys and at least one on every shard (the key
// secret is new each run, so where a key lands is not known in advance).
func (c *cluster) targets(scenario string) []*target {
	var out []*target
	add := func(n int, kind, path string, p config.Policy, cost int64) {
		onShard := make([]bool, c.store.Shards())
		for i := 0; i < n || slices.Contains(onShard, false); i++ {
			if i > n+200 {
				panic(fmt.Sprintf("faults: no %s key on one of the shards in %d tries", kind, i))
			}
			id := fmt.Sprintf("%s/%s-%d", scenario, kind, i)
			// The edge keys an identity from a header as docs/keys.md says.
			tg := &target{identity: id, path: path + "/items", policy: p.Limiter(), cost: cost,
				key: c.keys.Key(p.Name, limiter.HeaderIdentity("Authorization", id))}
			onShard[c.store.ShardOf(tg.key)] = true
			out = append(out, tg)
			c.identities = append(c.identities, id)
		}
	}
	add(20, "far", "/api", far, 1)
	add(4, "heavy", "/heavy", far, 3)
	add(8, "exact", "/exact", exact, 1)
	add(4, "tight", "/tight", tight, 1)
	return out
}

// usage is the count of tg's window on its primary (0 when none is live).
func (c *cluster) usage(t *testing.T, tg *target) int64 {
	g, err := c.store.Take(context.Background(), tg.key, time.Now(),
		limiter.TakeArgs{Window: tg.policy.Window, Limit: tg.policy.Limit, Producer: "fault-suite"})
	require.NoError(t, err, "reading %s", tg.identity)
	return g.Used
}

// shardOf is the name of tg's shard.
func (c *cluster) shardOf(tg *target) string { return c.store.ShardName(c.store.ShardOf(tg.key)) }

// stream returns the state of one of the deployment's streams.
func (c *cluster) stream(t *testing.T, name string) jetstream.StreamState {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, name)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	return info.State
}

// deadLetters reads the dead-letter stream's messages from sequence from.
func (c *cluster) deadLetters(t *testing.T, from uint64) []*jetstream.RawStreamMsg {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := c.js.Stream(ctx, c.streams.DeadLetters.Name)
	require.NoError(t, err)
	var out []*jetstream.RawStreamMsg
	last := c.stream(t, c.streams.DeadLetters.Name).LastSeq
	for seq := max(from, 1); seq <= last; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// settle stops the edge as a deploy would — it gives its unused credit
// back and hands what is left to account for to JetStream (or applies it
// itself) — and waits until the accountant has applied everything: the
// accounting stream is empty (the accountant deletes only what it applied
// and a replica confirmed).
func (c *cluster) settle(t *testing.T, e *edge) {
	e.Stop()
	log, err := os.ReadFile(e.LogFile())
	require.NoError(t, err)
	require.NotContains(t, string(log), "not everything was delivered", "the edge dropped accounting events at shutdown")
	const limit = 30 * time.Second
	for deadline := time.Now().Add(limit); ; time.Sleep(50 * time.Millisecond) {
		left := c.stream(t, c.streams.Accounting.Name).Msgs
		if left == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.broken = true
			m := metrics(t, c.acc.AdminAddr)
			t.Fatalf("%d messages still in the accounting stream %v after the edge stopped; the accountant has tried "+
				"%v runs again and dead-lettered %v messages (see %s)", left, limit, m["tally_accountant_retries_total"],
				m["tally_accountant_dead_letters_total"], c.acc.LogFile())
		}
	}
}

// metrics reads a process's /metrics into "name{labels}" → value.
func metrics(t *testing.T, adminAddr string) map[string]float64 {
	out, err := tallymetrics.Scrape("http://" + adminAddr + "/metrics")
	require.NoError(t, err)
	return out
}
