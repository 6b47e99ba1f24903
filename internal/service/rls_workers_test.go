package service

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/tallyhq/tally/internal/testutil"
)

// blockingRLS holds every call until release is closed.
type blockingRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	entered atomic.Int64
	release chan struct{}
}

func (b *blockingRLS) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	b.entered.Add(1)
	select {
	case <-b.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

type servingHealth struct {
	healthpb.UnimplementedHealthServer
}

func (servingHealth) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// Calls that wait (on a reservation from a paused primary, say) hold the
// goroutines the server keeps for calls, but never the calls after them:
// with more calls waiting than it keeps goroutines, the next call still
// starts at once, and the health check still answers. A caller cannot
// stall the door by holding its calls open.
func TestRLSCallsNeverQueueBehindWaitingOnes(t *testing.T) {
	svc := &blockingRLS{release: make(chan struct{})}
	gs := newRLSServer("tok")
	rlsv3.RegisterRateLimitServiceServer(gs, svc)
	healthpb.RegisterHealthServer(gs, servingHealth{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = gs.Serve(ln) }()
	t.Cleanup(gs.Stop)

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer tok"),
		time.Minute)
	defer cancel()

	n := int(rlsStreamWorkers()) + 8
	var wg sync.WaitGroup
	errs := make(chan error, n+1)
	call := func() {
		_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api"})
		errs <- err
	}
	for range n {
		wg.Go(call)
	}
	testutil.WaitFor(t, "every call waiting in its handler, more than the kept goroutines", func() bool {
		return svc.entered.Load() == int64(n)
	})
	hctx, hcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer hcancel()
	resp, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err, "the health check answers while every kept goroutine waits")
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, resp.Status)
	wg.Go(call)
	testutil.WaitFor(t, "one call more started", func() bool { return svc.entered.Load() == int64(n+1) })

	close(svc.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
