package service

import (
	"context"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/servertls"
)

// The rate-limit service's gRPC listener: Envoy's
// envoy.service.ratelimit.v3.RateLimitService and grpc.health.v1, the
// latter for Envoy's and Kubernetes' health checks (SERVING once the edge
// is ready, NOT_SERVING while it drains).

// rlsServer is the gRPC server of the rate-limit service.
type rlsServer struct {
	gs  *grpc.Server
	log *slog.Logger
}

// serveRLS listens on addr and serves srv's rate-limit service, over TLS
// when tc is on; with a token, every call but the health check must carry
// "authorization: Bearer <token>" (Envoy: the grpc_service's
// initial_metadata).
func serveRLS(addr string, tc servertls.Config, srv *edge.Server, token string, failed chan<- error, log *slog.Logger) (*rlsServer, error) {
	files, err := loadTLS(tc, log)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	var creds []grpc.ServerOption
	if files != nil {
		creds = append(creds, grpc.Creds(credentials.NewTLS(files.TLSConfig())))
	}
	gs := newRLSServer(token, creds...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv.RateLimitService())
	healthpb.RegisterHealthServer(gs, rlsHealth{srv: srv})
	log.Info("listening", "addr", ln.Addr().String(), "serves", "envoy.service.ratelimit.v3.RateLimitService (gRPC)",
		"tls", tc.On(), "client_certificates", tc.ClientCAFile != "")
	go func() {
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			failed <- err
		}
	}()
	return &rlsServer{gs: gs, log: log}, nil
}

// newRLSServer is the gRPC server the rate-limit service runs on, its
// calls held to token (requireMetadataToken).
func newRLSServer(token string, opts ...grpc.ServerOption) *grpc.Server {
	return grpc.NewServer(append(opts,
		grpc.ChainUnaryInterceptor(requireMetadataToken(token)),
		grpc.MaxRecvMsgSize(1<<20),
		grpc.ConnectionTimeout(5*time.Second),
		// Calls run on goroutines kept for them (rlsStreamWorkers).
		grpc.NumStreamWorkers(rlsStreamWorkers()),
		// Envoy keeps its connection open and may ping it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)...)
}

// rlsStreamWorkers is how many goroutines the gRPC server keeps to run
// calls on. Without them it starts a goroutine per call, whose stack grows
// by copying, two or three times, as the call descends into the decision:
// a fifth of the door's CPU under load (docs/architecture.md, "The gRPC
// door's goroutines"). A call that finds every worker busy (each may wait
// on a reservation) gets a goroutine of its own, as before.
func rlsStreamWorkers() uint32 {
	return uint32(max(64, 16*runtime.GOMAXPROCS(0)))
}

// stop lets the calls in flight finish until ctx ends, then closes.
func (r *rlsServer) stop(ctx context.Context) {
	done := make(chan struct{})
	go func() { r.gs.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		r.gs.Stop()
	}
}

// requireMetadataToken is RequireToken for gRPC: the health service is
// open to probes (it reveals nothing).
func requireMetadataToken(token string) grpc.UnaryServerInterceptor {
	want := []byte("Bearer " + token)
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if token == "" || strings.HasPrefix(info.FullMethod, "/grpc.health.v1.Health/") {
			return next(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		got := md.Get("authorization")
		if len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), want) != 1 {
			return nil, status.Error(codes.Unauthenticated, "a valid bearer token is required")
		}
		return next(ctx, req)
	}
}

// rlsHealth answers gRPC health checks from the edge's readiness.
type rlsHealth struct {
	healthpb.UnimplementedHealthServer
	srv *edge.Server
}

func (h rlsHealth) Check(_ context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch req.Service {
	case "", rlsv3.RateLimitService_ServiceDesc.ServiceName:
	default:
		return nil, status.Errorf(codes.NotFound, "unknown service %q", req.Service)
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.srv.Ready() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}
