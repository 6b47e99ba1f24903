// Package config reads Tally's configuration file: one YAML file for a
// deployment, from which the edge-checker and the accountant each take the
// sections they need. Errors name the line and the field. Environment
// variables override addresses and secrets (Env), so that secrets need not
// be written in the file.
//
// docs/configuration.md describes every field and its default.
package config

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/backoff"
	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/outbox"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/servertls"
	"github.com/tallyhq/tally/internal/setting"
	"github.com/tallyhq/tally/internal/shard"
)

// ErrInvalid is wrapped by every configuration error.
var ErrInvalid = errors.New("config: invalid")

// File is the whole configuration file.
type File struct {
	KeyPrefix  string     `yaml:"key_prefix"`
	Redis      Redis      `yaml:"redis"`
	NATS       NATS       `yaml:"nats"`
	Edge       Edge       `yaml:"edge"`
	Accountant Accountant `yaml:"accountant"`
	Policies   []Policy   `yaml:"policies"`
	Routes     []Route    `yaml:"routes"`
	// Serve is what tally serve adds: the embedded NATS JetStream server
	// (docs/operations.md, One process).
	Serve Serve `yaml:"serve"`

	// KeySecret keys the identity hash and signs request ids and notices
	// (TALLY_KEY_SECRET, at least 32 random bytes in hex or base64:
	// ParseSecret). Required; never in the file.
	KeySecret []byte `yaml:"-"`
	// APIToken is the bearer token the decision API requires
	// (TALLY_API_TOKEN); AdminToken the one /metrics and /debug/pprof/
	// require on both binaries (TALLY_ADMIN_TOKEN). Never in the file.
	APIToken   string `yaml:"-"`
	AdminToken string `yaml:"-"`

	// path and env are where Load read the file and its environment, for
	// Reload.
	path string
	env  func(string) string

	// natsURLGiven: nats.url (or TALLY_NATS_URL) was set, naming an
	// external NATS; otherwise tally serve embeds one.
	natsURLGiven bool

	redisTLS *tls.Config // built from Redis.TLS by validate
	xdsTLS   *tls.Config // built from Edge.RLS.XDS.TLS by validate
	// descriptors are Edge.RLS.Config's rules, read by validate.
	descriptors *descriptors.Config
	natsOpts    []nats.Option
}

// Redis is the shard map and the window settings.
type Redis struct {
	Shards        []shard.Config   `yaml:"shards"`
	ReadPolicy    shard.ReadPolicy `yaml:"read_policy"`
	Grace         time.Duration    `yaml:"grace"`
	SkewTolerance time.Duration    `yaml:"skew_tolerance"`
	Timeout       time.Duration    `yaml:"timeout"`
	// WaitReplicas and WaitTimeout: the accountant waits for this many
	// replicas (default 1 when a shard has replicas; -1 never) before it
	// deletes applied events from the stream.
	WaitReplicas int           `yaml:"wait_replicas"`
	WaitTimeout  time.Duration `yaml:"wait_timeout"`
	// ReseedFor is how long, at least, a shard whose primary changed (a
	// promotion, a restart) takes no reservation while the edges re-assert
	// what they hold in its windows (docs/operations.md, When a primary
	// changes). Default 1s.
	ReseedFor time.Duration `yaml:"reseed_for"`
	// Placement names the shards keys are placed on (default: every
	// shard); PreviousPlacement, while shards are added or removed, the
	// placement before (docs/operations.md, Resharding).
	Placement         []string `yaml:"placement,omitempty"`
	PreviousPlacement []string `yaml:"previous_placement,omitempty"`
	// TLS secures every connection to every node.
	TLS TLS `yaml:"tls"`
}

// TLS configures a client's TLS: on when Enabled or any file is set.
type TLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile holds the certificates that sign the servers' (PEM); default
	// the system's roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate and its key (PEM), for
	// servers that require one.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the name checked in the servers' certificates.
	ServerName string `yaml:"server_name"`
}

