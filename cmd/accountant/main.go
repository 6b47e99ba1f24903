// Command accountant applies Tally's accounting events to the rate-limit
// windows: for each shard it consumes the shard's events from NATS
// JetStream in order and applies them on the shard's Redis primary, exactly
// once, deleting from the stream only what a replica confirmed. Several
// accountants can run at once; each shard is served by one of them at a
// time (a lease in Redis), and another takes over when it stops.
//
// Usage:
//
//	accountant -config tally.yaml
//
// SIGTERM or SIGINT stops it: each shard stops reading, the run in hand is
// applied and deleted from the stream, the shard's lease is given up (so
// that another accountant takes over at once), then NATS and Redis
// connections close.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/config"
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
		log.Error("accountant stopped", "err", err)
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
	store, err := limiter.NewStore(cfg.Redis.Shards, keys, cfg.StoreOptions())
	if err != nil {
		return err
	}
	defer store.Close()
	if err := service.CheckRedis(ctx, store, log); err != nil {
		return err
	}
	nc, err := service.ConnectNATS(cfg, "tally-accountant", "shards stop reading until it is back", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	a := cfg.Accountant
	acc := accountant.New(js, store, keys, accountant.Config{
		Streams: cfg.NATS.Streams, Policies: cfg.PolicyMap(),
		BatchSize: a.BatchSize, BatchWait: a.BatchWait, LeaseTTL: a.LeaseTTL, PurgeEvery: a.PurgeEvery,
		RetryMin: a.RetryMin, RetryMax: a.RetryMax, MaxAttempts: a.MaxAttempts,
	}, log)

	errc := make(chan error, 1)
	if addr := a.AdminListen; addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		admin := &http.Server{Handler: service.GuardAdmin(cfg.AdminToken, acc.AdminHandler(func(ctx context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("nats %s", nc.Status())
			}
			return nil
		})), ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := admin.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
		defer admin.Close()
	}
	log.Info("accounting", "shards", store.Shards())
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- acc.Run(runCtx) }()
	var failed error
	select {
	case err = <-done:
	case failed = <-errc:
		log.Error("admin listener failed; shutting down", "err", failed)
		stop()
		err = <-done
	}
	_ = nc.Drain()
	s := acc.Stats()
	log.Info("stopped", "charged", s.Charged, "refunded", s.Refunded, "released", s.Released,
		"duplicates", s.Duplicates, "late", s.Late, "dead_lettered", s.DeadLettered)
	return errors.Join(err, failed)
}
