package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// NewLogHandler returns the binaries' log handler: JSON lines (format
// "json", the default) or text ("text", for people), at level and above,
// with the trace_id and span_id of the span in a record's context, so that
// logs join traces.
func NewLogHandler(w io.Writer, format, level string) (slog.Handler, error) {
	var lv slog.Level
	if level != "" {
		if err := lv.UnmarshalText([]byte(level)); err != nil {
			return nil, fmt.Errorf("telemetry: log level %q: want debug, info, warn or error", level)
		}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch strings.ToLower(format) {
	case "", "json":
		return traceHandler{slog.NewJSONHandler(w, opts)}, nil
	case "text":
		return traceHandler{slog.NewTextHandler(w, opts)}, nil
	}
	return nil, fmt.Errorf("telemetry: log format %q: want json or text", format)
}

// traceHandler adds the trace context of a record's context.
type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(as)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
