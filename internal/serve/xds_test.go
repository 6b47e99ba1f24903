package serve_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/rlsconformance"
	"github.com/tallyhq/tally/internal/testpki"
	"github.com/tallyhq/tally/internal/testutil"
)

// nodeID is the node Envoy Gateway's rate-limit Deployment presents.
const nodeID = "envoy-ratelimit"

// managementServer is a go-control-plane xDS server, as Envoy Gateway
// runs one for its rate-limit service: a snapshot cache served over ADS.
type managementServer struct {
	t     *testing.T
	addr  string
	cache cachev3.SnapshotCache
	gs    *grpc.Server
	done  chan struct{}

	mu    sync.Mutex
	nacks []string // the error details of refused updates
	nodes []string // the node ids of the requests
}

func startManagementServer(t *testing.T, addr string, cache cachev3.SnapshotCache, opts ...grpc.ServerOption) *managementServer {
	t.Helper()
	if cache == nil {
		cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	}
	m := &managementServer{t: t, addr: addr, cache: cache}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, req *discoverygrpc.DiscoveryRequest) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.nodes = append(m.nodes, req.GetNode().GetId())
		if req.ErrorDetail != nil {
			m.nacks = append(m.nacks, req.ErrorDetail.Message)
		}
		return nil
	}}
	var ln net.Listener
	var err error
	// A restarted server takes its address back; the port was just freed.
	testutil.WaitForWithin(t, "listening at "+addr, 10*time.Second, func() bool {
		ln, err = net.Listen("tcp", addr)
		return err == nil
	})
	m.gs = grpc.NewServer(opts...)
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(m.gs, serverv3.NewServer(context.Background(), cache, cb))
	m.done = make(chan struct{})
	go func() { defer close(m.done); _ = m.gs.Serve(ln) }()
	t.Cleanup(m.stop)
	return m
}

func (m *managementServer) stop() {
	m.gs.Stop()
	<-m.done
}

// push makes rules (name → rate-limit config) the state of the world.
func (m *managementServer) push(version string, configs ...*rlsconfv3.RateLimitConfig) {
	m.t.Helper()
	var rs []types.Resource
	for _, c := range configs {
		rs = append(rs, c)
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	require.NoError(m.t, err)
	require.NoError(m.t, m.cache.SetSnapshot(context.Background(), nodeID, snap))
}

func (m *managementServer) refusals() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.nacks...)
}

func limitConfig(domain string, unit rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{
		{Key: "client", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}}}}
}

// limitOf is the limit a domain's rule answers for a fresh client (0: no
// rule, or no domain), checking without charging.
func limitOf(t *testing.T, c rlsv3.RateLimitServiceClient, domain string) uint32 {
	key := "client"
	if domain == "tokens" {
		key = "user"
	}
	resp := rlsconformance.Ask(t, c, domain, rlsconformance.Desc(key, "probe"))
	if resp.Statuses[0].CurrentLimit == nil {
		return 0
	}
	return resp.Statuses[0].CurrentLimit.RequestsPerUnit
}

