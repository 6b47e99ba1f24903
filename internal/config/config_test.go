package config

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

func TestParseGood(t *testing.T) {
	f, err := Parse([]byte(good), func(k string) string {
		return map[string]string{
			EnvKeySecret: "s3cret", EnvRedisPassword: "pw",
			"TALLY_SHARD_S0_REPLICAS": "127.0.0.1:7002, 127.0.0.1:7003",
		}[k]
	})
	require.NoError(t, err)
	require.Equal(t, []byte("s3cret"), f.KeySecret)
	require.Equal(t, time.Minute, f.PolicyMap()["core"].Window)
	require.Len(t, f.Redis.Shards[0].Replicas, 2)
	require.Equal(t, "127.0.0.1:7003", f.Redis.Shards[0].Replicas[1].Addr)
	require.Equal(t, "pw", f.Redis.Shards[0].Primary.Password)
	require.Equal(t, "allow", f.Edge.OnRedisError)
	require.Len(t, f.Edge.Identity.Trusted(), 2)
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
		{"bad stream", "  url: nats://127.0.0.1:4222", "  url: nats://127.0.0.1:4222\n  streams: {storage: tape}", "nats.streams: storage"},
		{"bad on_redis_error", "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  on_redis_error: maybe", "line 13: edge.on_redis_error"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := strings.Replace(good, c.from, c.to, 1)
			require.NotEqual(t, good, src, "the case changed nothing")
			_, err := Parse([]byte(src), nil)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, c.want)
		})
	}
}