// NATS is the connection and the streams.
type NATS struct {
	URL     string         `yaml:"url"`
	Streams events.Streams `yaml:"streams"`
	TLS     TLS            `yaml:"tls"`
	// CredentialsFile is a NATS credentials file (a user JWT and its nkey
	// seed); NKeyFile a file holding an nkey seed. At most one of them.
	// User and password go in the URL or TALLY_NATS_USER and
	// TALLY_NATS_PASSWORD.
	CredentialsFile string `yaml:"credentials_file"`
	NKeyFile        string `yaml:"nkey_file"`
	User            string `yaml:"-"`
	Password        string `yaml:"-"`
	// InboxPrefix is the prefix of the subjects replies come back on
	// (TALLY_NATS_INBOX_PREFIX wins). Default _INBOX; the shipped
	// permissions (deploy/nats) give each role its own, so that no role
	// reads another's replies.
	InboxPrefix string `yaml:"inbox_prefix"`
}

// Edge configures the edge-checker.
type Edge struct {
	// Listen serves proxy mode (requires Upstream). Empty: no proxy.
	Listen   string `yaml:"listen"`
	Upstream string `yaml:"upstream"`
	// TLS is the proxy listener's TLS. Off by default.
	TLS servertls.Config `yaml:"tls"`
	// APIListen serves the decision API (/v1/check, /v1/finish). Empty: none.
	APIListen string `yaml:"api_listen"`
	// APITLS is the decision API's TLS. Off by default.
	APITLS servertls.Config `yaml:"api_tls"`
	// AdminListen serves /healthz, /readyz and /metrics. Default 127.0.0.1:9090.
	AdminListen string `yaml:"admin_listen"`
	// AdminTLS is the admin listener's TLS. Off by default.
	AdminTLS servertls.Config `yaml:"admin_tls"`
	// OnRedisError is "allow" (default: fail open) or "deny" (503).
	OnRedisError string `yaml:"on_redis_error"`
	// MaxHeaderBytes bounds request headers (431 above). Default 16 KiB.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// Timeouts of the edge's listeners (proxy, decision API, admin):
	// reading a request's headers (default 5s), reading a whole request
	// with its body (30s), writing a response, the upstream's time
	// included in proxy mode (60s), and how long an idle keep-alive
	// connection stays open (120s). A slow client holds a connection at
	// most this long.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	ReadTimeout       time.Duration `yaml:"read_timeout"`
	WriteTimeout      time.Duration `yaml:"write_timeout"`
	IdleTimeout       time.Duration `yaml:"idle_timeout"`
	// ShutdownTimeout bounds the graceful shutdown. Default 15s.
	ShutdownTimeout time.Duration `yaml:"shutdown_timeout"`
	Identity        Identity      `yaml:"identity"`
	// DefaultPolicy applies to paths no route matches. Empty: such requests
	// are passed through unlimited (global policies still apply).
	DefaultPolicy string `yaml:"default_policy"`
	// GlobalPolicies hold every proxied request beside its route's
	// policies (e.g. a limit per address, with key: address).
	GlobalPolicies []string `yaml:"global_policies"`
	// Source is the CloudEvents source. Default edge-checker/<hostname>.
	Source string `yaml:"source"`
	// Pprof serves Go's profiles on the admin listener (/debug/pprof/).
	Pprof     bool                 `yaml:"pprof"`
	Credit    credit.Config        `yaml:"credit"`
	Outbox    outbox.Config        `yaml:"outbox"`
	Decisions edge.DecisionsConfig `yaml:"decisions"`
	RLS       RLS                  `yaml:"rls"`
	// ForwardAuth answers gateways' forward-auth requests (nginx
	// auth_request, Traefik ForwardAuth, Caddy forward_auth).
	ForwardAuth ForwardAuth `yaml:"forward_auth"`
	// Metrics is a listener of its own for /metrics (envoyproxy/ratelimit's
	// PROMETHEUS_ADDR and PROMETHEUS_PATH), beside the admin listener's.
	Metrics MetricsListener `yaml:"metrics"`
}

// MetricsListener serves the process's metrics at Path only.
type MetricsListener struct {
	// Listen is its address. Empty: none.
	Listen string `yaml:"listen"`
	// Path is where the metrics are. Default /metrics.
	Path string `yaml:"path"`
}

