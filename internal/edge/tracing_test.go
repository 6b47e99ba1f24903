package edge_test

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/testutil"
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
	testutil.WaitFor(t, "the three spans", func() bool {
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
		require.True(t, strings.HasPrefix(attrs["messaging.destination.name"], "tally.accounting.s0.edge."), s.Name)
		require.Equal(t, "s0", attrs["messaging.destination.partition.id"], s.Name)
	}
}

// A decision-API request has a server span, the child of the caller's
// traceparent, with its route and status; its reservation on Redis (mode
// exact: the request makes it) is that span's child, and its decision
// record carries the span's trace context.
func TestDecisionAPISpans(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	t.Cleanup(func() { _ = provider.Shutdown(t.Context()) })

	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	var mu sync.Mutex
	var records []string // traceparents
	nc, _ := pl.nats.Connect()
	_, err := nc.Subscribe(events.Streams{}.DecisionsSubject(), func(m *nats.Msg) {
		var batch []struct {
			TraceParent string `json:"traceparent"` // the CloudEvents extension
		}
		if json.Unmarshal(m.Data, &batch) == nil {
			mu.Lock()
			for _, b := range batch {
				records = append(records, b.TraceParent)
			}
			mu.Unlock()
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	e := pl.edge(func(o *edge.Options) {
		o.Tracer = provider.Tracer("tally/edge")
		require.NoError(t, o.Store.(*redisstore.Store).InstrumentTracing(provider))
	})

	const client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	apiCheck := func(body string) int {
		req, err := http.NewRequest("POST", e.api.URL+"/v1/check", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Traceparent", client)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 200, apiCheck(`{"policy":"core","identity":"traced"}`))
	require.Equal(t, 400, apiCheck(`{"policy":"nope","identity":"traced"}`))

	attrs := func(s tracetest.SpanStub) map[string]string {
		m := map[string]string{}
		for _, a := range s.Attributes {
			m[string(a.Key)] = a.Value.Emit()
		}
		return m
	}
	var servers []tracetest.SpanStub
	testutil.WaitFor(t, "both server spans", func() bool {
		servers = nil
		for _, s := range spans.GetSpans() {
			if s.SpanKind == trace.SpanKindServer {
				servers = append(servers, s)
			}
		}
		return len(servers) == 2
	})
	for i, want := range []string{"200", "400"} {
		s := servers[i]
		require.Equal(t, "POST /v1/check", s.Name)
		require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext.TraceID().String(), "the caller's trace goes on")
		require.Equal(t, "00f067aa0ba902b7", s.Parent.SpanID().String())
		a := attrs(s)
		require.Equal(t, want, a["http.response.status_code"])
		require.Equal(t, "POST", a["http.request.method"])
		require.Equal(t, "/v1/check", a["http.route"])
	}
	server := servers[0]
	require.True(t, slices.ContainsFunc(spans.GetSpans(), func(s tracetest.SpanStub) bool {
		return attrs(s)["db.system"] == "redis" && s.Parent.SpanID() == server.SpanContext.SpanID()
	}), "the reservation is the request's child")

	want := events.TraceParent(server.SpanContext)
	testutil.WaitFor(t, "the decision record", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(records, want)
	})
}
