package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tally serve's section and the rate-limit service's new settings: what
// is refused, with the field, and the defaults.
func TestServeAndXDSSettings(t *testing.T) {
	rules := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(rules, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"), 0o600))
	const head = "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"127.0.0.1:6379\"}\n"
	env := func(extra map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := extra[k]; ok {
				return v
			}
			return withSecret(k)
		}
	}
	routePW := map[string]string{"TALLY_NATS_ROUTE_PASSWORD": "pw"}
	for _, tc := range []struct {
		name, src string
		env       map[string]string
		refused   string // "" when accepted
	}{
		{"embedded by default", "edge:\n  rls:\n    listen: 127.0.0.1:1\n    config: " + rules + "\nserve:\n  data_dir: /x\n", nil, ""},
		{"an external NATS and a data dir", "nats:\n  url: nats://n:4222\nserve:\n  data_dir: /x\n", nil, "serve.data_dir: set, but nats.url"},
		{"an external NATS from the environment and a listener", "serve:\n  nats:\n    listen: 127.0.0.1:4222\n", map[string]string{EnvNATSURL: "nats://n:4222"}, "serve.nats: set, but nats.url"},
		{"routes without a route listener", "serve:\n  nats:\n    cluster:\n      routes: [a:6222]\n", nil, "serve.nats.cluster.listen: empty"},
		{"a cluster without its password", "serve:\n  nats:\n    cluster:\n      listen: 0.0.0.0:6222\n      routes: [a:6222]\n", nil, "TALLY_NATS_ROUTE_PASSWORD"},
		{"a route with credentials", "serve:\n  nats:\n    cluster:\n      listen: 0.0.0.0:6222\n      routes: [\"nats-route://u:p@a:6222\"]\n", routePW, "serve.nats.cluster.routes[0]"},
		{"more replicas than servers", "nats:\n  streams:\n    replicas: 3\nserve:\n  nats:\n    cluster:\n      listen: 0.0.0.0:6222\n      routes: [a:6222]\n", routePW, "nats.streams.replicas: 3: the embedded cluster has 2 servers"},
		{"replicas on a lone server", "nats:\n  streams:\n    replicas: 3\n", nil, "nats.streams.replicas: 3: the embedded server is alone"},
		{"xds and a directory", "edge:\n  rls:\n    listen: 127.0.0.1:1\n    config: " + rules + "\n    xds: {server: \"cp:18000\"}\n", nil, "edge.rls.xds: set with edge.rls.config"},
		{"xds without a port", "edge:\n  rls:\n    listen: 127.0.0.1:1\n    xds: {server: cp}\n", nil, "edge.rls.xds.server"},
		{"xds TLS with a missing CA", "edge:\n  rls:\n    listen: 127.0.0.1:1\n    xds: {server: \"cp:18000\", tls: {ca_file: /nonexistent}}\n", nil, "edge.rls.xds.tls"},
		{"neither xds nor a directory", "edge:\n  rls:\n    listen: 127.0.0.1:1\n", nil, "edge.rls.config: empty"},
		{"http_listen beyond loopback without a token", "edge:\n  rls:\n    listen: 127.0.0.1:1\n    config: " + rules + "\n    http_listen: 0.0.0.0:8080\n", nil, "edge.rls.http_listen"},
		{"the gRPC door beyond loopback, unauthenticated on purpose", "edge:\n  rls:\n    listen: 0.0.0.0:8081\n    http_listen: 0.0.0.0:8080\n    unauthenticated: true\n    config: " + rules + "\n", nil, ""},
		{"a metrics path without a slash", "edge:\n  metrics: {listen: \"127.0.0.1:9\", path: metrics}\n", nil, "edge.metrics.path"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := head + tc.src
			if !strings.Contains(src, "policies:") && !strings.Contains(src, "rls:") {
				src += "policies:\n  - {name: p, limit: 1, window: 1m}\n"
			}
			_, err := Parse([]byte(src), env(tc.env))
			if tc.refused == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tc.refused)
		})
	}
	// Three clustered servers: R3 by default; the embedded NATS is on.
	f, err := Parse([]byte(head+"policies:\n  - {name: p, limit: 1, window: 1m}\nserve:\n  nats:\n    cluster:\n      listen: 0.0.0.0:6222\n      routes: [a:6222, b:6222]\n"),
		env(routePW))
	require.NoError(t, err)
	assert.Equal(t, 3, f.NATS.Streams.Replicas)
	assert.True(t, f.EmbeddedNATS())
	assert.Equal(t, "tally", f.Serve.NATS.Cluster.Name)
	assert.Equal(t, "pw", f.Serve.NATS.Cluster.Password)
}