// ForwardAuth is the forward-auth listener (docs/nginx.md, docs/traefik.md,
// docs/caddy.md).
type ForwardAuth struct {
	// Listen serves /auth/nginx, /auth/traefik and /auth/caddy. Empty: off.
	Listen string `yaml:"listen"`
	// Gateways are the addresses (or CIDRs) of the gateways: only their
	// requests and access logs are believed. Required with Listen.
	Gateways []string `yaml:"gateways"`
	// LogListen is a UDP address for the gateways' access logs (nginx's
	// syslog, Caddy's JSON), from which 304s get their charge back.
	// Empty: none.
	LogListen string `yaml:"log_listen"`
	// TLS is the forward-auth listener's TLS. Off by default.
	TLS servertls.Config `yaml:"tls"`
}

// RLS serves Envoy's rate-limit service over gRPC
// (envoy.service.ratelimit.v3.RateLimitService, and grpc.health.v1), from
// limits written in envoyproxy/ratelimit's YAML (docs/envoy.md).
type RLS struct {
	// Listen is the gRPC listener. Empty: no rate-limit service.
	Listen string `yaml:"listen"`
	// TLS is the gRPC listener's TLS. Off by default.
	TLS servertls.Config `yaml:"tls"`
	// Config is the directory of envoyproxy/ratelimit's configuration
	// files: every file in it but dot files, one domain each (what the
	// reference reads from RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config).
	Config string `yaml:"config"`
	// MergeDomains lets several files add to one domain (the reference's
	// MERGE_DOMAIN_CONFIG).
	MergeDomains bool `yaml:"merge_domains"`
	// ShadowMode and QuotaMode put every rule in shadow_mode, or
	// quota_mode (the reference's SHADOW_MODE and QUOTA_MODE). Default
	// false.
	ShadowMode bool `yaml:"shadow_mode"`
	QuotaMode  bool `yaml:"quota_mode"`
	// Mode is the mode of every rule: auto (default), exact or async.
	Mode limiter.Mode `yaml:"mode"`
	// ResponseHeaders adds RateLimit-Limit, -Remaining and -Reset to the
	// answers for Envoy to pass to clients (the reference's
	// LIMIT_RESPONSE_HEADERS_ENABLED). Default false, as there.
	ResponseHeaders bool `yaml:"response_headers"`
	// ChargeAtEnd names the domains whose descriptors that carry their own
	// hits_addend are charges of a cost known only at the end (Envoy's
	// apply_on_stream_done): applied in full, even past the limit.
	ChargeAtEnd []string `yaml:"charge_at_end"`
	// ClockWindows names the domains whose windows are aligned to the
	// clock, as envoyproxy/ratelimit's ("*": every domain); the others
	// open at the second of their first request.
	ClockWindows []string `yaml:"clock_windows"`
	// XDS takes the rules from an xDS management server instead of Config
	// (envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW). Off when its
	// server is empty.
	XDS XDS `yaml:"xds"`
	// HTTPListen serves envoyproxy/ratelimit's HTTP port: POST /json (a
	// RateLimitRequest in protobuf JSON; 429 when over the limit) and
	// GET /healthcheck. Empty: none.
	HTTPListen string `yaml:"http_listen"`
	// HealthNeedsRules makes /healthcheck (http_listen) fail until rules
	// are loaded (the reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	// Default false.
	HealthNeedsRules bool `yaml:"health_needs_rules"`
	// Unauthenticated lets the rate-limit service (gRPC and http_listen)
	// reachable beyond loopback take calls with neither a token nor a
	// client certificate, as envoyproxy/ratelimit does: for a network
	// where only the gateways reach it (docs/security.md). Default false.
	Unauthenticated bool `yaml:"unauthenticated"`
}

// XDS subscribes to the rate-limit rules as envoyproxy/ratelimit does with
// CONFIG_TYPE=GRPC_XDS_SOTW: resources of the type
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig over
// the aggregated discovery service, state of the world.
type XDS struct {
	// Server is the management server, host:port.
	Server string `yaml:"server"`
	// NodeID and NodeMetadata are the node Tally presents (default id
	// "default", as the reference's).
	NodeID       string            `yaml:"node_id"`
	NodeMetadata map[string]string `yaml:"node_metadata"`
	// Headers are gRPC metadata sent on the stream.
	Headers map[string]string `yaml:"headers"`
	// TLS to the management server. Off by default.
	TLS TLS `yaml:"tls"`
	// BackoffInitial and BackoffMax bound the wait before reconnecting
	// (doubled each time, with jitter). Defaults 500ms and 30s.
	BackoffInitial time.Duration `yaml:"backoff_initial"`
	BackoffMax     time.Duration `yaml:"backoff_max"`
	// MaxMessageBytes bounds an update. Default 4 MiB.
	MaxMessageBytes int `yaml:"max_message_bytes"`
}

