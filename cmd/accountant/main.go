// Command accountant applies Tally's request events to the rate-limit
// windows: for each shard it consumes the shard's events from NATS
// JetStream and runs the charge and 304-refund scripts on the shard's Redis
// primary, acknowledging each event only after Redis confirmed it. Several
// accountants can run at once; each shard is served by one of them at a
// time, and another takes over when it stops.
//
// Usage:
//
//	accountant -config tally.yaml
//
// SIGTERM or SIGINT drains: consumers stop pulling, the batch in hand is
// applied and acknowledged, then NATS and Redis connections close.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/limiter"
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
	store, err := limiter.NewStore(cfg.Redis.Shards, cfg.StoreOptions())
	if err != nil {
		return err
	}
	defer store.Close()
	nc, err := nats.Connect(cfg.NATS.URL, nats.Name("tally-accountant"),
		nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second))
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	acc := accountant.New(js, store, keys, accountant.Config{
		Stream: cfg.NATS.Stream, Consumer: cfg.NATS.Consumer,
		BatchSize: cfg.Accountant.BatchSize, BatchWait: cfg.Accountant.BatchWait,
		RetryMin: cfg.Accountant.RetryMin, RetryMax: cfg.Accountant.RetryMax,
	}, log)

	if addr := cfg.Accountant.AdminListen; addr != "" {
		admin := &http.Server{Addr: addr, Handler: acc.AdminHandler(func(ctx context.Context) error {
			if nc.Status() != nats.CONNECTED {
				return fmt.Errorf("nats %s", nc.Status())
			}
			return store.Ping(ctx)
		}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = admin.ListenAndServe() }()
		defer admin.Close()
	}
	log.Info("accounting", "shards", store.Shards())
	err = acc.Run(ctx)
	_ = nc.Drain()
	s := acc.Stats()
	log.Info("stopped", "charged", s.Charged, "refunded", s.Refunded, "duplicates", s.Duplicates,
		"late", s.Late, "dead_lettered", s.DeadLettered)
	return err
}
