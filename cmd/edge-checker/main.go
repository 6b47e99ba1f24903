// Command edge-checker decides API requests at once, with rate-limit
// headers, from units it reserves on the Redis shard primaries, and sends
// what is left to account for to NATS JetStream for the accountant. It runs as a reverse proxy in front of
// an API (edge.listen + edge.upstream), as a decision API for gateways and
// services (edge.api_listen), or both.
//
// Usage:
//
//	edge-checker -config tally.yaml
//
// SIGTERM or SIGINT shuts it down in this order: /readyz fails, the
// listeners stop accepting and in-flight requests finish, unused
// reservations are given back, queued accounting events are delivered (to
// JetStream, or the primaries) and decisions published, the NATS connection
// drains, Redis connections close. A listener that fails stops the process
// with a non-zero status.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/service"
)

func main() {
	path := flag.String("config", "tally.yaml", "configuration file (docs/configuration.md)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *path, log); err != nil {
		log.Error("edge-checker stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, path string, log *slog.Logger) error {
	cfg, err := config.Load(path, os.Getenv)
	if err != nil {
		return err
	}
	keys, err := limiter.NewKeySpace(cfg.KeyPrefix, cfg.KeySecret)
	if err != nil {
		return err
	}
	if len(cfg.KeySecret) == 0 {
		log.Warn("TALLY_KEY_SECRET is empty: identity digests are unkeyed and request ids unsigned")
	}
	store, err := limiter.NewStore(cfg.Redis.Shards, keys, cfg.StoreOptions())
	if err != nil {
		return err
	}
	defer store.Close()
	if err := service.CheckRedis(ctx, store, log); err != nil {
		return err
	}
	probeCtx, stopProbes := context.WithCancel(context.Background())
	defer stopProbes()
	go store.RunProbes(probeCtx, time.Second)

	nc, err := service.ConnectNATS(cfg, "tally-edge-checker", "accounting events are applied on the primaries until it is back", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// Decisions (bulk telemetry) travel on a connection of their own, so that
	// accounting events never queue behind them.
	dnc, err := service.ConnectNATS(cfg, "tally-edge-checker-decisions", "decision records are dropped until it is back", log)
	if err != nil {
		return err
	}
	defer dnc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	go func() {
		_ = events.EnsureStreamsRetry(probeCtx, js, cfg.NATS.Streams, 2*time.Second, func(err error) {
			log.Warn("creating streams failed; retrying", "err", err)
		})
	}()

	var upstream *url.URL
	if cfg.Edge.Listen != "" {
		upstream, _ = url.Parse(cfg.Edge.Upstream) // validated by config
	}
	source := cfg.Edge.Source
	if source == "" {
		host, _ := os.Hostname()
		source = "edge-checker/" + host
	}
	routes := make([]edge.Route, len(cfg.Routes))
	for i, r := range cfg.Routes {
		routes[i] = edge.Route{Path: r.Path, Policies: r.Names(), Cost: r.Cost}
	}
	srv, err := edge.New(edge.Options{
		Store: store, Keys: keys, NATS: nc, DecisionsNATS: dnc, Streams: cfg.NATS.Streams,
		Outbox: cfg.Edge.Outbox, Decisions: cfg.Edge.Decisions, Credit: cfg.Edge.Credit,
		Policies: cfg.PolicyMap(), Routes: routes, DefaultPolicy: cfg.Edge.DefaultPolicy,
		GlobalPolicies: cfg.Edge.GlobalPolicies, AddressKeyed: cfg.AddressKeyed(),
		Identity: edge.Identifier{Header: cfg.Edge.Identity.Header, Trusted: cfg.Edge.Identity.Trusted(),
			IPv4Prefix: cfg.Edge.Identity.IPv4Prefix, IPv6Prefix: cfg.Edge.Identity.IPv6Prefix},
		DenyOnRedisError: cfg.Edge.OnRedisError == "deny",
		Upstream:         upstream, Source: source, TicketSecret: cfg.KeySecret, Pprof: cfg.Edge.Pprof, Log: log,
	})
	if err != nil {
		return err
	}
	log.Info("edge-checker starting", "producer", srv.Producer(), "shards", store.Shards())

	var serving []*http.Server
	errc := make(chan error, 3)
	serve := func(addr string, h http.Handler) error {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		hs := &http.Server{Handler: h, MaxHeaderBytes: cfg.Edge.MaxHeaderBytes,
			ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
		serving = append(serving, hs)
		log.Info("listening", "addr", ln.Addr().String())
		go func() {
			if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
		return nil
	}
	admin := &http.Server{Addr: cfg.Edge.AdminListen, Handler: service.GuardAdmin(cfg.AdminToken, srv.AdminHandler()),
		ReadHeaderTimeout: 5 * time.Second}
	if cfg.Edge.Listen != "" {
		if err := serve(cfg.Edge.Listen, srv.ProxyHandler()); err != nil {
			return err
		}
	}
	if cfg.Edge.APIListen != "" {
		if err := serve(cfg.Edge.APIListen, service.RequireToken(cfg.APIToken, srv.APIHandler())); err != nil {
			return err
		}
	}
	adminLn, err := net.Listen("tcp", cfg.Edge.AdminListen)
	if err != nil {
		return err
	}
	go func() {
		if err := admin.Serve(adminLn); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
		}
	}()

	var failed error
	select {
	case <-ctx.Done():
	case failed = <-errc:
		log.Error("listener failed; shutting down", "err", failed)
	}
	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), cfg.Edge.ShutdownTimeout)
	defer cancel()
	srv.SetDraining()
	for _, hs := range serving {
		_ = hs.Shutdown(shutdown)
	}
	if err := srv.Close(shutdown); err != nil {
		log.Warn("not everything was delivered", "err", err)
	}
	_ = nc.Drain()
	_ = dnc.Drain()
	_ = admin.Shutdown(shutdown)
	log.Info("stopped")
	return failed
}
