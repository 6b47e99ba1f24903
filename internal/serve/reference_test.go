package serve_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/rlsconformance"
)

// referenceEnv is what Istio's sample sets (docs/istio.md), with the
// listeners on loopback and free ports: the reference's variables only.
func referenceEnv(t *testing.T, redisAddr, runtimeRoot string) (env map[string]string, grpcAddr, httpAddr string) {
	grpcAddr, httpAddr = freeAddr(t), freeAddr(t)
	return map[string]string{
		"LOG_LEVEL": "info", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redisAddr, "USE_STATSD": "false",
		"RUNTIME_ROOT": runtimeRoot, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"HOST": "127.0.0.1", "PORT": port(httpAddr), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": port(grpcAddr), "DEBUG_PORT": port(freeAddr(t)),
	}, grpcAddr, httpAddr
}

// tally serve started with envoyproxy/ratelimit's environment variables
// only — no configuration file, no Tally variable, no key secret — reads
// the reference's rules from its runtime directory and answers as the
// reference does over gRPC, and on the HTTP port /json and /healthcheck.
func TestReferenceSettingsConformance(t *testing.T) {
	rs := redistest.Start(t)
	env, grpcAddr, httpAddr := referenceEnv(t, rs.Addr, runtimeDir(t))
	promAddr := freeAddr(t)
	env["USE_PROMETHEUS"], env["PROMETHEUS_ADDR"], env["PROMETHEUS_PATH"] = "true", promAddr, "/prom"
	tallyServe(t, env, "-data-dir", t.TempDir())
	c := rlsClient(t, grpcAddr)
	rlsconformance.Run(t, c)

	resp, err := http.Get("http://" + httpAddr + "/healthcheck")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
	assert.Equal(t, "OK", string(body))
	post := func() (int, string) {
		resp, err := http.Post("http://"+httpAddr+"/json", "application/json",
			strings.NewReader(`{"domain": "override", "descriptors": [{"entries": [{"key": "k", "value": "json"}], "limit": {"requests_per_unit": 1, "unit": "HOUR"}}]}`))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body1 := post()
	assert.Equal(t, 200, code, body1)
	assert.Contains(t, body1, `"overallCode":"OK"`)
	code, body2 := post()
	assert.Equal(t, 429, code, body2)
	assert.Contains(t, body2, `"overallCode":"OVER_LIMIT"`)
	resp, err = http.Post("http://"+httpAddr+"/json", "application/json", strings.NewReader(`{"domain": `))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 400, resp.StatusCode)
	// USE_PROMETHEUS: the process's metrics — the edge's and the
	// accountant's together — at PROMETHEUS_ADDR and PROMETHEUS_PATH.
	m, err := metrics.Scrape("http://" + promAddr + "/prom")
	require.NoError(t, err)
	assert.Greater(t, m[`tally_edge_decisions_total{path="reserve",result="allowed"}`], 0.0)
	found := false
	for k := range m {
		found = found || strings.HasPrefix(k, "tally_accountant_")
	}
	assert.True(t, found, "the accountant's metrics are there too")
}