// RuleOptions are how the rules' files are put together.
func (r RLS) RuleOptions() descriptors.Options {
	return descriptors.Options{MergeDomains: r.MergeDomains, Shadow: r.ShadowMode, Quota: r.QuotaMode}
}

// On says whether the rules come over xDS.
func (x XDS) On() bool { return x.Server != "" }

// Serve configures tally serve: an edge-checker, an accountant and —
// unless nats.url names an external NATS — an embedded NATS JetStream
// server in one process.
type Serve struct {
	// DataDir holds the embedded server's JetStream store (in
	// DataDir/jetstream). Required with the embedded NATS; on a durable
	// disk.
	DataDir string `yaml:"data_dir"`
	// NATS is the embedded server.
	NATS EmbeddedNATS `yaml:"nats"`
}

// EmbeddedNATS is the embedded NATS server: Tally's users and permissions
// (deploy/nats/tally.conf) with their passwords from
// TALLY_NATS_<USER>_PASSWORD; a user with none gets a random one, known
// to the process only.
type EmbeddedNATS struct {
	// Name is the server's name, unique in a cluster. Default the host
	// name.
	Name string `yaml:"name"`
	// Listen is a client listener for services and analytics consumers.
	// Empty (default): none, the process's own parts connect in process.
	Listen string `yaml:"listen"`
	// TLS is the client listener's TLS. Off by default.
	TLS servertls.Config `yaml:"tls"`
	// Cluster joins the embedded servers of several tally serve into one
	// JetStream cluster.
	Cluster EmbeddedCluster `yaml:"cluster"`
	// Passwords are the users' passwords (TALLY_NATS_<USER>_PASSWORD),
	// by user. Never in the file.
	Passwords map[string]string `yaml:"-"`
}

// EmbeddedCluster is the embedded server's cluster: routes authenticate
// with TALLY_NATS_ROUTE_PASSWORD, as deploy/nats/cluster.conf's.
type EmbeddedCluster struct {
	// Name is the cluster's name. Default tally.
	Name string `yaml:"name"`
	// Listen is the route listener (host:port). Empty: no cluster.
	Listen string `yaml:"listen"`
	// Routes are the other servers' route listeners
	// (nats-route://host:6222, or host:6222).
	Routes []string `yaml:"routes"`
	// Password is the routes' password (TALLY_NATS_ROUTE_PASSWORD). Never
	// in the file.
	Password string `yaml:"-"`
}

// On says whether the embedded server is clustered.
func (c EmbeddedCluster) On() bool { return c.Listen != "" }

// EmbeddedNATS says whether tally serve embeds NATS: nats.url (and
// TALLY_NATS_URL) named none.
func (f *File) EmbeddedNATS() bool { return !f.natsURLGiven }

// Identity says whose window a request counts against.
type Identity struct {
	// Header, when set and present on a request, is the identity (hashed).
	// Requests without it are keyed by client IP.
	Header string `yaml:"header"`
	// TrustedProxies are CIDRs whose X-Forwarded-For entries are believed.
	TrustedProxies []string `yaml:"trusted_proxies"`
	// IPv4Prefix and IPv6Prefix group client addresses. Defaults 32 and 64.
	IPv4Prefix int `yaml:"ipv4_prefix"`
	IPv6Prefix int `yaml:"ipv6_prefix"`
}

// Accountant configures the accountant: its tunables (accountant.Config,
// which has their defaults and checks) and its admin listener.
type Accountant struct {
	accountant.Config `yaml:",inline"`
	// AdminListen serves /healthz, /readyz and /metrics. Empty: none.
	AdminListen string `yaml:"admin_listen"`
	// AdminTLS is the admin listener's TLS. Off by default.
	AdminTLS servertls.Config `yaml:"admin_tls"`
}

