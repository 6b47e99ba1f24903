package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/config"
)

// RunAccountant runs an accountant until ctx ends or its admin listener
// fails (its error is returned). Stopping, each shard stops reading, the
// run in hand is applied and deleted from the stream, the shard's lease is
// given up (another accountant takes over at once), then the NATS and
// Redis connections close.
func RunAccountant(ctx context.Context, cfg *config.File, log *slog.Logger) error {
	return RunAccountantIn(ctx, cfg, log, nil)
}

// RunAccountantIn is RunAccountant as a part of the process h describes
// (nil: a process of its own).
func RunAccountantIn(ctx context.Context, cfg *config.File, log *slog.Logger, h *Host) error {
	p, err := open(ctx, cfg, "tally-accountant", log, h)
	if err != nil {
		return err
	}
	defer p.close(5*time.Second, log)
	nc, err := connectNATS(cfg, h, "tally-accountant", "shards stop reading until it is back", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	a := cfg.Accountant
	ac := a.Config
	ac.Streams, ac.Policies, ac.Metrics, ac.Tracer = cfg.NATS.Streams, cfg.PolicyMap(), p.metrics, p.tracing.Tracer("tally/accountant")
	acc := accountant.New(js, p.store, p.keys, ac, log)

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	l := newListeners(log)
	if a.AdminListen != "" {
		admin, err := l.serve(a.AdminListen, a.AdminTLS, GuardAdmin(cfg.AdminToken, acc.AdminHandler(func(context.Context) error {
			if !nc.IsConnected() {
				return fmt.Errorf("nats %s", nc.Status())
			}
			return nil
		})), adminLimits)
		if err != nil {
			return err
		}
		defer admin.Close()
	}
	log.Info("accounting", "shards", p.store.Shards())
	done := make(chan error, 1)
	go func() { done <- acc.Run(runCtx) }()
	failedc := make(chan error, 1)
	go func() {
		failedc <- l.wait(runCtx) // a failed listener stops the accountant
		stop()
	}()
	err = <-done
	stop()
	failed := <-failedc
	_ = nc.Drain()
	s := acc.Stats()
	log.Info("stopped", "charged", s.Charged, "refunded", s.Refunded, "released", s.Released,
		"duplicates", s.Duplicates, "late", s.Late, "dead_lettered", s.DeadLettered)
	return errors.Join(err, failed)
}
