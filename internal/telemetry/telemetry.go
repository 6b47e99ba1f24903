package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/metrics"
)

// LatencyBounds are the bucket bounds, in seconds, of Tally's latency
// histograms: fine below 10 ms, where accounting lag should be, coarse
// above (the same as metrics.Histogram's).
var LatencyBounds = metrics.Bounds

// DecisionBounds are the bucket bounds, in seconds, of the edge's decision
// latency: most decisions take microseconds (no Redis call), a reservation
// a Redis round trip, and none longer than the Redis budget.
var DecisionBounds = []float64{0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}

// BatchBounds are the bucket bounds of Tally's batch-size histograms
// (events per message, records per message).
var BatchBounds = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// Metrics is one process's meter provider and the registry /metrics serves.
type Metrics struct {
	provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
}

// NewMetrics sets up a meter provider exported to Prometheus, with the Go
// runtime's metrics in the same registry, for tests and for components run
// on their own. Binaries use Setup.
func NewMetrics() (*Metrics, error) { return newMetrics(nil) }

// Setup is NewMetrics for a binary named service, configured by the
// standard OpenTelemetry environment: OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES name the resource; OTEL_METRICS_EXPORTER lists
// exporters beside Prometheus's /metrics, "otlp" (also implied by
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT; OTLP
// over HTTP, every OTEL_METRIC_EXPORT_INTERVAL) and "console" (stdout, for
// development). Shutdown pushes what is left.
func Setup(ctx context.Context, service string) (*Metrics, error) {
	res, err := newResource(ctx, service)
	if err != nil {
		return nil, err
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	want := exporters("OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
	if want["otlp"] {
		exp, err := otlpmetrichttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	if want["console"] {
		exp, err := stdoutmetric.New()
		if err != nil {
			return nil, fmt.Errorf("telemetry: console: %w", err)
		}
		opts = append(opts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)))
	}
	return newMetrics(opts)
}

// newResource names the process: service, then OTEL_SERVICE_NAME and
// OTEL_RESOURCE_ATTRIBUTES, which win.
func newResource(ctx context.Context, service string) (*resource.Resource, error) {
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName(service)), resource.WithFromEnv(),
		resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// exporters reads the exporters an OTEL_*_EXPORTER variable lists; an OTLP
// endpoint (the general one, or the signal's) implies "otlp" unless the
// variable says "none".
func exporters(variable, endpoint string) map[string]bool {
	want := map[string]bool{}
	for _, e := range strings.Split(os.Getenv(variable), ",") {
		if e = strings.TrimSpace(e); e != "" {
			want[e] = true
		}
	}
	if !want["none"] && (os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv(endpoint) != "") {
		want["otlp"] = true
	}
	return want
}

func newMetrics(opts []sdkmetric.Option) (*Metrics, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(collectors.NewGoCollector(
		collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler, collectors.MetricsGC))); err != nil {
		return nil, err
	}
	if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
		return nil, err
	}
	exp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		return nil, err
	}
	return &Metrics{provider: sdkmetric.NewMeterProvider(append(opts, sdkmetric.WithReader(exp))...), registry: reg}, nil
}

// Meter returns the meter of one component (e.g. "tally/edge").
func (m *Metrics) Meter(name string) metric.Meter { return m.provider.Meter(name) }

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// Shutdown stops the provider, pushing what push exporters have not sent
// yet; observable instruments stop being read.
func (m *Metrics) Shutdown(ctx context.Context) error { return m.provider.Shutdown(ctx) }

// Tracing is a process's tracer provider, when traces are exported.
type Tracing struct {
	provider *sdktrace.TracerProvider
}

// SetupTracing sets up tracing for a binary named service from the
// standard environment: OTEL_TRACES_EXPORTER lists "otlp" (OTLP over HTTP;
// implied by OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) and "console" (stdout); without
// either, no spans are made at all. OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG choose the sampler (default parentbased_always_on;
// at high request rates parentbased_traceidratio).
func SetupTracing(ctx context.Context, service string) (*Tracing, error) {
	want := exporters("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if !want["otlp"] && !want["console"] {
		return &Tracing{}, nil
	}
	res, err := newResource(ctx, service)
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if want["otlp"] {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: otlp traces: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	if want["console"] {
		exp, err := stdouttrace.New()
		if err != nil {
			return nil, fmt.Errorf("telemetry: console traces: %w", err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	return &Tracing{provider: sdktrace.NewTracerProvider(opts...)}, nil
}

// Tracer returns the tracer of one component, nil when traces are not
// exported (the components then make no spans).
func (t *Tracing) Tracer(name string) trace.Tracer {
	if t.provider == nil {
		return nil
	}
	return t.provider.Tracer(name)
}

// Provider is the tracer provider, nil when traces are not exported (then
// nothing should be instrumented at all).
func (t *Tracing) Provider() trace.TracerProvider {
	if t.provider == nil {
		return nil // not a typed nil in an interface
	}
	return t.provider
}

// Shutdown exports the spans not sent yet and stops the provider.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t.provider == nil {
		return nil
	}
	return t.provider.Shutdown(ctx)
}