// Policy is one rate limit.
type Policy struct {
	Name   string        `yaml:"name"`
	Limit  int64         `yaml:"limit"`
	Window time.Duration `yaml:"window"`
	Cost   int64         `yaml:"cost"`
	// Algorithm is how the policy counts: fixed_window (the default,
	// limiter.FixedWindow), sliding_window (limiter.SlidingWindow: at most
	// Limit in any Window, measured in Slices sub-windows aligned to the
	// clock) or concurrency (limiter.Concurrency: at most Limit in flight,
	// each request's units held until its finish or its Lease) or
	// token_bucket (limiter.TokenBucket: refilled Limit units every
	// Window, holding at most Burst).
	Algorithm limiter.Algorithm `yaml:"algorithm"`
	// Burst is a token bucket's size: the most admitted at once, 1 to the
	// limiter's bound (default Limit).
	Burst int64 `yaml:"burst"`
	// Slices is a sliding window's number of sub-windows, 2 to 60 (default
	// 10); Window must be that many whole seconds.
	Slices int `yaml:"slices"`
	// Lease is a concurrency limit's (algorithm: concurrency, at most Limit
	// requests in flight): how long a request's units are held at least
	// when its finish never comes; they are given back by 2 × Lease after
	// its start. Whole seconds; Window is then left out.
	Lease time.Duration `yaml:"lease"`
	// Mode is auto (default), exact or async (docs/accuracy.md).
	Mode limiter.Mode `yaml:"mode"`
	// Key is what a proxied request's window is keyed by: identity (the
	// default: the identity header, or the client address without one) or
	// address (the client address always).
	Key string `yaml:"key"`
	// Shadow decides and records without enforcing (limiter.Policy.Shadow).
	Shadow bool `yaml:"shadow"`
	// Windows is when a window opens: first_request (the default: at the
	// second of a client's first request), clock (at the multiple of the
	// window since the Unix epoch, limiter.Policy.Align) or calendar (at
	// local midnight of the first day of a Period of TimeZone's calendar,
	// limiter.Policy.Calendar; Window is then left out).
	Windows string `yaml:"windows"`
	// Period is a calendar window's period: day, week (ISO, from Monday),
	// month or year. Only with Windows calendar.
	Period string `yaml:"period"`
	// TimeZone is the IANA time zone whose calendar a calendar window
	// follows (Europe/Berlin); default UTC. Only with Windows calendar.
	TimeZone string `yaml:"time_zone"`
	// Tiers give other limits by the client's plan (edge.Tiers).
	Tiers *Tiers `yaml:"tiers"`
	// Overrides give one identity another limit (edge.Override).
	Overrides []Override `yaml:"overrides"`
	// Backoff makes the Retry-After of a client that keeps sending while
	// denied grow: factor (1.1 to 10) and max (default 1h). Unset: none.
	Backoff backoff.Config `yaml:"backoff"`
}

// Tiers are a policy's limits by plan: the plan named by Header on a
// proxied request from a trusted proxy, or by the decision API's "tier".
type Tiers struct {
	Header string           `yaml:"header"`
	Limits map[string]int64 `yaml:"limits"`
}

// Override is one identity's limit under a policy: the identity header's
// value (or the decision API's identity), or "ip:" and an address prefix
// as the edge groups addresses ("ip:203.0.113.7/32").
type Override struct {
	Identity string `yaml:"identity"`
	Limit    int64  `yaml:"limit"`
}

// burst is a token bucket's size: Burst, or Limit.
func (p Policy) burst() int64 {
	if p.Burst == 0 {
		return p.Limit
	}
	return p.Burst
}

// slices is p's number of sub-windows: Slices, or limiter.DefaultSlices.
func (p Policy) slices() int {
	if p.Slices == 0 {
		return limiter.DefaultSlices
	}
	return p.Slices
}

// When a policy's windows open.
const (
	WindowsFirstRequest = "first_request"
	WindowsClock        = "clock"
	WindowsCalendar     = "calendar"
)

// Policy keys.
const (
	KeyIdentity = "identity"
	KeyAddress  = "address"
)

// Route maps a path prefix to the policies its requests are held to.
type Route struct {
	// Path is a prefix: "/search" matches /search and /search/code. The
	// longest matching prefix wins. Request paths are cleaned (//search,
	// /x/../search → /search) before matching.
	Path string `yaml:"path"`
	// Methods and Host, when set, narrow the route to those methods and
	// that host ("*.example.com": any name below it); among routes of the
	// same path, one with a host wins, then one with methods.
	Methods []string `yaml:"methods"`
	Host    string   `yaml:"host"`
	// Policy is the route's limit; Policies lists several, all of which
	// must allow a request. One of the two.
	Policy   string   `yaml:"policy"`
	Policies []string `yaml:"policies"`
	// Cost overrides the route's policies' cost.
	Cost int64 `yaml:"cost"`
}

