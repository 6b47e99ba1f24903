package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/telemetry"
)

// process is what both binaries open first: the key space, the store of
// the Redis shards (their primaries' eviction policy checked) and
// telemetry.
type process struct {
	keys    *limiter.KeySpace
	store   *redisstore.Store
	metrics *telemetry.Metrics
	tracing *telemetry.Tracing
}

// open opens a process named service; close undoes it.
func open(ctx context.Context, cfg *config.File, service string, log *slog.Logger) (*process, error) {
	keys, err := limiter.NewKeySpace(cfg.KeyPrefix, cfg.KeySecret)
	if err != nil {
		return nil, err
	}
	opts := cfg.StoreOptions()
	opts.Log = telemetry.NewRateLog(log, time.Second)
	store, err := redisstore.NewStore(cfg.Redis.Shards, keys, opts)
	if err != nil {
		return nil, err
	}
	p := &process{keys: keys, store: store}
	if err := CheckRedis(ctx, store, log); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	if p.metrics, err = telemetry.Setup(ctx, service); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	if p.tracing, err = telemetry.SetupTracing(ctx, service); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	// Redis commands get spans only when traces are exported: otherwise
	// the clients carry no hook at all.
	if err := store.InstrumentTracing(p.tracing.Provider()); err != nil {
		return nil, errors.Join(err, store.Close())
	}
	return p, nil
}

// close pushes the telemetry not exported yet (within d) and closes the
// Redis connections.
func (p *process) close(d time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := errors.Join(p.metrics.Shutdown(ctx), p.tracing.Shutdown(ctx)); err != nil {
		log.Warn("telemetry not flushed", "err", err)
	}
	_ = p.store.Close()
}
