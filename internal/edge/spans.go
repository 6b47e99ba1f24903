package edge

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/events"
)

// startServerSpan starts the server span of request r (the edge makes
// spans: Options.Tracer is set), the child of the client's traceparent
// header when it sent one. The span is named after the method and route
// (the route is "" where there is none, as in front of the upstream). It
// returns r with the span in its context, so that the Redis calls and
// events the request makes are its children, and the span.
func (s *Server) startServerSpan(r *http.Request, route string) (*http.Request, trace.Span) {
	parent := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	name := r.Method
	attrs := []attribute.KeyValue{attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)}
	if route != "" {
		name += " " + route
		attrs = append(attrs, attribute.String("http.route", route))
	}
	ctx, span := s.o.Tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return r.WithContext(ctx), span
}

// traceParent is the trace context a request's decision records and
// events carry: its server span's when the edge makes spans, else the
// client's traceparent header when it is a valid one.
func (s *Server) traceParent(r *http.Request) string {
	if s.o.Tracer != nil {
		if sc := trace.SpanContextFromContext(r.Context()); sc.IsValid() {
			return events.TraceParent(sc)
		}
	}
	return validTraceParent(r.Header.Get("Traceparent"))
}

// setStatus records the response's status on a server span; a 5xx marks
// the span failed (a 4xx is the client's doing, not the edge's).
func setStatus(span trace.Span, status int) {
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, "")
	}
}

// traced serves h with a server span per request (startServerSpan) that
// carries the response's status, when the edge makes spans; without them
// it is h itself.
func (s *Server) traced(route string, h http.HandlerFunc) http.HandlerFunc {
	if s.o.Tracer == nil {
		return h
	}
	return func(w http.ResponseWriter, r *http.Request) {
		r, span := s.startServerSpan(r, route)
		defer span.End()
		sw := &statusWriter{ResponseWriter: w}
		h(sw, r)
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		setStatus(span, sw.status)
	}
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 && status >= 200 { // not an informational 1xx
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
