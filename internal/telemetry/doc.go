// Package telemetry is how Tally's binaries expose measurements: an
// OpenTelemetry SDK MeterProvider whose Prometheus exporter serves /metrics,
// beside the Go runtime's own metrics (the scheduler's latencies included:
// how long runnable goroutines waited for a CPU).
//
// Instruments keep the names operators, alert rules and dashboards rely on
// (docs/operations.md): the exporter adds _total to counters and _seconds
// to histograms in seconds. Metrics never carry a rate-limit key as a label.
package telemetry
