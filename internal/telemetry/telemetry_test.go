package telemetry_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	collogspb "go.opentelemetry.io/proto/otlp/collector/logs/v1"
	logspb "go.opentelemetry.io/proto/otlp/logs/v1"
	"google.golang.org/protobuf/proto"

	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/telemetry"
)

// The names operators, alert rules and dashboards rely on come out as
// written: counters with _total, histograms in seconds with _seconds and
// second-scale buckets, attributes as labels and nothing else added; the Go
// runtime's scheduling latency beside them.
func TestPrometheusNames(t *testing.T) {
	m, err := telemetry.NewMetrics()
	require.NoError(t, err)
	defer m.Shutdown(context.Background())
	meter := m.Meter("tally/test")
	c, err := meter.Int64Counter("tally_test_events")
	require.NoError(t, err)
	c.Add(context.Background(), 3, metric.WithAttributes(attribute.String("outcome", "charged"), attribute.String("a", "x\"y")))
	h, err := meter.Float64Histogram("tally_test_lag", metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(telemetry.LatencyBounds...))
	require.NoError(t, err)
	h.Record(context.Background(), 0.004)

	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	got, err := metrics.ParseText(strings.NewReader(string(body)))
	require.NoError(t, err)
	require.Equal(t, 3.0, got[`tally_test_events_total{a="x\"y",outcome="charged"}`], "%s", body)
	require.Equal(t, 1.0, got[`tally_test_lag_seconds_bucket{le="0.005"}`], "%s", body)
	require.Equal(t, 0.0, got[`tally_test_lag_seconds_bucket{le="0.003"}`], "%s", body)
	require.Equal(t, 1.0, got[`tally_test_lag_seconds_count`], "%s", body)
	var sched bool
	for k := range got {
		sched = sched || strings.HasPrefix(k, `go_sched_latencies_seconds_bucket{le="`)
	}
	require.True(t, sched, "go_sched_latencies_seconds")
	require.NotContains(t, string(body), "otel_scope")
	require.NotContains(t, string(body), "target_info")
}

// With an OTLP endpoint in the environment, metrics are also pushed there
// (OTLP over HTTP), named by OTEL_SERVICE_NAME, and Shutdown pushes what is
// left.
func TestOTLPPushFromTheEnvironment(t *testing.T) {
	received := otlpReceiver(t, "/v1/metrics")
	t.Setenv("OTEL_SERVICE_NAME", "tally-edge-test")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000") // only Shutdown pushes

	m, err := telemetry.Setup(context.Background(), "tally-edge-checker")
	require.NoError(t, err)
	c, err := m.Meter("tally/test").Int64Counter("tally_test_pushed")
	require.NoError(t, err)
	c.Add(context.Background(), 7)
	require.NoError(t, m.Shutdown(context.Background()))

	bodies := received()
	require.Len(t, bodies, 1, "one push, at shutdown")
	require.True(t, bytes.Contains(bodies[0], []byte("tally_test_pushed")))
	require.True(t, bytes.Contains(bodies[0], []byte("tally-edge-test")), "OTEL_SERVICE_NAME wins over the default name")
}

// Spans are made only when they are exported: with an OTLP endpoint they
// go to it (OTLP over HTTP) by Shutdown; without one there is no tracer.
func TestTracingFromTheEnvironment(t *testing.T) {
	off, err := telemetry.SetupTracing(context.Background(), "tally-edge-checker")
	require.NoError(t, err)
	require.Nil(t, off.Tracer("tally/edge"), "nothing exported, no spans made")
	require.NoError(t, off.Shutdown(context.Background()))

	received := otlpReceiver(t, "/v1/traces")
	t.Setenv("OTEL_SERVICE_NAME", "tally-traced")
	on, err := telemetry.SetupTracing(context.Background(), "tally-edge-checker")
	require.NoError(t, err)
	tracer := on.Tracer("tally/edge")
	require.NotNil(t, tracer)
	_, span := tracer.Start(context.Background(), "send tally.accounting.s0")
	span.End()
	require.NoError(t, on.Shutdown(context.Background()))
	bodies := received()
	require.Len(t, bodies, 1)
	require.True(t, bytes.Contains(bodies[0], []byte("send tally.accounting.s0")))
	require.True(t, bytes.Contains(bodies[0], []byte("tally-traced")))
}