// Names is the route's policies.
func (r Route) Names() []string {
	if r.Policy != "" {
		return append([]string{r.Policy}, r.Policies...)
	}
	return r.Policies
}

// Load reads, overrides from env and validates the file at path. env is
// os.Getenv in production.
func Load(path string, env func(string) string) (*File, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	f, err := Parse(b, env)
	if err != nil {
		return nil, err
	}
	f.path, f.env = path, env
	return f, nil
}

// Path is the file Load read ("" for a File from Parse).
func (f *File) Path() string { return f.path }

// Reload reads f's file again, with the same environment.
func (f *File) Reload() (*File, error) {
	if f.path == "" {
		return nil, fmt.Errorf("config: no file to read again")
	}
	return Load(f.path, f.env)
}

// Parse is Load on bytes. It returns the first of the problems Check
// finds, in the order the file is checked: errors wrap ErrInvalid and say
// "line N: field".
func Parse(b []byte, env func(string) string) (*File, error) {
	f, root, ps := read(b, env)
	if len(ps) == 0 {
		return f, nil
	}
	var de decodeError
	var se *setting.Error
	switch err := ps[0]; {
	case errors.As(err, &de):
		return nil, fmt.Errorf("%w: %s", ErrInvalid, strings.TrimPrefix(de.err.Error(), "yaml: "))
	case !errors.As(err, &se):
		return nil, err
	}
	if line := lineOf(root, se.Field); line > 0 {
		return nil, fmt.Errorf("%w: line %d: %s: %s", ErrInvalid, line, se.Field, se.Msg)
	}
	return nil, fmt.Errorf("%w: %s: %s", ErrInvalid, se.Field, se.Msg)
}

// Environment variables read by Load.
const (
	EnvKeySecret     = "TALLY_KEY_SECRET"
	EnvNATSURL       = "TALLY_NATS_URL"
	EnvUpstream      = "TALLY_UPSTREAM"
	EnvRedisUsername = "TALLY_REDIS_USERNAME"
	EnvRedisPassword = "TALLY_REDIS_PASSWORD"
	EnvNATSUser      = "TALLY_NATS_USER"
	EnvNATSPassword  = "TALLY_NATS_PASSWORD"
	EnvNATSInbox     = "TALLY_NATS_INBOX_PREFIX"
	EnvAPIToken      = "TALLY_API_TOKEN"
	EnvAdminToken    = "TALLY_ADMIN_TOKEN"
	// TALLY_SHARD_<NAME>_PRIMARY and TALLY_SHARD_<NAME>_REPLICAS (comma
	// separated) replace a shard's addresses, TALLY_SHARD_<NAME>_SENTINELS
	// (comma separated) its sentinels' (making it a Sentinel shard whose
	// master is named as the shard when the file names none); NAME is
	// upper-cased, - → _.
	envShardPrefix = "TALLY_SHARD_"
	// The sentinels' own credentials, for every Sentinel shard whose
	// configuration names none.
	EnvSentinelUsername = "TALLY_SENTINEL_USERNAME"
	EnvSentinelPassword = "TALLY_SENTINEL_PASSWORD"
)

