package service_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/testutil"
)

// An edge started on a directory of envoyproxy/ratelimit files serves
// Envoy's rate-limit service: calls need the token, the health check
// needs none and says SERVING once the edge is ready; a changed file is
// taken at once, an invalid one refused with the rules in effect kept,
// and SIGHUP reads the directory again.
func TestRateLimitServiceFromADirectory(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	dir := t.TempDir()
	write := func(limit string) {
		t.Helper()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "api.yaml"),
			[]byte("domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: "+limit+"}\n"), 0o600))
	}
	write("2")
	rls := freeAddr(t)
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  admin_listen: " + freeAddr(t) + "\n  rls:\n    listen: " + rls + "\n    config: " + dir + "\n"
	cfg, err := config.Parse([]byte(src), func(k string) string {
		return map[string]string{config.EnvKeySecret: secret, config.EnvNATSUser: "edge", config.EnvAPIToken: "rls-token",
			config.EnvNATSPassword: natstest.Password("edge"), config.EnvNATSInbox: natstest.InboxPrefix("edge")}[k]
	})
	require.NoError(t, err)
	log := &testutil.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.RunEdge(ctx, cfg, slog.New(slog.NewJSONHandler(log, nil))) }()
	t.Cleanup(func() { cancel(); <-done })

	conn, err := grpc.NewClient(rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	testutil.WaitFor(t, "the rate-limit service serving", func() bool {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
	})
	c := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c1"}}}}}
	_, err = c.ShouldRateLimit(context.Background(), req)
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no token")
	authed := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer rls-token")
	limitOf := func() uint32 {
		resp, err := c.ShouldRateLimit(authed, req)
		require.NoError(t, err)
		return resp.Statuses[0].CurrentLimit.RequestsPerUnit
	}
	require.Equal(t, uint32(2), limitOf())

	// A changed file is taken within the watch interval.
	write("7")
	testutil.WaitFor(t, "the new limit in effect", func() bool { return limitOf() == 7 })
	require.Contains(t, log.String(), "changed api.client: 2/HOUR → 7/HOUR")
	// An invalid one is refused; the rules in effect stay.
	write("-1")
	testutil.WaitFor(t, "the refusal logged", func() bool { return strings.Contains(log.String(), "was not reloaded") })
	require.Equal(t, uint32(7), limitOf())
	// SIGHUP reads the directory again (whether or not the watch saw the
	// change first).
	write("9")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	testutil.WaitFor(t, "reloaded on SIGHUP", func() bool { return strings.Contains(log.String(), `"why":"SIGHUP"`) })
	require.Equal(t, uint32(9), limitOf())
}

// With on_redis_error deny, the health check follows the edge's ability to
// decide: every primary down, every request for a key it does not know
// fails, and the service says NOT_SERVING (and /readyz 503) until the
// primary answers again — which the edge finds out by itself, with no
// request to tell it.
func TestRateLimitServiceHealthFollowsTheAbilityToDecide(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "api.yaml"),
		[]byte("domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"), 0o600))
	rls, admin := freeAddr(t), freeAddr(t)
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  admin_listen: " + admin + "\n  on_redis_error: deny\n  rls:\n    listen: " + rls + "\n    config: " + dir + "\n"
	cfg, err := config.Parse([]byte(src), func(k string) string {
		return map[string]string{config.EnvKeySecret: secret, config.EnvNATSUser: "edge",
			config.EnvNATSPassword: natstest.Password("edge"), config.EnvNATSInbox: natstest.InboxPrefix("edge")}[k]
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.RunEdge(ctx, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })

	conn, err := grpc.NewClient(rls, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	serving := func() healthpb.HealthCheckResponse_ServingStatus {
		resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		if err != nil {
			return healthpb.HealthCheckResponse_UNKNOWN // not listening yet
		}
		return resp.Status
	}
	readyz := func() int {
		resp, err := http.Get("http://" + admin + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	testutil.WaitFor(t, "the rate-limit service serving", func() bool { return serving() == healthpb.HealthCheckResponse_SERVING })
	c := rlsv3.NewRateLimitServiceClient(conn)
	n := 0
	decide := func() error {
		n++
		_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: fmt.Sprint("c", n)}}}}})
		return err
	}
	require.NoError(t, decide())
	require.Equal(t, 200, readyz())

	rs.Stop()
	testutil.WaitFor(t, "NOT_SERVING while no new key can be decided", func() bool {
		require.Equal(t, codes.Unavailable, status.Code(decide()), "mode deny: a key the edge does not know fails")
		return serving() == healthpb.HealthCheckResponse_NOT_SERVING
	})
	require.Equal(t, 503, readyz())
	// It stays so while the primary is down, with no request coming: also
	// once the request path's own pause on a failing primary has lapsed
	// (the gauge back at 1), after which it would try the primary again.
	testutil.WaitFor(t, "the request path's pause over", func() bool {
		m, err := metrics.Scrape("http://" + admin + "/metrics")
		return err == nil && m[`tally_edge_primary_reachable{shard="s0"}`] == 1
	})
	require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, serving())
	require.Equal(t, 503, readyz())

	rs.Restart()
	testutil.WaitFor(t, "SERVING once the primary answers, with no request to tell", func() bool {
		return serving() == healthpb.HealthCheckResponse_SERVING
	})
	require.Equal(t, 200, readyz())
	require.NoError(t, decide())
}
