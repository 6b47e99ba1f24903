package service

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/redistest"
)

// With traces exported, a process's Redis commands are spans under the
// caller's span, sent with the process's other spans; no argument value is
// in them.
func TestProcessTracesRedisCommands(t *testing.T) {
	rs := redistest.Start(t)
	var mu sync.Mutex
	var traces [][]byte
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/traces" {
			mu.Lock()
			traces = append(traces, b)
			mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer collector.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.URL)
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")

	cfg, err := config.Parse([]byte("redis:\n  shards:\n    - name: s0\n      primary: {addr: \""+rs.Addr+"\"}\n"+
		"nats:\n  url: nats://127.0.0.1:4222\n"), nil)
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := open(context.Background(), cfg, "tally-test", log)
	require.NoError(t, err)
	ctx, span := p.tracing.Tracer("tally/test").Start(context.Background(), "tally-test-request")
	require.NoError(t, p.store.Ping(ctx))
	span.End()
	p.close(5*time.Second, log)

	mu.Lock()
	defer mu.Unlock()
	all := bytes.Join(traces, nil)
	require.True(t, bytes.Contains(all, []byte("tally-test-request")), "the caller's span")
	require.True(t, bytes.Contains(all, []byte("ping")), "the Redis command's span")
	require.True(t, bytes.Contains(all, []byte("db.system")))
	require.False(t, bytes.Contains(all, []byte("db.statement")))
}
