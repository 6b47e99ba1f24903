package redisstore_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

// With tracing on, the commands a caller's span makes on the primary and
// on the replica are its children (client spans, db.system=redis) with no
// argument values recorded; commands outside any span make no span.
func TestRedisSpansAreChildrenOfTheCaller(t *testing.T) {
	e := newEnv(t, redisstore.Options{})
	spans := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = provider.Shutdown(context.Background()) })
	require.NoError(t, e.store.InstrumentTracing(provider))

	k := e.keys.Key("core", "h:traced")
	e.take(t, k, 10, 1, 1) // no span in ctx: no Redis span
	e.checkReplica(t, k)
	require.Empty(t, spans.GetSpans(), "commands outside a span make no spans")

	ctx, parent := provider.Tracer("tally/test").Start(context.Background(), "request")
	_, err := e.store.Take(ctx, k, e.clock.Now(), limiter.TakeArgs{Window: minute, Limit: 10, Need: 1, Want: 1, Producer: "edge-a"})
	require.NoError(t, err)
	_, err = e.store.Check(ctx, k)
	require.NoError(t, err)
	parent.End()

	var redisSpans []tracetest.SpanStub
	addrs := map[string]bool{}
	for _, s := range spans.GetSpans() {
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		if attrs["db.system"] != "redis" {
			continue
		}
		redisSpans = append(redisSpans, s)
		require.Equal(t, trace.SpanKindClient, s.SpanKind, s.Name)
		require.Equal(t, parent.SpanContext().TraceID(), s.SpanContext.TraceID(), s.Name)
		require.Equal(t, parent.SpanContext().SpanID(), s.Parent.SpanID(), "%s is the caller's child", s.Name)
		require.NotContains(t, attrs, "db.statement", "no argument values in spans")
		require.NotContains(t, attrs, "code.function")
		addrs[attrs["server.address"]+":"+attrs["server.port"]] = true
	}
	names := make([]string, len(redisSpans))
	for i, s := range redisSpans {
		names[i] = s.Name
	}
	require.Contains(t, names, "evalsha", "the reservation")
	require.Contains(t, names, "evalsha_ro", "the read")
	require.Equal(t, map[string]bool{e.primary.Addr: true, e.replica.Addr: true}, addrs, "primary and replica both traced")
}
