package service

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/edge"
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

// serveRLS listens on addr and serves srv's rate-limit service; with a
// token, every call but the health check must carry "authorization: Bearer
// <token>" (Envoy: the grpc_service's initial_metadata).
func serveRLS(addr string, srv *edge.Server, token string, failed chan<- error, log *slog.Logger) (*rlsServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	gs := grpc.NewServer(
		grpc.ChainUnaryInterceptor(requireMetadataToken(token)),
		grpc.MaxRecvMsgSize(1<<20),
		grpc.ConnectionTimeout(5*time.Second),
		// Envoy keeps its connection open and may ping it.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	)
	rlsv3.RegisterRateLimitServiceServer(gs, srv.RateLimitService())
	healthpb.RegisterHealthServer(gs, rlsHealth{srv: srv})
	log.Info("listening", "addr", ln.Addr().String(), "serves", "envoy.service.ratelimit.v3.RateLimitService (gRPC)")
	go func() {
		if err := gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			failed <- err
		}
	}()
	return &rlsServer{gs: gs, log: log}, nil
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

// reloadDescriptors reads the rate-limit service's rules again on SIGHUP
// and whenever a file of their directory changes (checked every interval),
// until ctx ends. A set that cannot be read or used is refused, and the
// rules in effect stay.
func reloadDescriptors(ctx context.Context, cfg *config.File, srv *edge.Server, interval time.Duration, log *slog.Logger) {
	r := &cfg.Edge.RLS
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	current := cfg.Descriptors()
	seen := dirState(r.Config)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		why := ""
		select {
		case <-ctx.Done():
			return
		case <-hup:
			why = "SIGHUP"
		case <-t.C:
			if now := dirState(r.Config); now != seen {
				seen, why = now, "a file changed"
			}
		}
		if why == "" {
			continue
		}
		next, err := descriptors.LoadDir(r.Config, descriptors.Options{MergeDomains: r.MergeDomains})
		if err == nil {
			err = srv.SetDescriptors(next)
		}
		if err != nil {
			log.Error("the rate-limit rules were not reloaded; the rules in effect stay", "why", why, "dir", r.Config, "err", err)
			continue
		}
		changes := descriptors.Diff(current, next)
		current = next
		for _, w := range next.Warnings {
			log.Warn("rate-limit rules", "warning", w)
		}
		log.Info("rate-limit rules reloaded", "why", why, "dir", r.Config, "rules", len(next.Rules()), "changes", len(changes),
			"changed", strings.Join(changes, "; "))
	}
}

// dirState sums up a directory's files (names, sizes, times) to notice a
// change.
func dirState(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	var parts []string
	for _, e := range entries {
		info, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		parts = append(parts, fmt.Sprintf("%s:%d:%d", e.Name(), info.Size(), info.ModTime().UnixNano()))
	}
	sort.Strings(parts)
	return strings.Join(parts, "|")
}

// ignoreHangUps answers SIGHUP, until ctx ends, with a log line: an edge
// without the rate-limit service has nothing to read again (its policies
// and routes are read at start).
func ignoreHangUps(ctx context.Context, log *slog.Logger) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Warn("SIGHUP: nothing to reload; policies and routes are read at start (restart to change them)")
		}
	}
}
