package ratelimitenv

import (
	"fmt"
	"strings"
)

// Treatment is what Tally does with one of the reference's variables.
type Treatment string

// Treatments.
const (
	// Honoured: Tally does what the reference does with the variable.
	Honoured Treatment = "honoured"
	// Ignored: accepted, not acted on; the reason is logged once at start
	// when the variable is set.
	Ignored Treatment = "ignored"
	// Refused: a value Tally cannot honour stops the start with an error
	// naming the variable (the reference's default is accepted).
	Refused Treatment = "refused"
)

// Variable is one of the reference's settings.
type Variable struct {
	Name, Default string
	Treatment     Treatment
	// Tally says what the variable becomes in Tally's configuration, or
	// why it is ignored or refused.
	Tally string
}

const (
	whyStatsd    = "Tally exports Prometheus (USE_PROMETHEUS, and the debug port's /metrics) and OpenTelemetry (OTEL_* variables), not statsd"
	whyPerSecond = "Tally keeps every window, per-second ones too, on the Redis of REDIS_URL; more load wants more Redis shards (docs/scaling.md), not a second Redis"
	whyMemcache  = "Tally's windows live in Redis only"
	whyPool      = "Tally sizes its own Redis connection pools and pipelines its own way (docs/performance.md)"
	whyTracing   = "Tally traces from OpenTelemetry's own variables (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT — which Envoy Gateway sets beside these — OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER_ARG), exported over OTLP/HTTP"
)

