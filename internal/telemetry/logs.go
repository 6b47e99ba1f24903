package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/bridges/otelslog"
	"go.opentelemetry.io/otel/exporters/otlp/otlplog/otlploghttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutlog"
	sdklog "go.opentelemetry.io/otel/sdk/log"
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

// Logs is a process's OpenTelemetry logger provider, when logs are
// exported.
type Logs struct {
	provider *sdklog.LoggerProvider
}

// SetupLogs sends what h logs to an OpenTelemetry logger provider too,
// for a binary named service, when OTEL_LOGS_EXPORTER lists "otlp" (OTLP
// over HTTP, to OTEL_EXPORTER_OTLP_LOGS_ENDPOINT or
// OTEL_EXPORTER_OTLP_ENDPOINT) or "console" (stdout): it returns a handler
// that writes each record to h and to the provider (through otelslog, with
// the trace context of the record's context and the resource of the
// process's traces and metrics). h's level applies to both. Unlike traces
// and metrics, an OTLP endpoint alone does not turn logs on: h (JSON lines
// on stderr) is the default path, collected by whatever collects the
// containers' output, and sending them over OTLP as well is opted into.
// Without an exporter it returns h itself. Shutdown pushes what is left.
func SetupLogs(ctx context.Context, service string, h slog.Handler) (slog.Handler, *Logs, error) {
	want := map[string]bool{}
	for _, e := range strings.Split(os.Getenv("OTEL_LOGS_EXPORTER"), ",") {
		want[strings.TrimSpace(e)] = true
	}
	if !want["otlp"] && !want["console"] {
		return h, &Logs{}, nil
	}
	res, err := newResource(ctx, service)
	if err != nil {
		return nil, nil, err
	}
	opts := []sdklog.LoggerProviderOption{sdklog.WithResource(res)}
	if want["otlp"] {
		exp, err := otlploghttp.New(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("telemetry: otlp logs: %w", err)
		}
		opts = append(opts, sdklog.WithProcessor(sdklog.NewBatchProcessor(exp)))
	}
	if want["console"] {
		exp, err := stdoutlog.New()
		if err != nil {
			return nil, nil, fmt.Errorf("telemetry: console logs: %w", err)
		}
		opts = append(opts, sdklog.WithProcessor(sdklog.NewBatchProcessor(exp)))
	}
	l := &Logs{provider: sdklog.NewLoggerProvider(opts...)}
	return fanOut{h, otelslog.NewHandler("github.com/tallyhq/tally", otelslog.WithLoggerProvider(l.provider))}, l, nil
}

// Shutdown exports the log records not sent yet and stops the provider.
// Log nothing through the handler after it.
func (l *Logs) Shutdown(ctx context.Context) error {
	if l.provider == nil {
		return nil
	}
	return l.provider.Shutdown(ctx)
}

// fanOut writes each record that first takes to second as well.
type fanOut struct{ first, second slog.Handler }

func (h fanOut) Enabled(ctx context.Context, lv slog.Level) bool { return h.first.Enabled(ctx, lv) }

func (h fanOut) Handle(ctx context.Context, r slog.Record) error {
	var err2 error
	if h.second.Enabled(ctx, r.Level) {
		err2 = h.second.Handle(ctx, r.Clone()) // first may add attributes to its record
	}
	return errors.Join(h.first.Handle(ctx, r), err2)
}

func (h fanOut) WithAttrs(as []slog.Attr) slog.Handler {
	return fanOut{h.first.WithAttrs(as), h.second.WithAttrs(as)}
}

func (h fanOut) WithGroup(name string) slog.Handler {
	return fanOut{h.first.WithGroup(name), h.second.WithGroup(name)}
}

// RateLog logs at most one line per message every interval, counting the
// ones it held back (the "repeated" attribute of the next one): a failing
// dependency is reported, not written once per request.
type RateLog struct {
	log      *slog.Logger
	interval time.Duration
	mu       sync.Mutex
	last     map[string]time.Time
	held     map[string]int
}

// NewRateLog returns a RateLog writing to log.
func NewRateLog(log *slog.Logger, interval time.Duration) *RateLog {
	return &RateLog{log: log, interval: interval, last: map[string]time.Time{}, held: map[string]int{}}
}

func (r *RateLog) emit(level slog.Level, msg string, args ...any) {
	r.mu.Lock()
	now := time.Now()
	if now.Sub(r.last[msg]) < r.interval {
		r.held[msg]++
		r.mu.Unlock()
		return
	}
	held := r.held[msg]
	r.last[msg], r.held[msg] = now, 0
	r.mu.Unlock()
	if held > 0 {
		args = append(args, "repeated", held)
	}
	r.log.Log(context.Background(), level, msg, args...)
}

// Info, Warn and Error log msg at their level unless it was logged less
// than the interval ago.
func (r *RateLog) Info(msg string, args ...any)  { r.emit(slog.LevelInfo, msg, args...) }
func (r *RateLog) Warn(msg string, args ...any)  { r.emit(slog.LevelWarn, msg, args...) }
func (r *RateLog) Error(msg string, args ...any) { r.emit(slog.LevelError, msg, args...) }