// tally serve started with Envoy Gateway's settings for rules over xDS
// (CONFIG_TYPE=GRPC_XDS_SOTW, its node id) takes the rules a
// go-control-plane management server pushes: the conformance cases pass on
// them; a domain added, changed and removed is followed within a bound;
// a bad update is refused (NACKed) while the last good rules keep
// serving; and after the management server restarts, Tally reconnects
// and follows again.
func TestReferenceSettingsOverXDS(t *testing.T) {
	rs := redistest.Start(t)
	xdsAddr := freeAddr(t)
	ms := startManagementServer(t, xdsAddr, nil)
	var base []*rlsconfv3.RateLimitConfig
	for _, c := range rlsconformance.Cases {
		x, err := rlsconformance.XDS(c.Domain, c.Rules)
		require.NoError(t, err, c.Name)
		base = append(base, x)
	}
	ms.push("1", base...)

	env, grpcAddr, _ := referenceEnv(t, rs.Addr, t.TempDir())
	for k, v := range map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xdsAddr, "CONFIG_GRPC_XDS_NODE_ID": nodeID,
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1s"} {
		env[k] = v
	}
	tallyServe(t, env, "-data-dir", t.TempDir())
	c := rlsClient(t, grpcAddr)
	testutil.WaitFor(t, "the first update applied", func() bool {
		_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokens",
			Descriptors: rlsconformanceProbe()})
		return err == nil
	})
	rlsconformance.Run(t, c)

	// follows pushes the version and measures how long the answers take
	// to follow.
	var worst time.Duration
	follows := func(what string, cond func() bool, version string, configs ...*rlsconfv3.RateLimitConfig) {
		t.Helper()
		start := time.Now()
		ms.push(version, configs...)
		testutil.WaitFor(t, what, cond)
		worst = max(worst, time.Since(start))
	}
	follows("a domain added", func() bool { return limitOf(t, c, "added") == 5 }, "2",
		append(base, limitConfig("added", rlsconfv3.RateLimitUnit_MINUTE, 5))...)
	follows("a domain changed", func() bool { return limitOf(t, c, "added") == 7 }, "3",
		append(base, limitConfig("added", rlsconfv3.RateLimitUnit_MINUTE, 7))...)
	follows("a domain removed", func() bool { return limitOf(t, c, "added") == 0 }, "4", base...)
	t.Logf("updates took at most %v from the push to the answers", worst)
	assert.Less(t, worst, 5*time.Second, "an update is applied within 5 s (about 20 ms on an idle machine)")

	// A bad update (a unit the reference refuses) is NACKed; the rules in
	// effect stay.
	bad := limitConfig("tokens", rlsconfv3.RateLimitUnit_UNKNOWN, 9)
	ms.push("5", append(base[:0:0], bad, limitConfig("added", rlsconfv3.RateLimitUnit_HOUR, 3))...)
	testutil.WaitFor(t, "the bad update refused", func() bool { return len(ms.refusals()) > 0 })
	assert.Contains(t, ms.refusals()[0], "invalid rate limit unit")
	assert.Equal(t, uint32(0), limitOf(t, c, "added"), "nothing of the refused update applies")
	assert.Equal(t, uint32(100), limitOf(t, c, "tokens"), "the last good rules keep serving")

	// The management server restarts, with other rules: Tally reconnects
	// (with backoff) and follows them.
	ms.stop()
	ms2 := startManagementServer(t, xdsAddr, nil)
	ms2.push("1", append(base, limitConfig("after_restart", rlsconfv3.RateLimitUnit_SECOND, 11))...)
	testutil.WaitFor(t, "the rules of the restarted server", func() bool { return limitOf(t, c, "after_restart") == 11 })
	ms2.mu.Lock()
	assert.Contains(t, ms2.nodes, nodeID)
	ms2.mu.Unlock()
	assert.Equal(t, uint32(math.MaxUint32), rlsconformance.Ask(t, c, "edge_proxy_per_ip", rlsconformance.Desc("ldap", "x")).Statuses[0].LimitRemaining)
}

func rlsconformanceProbe() []*rlv3.RateLimitDescriptor {
	return []*rlv3.RateLimitDescriptor{rlsconformance.Desc("user", fmt.Sprint("probe-", time.Now().UnixNano()))}
}

// Over mutual TLS, as Envoy Gateway sets it (CONFIG_GRPC_XDS_SERVER_USE_TLS
// with the client certificate and the server's CA): the rules arrive; a
// management server that asks for a client certificate refuses a Tally
// without one, and the service keeps refusing calls (no rules) rather
// than answering from nothing.
func TestXDSOverMutualTLS(t *testing.T) {
	rs := redistest.Start(t)
	ca := testpki.NewCA(t, "xds CA")
	serverCert, serverKey := ca.Server("envoy-gateway")
	clientCert, clientKey := ca.Client("envoy-ratelimit")
	cert, err := tls.LoadX509KeyPair(serverCert, serverKey)
	require.NoError(t, err)
	creds := credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: ca.Pool(),
		ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	xdsAddr := freeAddr(t)
	ms := startManagementServer(t, xdsAddr, nil, grpc.Creds(creds))
	ms.push("1", limitConfig("secure", rlsconfv3.RateLimitUnit_HOUR, 4))

	env, grpcAddr, _ := referenceEnv(t, rs.Addr, t.TempDir())
	for k, v := range map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xdsAddr, "CONFIG_GRPC_XDS_NODE_ID": nodeID,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": ca.File,
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": clientCert, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": clientKey,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1s"} {
		env[k] = v
	}
	tallyServe(t, env, "-data-dir", t.TempDir())
	c := rlsClient(t, grpcAddr)
	testutil.WaitFor(t, "the rules over mutual TLS", func() bool { return limitOfSafe(c, "secure") == 4 })

	// Without a client certificate the server refuses the stream: no rules,
	// every call refused.
	env2, grpcAddr2, _ := referenceEnv(t, rs.Addr, t.TempDir())
	for k, v := range map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xdsAddr, "CONFIG_GRPC_XDS_NODE_ID": nodeID,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": ca.File,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "100ms", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "1s"} {
		env2[k] = v
	}
	tallyServe(t, env2, "-data-dir", t.TempDir())
	c2 := rlsClient(t, grpcAddr2)
	_, err = c2.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "secure",
		Descriptors: []*rlv3.RateLimitDescriptor{rlsconformance.Desc("client", "x")}})
	require.Error(t, err, "no rules without the management server")
}

// limitOfSafe is limitOf that answers 0 while the service refuses calls.
func limitOfSafe(c rlsv3.RateLimitServiceClient, domain string) uint32 {
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*rlv3.RateLimitDescriptor{rlsconformance.Desc("client", "probe")}})
	if err != nil || resp.Statuses[0].CurrentLimit == nil {
		return 0
	}
	return resp.Statuses[0].CurrentLimit.RequestsPerUnit
}
