package ratelimitenv_test

import (
	"bufio"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/ratelimitenv"
)

// Every variable of the reference's settings.go (f2fb157, listed in
// testdata with its default) is in the table with the same default, and
// the table has nothing else.
func TestEveryVariableOfTheReference(t *testing.T) {
	f, err := os.Open("testdata/settings-f2fb157.txt")
	require.NoError(t, err)
	defer f.Close()
	want := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, def, _ := strings.Cut(sc.Text(), "=")
		want[name] = def
	}
	require.Len(t, want, 114)
	got := map[string]string{}
	for _, v := range ratelimitenv.Variables {
		got[v.Name] = v.Default
		assert.NotEmpty(t, v.Tally, v.Name)
		assert.Contains(t, []ratelimitenv.Treatment{ratelimitenv.Honoured, ratelimitenv.Ignored, ratelimitenv.Refused}, v.Treatment, v.Name)
	}
	assert.Equal(t, want, got)
}

// docs/envoy.md shows the table as it is.
func TestTheDocsShowTheTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/envoy.md")
	require.NoError(t, err)
	require.True(t, strings.Contains(string(doc), ratelimitenv.Table()), "docs/envoy.md must hold ratelimitenv.Table() verbatim")
}

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// What Envoy Gateway (internal/infrastructure/kubernetes/ratelimit,
// resource.go) and Istio's sample (samples/ratelimit/rate-limit-service.yaml)
// set reads into a configuration Tally accepts.
func TestGatewaysSettings(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		require.NoError(t, os.WriteFile(dir+"/"+f, nil, 0o600))
	}
	envoyGateway := map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "false", "CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": dir + "/tls.crt",
		"GRPC_SERVER_TLS_KEY": dir + "/tls.key", "GRPC_SERVER_TLS_CA_CERT": dir + "/ca.crt", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": dir + "/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": dir + "/tls.key",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": dir + "/ca.crt", "FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
	}
	res, err := ratelimitenv.Read(envOf(envoyGateway), ratelimitenv.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	y := string(res.File)
	for _, want := range []string{"server: envoy-gateway:18001", "node_id: envoy-ratelimit", "listen: 0.0.0.0:8081", "http_listen: 0.0.0.0:8080",
		"listen: :19001", "admin_listen: 127.0.0.1:6070", "unauthenticated: true", "cert_file: " + dir + "/tls.crt"} {
		assert.Contains(t, y, want)
	}
	assert.NotContains(t, y, "client_ca_file", "GRPC_SERVER_TLS_CA_CERT is not the reference's: ignored as there")
	notes := strings.Join(res.Notes, "\n")
	for _, v := range []string{"GRPC_SERVER_TLS_CA_CERT", "PROMETHEUS_MAPPER_YAML", "FORCE_START_WITHOUT_INITIAL_CONFIG", "RUNTIME_WATCH_ROOT"} {
		assert.Contains(t, notes, v)
	}
	assert.NotContains(t, notes, "USE_STATSD", "turned off: nothing to say")
	assert.Equal(t, "info", res.LogLevel)
	// The certificates are empty files here: the configuration is checked
	// up to reading them.
	_, err = config.Parse(res.File, envOf(map[string]string{config.EnvKeySecret: strings.Repeat("5e", 32)}))
	require.ErrorContains(t, err, "edge.rls.tls")

	istio := map[string]string{"LOG_LEVEL": "debug", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false",
		"RUNTIME_ROOT": dir, "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"HOST": "::", "GRPC_HOST": "::"}
	require.NoError(t, os.MkdirAll(dir+"/ratelimit/config", 0o700))
	require.NoError(t, os.WriteFile(dir+"/ratelimit/config/config.yaml", []byte("domain: echo-ratelimit\ndescriptors:\n  - key: PATH\n    value: \"/\"\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o600))
	res, err = ratelimitenv.Read(envOf(istio), ratelimitenv.Options{DataDir: t.TempDir()})
	require.NoError(t, err)
	assert.Contains(t, string(res.File), "listen: '[::]:8081'")
	assert.Equal(t, "debug", res.LogLevel)
	cfg, err := config.Parse(res.File, envOf(map[string]string{config.EnvKeySecret: strings.Repeat("5e", 32)}))
	require.NoError(t, err)
	assert.Equal(t, []string{"echo-ratelimit"}, cfg.Descriptors().Domains())
	assert.True(t, cfg.EmbeddedNATS())
}

// A setting Tally cannot honour is refused with an error naming it.
func TestRefusals(t *testing.T) {
	base := map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:6379"}
	for _, tc := range []struct{ name, value string }{
		{"REDIS_SOCKET_TYPE", "unix"},
		{"REDIS_TYPE", "CLUSTER"},
		{"REDIS_URL", "a:1,b:2"},
		{"BACKEND_TYPE", "memcache"},
		{"GRPC_UDS", "/tmp/rl.sock"},
		{"GRPC_CLIENT_TLS_SAN", "envoy"},
		{"CONFIG_TYPE", "GRPC_XDS_DELTA"},
		{"LIMIT_LIMIT_HEADER", "X-Limit"},
		{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"},
		{"LOG_LEVEL", "loud"},
		{"GRPC_PORT", "http"},
		{"SHADOW_MODE", "maybe"},
		{"CACHE_KEY_PREFIX", "a b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{tc.name: tc.value}
			for k, v := range base {
				if _, ok := env[k]; !ok {
					env[k] = v
				}
			}
			_, err := ratelimitenv.Read(envOf(env), ratelimitenv.Options{})
			require.ErrorIs(t, err, ratelimitenv.ErrRefused)
			require.ErrorContains(t, err, tc.name+"=")
		})
	}
}

// USE_STATSD is on by default in the reference: Tally says once that it
// does not speak statsd, unless it is turned off.
func TestStatsdSaidOnce(t *testing.T) {
	res, err := ratelimitenv.Read(envOf(map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "STATSD_HOST": "s"}), ratelimitenv.Options{})
	require.NoError(t, err)
	n := 0
	for _, note := range res.Notes {
		if strings.Contains(note, "statsd") {
			n++
		}
	}
	assert.Equal(t, 1, n, "%q", res.Notes)
}
