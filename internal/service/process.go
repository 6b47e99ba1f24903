package service

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

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
	// hosted: the telemetry is the host's, which shuts it down.
	hosted bool
}

// Host is what a process that runs several parts of Tally (tally serve)
// gives each of them. The zero value is a binary of its own: it sets up
// its own telemetry and connects to nats.url with the file's credentials.
type Host struct {
	// Metrics and Tracing, when set, are shared by every part (one
	// /metrics for the process); the host shuts them down.
	Metrics *telemetry.Metrics
	Tracing *telemetry.Tracing
	// NATS, when set, replaces the file's NATS connection options (TLS,
	// credentials, inbox prefix): an embedded server reached in process,
	// and the user of the part's role.
	NATS []nats.Option
}

// open opens a process named service; close undoes it.
func open(ctx context.Context, cfg *config.File, service string, log *slog.Logger, h *Host) (*process, error) {
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
	if h != nil && h.Metrics != nil && h.Tracing != nil {
		p.metrics, p.tracing, p.hosted = h.Metrics, h.Tracing, true
	} else {
		if p.metrics, err = telemetry.Setup(ctx, service); err != nil {
			return nil, errors.Join(err, store.Close())
		}
		if p.tracing, err = telemetry.SetupTracing(ctx, service); err != nil {
			return nil, errors.Join(err, store.Close())
		}
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
	if p.hosted {
		_ = p.store.Close()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if err := errors.Join(p.metrics.Shutdown(ctx), p.tracing.Shutdown(ctx)); err != nil {
		log.Warn("telemetry not flushed", "err", err)
	}
	_ = p.store.Close()
}