// applyEnv overrides f's settings from env; a secret that cannot be used
// is recorded in ps.
func (f *File) applyEnv(ps *problems, env func(string) string) {
	if env == nil {
		env = func(string) string { return "" }
	}
	var err error
	if f.KeySecret, err = ParseSecret(env(EnvKeySecret)); err != nil {
		ps.add(err)
	}
	f.APIToken, f.AdminToken = env(EnvAPIToken), env(EnvAdminToken)
	f.NATS.User, f.NATS.Password = env(EnvNATSUser), env(EnvNATSPassword)
	if v := env(EnvNATSInbox); v != "" {
		f.NATS.InboxPrefix = v
	}
	if v := env(EnvNATSURL); v != "" {
		f.NATS.URL = v
	}
	f.natsURLGiven = f.NATS.URL != ""
	f.Serve.NATS.Passwords = map[string]string{}
	for _, u := range deploy.NATSUsers {
		if v := env(deploy.NATSPasswordEnv(u)); v != "" {
			f.Serve.NATS.Passwords[u] = v
		}
	}
	f.Serve.NATS.Cluster.Password = env(deploy.NATSRoutePasswordEnv)
	if v := env(EnvUpstream); v != "" {
		f.Edge.Upstream = v
	}
	user, pass := env(EnvRedisUsername), env(EnvRedisPassword)
	for i := range f.Redis.Shards {
		s := &f.Redis.Shards[i]
		name := envShardPrefix + strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		if v := env(name + "_PRIMARY"); v != "" {
			s.Primary.Addr = v
		}
		if v := env(name + "_REPLICAS"); v != "" {
			s.Replicas = nil
			for _, a := range strings.Split(v, ",") {
				s.Replicas = append(s.Replicas, shard.Node{Addr: strings.TrimSpace(a)})
			}
		}
		if v := env(name + "_SENTINELS"); v != "" {
			if s.Sentinel == nil {
				s.Sentinel = &shard.Sentinel{Master: s.Name}
			}
			s.Sentinel.Addrs = nil
			for _, a := range strings.Split(v, ",") {
				s.Sentinel.Addrs = append(s.Sentinel.Addrs, strings.TrimSpace(a))
			}
		}
		if sn := s.Sentinel; sn != nil && sn.Username == "" && sn.Password == "" {
			sn.Username, sn.Password = env(EnvSentinelUsername), env(EnvSentinelPassword)
		}
		for _, n := range append([]*shard.Node{&s.Primary}, ptrs(s.Replicas)...) {
			if n.Username == "" {
				n.Username = user
			}
			if n.Password == "" {
				n.Password = pass
			}
		}
	}
}

func ptrs(ns []shard.Node) []*shard.Node {
	out := make([]*shard.Node, len(ns))
	for i := range ns {
		out[i] = &ns[i]
	}
	return out
}

