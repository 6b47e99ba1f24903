// Command edge-checker decides API requests from one read of a Redis
// replica, answers with rate-limit headers, and publishes request events to
// NATS JetStream for the accountant. It runs as a reverse proxy in front of
// an API (edge.listen + edge.upstream), as a decision API for gateways and
// services (edge.api_listen), or both.
//
// Usage:
//
//	edge-checker -config tally.yaml
//
// SIGTERM or SIGINT shuts it down in this order: /readyz fails, the
// listeners stop accepting and in-flight requests finish (publishing their
// finish events), pending events are flushed to JetStream, the NATS
// connection drains, Redis connections close.
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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
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
	store, err := limiter.NewStore(cfg.Redis.Shards, cfg.StoreOptions())
	if err != nil {
		return err
	}
	defer store.Close()
	probeCtx, stopProbes := context.WithCancel(context.Background())
	defer stopProbes()
	go store.RunProbes(probeCtx, time.Second)

	nc, err := nats.Connect(cfg.NATS.URL, nats.Name("tally-edge-checker"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	go func() {
		_ = events.EnsureStreamsRetry(probeCtx, js, cfg.NATS.Stream, 2*time.Second, func(err error) {
			log.Warn("creating streams failed; retrying", "err", err)
		})
	}()
	pub, err := events.NewPublisher(nc, cfg.NATS.Publisher)
	if err != nil {
		return err
	}

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
		routes[i] = edge.Route{Path: r.Path, Policy: r.Policy, Cost: r.Cost}
	}
	srv, err := edge.New(edge.Options{
		Store: store, Keys: keys, Publisher: pub,
		SubjectPrefix: cfg.NATS.Stream.WithDefaults().SubjectPrefix,
		Policies:      cfg.PolicyMap(), Routes: routes, DefaultPolicy: cfg.Edge.DefaultPolicy,
		Identity: edge.Identifier{Header: cfg.Edge.Identity.Header, Trusted: cfg.Edge.Identity.Trusted(),
			IPv4Prefix: cfg.Edge.Identity.IPv4Prefix, IPv6Prefix: cfg.Edge.Identity.IPv6Prefix},
		DenyOnRedisError: cfg.Edge.OnRedisError == "deny",
		Upstream:         upstream, Source: source, TicketSecret: cfg.KeySecret,
		Ready: func() error {
			if nc.Status() != nats.CONNECTED {
				return fmt.Errorf("nats %s", nc.Status())
			}
			return nil
		},
		Log: log,
	})
	if err != nil {
		return err
	}

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
	admin := &http.Server{Addr: cfg.Edge.AdminListen, Handler: srv.AdminHandler(), ReadHeaderTimeout: 5 * time.Second}
	if cfg.Edge.Listen != "" {
		if err := serve(cfg.Edge.Listen, srv.ProxyHandler()); err != nil {
			return err
		}
	}
	if cfg.Edge.APIListen != "" {
		if err := serve(cfg.Edge.APIListen, srv.APIHandler()); err != nil {
			return err
		}
	}
	adminLn, err := net.Listen("tcp", cfg.Edge.AdminListen)
	if err != nil {
		return err
	}
	go func() { _ = admin.Serve(adminLn) }()

	select {
	case <-ctx.Done():
	case err := <-errc:
		log.Error("listener failed; shutting down", "err", err)
	}
	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), cfg.Edge.ShutdownTimeout)
	defer cancel()
	srv.SetDraining()
	for _, hs := range serving {
		_ = hs.Shutdown(shutdown)
	}
	if err := pub.Close(shutdown); err != nil {
		log.Warn("events not flushed", "err", err)
	}
	_ = nc.Drain()
	_ = admin.Shutdown(shutdown)
	log.Info("stopped", "published", pub.Stats().Published, "dropped", pub.Stats().Dropped)
	return nil
}