// Variables are every variable of envoyproxy/ratelimit's
// src/settings/settings.go (f2fb157), in its order.
var Variables = []Variable{
	{"HOST", "0.0.0.0", Honoured, "with PORT: `edge.rls.http_listen`, serving `POST /json` and `GET /healthcheck`"},
	{"PORT", "8080", Honoured, "see HOST"},
	{"DEBUG_HOST", "0.0.0.0", Honoured, "with DEBUG_PORT: `edge.admin_listen` (`/metrics`, `/healthz`, `/readyz`); on loopback (127.0.0.1) unless TALLY_ADMIN_TOKEN is set, which it then requires for `/metrics`"},
	{"DEBUG_PORT", "6070", Honoured, "see DEBUG_HOST"},
	{"GRPC_UDS", "", Refused, "a gRPC listener on a Unix socket: Tally's rate-limit service listens on TCP (GRPC_HOST, GRPC_PORT)"},
	{"GRPC_HOST", "0.0.0.0", Honoured, "with GRPC_PORT: `edge.rls.listen`"},
	{"GRPC_PORT", "8081", Honoured, "see GRPC_HOST"},
	{"GRPC_MAX_CONNECTION_AGE", "24h", Ignored, "Tally's gRPC connections have no maximum age: they last until the client or a shutdown closes them"},
	{"GRPC_MAX_CONNECTION_AGE_GRACE", "1h", Ignored, "see GRPC_MAX_CONNECTION_AGE"},
	{"GRPC_SERVER_USE_TLS", "false", Honoured, "`edge.rls.tls` from GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"},
	{"GRPC_SERVER_TLS_CERT", "", Honoured, "`edge.rls.tls.cert_file`"},
	{"GRPC_SERVER_TLS_KEY", "", Honoured, "`edge.rls.tls.key_file`"},
	{"GRPC_CLIENT_TLS_CACERT", "", Honoured, "`edge.rls.tls.client_ca_file`: every caller must present a certificate it signs"},
	{"GRPC_CLIENT_TLS_SAN", "", Refused, "Tally checks a caller's certificate against the CA, not one subject alternative name: sign the gateways' certificates with a CA of their own"},
	{"LOG_LEVEL", "WARN", Honoured, "the log level: trace and debug → debug, info, warn, error, fatal and panic → error"},
	{"LOG_FORMAT", "text", Honoured, "text or json"},
	{"CONFIG_TYPE", "FILE", Honoured, "FILE: `edge.rls.config`; GRPC_XDS_SOTW: `edge.rls.xds`; anything else is refused"},
	{"FORCE_START_WITHOUT_INITIAL_CONFIG", "false", Ignored, "with GRPC_XDS_SOTW Tally starts without rules and refuses calls until the first update, whatever the value; with FILE the directory must hold the rules at start"},
	{"CONFIG_GRPC_XDS_NODE_ID", "default", Honoured, "`edge.rls.xds.node_id`"},
	{"CONFIG_GRPC_XDS_NODE_METADATA", "", Honoured, "`edge.rls.xds.node_metadata` (`key=value,key=value`)"},
	{"CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000", Honoured, "`edge.rls.xds.server`"},
	{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "3s", Ignored, "Tally waits XDS_CLIENT_BACKOFF_INITIAL_INTERVAL, doubling up to XDS_CLIENT_BACKOFF_MAX_INTERVAL, between tries"},
	{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "", Honoured, "`edge.rls.xds.headers` (`key:value,key:value`)"},
	{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", Honoured, "`edge.rls.xds.tls.enabled`"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "", Honoured, "`edge.rls.xds.tls.cert_file`"},
	{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "", Honoured, "`edge.rls.xds.tls.key_file`"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "", Honoured, "`edge.rls.xds.tls.ca_file`"},
	{"CONFIG_GRPC_XDS_SERVER_TLS_SAN", "", Honoured, "`edge.rls.xds.tls.server_name`"},
	{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "10s", Honoured, "`edge.rls.xds.backoff_initial`"},
	{"XDS_CLIENT_BACKOFF_MAX_INTERVAL", "60s", Honoured, "`edge.rls.xds.backoff_max`"},
	{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.5", Ignored, "Tally's backoff doubles, with a jitter of a quarter either way"},
	{"XDS_CLIENT_BACKOFF_JITTER", "true", Ignored, "see XDS_CLIENT_BACKOFF_RANDOM_FACTOR"},
	{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "", Honoured, "`edge.rls.xds.max_message_bytes`"},
	{"USE_DOG_STATSD", "false", Ignored, whyStatsd},
	{"USE_DOG_STATSD_MOGRIFIERS", "", Ignored, whyStatsd},
	{"USE_STATSD", "true", Ignored, whyStatsd},
	{"STATSD_HOST", "localhost", Ignored, whyStatsd},
	{"STATSD_PORT", "8125", Ignored, whyStatsd},
	{"EXTRA_TAGS", "", Ignored, whyStatsd},
	{"STATS_FLUSH_INTERVAL", "10s", Ignored, "Prometheus scrapes; OTLP pushes every OTEL_METRIC_EXPORT_INTERVAL"},
	{"DISABLE_STATS", "false", Ignored, "Tally's metrics are always kept (bounded: no key is a label)"},
	{"USE_PROMETHEUS", "false", Honoured, "`edge.metrics` at PROMETHEUS_ADDR and PROMETHEUS_PATH (Tally's metric names, docs/operations.md)"},
	{"PROMETHEUS_ADDR", ":9090", Honoured, "`edge.metrics.listen`"},
	{"PROMETHEUS_PATH", "/metrics", Honoured, "`edge.metrics.path`"},
	{"PROMETHEUS_MAPPER_YAML", "", Ignored, "it maps statsd names; Tally's metrics have their own Prometheus names (docs/operations.md)"},
	{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "false", Ignored, "Tally's durations are in seconds, as Prometheus recommends"},
	{"RUNTIME_ROOT", "/srv/runtime_data/current", Honoured, "with RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY: `edge.rls.config`, the directory ROOT/SUBDIRECTORY/APPDIRECTORY"},
	{"RUNTIME_SUBDIRECTORY", "", Honoured, "see RUNTIME_ROOT"},
	{"RUNTIME_APPDIRECTORY", "config", Honoured, "see RUNTIME_ROOT"},
	{"RUNTIME_IGNOREDOTFILES", "false", Ignored, "Tally never reads dot files (Kubernetes mounts its ConfigMap bookkeeping there)"},
	{"RUNTIME_WATCH_ROOT", "true", Ignored, "Tally watches the rules' directory itself, whatever the value: a change, or a ConfigMap update, is taken within 2 s"},
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", Ignored, "Tally expires a window a little after its reset time (docs/windows.md)"},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", Ignored, "Tally decides from memory anyway: its edge holds credit and knows full windows (docs/architecture.md)"},
	{"NEAR_LIMIT_RATIO", "0.8", Ignored, "it only names the reference's near-limit statistic"},
	{"CACHE_KEY_PREFIX", "", Honoured, "`key_prefix` (Tally's keys start with it)"},
	{"BACKEND_TYPE", "redis", Refused, "redis only: " + whyMemcache},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", Ignored, "Tally never charges a request it denies, whatever the value: a deliberate difference (docs/envoy.md)"},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", Honoured, "`edge.rls.response_headers`"},
	{"LIMIT_LIMIT_HEADER", "RateLimit-Limit", Refused, "Tally names the headers RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset; another name is refused"},
	{"LIMIT_REMAINING_HEADER", "RateLimit-Remaining", Refused, "see LIMIT_LIMIT_HEADER"},
	{"LIMIT_RESET_HEADER", "RateLimit-Reset", Refused, "see LIMIT_LIMIT_HEADER"},
	{"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false", Honoured, "`edge.rls.health_needs_rules`"},
	{"REDIS_SOCKET_TYPE", "unix", Honoured, "tcp; unix is refused (Tally reaches Redis over TCP). Unset with a host:port REDIS_URL, tcp is taken"},
	{"REDIS_TYPE", "SINGLE", Honoured, "SINGLE: one shard, `redis.shards[0].primary`; SENTINEL: REDIS_URL is `master,sentinel:port,...`; CLUSTER is refused (Redis Cluster is on Tally's roadmap)"},
	{"REDIS_URL", "/var/run/nutcracker/ratelimit.sock", Honoured, "host:port (or redis:// / rediss:// URL) of the primary; SENTINEL: master name and sentinels"},
	{"REDIS_POOL_SIZE", "10", Ignored, whyPool},
	{"REDIS_AUTH", "", Honoured, "the password, or `user:password` (TALLY_REDIS_USERNAME, TALLY_REDIS_PASSWORD)"},
	{"REDIS_TLS", "false", Honoured, "`redis.tls.enabled`"},
	{"REDIS_TLS_CLIENT_CERT", "", Honoured, "`redis.tls.cert_file`"},
	{"REDIS_TLS_CLIENT_KEY", "", Honoured, "`redis.tls.key_file`"},
	{"REDIS_TLS_CACERT", "", Honoured, "`redis.tls.ca_file`"},
	{"REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "false", Refused, "Tally verifies Redis's certificate for its name; give it one that names the host (or set `redis.tls.server_name` in a configuration file)"},
	{"REDIS_PIPELINE_WINDOW", "0", Ignored, whyPool},
	{"REDIS_PIPELINE_LIMIT", "0", Ignored, whyPool},
	{"REDIS_CLUSTER_PIPELINE_PARALLELISM", "1", Ignored, whyPool},
	{"REDIS_PERSECOND", "false", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_SOCKET_TYPE", "unix", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_TYPE", "SINGLE", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_URL", "/var/run/nutcracker/ratelimitpersecond.sock", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_POOL_SIZE", "10", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_AUTH", "", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_TLS", "false", Ignored, whyPerSecond},
	{"REDIS_SENTINEL_AUTH", "", Honoured, "the sentinels' password (TALLY_SENTINEL_PASSWORD)"},
	{"REDIS_PERSECOND_SENTINEL_AUTH", "", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_PIPELINE_WINDOW", "0", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_PIPELINE_LIMIT", "0", Ignored, whyPerSecond},
	{"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "1", Ignored, whyPerSecond},
	{"REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "false", Ignored, "Tally probes every primary each second, and its health follows (docs/operations.md)"},
	{"REDIS_TIMEOUT", "10s", Honoured, "`redis.timeout` (up to 1m)"},
	{"REDIS_PERSECOND_TIMEOUT", "10s", Ignored, whyPerSecond},
	{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "WAIT", Ignored, whyPool},
	{"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", "WAIT", Ignored, whyPerSecond},
	{"REDIS_STARTUP_INITIAL_INTERVAL", "1s", Ignored, "Tally starts without Redis and decides as `edge.on_redis_error` says until it answers"},
	{"REDIS_STARTUP_MAX_INTERVAL", "30s", Ignored, "see REDIS_STARTUP_INITIAL_INTERVAL"},
	{"REDIS_STARTUP_MAX_ELAPSED_TIME", "0", Ignored, "see REDIS_STARTUP_INITIAL_INTERVAL"},
	{"MEMCACHE_HOST_PORT", "", Ignored, whyMemcache + " (BACKEND_TYPE=memcache is refused)"},
	{"MEMCACHE_MAX_IDLE_CONNS", "2", Ignored, whyMemcache},
	{"MEMCACHE_SRV", "", Ignored, whyMemcache},
	{"MEMCACHE_SRV_REFRESH", "0", Ignored, whyMemcache},
	{"MEMCACHE_TLS", "false", Ignored, whyMemcache},
	{"MEMCACHE_TLS_CLIENT_CERT", "", Ignored, whyMemcache},
	{"MEMCACHE_TLS_CLIENT_KEY", "", Ignored, whyMemcache},
	{"MEMCACHE_TLS_CACERT", "", Ignored, whyMemcache},
	{"MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", "false", Ignored, whyMemcache},
	{"SHADOW_MODE", "false", Honoured, "`edge.rls.shadow_mode`: every rule in shadow mode"},
	{"QUOTA_MODE", "false", Honoured, "`edge.rls.quota_mode`: every rule in quota mode"},
	{"RESPONSE_DYNAMIC_METADATA", "false", Ignored, "Tally's answers carry no dynamic metadata; its decisions stream records each one (docs/events.md)"},
	{"MERGE_DOMAIN_CONFIG", "false", Honoured, "`edge.rls.merge_domains`"},
	{"TRACING_ENABLED", "false", Ignored, whyTracing},
	{"TRACING_SERVICE_NAME", "RateLimit", Ignored, whyTracing},
	{"TRACING_SERVICE_NAMESPACE", "", Ignored, whyTracing},
	{"TRACING_SERVICE_INSTANCE_ID", "", Ignored, whyTracing},
	{"TRACING_EXPORTER_PROTOCOL", "http", Ignored, whyTracing},
	{"TRACING_SAMPLING_RATE", "1", Ignored, whyTracing},
}

// Others are variables Envoy Gateway or Istio's sample set that are not
// the reference's (it reads none of them).
var Others = []Variable{
	{"GRPC_SERVER_TLS_CA_CERT", "", Ignored, "Envoy Gateway sets it, but the reference reads GRPC_CLIENT_TLS_CACERT and ignores this one; Tally does as the reference does"},
	{"OTEL_EXPORTER_OTLP_ENDPOINT", "", Honoured, "OpenTelemetry's own: Tally exports traces and metrics there over OTLP/HTTP (a collector's HTTP port, 4318, not its gRPC port)"},
}

// lookup finds a variable of Variables or Others.
func lookup(name string) (Variable, bool) {
	for _, v := range append(Variables, Others...) {
		if v.Name == name {
			return v, true
		}
	}
	return Variable{}, false
}

// Table is Variables and Others as the Markdown table docs/envoy.md shows.
func Table() string {
	var b strings.Builder
	b.WriteString("| variable | reference's default | Tally | what Tally does with it |\n|---|---|---|---|\n")
	row := func(v Variable) {
		def := "(empty)"
		if v.Default != "" {
			def = "`" + v.Default + "`"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", v.Name, def, v.Treatment, v.Tally)
	}
	for _, v := range Variables {
		row(v)
	}
	for _, v := range Others {
		row(v)
	}
	return b.String()
}
