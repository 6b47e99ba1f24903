package serve_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/rlsconformance"
	"github.com/tallyhq/tally/internal/serve"
	"github.com/tallyhq/tally/internal/testutil"
)

// instance is one tally serve run in process by serve.Run.
type instance struct {
	log      *testutil.Buffer
	rls      string
	cancel   context.CancelFunc
	done     chan error
	stopOnce sync.Once
}

// start runs serve.Run on the configuration src (YAML) in env until the
// test ends (or stop).
func start(t *testing.T, src string, env map[string]string) *instance {
	t.Helper()
	cfg, err := config.Parse([]byte(src), func(k string) string { return env[k] })
	require.NoError(t, err)
	in := &instance{log: &testutil.Buffer{}, rls: cfg.Edge.RLS.Listen, done: make(chan error, 1)}
	var ctx context.Context
	ctx, in.cancel = context.WithCancel(context.Background())
	log := slog.New(slog.NewJSONHandler(in.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	go func() { in.done <- serve.Run(ctx, cfg, log, serve.Options{Hostname: "test"}) }()
	t.Cleanup(func() { in.stop(t) })
	return in
}

func (in *instance) stop(t *testing.T) {
	in.stopOnce.Do(func() {
		in.cancel()
		select {
		case err := <-in.done:
			assert.NoError(t, err, "serve.Run's error; its log:\n%s", in.log.String())
		case <-time.After(60 * time.Second):
			t.Errorf("serve.Run did not stop within 60s; its log:\n%s", in.log.String())
		}
	})
}

// rulesDir writes one file of envoyproxy/ratelimit's YAML.
func rulesDir(t *testing.T, rules string) string {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o600))
	return dir
}

func baseConfig(redisAddr, rules, rls, dataDir string) string {
	return "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + redisAddr + "\"}\n" +
		"edge:\n  admin_listen: 127.0.0.1:0\n  rls:\n    listen: " + rls + "\n    config: " + rules + "\n" +
		"serve:\n  data_dir: " + dataDir + "\n"
}

// One tally serve from a configuration file: it decides, and it stops in
// the documented order — the edge first (it gives back and hands over
// what it holds), then the accountant, then the embedded NATS.
func TestServeStopsInOrder(t *testing.T) {
	rs := redistest.Start(t)
	rls := freeAddr(t)
	in := start(t, baseConfig(rs.Addr, rulesDir(t, "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
		rls, t.TempDir()), map[string]string{config.EnvKeySecret: secret})
	c := rlsClient(t, rls)
	var codes []rlsv3.RateLimitResponse_Code
	for range 4 {
		codes = append(codes, rlsconformance.Ask(t, c, "api", rlsconformance.Desc("client", "a")).OverallCode)
	}
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK,
		rlsv3.RateLimitResponse_OVER_LIMIT}, codes)
	in.stop(t)
	log := in.log.String()
	order := []string{`"msg":"shutting down","part":"edge"`, `"msg":"stopped","part":"edge"`, `"msg":"stopped","part":"accountant"`,
		`"msg":"embedded NATS stopped"`}
	last := -1
	for _, line := range order {
		i := strings.Index(log, line)
		require.Greater(t, i, last, "%s after the lines before it; the log:\n%s", line, log)
		last = i
	}
}

