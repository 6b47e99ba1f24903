package service

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/testutil"
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
		"nats:\n  url: nats://127.0.0.1:4222\n"), func(k string) string {
		if k == config.EnvKeySecret {
			return strings.Repeat("5e", 32)
		}
		return ""
	})
	require.NoError(t, err)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p, err := open(context.Background(), cfg, "tally-test", log, nil)
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

// go-redis's own log lines (a pool that cannot dial) come out as JSON
// through the process's logger, like every other line.
func TestRedisLogsAreJSON(t *testing.T) {
	var buf testutil.Buffer
	redis.SetLogger(redisLogger{slog.New(slog.NewJSONHandler(&buf, nil)).With("component", "go-redis")})
	t.Cleanup(func() { redis.SetLogger(redisLogger{slog.New(slog.NewJSONHandler(io.Discard, nil))}) })
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 50 * time.Millisecond, MaxRetries: -1})
	defer c.Close()
	require.Eventually(t, func() bool {
		_ = c.Ping(context.Background()).Err()
		return strings.Contains(buf.String(), "dial")
	}, 10*time.Second, 10*time.Millisecond)
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		require.Equal(t, "go-redis", m["component"])
		require.Equal(t, "WARN", m["level"])
	}
}