// Config builds the TLS configuration; nil when TLS is off.
func (t TLS) Config() (*tls.Config, error) {
	if !t.Enabled && t.CAFile == "" && t.CertFile == "" && t.KeyFile == "" && t.ServerName == "" {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ca_file %s: no PEM certificate in it", t.CAFile)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		return nil, errors.New("cert_file and key_file go together")
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("cert_file, key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// options are the connection options n sets; what cannot be used is
// recorded in ps.
func (n NATS) options(ps *problems) []nats.Option {
	var opts []nats.Option
	tc, err := n.TLS.Config()
	if err != nil {
		ps.field("nats", "tls: %v", err)
	}
	if tc != nil {
		opts = append(opts, nats.Secure(tc))
	}
	switch {
	case n.CredentialsFile != "" && n.NKeyFile != "":
		ps.field("nats", "credentials_file and nkey_file: set one")
	case n.CredentialsFile != "":
		if _, err := os.Stat(n.CredentialsFile); err != nil {
			ps.field("nats", "credentials_file: %v", err)
		} else {
			opts = append(opts, nats.UserCredentials(n.CredentialsFile))
		}
	case n.NKeyFile != "":
		if o, err := nats.NkeyOptionFromSeed(n.NKeyFile); err != nil {
			ps.field("nats", "nkey_file: %v", err)
		} else {
			opts = append(opts, o)
		}
	}
	if n.User != "" {
		opts = append(opts, nats.UserInfo(n.User, n.Password))
	}
	if n.InboxPrefix != "" {
		if !validPrefixTokens(n.InboxPrefix) {
			ps.field("nats", "inbox_prefix %q: want tokens of [A-Za-z0-9_-] separated by dots", n.InboxPrefix)
		} else {
			opts = append(opts, nats.CustomInboxPrefix(n.InboxPrefix))
		}
	}
	return opts
}

// RedisTLS is the TLS of the connections to Redis; nil when they are
// plain.
func (f *File) RedisTLS() *tls.Config {
	if f.redisTLS == nil {
		return nil
	}
	return f.redisTLS.Clone()
}

// NATSOptions are the connection options the file sets: TLS and
// credentials.
func (f *File) NATSOptions() []nats.Option { return slices.Clip(f.natsOpts) }

// AddressKeyed is the set of policies keyed by the client address.
func (f *File) AddressKeyed() map[string]bool {
	m := map[string]bool{}
	for _, p := range f.Policies {
		if p.Key == KeyAddress {
			m[p.Name] = true
		}
	}
	return m
}

// Limiter is the policy as the limiter takes it.
func (p Policy) Limiter() limiter.Policy {
	lp := limiter.Policy{Name: p.Name, Algorithm: p.Algorithm, Limit: p.Limit, Window: p.Window, Cost: p.Cost, Mode: p.Mode,
		Shadow: p.Shadow, Align: p.Windows == WindowsClock}
	if p.Windows == WindowsCalendar {
		lp.Calendar = limiter.Period(p.Period)
		lp.Window = lp.Calendar.Longest()
		lp.Location, _ = limiter.LoadZone(p.TimeZone) // Check reports a zone that cannot be loaded
	}
	if p.Algorithm == limiter.SlidingWindow {
		// The limiter's window is the sub-window; Check reports a window
		// that does not divide into whole seconds.
		lp.Slices = p.slices()
		lp.Window, lp.Align = p.Window/time.Duration(lp.Slices), true
	}
	if p.Algorithm == limiter.Concurrency {
		// Two sub-windows of the lease: a unit counts from its request's
		// start until its finish, or until its sub-window leaves the span.
		lp.Slices, lp.Window, lp.Align = 2, p.Lease, true
	}
	if p.Algorithm == limiter.TokenBucket {
		// The limiter's limit is the burst; its windows are the bucket's
		// periods.
		lp = lp.Bucket(p.burst(), p.Limit, p.Window).WithDefaultMode()
	}
	return lp
}

// Limits are the terms the edge holds requests to, as the edge takes them
// at start and at a reload.
func (f *File) Limits() edge.Limits {
	l := edge.Limits{Policies: f.PolicyMap(), DefaultPolicy: f.Edge.DefaultPolicy, GlobalPolicies: f.Edge.GlobalPolicies,
		AddressKeyed: f.AddressKeyed(), Tiers: map[string]edge.Tiers{}, Overrides: map[string][]edge.Override{},
		Backoff: map[string]backoff.Config{}}
	for _, r := range f.Routes {
		l.Routes = append(l.Routes, edge.Route{Path: r.Path, Methods: r.Methods, Host: r.Host, Policies: r.Names(), Cost: r.Cost})
	}
	for _, p := range f.Policies {
		if p.Tiers != nil {
			l.Tiers[p.Name] = edge.Tiers{Header: p.Tiers.Header, Limits: p.Tiers.Limits}
		}
		for _, o := range p.Overrides {
			l.Overrides[p.Name] = append(l.Overrides[p.Name], edge.Override{Identity: o.Identity, Limit: o.Limit})
		}
		if p.Backoff.On() {
			l.Backoff[p.Name] = p.Backoff
		}
	}
	return l
}

// PolicyMap is the policies by name.
func (f *File) PolicyMap() map[string]limiter.Policy {
	m := make(map[string]limiter.Policy, len(f.Policies))
	for _, p := range f.Policies {
		m[p.Name] = p.Limiter()
	}
	return m
}

// StoreOptions are the limiter options the file sets.
func (f *File) StoreOptions() redisstore.Options {
	return redisstore.Options{
		Grace: f.Redis.Grace, SkewTolerance: f.Redis.SkewTolerance, ReadPolicy: f.Redis.ReadPolicy,
		DialTimeout: f.Redis.Timeout, ReadTimeout: f.Redis.Timeout, WriteTimeout: f.Redis.Timeout,
		WaitReplicas: f.Redis.WaitReplicas, WaitTimeout: f.Redis.WaitTimeout, ReseedFor: f.Redis.ReseedFor, TLS: f.redisTLS,
		Placement: f.Redis.Placement, PreviousPlacement: f.Redis.PreviousPlacement,
		// Ample for a stream that keeps events up to its max age.
		ProducerTTL: max(25*time.Hour, f.NATS.Streams.WithDefaults().Accounting.MaxAge+time.Hour),
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Trusted returns the trusted proxy prefixes (validated by Load).
func (id Identity) Trusted() []netip.Prefix {
	out := make([]netip.Prefix, 0, len(id.TrustedProxies))
	for _, s := range id.TrustedProxies {
		if p, err := parsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}
