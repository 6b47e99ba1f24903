package redisstore

import (
	"context"
	"errors"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
)

// InstrumentTracing makes a client span (db.system=redis, named after the
// command, e.g. "evalsha") for every Redis command and dial of the store's
// nodes, primaries and replicas, with tp's tracers. Call it once, before
// the store is used concurrently: it adds a hook to each client. Without
// it (tracing off) the store has no hook at all.
//
// Spans are made only as children: a command whose ctx carries no span
// (replica probes, background reservations, sweeps, leases) makes none,
// rather than a one-span trace of its own every time. Commands' arguments
// are not recorded (no db.statement), nor is the calling Go function.
func (s *Store) InstrumentTracing(tp trace.TracerProvider) error {
	if tp == nil {
		return nil
	}
	opts := []redisotel.TracingOption{
		redisotel.WithTracerProvider(childrenOnly{tp: tp}),
		redisotel.WithDBStatement(false),
		redisotel.WithCallerEnabled(false),
	}
	var errs []error
	for _, n := range s.shards {
		for _, c := range append([]*redis.Client{n.primary}, n.replicas...) {
			errs = append(errs, redisotel.InstrumentTracing(c, opts...))
		}
	}
	return errors.Join(errs...)
}

// childrenOnly is a tracer provider whose tracers start a span only under
// a parent (local or remote) in the context.
type childrenOnly struct {
	embedded.TracerProvider
	tp trace.TracerProvider
}

func (c childrenOnly) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return childTracer{t: c.tp.Tracer(name, opts...)}
}

type childTracer struct {
	embedded.Tracer
	t trace.Tracer
}

func (c childTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return ctx, trace.SpanFromContext(ctx) // a no-op span, nothing recorded
	}
	return c.t.Start(ctx, name, opts...)
}
