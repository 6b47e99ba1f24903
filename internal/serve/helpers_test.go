package serve_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/rlsconformance"
	"github.com/tallyhq/tally/internal/testutil"
)

// secret is a valid TALLY_KEY_SECRET.
var secret = strings.Repeat("5e", 32)

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// runtimeDir writes every conformance case's rules into a runtime
// directory laid out as the reference reads it: ROOT/ratelimit/config.
func runtimeDir(t *testing.T, extra ...string) string {
	t.Helper()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	require.NoError(t, os.MkdirAll(dir, 0o700))
	for _, c := range rlsconformance.Cases {
		require.NoError(t, os.WriteFile(filepath.Join(dir, c.Domain+".yaml"), []byte(c.Rules), 0o600))
	}
	for i, r := range extra {
		require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("extra%d.yaml", i)), []byte(r), 0o600))
	}
	return root
}

// tallyServe runs "tally serve args..." in process (the entry point the
// binary runs) with env as its whole environment, until the test ends;
// it must then stop cleanly.
func tallyServe(t *testing.T, env map[string]string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := &testutil.Buffer{}
	done := make(chan int, 1)
	go func() {
		done <- cli.Main(ctx, cli.Env{Stdout: out, Stderr: out, Getenv: func(k string) string { return env[k] }},
			append([]string{"serve"}, args...))
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			require.Equal(t, 0, code, "tally serve's exit status; its output:\n%s", out.String())
		case <-time.After(60 * time.Second):
			t.Errorf("tally serve did not stop within 60s; its output:\n%s", out.String())
		}
	})
	// A start that fails fast says why.
	select {
	case code := <-done:
		t.Fatalf("tally serve stopped at once (status %d):\n%s", code, out.String())
	default:
	}
}

// rlsClient connects to a rate-limit service at addr and waits until it
// says SERVING.
func rlsClient(t *testing.T, addr string) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	health := healthpb.NewHealthClient(conn)
	testutil.WaitFor(t, "the rate-limit service at "+addr+" serving", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
		return err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING
	})
	return rlsv3.NewRateLimitServiceClient(conn)
}