// otlpReceiver stands in for an OpenTelemetry collector (OTLP over HTTP),
// set as OTEL_EXPORTER_OTLP_ENDPOINT for the test; it returns what was
// posted to path so far.
func otlpReceiver(t *testing.T, path string) func() [][]byte {
	var mu sync.Mutex
	var bodies [][]byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == path && r.Header.Get("Content-Type") == "application/x-protobuf" {
			mu.Lock()
			bodies = append(bodies, b)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	t.Cleanup(collector.Close)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	return func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(bodies)
	}
}

// Logs are JSON lines with the trace context of the record's context.
func TestLogsCarryTraceIDs(t *testing.T) {
	var b bytes.Buffer
	h, err := telemetry.NewLogHandler(&b, "", "info")
	require.NoError(t, err)
	log := slog.New(h).With("component", "edge")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2}, SpanID: trace.SpanID{3}, TraceFlags: trace.FlagsSampled})
	log.InfoContext(trace.ContextWithSpanContext(context.Background(), sc), "upstream failed", "err", "refused")
	log.Debug("not shown below info")
	log.Info("no span")
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 2)
	var first, second map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &first))
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &second))
	require.Equal(t, sc.TraceID().String(), first["trace_id"])
	require.Equal(t, sc.SpanID().String(), first["span_id"])
	require.Equal(t, "edge", first["component"])
	require.NotContains(t, second, "trace_id")

	_, err = telemetry.NewLogHandler(&b, "xml", "")
	require.ErrorContains(t, err, "want json or text")
	_, err = telemetry.NewLogHandler(&b, "text", "loud")
	require.ErrorContains(t, err, "want debug, info, warn or error")
}

// With OTEL_LOGS_EXPORTER=otlp, what the binaries log goes to the OTLP
// endpoint too (at the same level), with the trace context of the
// record's context and the process's resource, while the JSON lines go on;
// an endpoint alone does not send logs.
func TestLogsOverOTLPFromTheEnvironment(t *testing.T) {
	received := otlpReceiver(t, "/v1/logs")
	var b bytes.Buffer
	h, err := telemetry.NewLogHandler(&b, "", "info")
	require.NoError(t, err)
	same, off, err := telemetry.SetupLogs(context.Background(), "tally-edge-checker", h)
	require.NoError(t, err)
	require.Equal(t, h, same, "an endpoint alone: the JSON lines only")
	require.NoError(t, off.Shutdown(context.Background()))

	t.Setenv("OTEL_LOGS_EXPORTER", "otlp")
	t.Setenv("OTEL_SERVICE_NAME", "tally-logged")
	both, logs, err := telemetry.SetupLogs(context.Background(), "tally-edge-checker", h)
	require.NoError(t, err)
	log := slog.New(both).With("component", "edge")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2}, SpanID: trace.SpanID{3}, TraceFlags: trace.FlagsSampled})
	log.WarnContext(trace.ContextWithSpanContext(context.Background(), sc), "upstream failed", "err", "refused")
	log.Debug("not shown below info")
	require.NoError(t, logs.Shutdown(context.Background()))

	var records []*logspb.LogRecord
	var service string
	for _, body := range received() {
		var req collogspb.ExportLogsServiceRequest
		require.NoError(t, proto.Unmarshal(body, &req))
		for _, rl := range req.ResourceLogs {
			for _, a := range rl.Resource.Attributes {
				if a.Key == "service.name" {
					service = a.Value.GetStringValue()
				}
			}
			for _, sl := range rl.ScopeLogs {
				records = append(records, sl.LogRecords...)
			}
		}
	}
	require.Len(t, records, 1, "the record at info and above, once")
	r := records[0]
	require.Equal(t, "upstream failed", r.Body.GetStringValue())
	require.Equal(t, "WARN", r.SeverityText)
	require.Equal(t, sc.TraceID().String(), hex.EncodeToString(r.TraceId))
	require.Equal(t, sc.SpanID().String(), hex.EncodeToString(r.SpanId))
	attrs := map[string]string{}
	for _, a := range r.Attributes {
		attrs[a.Key] = a.Value.GetStringValue()
	}
	require.Equal(t, map[string]string{"component": "edge", "err": "refused"}, attrs, "the trace ids are the record's own fields, not attributes")
	require.Equal(t, "tally-logged", service)

	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	require.Len(t, lines, 1, "the JSON line too")
	require.Contains(t, lines[0], `"trace_id":"`+sc.TraceID().String()+`"`)
}
