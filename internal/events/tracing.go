package events

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Trace context across the NATS hop (W3C Trace Context): a message carries
// the context of the span that published it in its traceparent header, and
// each event the traceparent of the request it comes from, which the
// spans that publish and process it link to (OTel's messaging and
// CloudEvents conventions for batches).

var traceContext = propagation.TraceContext{}

// HeaderCarrier adapts NATS headers to OpenTelemetry propagation.
type HeaderCarrier nats.Header

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string { return nats.Header(c).Get(key) }

// Set sets key to value.
func (c HeaderCarrier) Set(key, value string) { nats.Header(c).Set(key, value) }

// Keys lists the keys present.
func (c HeaderCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// InjectTrace writes the span context of ctx into m's headers.
func InjectTrace(ctx context.Context, m *nats.Msg) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	traceContext.Inject(ctx, HeaderCarrier(m.Header))
}

// ExtractTrace returns ctx carrying the span context in m's headers, if
// any.
func ExtractTrace(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return traceContext.Extract(ctx, HeaderCarrier(h))
}

// TraceParent renders a valid span context as a traceparent; "" when it
// is not valid.
func TraceParent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	flags := "00"
	if sc.IsSampled() {
		flags = "01"
	}
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + flags
}

// SpanContextOf parses a traceparent (ValidTraceParent), reporting false
// when it is not one.
func SpanContextOf(traceparent string) (trace.SpanContext, bool) {
	if !ValidTraceParent(traceparent) {
		return trace.SpanContext{}, false
	}
	ctx := traceContext.Extract(context.Background(), propagation.MapCarrier{"traceparent": traceparent})
	sc := trace.SpanContextFromContext(ctx)
	return sc, sc.IsValid()
}

// Links are links to the requests the events come from (those with a
// traceparent), for the span that publishes or processes them.
func Links(evs []Accounting) []trace.Link {
	var out []trace.Link
	for i := range evs {
		if sc, ok := SpanContextOf(evs[i].TraceParent); ok {
			out = append(out, trace.Link{SpanContext: sc})
		}
	}
	return out
}

// MessagingAttributes describe a batch of accounting events on subject for
// a messaging span (semantic conventions; NATS has no constant of its own).
func MessagingAttributes(operation, subject, shard string, n int) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("messaging.system", "nats"),
		attribute.String("messaging.operation.type", operation),
		attribute.String("messaging.destination.name", subject),
		attribute.String("messaging.destination.partition.id", shard),
		attribute.Int("messaging.batch.message_count", n),
	}
}
