package config

import (
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

const good = `
key_prefix: tally
redis:
  shards:
    - name: s0
      primary: {addr: "127.0.0.1:7000"}
      replicas:
        - {addr: "127.0.0.1:7001"}
nats:
  url: nats://127.0.0.1:4222
edge:
  listen: 127.0.0.1:8080
  upstream: http://127.0.0.1:9000
  identity:
    header: Authorization
    trusted_proxies: [127.0.0.1, 10.0.0.0/8]
policies:
  - name: core
    limit: 100
    window: 1m
  - name: search
    limit: 10
    window: 1m
routes:
  - path: /search
    policy: search
    cost: 2
`

// secret is a valid TALLY_KEY_SECRET: 32 bytes in hex.
var secret = strings.Repeat("ab", 32)

// withSecret is an environment with only the key secret.
func withSecret(k string) string {
	if k == EnvKeySecret {
		return secret
	}
	return ""
}

func TestParseGood(t *testing.T) {
	f, err := Parse([]byte(good), func(k string) string {
		return map[string]string{
			EnvKeySecret: secret, EnvRedisPassword: "pw",
			"TALLY_SHARD_S0_REPLICAS": "127.0.0.1:7002, 127.0.0.1:7003",
		}[k]
	})
	require.NoError(t, err)
	require.Equal(t, []byte(strings.Repeat("\xab", 32)), f.KeySecret)
	require.Equal(t, time.Minute, f.PolicyMap()["core"].Window)
	require.Len(t, f.Redis.Shards[0].Replicas, 2)
	require.Equal(t, "127.0.0.1:7003", f.Redis.Shards[0].Replicas[1].Addr)
	require.Equal(t, "pw", f.Redis.Shards[0].Primary.Password)
	require.Equal(t, "allow", f.Edge.OnRedisError)
	require.Len(t, f.Edge.Identity.Trusted(), 2)
}

// A shard may be a Sentinel master, named in the file or by the
// environment, with the sentinels' credentials from the environment.
func TestSentinelShards(t *testing.T) {
	src := strings.Replace(good, `      primary: {addr: "127.0.0.1:7000"}
      replicas:
        - {addr: "127.0.0.1:7001"}
`, `      sentinel: {master: tally-s0, addrs: ["127.0.0.1:26379", "127.0.0.1:26380"]}
    - name: s1
`, 1)
	env := map[string]string{EnvKeySecret: secret, EnvRedisPassword: "pw", EnvSentinelPassword: "spw",
		"TALLY_SHARD_S1_SENTINELS": "127.0.0.1:26379,127.0.0.1:26381"}
	f, err := Parse([]byte(src), func(k string) string { return env[k] })
	require.NoError(t, err)
	s0, s1 := f.Redis.Shards[0], f.Redis.Shards[1]
	require.Equal(t, "tally-s0", s0.Sentinel.Master)
	require.Equal(t, "spw", s0.Sentinel.Password)
	require.Equal(t, "pw", s0.Primary.Password, "the nodes' credentials")
	require.Equal(t, "s1", s1.Sentinel.Master, "named as the shard")
	require.Equal(t, []string{"127.0.0.1:26379", "127.0.0.1:26381"}, s1.Sentinel.Addrs)

	// Both ways of naming a shard's nodes at once is refused.
	env["TALLY_SHARD_S0_PRIMARY"] = "127.0.0.1:7000"
	_, err = Parse([]byte(src), func(k string) string { return env[k] })
	require.ErrorContains(t, err, "not both")
}

// A move between shards names shards of redis.shards, each once.
func TestPlacement(t *testing.T) {
	src := strings.Replace(good, "nats:\n", "  placement: [s0]\n  previous_placement: [s0]\nnats:\n", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, []string{"s0"}, f.StoreOptions().PreviousPlacement)
	for _, bad := range []string{"placement: [s9]", "placement: [s0, s0]", "previous_placement: [s1]"} {
		src := strings.Replace(good, "nats:\n", "  "+bad+"\nnats:\n", 1)
		_, err := Parse([]byte(src), withSecret)
		require.ErrorContains(t, err, "want names of shards in redis.shards", bad)
	}
}

// nats.url may name every server of a cluster; each must be a URL.
func TestNATSClusterURL(t *testing.T) {
	src := strings.Replace(good, "url: nats://127.0.0.1:4222", "url: nats://10.0.0.1:4222,nats://10.0.0.2:4222", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, "nats://10.0.0.1:4222,nats://10.0.0.2:4222", f.NATS.URL)
	_, err = Parse([]byte(strings.Replace(src, ",nats://10.0.0.2:4222", ",10.0.0.2", 1)), withSecret)
	require.ErrorContains(t, err, "nats.url")
}

// The decision API beyond loopback needs its token; with it (and the key
// secret) the file loads, and the tokens come from the environment only.
func TestAPIsBeyondLoopbackNeedTokens(t *testing.T) {
	src := strings.Replace(good, "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  api_listen: 0.0.0.0:8081\n  admin_listen: 10.1.2.3:9090", 1)
	env := map[string]string{EnvKeySecret: secret}
	get := func(k string) string { return env[k] }
	_, err := Parse([]byte(src), get)
	require.ErrorContains(t, err, "edge.api_listen: \"0.0.0.0:8081\" is reachable beyond loopback: set TALLY_API_TOKEN")
	env[EnvAPIToken] = "api-token"
	_, err = Parse([]byte(src), get)
	require.ErrorContains(t, err, "edge.admin_listen")
	env[EnvAdminToken] = "admin-token"
	f, err := Parse([]byte(src), get)
	require.NoError(t, err)
	require.Equal(t, "api-token", f.APIToken)
	require.Equal(t, "admin-token", f.AdminToken)

	for addr, want := range map[string]bool{"127.0.0.1:1": true, "[::1]:1": true, "localhost:1": true,
		":1": false, "0.0.0.0:1": false, "[::]:1": false, "10.0.0.1:1": false, "example.com:1": false, "nonsense": false} {
		require.Equal(t, want, Loopback(addr), addr)
	}
}

// A route may hold its requests to several policies, and global and
// address-keyed policies reach the edge.
func TestSeveralPolicies(t *testing.T) {
	src := strings.Replace(good, "    policy: search\n", "    policies: [search, core]\n", 1)
	src = strings.Replace(src, "  identity:", "  global_policies: [per-address]\n  identity:", 1)
	src = strings.Replace(src, "routes:", "  - name: per-address\n    limit: 1000\n    window: 1h\n    key: address\nroutes:", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, []string{"search", "core"}, f.Routes[0].Names())
	require.Equal(t, []string{"per-address"}, f.Edge.GlobalPolicies)
	require.Equal(t, map[string]bool{"per-address": true}, f.AddressKeyed())
}

func TestParseErrorsNameLineAndField(t *testing.T) {
	cases := []struct{ name, from, to, want string }{
		{"unknown field", "    window: 1m\n  - name: search", "    window: 1m\n    windw: 2m\n  - name: search", "line 21: field windw not found"},
		{"bad limit", "    limit: 100", "    limit: 0", "line 19: policies[0].limit"},
		{"bad window", "    window: 1m\n  - name: search", "    window: 1500ms\n  - name: search", "line 20: policies[0].window"},
		{"not a duration", "    window: 1m\n  - name: search", "    window: soon\n  - name: search", "line 20"},
		{"unknown route policy", "    policy: search", "    policy: serch", "line 26: routes[0].policy: unknown policy \"serch\""},
		{"route cost over limit", "    cost: 2", "    cost: 11", "line 27: routes[0].cost"},
		{"bad shard addr", `primary: {addr: "127.0.0.1:7000"}`, `primary: {addr: "nowhere"}`, "line 6: redis.shards[0].primary"},
		{"duplicate policy", "  - name: search", "  - name: core", "line 21: policies[1].name: duplicate"},
		{"proxy without upstream", "  upstream: http://127.0.0.1:9000\n", "", "edge.upstream"},
		{"bad trusted proxy", "10.0.0.0/8]", "10.0.0.0/99]", "edge.identity.trusted_proxies[1]"},
		{"bad mode", "    limit: 100", "    limit: 100\n    mode: fast", "line 20: policies[0].mode"},
		{"bad stream", "  url: nats://127.0.0.1:4222", "  url: nats://127.0.0.1:4222\n  streams: {storage: tape}", "line 11: nats.streams.storage: \"tape\": want file or memory"},
		{"bad on_redis_error", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  on_redis_error: maybe", "line 13: edge.on_redis_error"},
		{"slow-client timeouts out of range", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  read_timeout: 2h", "edge.read_timeout: 2h0m0s: want 100ms to 1h"},
		{"header timeout beyond the read timeout", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  read_header_timeout: 40s", "edge.read_header_timeout"},
		{"bad inbox prefix", "  url: nats://127.0.0.1:4222", "  url: nats://127.0.0.1:4222\n  inbox_prefix: \"_INBOX.>\"", "nats: inbox_prefix"},
		{"admin beyond loopback without a token", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  admin_listen: :9090", "line 13: edge.admin_listen: \":9090\" is reachable beyond loopback: set TALLY_ADMIN_TOKEN"},
		{"policy and policies", "    policy: search", "    policy: search\n    policies: [core]", "routes[0]: set policy or policies, not both"},
		{"unknown policy in a list", "    policy: search", "    policies: [search, nope]", "line 26: routes[0].policies: unknown policy \"nope\""},
		{"route without a policy", "    policy: search\n", "", "routes[0].policy: missing"},
		{"duplicate cleaned route", "    cost: 2\n", "    cost: 2\n  - path: /search/\n    policy: core\n", "routes[1].path: duplicate route \"/search/\""},
		{"bad policy key", "    limit: 100", "    limit: 100\n    key: cookie", "line 20: policies[0].key: \"cookie\": want identity or address"},
		{"unknown algorithm", "    limit: 100", "    limit: 100\n    algorithm: leaky_bucket", "line 20: policies[0].algorithm: \"leaky_bucket\": want fixed_window, sliding_window, concurrency or token_bucket"},
		{"a burst of a fixed window", "    limit: 100", "    limit: 100\n    burst: 10", "line 20: policies[0].burst: 10: a burst is a token bucket's"},
		{"a bucket refilled every day", "    window: 1m", "    window: 24h\n    algorithm: token_bucket", "policies[0].window: 24h0m0s: a token bucket refills its limit every whole number of seconds, 1s to 1h0m0s"},
		{"a bucket cut in slices", "    limit: 100", "    limit: 100\n    algorithm: token_bucket\n    slices: 4", "policies[0].slices: a token bucket refills continuously"},
		{"a bucket too large", "    window: 1m", "    window: 1h\n    algorithm: token_bucket\n    burst: 1000000000", "policies[0].burst: 1000000000: a bucket refilled every 1h0m0s holds at most 277777777"},
		{"concurrency with a window", "    limit: 100", "    limit: 100\n    algorithm: concurrency\n    lease: 30s", "policies[0].window: a concurrency limit has no window"},
		{"concurrency without a lease", "    limit: 100\n    window: 1m", "    limit: 100\n    algorithm: concurrency", "policies[0].lease: 0s: want whole seconds from 1s to"},
		{"a lease of a fixed window", "    limit: 100", "    limit: 100\n    lease: 30s", "policies[0].lease: 30s: a lease is a concurrency limit's"},
		{"sliding window not cut in whole seconds", "    limit: 100", "    limit: 100\n    algorithm: sliding_window\n    slices: 7", "policies[0].window: 1m0s: a sliding window of 7 slices lasts a multiple of 7s"},
		{"slices of a fixed window", "    limit: 100", "    limit: 100\n    slices: 6", "line 20: policies[0].slices: 6: slices are a sliding window's"},
		{"too many slices", "    limit: 100", "    limit: 100\n    algorithm: sliding_window\n    slices: 61", "policies[0].slices: 61: want 2 to 60"},
		{"sliding window on the calendar", "    limit: 100", "    limit: 100\n    algorithm: sliding_window\n    windows: clock", "policies[0].windows: \"clock\": a sliding window's sub-windows are aligned to the clock"},
		{"bad policy windows", "    limit: 100", "    limit: 100\n    windows: monthly", "line 20: policies[0].windows: \"monthly\": want first_request, clock or calendar"},
		{"unknown global policy", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  global_policies: [nope]", "edge.global_policies[0]: unknown policy"},
		{"client certificate without key", "  url: nats://127.0.0.1:4222", "  url: nats://127.0.0.1:4222\n  tls: {cert_file: /x.pem}", "nats: tls: cert_file and key_file go together"},
		{"missing CA file", "redis:\n", "redis:\n  tls: {ca_file: /nonexistent/ca.pem}\n", "redis.tls: ca_file"},
		{"bad decision log level", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  decisions: {log_sample: 0.5, log_level: loud}", "edge.decisions.log_level"},
		{"bad decision log sample", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  decisions: {log_sample: 2}", "edge.decisions.log_sample"},
		{"bad accountant record sample", "policies:\n", "accountant:\n  decisions: {sample_applied: 1.5}\npolicies:\n", "accountant.decisions.sample_applied"},
		{"rate-limit service without rules", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  rls: {listen: 127.0.0.1:8081}", "line 13: edge.rls.config: empty"},
		{"rate-limit rules without a listener", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  rls: {config: /etc/ratelimit}", "edge.rls.listen: empty"},
		{"unreadable rate-limit rules", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  rls: {listen: 127.0.0.1:8081, config: /nonexistent/ratelimit}", "edge.rls.config: descriptors: invalid"},
		{"bad rate-limit mode", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  rls: {listen: 127.0.0.1:8081, config: /tmp, mode: fast}", "edge.rls.mode"},
		{"bad route method", "    policy: search", "    policy: search\n    methods: [\"GET /\"]", "routes[0].methods[0]"},
		{"bad route host", "    policy: search", "    policy: search\n    host: \"a b\"", "routes[0].host"},
		{"tier below the cost", "    limit: 10\n", "    limit: 10\n    cost: 2\n    tiers: {header: X-Plan, limits: {free: 1}}\n", "policies[1].tiers.limits.free: 1: want 2 to"},
		{"tiers without a header", "    limit: 10\n", "    limit: 10\n    tiers: {limits: {free: 1}}\n", "policies[1].tiers.header"},
		{"override without identity", "    limit: 10\n", "    limit: 10\n    overrides: [{limit: 5}]\n", "policies[1].overrides[0].identity"},
		{"two NATS credentials", "  url: nats://127.0.0.1:4222", "  url: nats://127.0.0.1:4222\n  credentials_file: a\n  nkey_file: b", "credentials_file and nkey_file: set one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(good, c.from, c.to, 1)
			require.NotEqual(t, good, src, "the case changed nothing")
			_, err := Parse([]byte(src), withSecret)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// The key secret is at least 32 random bytes, in hex or base64, and every
// binary refuses anything else with what to do: a short secret lets
// anyone who sees a window key recover guessable identities by hashing
// candidates.
func TestKeySecretIsRequiredAndLongEnough(t *testing.T) {
	raw := []byte("0123456789abcdef0123456789abcdef") // 32 bytes
	for name, v := range map[string]string{
		"hex":                 hex.EncodeToString(raw),
		"hex, upper case":     strings.ToUpper(hex.EncodeToString(raw)),
		"base64":              base64.StdEncoding.EncodeToString(raw),
		"base64 without pads": base64.RawStdEncoding.EncodeToString(raw),
		"base64url":           base64.RawURLEncoding.EncodeToString(append(raw, 0xfb, 0xff)),
		"a file's newline":    hex.EncodeToString(raw) + "\n",
	} {
		b, err := ParseSecret(v)
		require.NoError(t, err, name)
		require.GreaterOrEqual(t, len(b), 32, name)
	}
	// 64 hex digits are valid base64 too (48 other bytes): hex wins, as
	// docs/keys.md says; the key is the bytes, not the text.
	b, err := ParseSecret(hex.EncodeToString(raw))
	require.NoError(t, err)
	require.Equal(t, raw, b)
	for name, v := range map[string]string{
		"unset":          "",
		"a password":     "s3cret",
		"31 bytes (hex)": hex.EncodeToString(raw[:31]),
		"31 bytes (b64)": base64.StdEncoding.EncodeToString(raw[:31]),
		"not encoded":    strings.Repeat("secret! ", 8),
		"inner newline":  hex.EncodeToString(raw[:16]) + "\n" + hex.EncodeToString(raw[16:]),
	} {
		_, err := ParseSecret(v)
		require.ErrorIs(t, err, ErrInvalid, name)
		require.ErrorContains(t, err, "TALLY_KEY_SECRET", name)
		_, err = Parse([]byte(good), func(k string) string {
			if k == EnvKeySecret {
				return v
			}
			return ""
		})
		require.ErrorContains(t, err, "TALLY_KEY_SECRET", name)
	}
}

// The rate-limit service reads its directory when the file is loaded: an
// invalid rule is refused with the rule's file and line; beyond loopback
// the service needs the API token. A policy may be in shadow mode.
func TestRateLimitServiceSettings(t *testing.T) {
	dir := t.TempDir()
	rules := filepath.Join(dir, "api.yaml")
	require.NoError(t, os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"), 0o600))
	src := strings.Replace(good, "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  rls:\n    listen: 127.0.0.1:8081\n    config: "+dir, 1)
	src = strings.Replace(src, "    limit: 100\n", "    limit: 100\n    shadow: true\n", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, []string{"api"}, f.Descriptors().Domains())
	require.True(t, f.PolicyMap()["core"].Shadow)

	_, err = Parse([]byte(strings.Replace(src, "listen: 127.0.0.1:8081", "listen: 0.0.0.0:8081", 1)), withSecret)
	require.ErrorContains(t, err, "edge.rls.listen: \"0.0.0.0:8081\" is reachable beyond loopback: set TALLY_API_TOKEN")

	require.NoError(t, os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: fortnight, requests_per_unit: 10}\n"), 0o600))
	_, err = Parse([]byte(src), withSecret)
	require.ErrorContains(t, err, "api.yaml:4: invalid rate limit unit 'fortnight'")
	require.NoError(t, os.WriteFile(rules, []byte("domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 4000000000}\n"), 0o600))
	_, err = Parse([]byte(src), withSecret)
	require.ErrorContains(t, err, "api.yaml:4: requests_per_unit 4000000000: Tally counts up to 1000000000 per window")
}

// Routes by method and host, tiers and overrides reach the edge's limits.
func TestRoutesTiersAndOverrides(t *testing.T) {
	src := strings.Replace(good, "    policy: search\n", "    policy: search\n    methods: [post]\n    host: \"*.example.com\"\n", 1)
	src = strings.Replace(src, "    limit: 100\n", "    limit: 100\n    tiers: {header: X-Plan, limits: {pro: 1000}}\n    overrides: [{identity: Bearer partner, limit: 5000}]\n", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	l := f.Limits()
	require.Equal(t, []string{"post"}, l.Routes[0].Methods)
	require.Equal(t, "*.example.com", l.Routes[0].Host)
	require.Equal(t, int64(1000), l.Tiers["core"].Limits["pro"])
	require.Equal(t, int64(5000), l.Overrides["core"][0].Limit)
	// Two routes of one path are one route only with the same methods and host.
	two := strings.Replace(src, "routes:\n", "routes:\n  - path: /search\n    policy: core\n", 1)
	_, err = Parse([]byte(two), withSecret)
	require.NoError(t, err)
}

// A sliding window's policy reaches the limiter as its sub-windows: the
// window divided by slices (10 when unset), aligned to the clock.
func TestSlidingWindowPolicy(t *testing.T) {
	src := strings.Replace(good, "    limit: 100\n    window: 1m", "    limit: 100\n    window: 1m\n    algorithm: sliding_window", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	p := f.PolicyMap()["core"]
	require.Equal(t, limiter.Policy{Name: "core", Algorithm: limiter.SlidingWindow, Limit: 100, Window: 6 * time.Second, Slices: 10,
		Align: true}, p)
	require.Equal(t, time.Minute, p.Span())
	src = strings.Replace(src, "algorithm: sliding_window", "algorithm: sliding_window\n    slices: 4", 1)
	f, err = Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, 15*time.Second, f.PolicyMap()["core"].Window)
	require.Equal(t, "1m0s, sliding in 4 sub-windows of 15s", f.PolicyMap()["core"].Per())
}

// A concurrency limit reaches the limiter as two sub-windows of its lease,
// aligned to the clock.
func TestTokenBucketPolicy(t *testing.T) {
	src := strings.Replace(good, "    limit: 100\n    window: 1m", "    limit: 100\n    window: 1m\n    algorithm: token_bucket\n    burst: 20", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	p := f.PolicyMap()["core"]
	require.Equal(t, limiter.Policy{Name: "core", Algorithm: limiter.TokenBucket, Limit: 20, Rate: 100, Every: time.Minute,
		Window: time.Second, Slices: 2, Align: true}, p)
	require.Equal(t, "a bucket of 20, refilled 100 every 1m0s", p.Per())
	require.Equal(t, 12*time.Second, p.Refill(20), "the burst refills in 12 s")
	// A tier's limit is the rate, the burst scaled alike.
	require.Equal(t, limiter.Policy{Name: "core", Algorithm: limiter.TokenBucket, Limit: 200, Rate: 1000, Every: time.Minute,
		Window: time.Second, Slices: 2, Align: true}, p.WithLimit(1000))
	// Without a burst, the limit.
	src = strings.Replace(good, "    limit: 100\n    window: 1m", "    limit: 100\n    window: 1m\n    algorithm: token_bucket", 1)
	f, err = Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.EqualValues(t, 100, f.PolicyMap()["core"].Limit)
	// A burst under two seconds of the rate: every request its own
	// reservation, and a mode that would hold credit is refused.
	src = strings.Replace(good, "    limit: 100\n    window: 1m", "    limit: 10\n    window: 1s\n    algorithm: token_bucket\n    burst: 1", 1)
	f, err = Parse([]byte(src), withSecret)
	require.NoError(t, err)
	require.Equal(t, limiter.ModeExact, f.PolicyMap()["core"].Mode)
	_, err = Parse([]byte(strings.Replace(src, "    burst: 1", "    burst: 1\n    mode: auto", 1)), withSecret)
	require.ErrorContains(t, err, "policies[0].mode: auto: a token bucket of 1 refilled 10 every 1s holds less than two periods (2s) of its rate: mode exact")
}

func TestConcurrencyPolicy(t *testing.T) {
	src := strings.Replace(good, "    limit: 100\n    window: 1m", "    limit: 100\n    algorithm: concurrency\n    lease: 30s", 1)
	f, err := Parse([]byte(src), withSecret)
	require.NoError(t, err)
	p := f.PolicyMap()["core"]
	require.Equal(t, limiter.Policy{Name: "core", Algorithm: limiter.Concurrency, Limit: 100, Window: 30 * time.Second, Slices: 2,
		Align: true}, p)
	require.Equal(t, "in flight, each request's units held until its finish or a lease of 30s to 1m0s", p.Per())
}