// Two tally serve over one Redis, their embedded servers one JetStream
// cluster (routes to each other), admit exactly a rule's limit together
// when clients ask both at once.
func TestTwoServeAdmitExactlyTheLimit(t *testing.T) {
	rs := redistest.Start(t)
	rules := rulesDir(t, "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 50}\n")
	routeA, routeB := freeAddr(t), freeAddr(t)
	env := map[string]string{config.EnvKeySecret: secret, deploy.NATSRoutePasswordEnv: "route-secret"}
	var ins []*instance
	for i, pair := range [][2]string{{routeA, routeB}, {routeB, routeA}} {
		src := baseConfig(rs.Addr, rules, freeAddr(t), t.TempDir()) +
			fmt.Sprintf("  nats:\n    name: tally-%d\n    cluster:\n      listen: %s\n      routes: [%s]\n", i, pair[0], pair[1])
		ins = append(ins, start(t, src, env))
	}
	var clients []rlsv3.RateLimitServiceClient
	for _, in := range ins {
		clients = append(clients, rlsClient(t, in.rls))
	}
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		c := clients[w%2]
		wg.Go(func() {
			for range 25 {
				resp, err := c.ShouldRateLimit(metadata.NewOutgoingContext(context.Background(), nil), &rlsv3.RateLimitRequest{
					Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{rlsconformance.Desc("client", "shared")}})
				if !assert.NoError(t, err) {
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(50), allowed.Load(), "two processes together admit exactly the limit")
	assert.Equal(t, int64(150), denied.Load())
	// One stops, then the other, as a rollout would: the first delivers
	// what it holds while the cluster is whole. (The last of two has no
	// quorum left: its accounting goes to the primary itself.)
	for _, in := range ins {
		assert.Contains(t, in.log.String(), `"routes":1`)
	}
	ins[0].stop(t)
	assert.NotContains(t, ins[0].log.String(), "not everything was delivered")
	ins[1].stop(t)
}

// The embedded server's client listener holds Tally's shipped users and
// permissions: a service (billing) may publish its own accounting events
// and nothing else, an analytics consumer may read the decisions stream
// and publish nothing, a user without a password in the environment
// cannot log in at all (its password is random), and nobody gets in
// without one.
func TestEmbeddedListenerPermissions(t *testing.T) {
	rs := redistest.Start(t)
	listen := freeAddr(t)
	env := map[string]string{config.EnvKeySecret: secret,
		deploy.NATSPasswordEnv("billing"): "billing-pw", deploy.NATSPasswordEnv("analytics"): "analytics-pw"}
	src := baseConfig(rs.Addr, rulesDir(t, "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 3}\n"),
		freeAddr(t), t.TempDir()) + "  nats:\n    listen: " + listen + "\n"
	in := start(t, src, env)
	c := rlsClient(t, in.rls)
	rlsconformance.Ask(t, c, "api", rlsconformance.Desc("client", "a")) // a decision on the stream
	url := "nats://" + listen
	connect := func(user, pw string) (*nats.Conn, error) {
		return nats.Connect(url, nats.UserInfo(user, pw), nats.CustomInboxPrefix(deploy.InboxPrefix(user)), nats.Timeout(5*time.Second))
	}
	for _, u := range []struct{ user, pw string }{{"edge", "guess"}, {"operator", ""}, {"accountant", "placeholder-accountant"}, {"nobody", "x"}} {
		_, err := connect(u.user, u.pw)
		require.Error(t, err, "%s must not get in", u.user)
	}
	errs := make(chan error, 8)
	handler := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err })
	billing, err := nats.Connect(url, nats.UserInfo("billing", "billing-pw"), nats.CustomInboxPrefix("_INBOX_billing"), handler)
	require.NoError(t, err)
	defer billing.Close()
	require.NoError(t, billing.Publish("tally.accounting.s0.edge.forged", []byte("x")))
	require.NoError(t, billing.Flush())
	testutil.WaitFor(t, "publishing as the edge refused", func() bool {
		select {
		case err := <-errs:
			return strings.Contains(err.Error(), "Permissions Violation")
		default:
			return false
		}
	})
	analytics, err := connect("analytics", "analytics-pw")
	require.NoError(t, err)
	defer analytics.Close()
	js, err := jetstream.New(analytics)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testutil.WaitFor(t, "analytics reads the decisions stream", func() bool {
		s, err := js.Stream(ctx, "TALLY_DECISIONS")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})
	// A publish the server refuses is never answered: a short wait says
	// so.
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	_, err = js.Publish(short, "tally.decisions.edge", []byte("{}"))
	require.Error(t, err, "analytics publishes nothing")
}

// With nats.url, tally serve embeds no server and uses that NATS, each
// part as its role of the shipped permissions when their passwords are
// given (a service's or an analyst's NATS stays where it was).
func TestServeWithExternalNATS(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	rls := freeAddr(t)
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  admin_listen: 127.0.0.1:0\n  rls:\n    listen: " + rls + "\n    config: " +
		rulesDir(t, "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 1}\n") + "\n"
	in := start(t, src, map[string]string{config.EnvKeySecret: secret,
		deploy.NATSPasswordEnv("edge"): natstest.Password("edge"), deploy.NATSPasswordEnv("accountant"): natstest.Password("accountant")})
	c := rlsClient(t, rls)
	assert.Equal(t, rlsv3.RateLimitResponse_OK, rlsconformance.Ask(t, c, "api", rlsconformance.Desc("client", "a")).OverallCode)
	assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, rlsconformance.Ask(t, c, "api", rlsconformance.Desc("client", "a")).OverallCode)
	_, js := ns.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testutil.WaitFor(t, "the decisions on the external NATS", func() bool {
		s, err := js.Stream(ctx, "TALLY_DECISIONS")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs > 0
	})
	in.stop(t)
	log := in.log.String()
	assert.Contains(t, log, `"as_roles":true`)
	assert.NotContains(t, log, "embedded NATS started")
	assert.NotContains(t, log, "Permissions Violation")
}

