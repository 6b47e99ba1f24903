package edge_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
)

// One request's trace crosses the NATS hop: the edge's server span
// continues the client's trace; the span that publishes the request's
// refund links to it and travels in the message's traceparent header; the
// accountant's span that applies it is that span's child and links to the
// request too.
func TestOneTraceAcrossTheNATSHop(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = provider.Shutdown(t.Context()) })
	tracer := provider.Tracer("tally/test")

	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	pl.stopAcc()
	pl.accConfig = func(c *accountant.Config) { c.Tracer = tracer }
	pl.startAccountant()
	e := pl.edge(func(o *edge.Options) { o.Tracer = tracer })

	const client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	resp := get(t, e.proxy.URL, "traced", "If-None-Match", `"v1"`, "Traceparent", client)
	require.Equal(t, 304, resp.StatusCode)
	pl.waitUsed(pl.keys.Key("core", "h:traced"), 0)

	find := func(kind trace.SpanKind) (tracetest.SpanStub, bool) {
		i := slices.IndexFunc(spans.GetSpans(), func(s tracetest.SpanStub) bool { return s.SpanKind == kind })
		if i < 0 {
			return tracetest.SpanStub{}, false
		}
		return spans.GetSpans()[i], true
	}
	var server, send, process tracetest.SpanStub
	waitFor(t, "the three spans", func() bool {
		var ok1, ok2, ok3 bool
		server, ok1 = find(trace.SpanKindServer)
		send, ok2 = find(trace.SpanKindProducer)
		process, ok3 = find(trace.SpanKindConsumer)
		return ok1 && ok2 && ok3
	})
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", server.SpanContext.TraceID().String(), "the client's trace goes on")
	require.Equal(t, "00f067aa0ba902b7", server.Parent.SpanID().String())
	linked := func(s tracetest.SpanStub) bool {
		return slices.ContainsFunc(s.Links, func(l sdktrace.Link) bool {
			return l.SpanContext.TraceID() == server.SpanContext.TraceID() && l.SpanContext.SpanID() == server.SpanContext.SpanID()
		})
	}
	require.True(t, linked(send), "the publish span links to the request")
	require.Equal(t, send.SpanContext.TraceID(), process.SpanContext.TraceID(), "one trace across the NATS hop")
	require.Equal(t, send.SpanContext.SpanID(), process.Parent.SpanID(), "processing is the publish's child")
	require.True(t, linked(process), "the processing span links to the request")
	for _, s := range []tracetest.SpanStub{send, process} {
		attrs := map[string]string{}
		for _, a := range s.Attributes {
			attrs[string(a.Key)] = a.Value.Emit()
		}
		require.Equal(t, "nats", attrs["messaging.system"], s.Name)
		require.Equal(t, "tally.accounting.s0", attrs["messaging.destination.name"], s.Name)
		require.Equal(t, "s0", attrs["messaging.destination.partition.id"], s.Name)
	}
}