// Three tally serve, their embedded servers one cluster (R3 by default),
// keep deciding exactly when one of them stops: the two left admit what
// is left of the limit, no more, and stop with everything delivered.
func TestThreeServeR3OneStops(t *testing.T) {
	rs := redistest.Start(t)
	rules := rulesDir(t, "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 60}\n")
	routes := []string{freeAddr(t), freeAddr(t), freeAddr(t)}
	env := map[string]string{config.EnvKeySecret: secret, deploy.NATSRoutePasswordEnv: "route-secret",
		deploy.NATSPasswordEnv("operator"): "operator-pw"}
	listen := freeAddr(t) // the second's client listener, to look at the streams
	var ins []*instance
	for i := range 3 {
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, r)
			}
		}
		src := baseConfig(rs.Addr, rules, freeAddr(t), t.TempDir()) +
			fmt.Sprintf("  nats:\n    name: tally-%d\n    cluster:\n      listen: %s\n      routes: [%s]\n", i, routes[i], strings.Join(others, ", "))
		if i == 1 {
			src += "    listen: " + listen + "\n"
		}
		ins = append(ins, start(t, src, env))
	}
	var clients []rlsv3.RateLimitServiceClient
	for _, in := range ins {
		clients = append(clients, rlsClient(t, in.rls))
	}
	ask := func(cs []rlsv3.RateLimitServiceClient, n int) (allowed int64) {
		var a atomic.Int64
		var wg sync.WaitGroup
		for w := range 6 {
			c := cs[w%len(cs)]
			wg.Go(func() {
				for range n {
					resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
						Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{rlsconformance.Desc("client", "shared")}})
					if assert.NoError(t, err) && resp.OverallCode == rlsv3.RateLimitResponse_OK {
						a.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return a.Load()
	}
	first := ask(clients, 5) // 30 asked of 60
	assert.Equal(t, int64(30), first)
	nc, err := nats.Connect("nats://"+listen, nats.UserInfo("operator", "operator-pw"))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	testutil.WaitFor(t, "the accounting stream on three servers", func() bool {
		s, err := js.Stream(ctx, "TALLY_ACCOUNTING")
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.Config.Replicas == 3 && info.Cluster != nil && len(info.Cluster.Replicas) == 2
	})
	ins[0].stop(t)
	// What the first held and did not use went back by events; the others
	// admit it once an accountant has applied them (the accounting lag,
	// and a lease that may have to pass from the stopped one): until the
	// stream holds nothing left to apply.
	testutil.WaitFor(t, "the first's events applied", func() bool {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		defer acancel()
		s, err := js.Stream(actx, "TALLY_ACCOUNTING")
		if err != nil {
			return false
		}
		info, err := s.Info(actx)
		return err == nil && info.State.Msgs == 0
	})
	rest := ask(clients[1:], 10) // 60 asked, 30 left
	assert.Equal(t, int64(30), rest, "the two left admit exactly what is left")
	// The first stopped while two of three servers stayed: it delivered
	// everything. The others stop in turn.
	assert.NotContains(t, ins[0].log.String(), "not everything was delivered")
	for _, in := range ins {
		assert.Contains(t, in.log.String(), `"routes":2`)
	}
	ins[1].stop(t)
	ins[2].stop(t)
}
