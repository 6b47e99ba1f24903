package config

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// mistakes has five independent mistakes in four sections; line 1 is
// key_prefix. The route to core names a policy that is there but invalid:
// its cost cannot be judged, and is not reported.
const mistakes = `key_prefix: tally
redis:
  shards:
    - name: s0
      primary: {addr: "127.0.0.1:7000"}
nats:
  url: 127.0.0.1:4222
edge:
  listen: 127.0.0.1:8080
  upstream: http://127.0.0.1:9000
  on_redis_error: maybe
policies:
  - name: core
    limit: -1
    window: 1m
  - name: search
    limit: 10
    window: 1m
  - name: search
    limit: 20
    window: 1m
routes:
  - path: /search
    policy: serch
  - path: /core
    policy: core
    cost: 5
`

// Check reports every mistake of a file at once, each with its line and
// field, in the order of the lines; Parse reports the first it checks.
func TestCheckReportsEveryProblem(t *testing.T) {
	got := Check([]byte(mistakes), withSecret)
	require.Equal(t, []Problem{
		{7, "nats.url", `"127.0.0.1:4222": want nats://host:port, or several separated by commas`},
		{11, "edge.on_redis_error", `"maybe": want allow or deny`},
		{14, "policies[0].limit", "-1: want 1 to 1000000000 (policy core)"},
		{19, "policies[2].name", `duplicate policy "search"`},
		{24, "routes[0].policy", `unknown policy "serch" (known: core, search)`},
	}, got)
	require.Equal(t, `line 14: policies[0].limit: -1: want 1 to 1000000000 (policy core)`, got[2].String())

	_, err := Parse([]byte(mistakes), withSecret)
	require.ErrorIs(t, err, ErrInvalid)
	require.EqualError(t, err, "config: invalid: "+got[0].String())
}

// Every problem of a file at once: the decoder's (an unknown field, a
// value of the wrong type) and the settings' after them; a shard's bad
// address does not hide a duplicate shard name.
func TestCheckEveryProblemOfAFile(t *testing.T) {
	src := strings.Replace(mistakes, `      primary: {addr: "127.0.0.1:7000"}`, `      primary: {addr: "127.0.0.1"}
    - name: s0
      primary: {addr: "127.0.0.1:7001"}`, 1)
	src = strings.Replace(src, "  upstream: http://127.0.0.1:9000", "  upstream: http://127.0.0.1:9000\n  upstrem: x\n  read_timeout: soon", 1)
	got := Check([]byte(src), withSecret)
	var where []string
	for _, p := range got {
		require.NotZero(t, p.Line, p)
		where = append(where, fmt.Sprintf("%d %s", p.Line, p.Field))
	}
	require.Equal(t, []string{"5 redis.shards[0].primary", "6 redis.shards[1].name", "9 nats.url", "13 edge.upstrem",
		"14 edge.read_timeout", "15 edge.on_redis_error", "18 policies[0].limit", "23 policies[2].name", "28 routes[0].policy"}, where)
}

// A file Parse accepts has no problems.
func TestCheckValidFile(t *testing.T) {
	require.Empty(t, Check([]byte(good), withSecret))
	b, err := os.ReadFile("../../deploy/tally.yaml")
	require.NoError(t, err)
	require.Empty(t, Check(b, withSecret))
}

// Every field the decoder cannot place is a problem of its own, with its
// line and the field's path; the settings it could read are judged too.
func TestCheckDecodeProblems(t *testing.T) {
	src := strings.Replace(good, "    window: 1m\n  - name: search", "    window: 1m\n    windw: 2m\n  - name: search", 1)
	src = strings.Replace(src, "  url: nats://127.0.0.1:4222", "  url: nats://127.0.0.1:4222\n  urls: [nats://127.0.0.1:4223]", 1)
	src = strings.Replace(src, "    limit: 10\n", "    limit: 0\n", 1) // judged all the same
	got := Check([]byte(src), withSecret)
	require.Equal(t, []Problem{
		{11, "nats.urls", "field urls not found in type config.NATS"},
		{22, "policies[0].windw", "field windw not found in type config.Policy"},
		{24, "policies[1].limit", "0: want 1 to 1000000000 (policy search)"},
	}, got)

	// A value of the wrong type names its field, in a flow mapping too.
	src = strings.Replace(good, "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  decisions: {log_level: info, log_sample: often}", 1)
	src = strings.Replace(src, "    window: 1m\n  - name: search", "    window: soon\n  - name: search", 1)
	got = Check([]byte(src), withSecret)
	require.Len(t, got, 2, "a value the decoder could not read is not judged again: %v", got)
	require.Equal(t, Problem{13, "edge.decisions.log_sample", "cannot unmarshal !!str `often` into float64"}, got[0])
	require.Equal(t, 21, got[1].Line)
	require.Equal(t, "policies[0].window", got[1].Field)
}

// A syntax error is a problem, with its line, and does not hide the next
// one, nor the settings' problems: the file is read again without its
// line. What that line held (the search policy's limit) is not judged.
func TestCheckSyntaxError(t *testing.T) {
	src := strings.Replace(good, "    limit: 10\n", "    limit: 10: 5\n", 1)
	src = strings.Replace(src, "  upstream: http://127.0.0.1:9000", "  upstream: http://127.0.0.1:9000: 8", 1)
	src = strings.Replace(src, "    policy: search", "    policy: serch", 1)
	require.Equal(t, []Problem{
		{13, "", "mapping values are not allowed in this context"},
		{22, "", "mapping values are not allowed in this context"},
		{26, "routes[0].policy", `unknown policy "serch" (known: core, search)`},
	}, Check([]byte(src), withSecret))

	// An error that leaving its line out does not cure is one problem.
	src = strings.Replace(good, "  listen: 127.0.0.1:8080", "  listen: [127.0.0.1:8080", 1)
	require.Len(t, Check([]byte(src), withSecret), 1)

	got := Check(nil, withSecret)
	require.Len(t, got, 1)
	require.Contains(t, got[0].String(), "empty")
}

// A bad item does not hide the next: every bad policy, every bad method
// of a route, every bad field of a section is reported.
func TestCheckGoesOnPastABadItem(t *testing.T) {
	src := strings.Replace(good, "    limit: 100\n", "    limit: 0\n    key: cookie\n", 1)
	src = strings.Replace(src, "    limit: 10\n", "    limit: 10\n    overrides: [{limit: 5}, {identity: a, limit: 0}]\n", 1)
	src = strings.Replace(src, "    policy: search\n", "    policy: search\n    methods: [\"a b\", GET, \"c d\"]\n", 1)
	src = strings.Replace(src, "  listen: 127.0.0.1:8080", "  listen: 127.0.0.1:8080\n  max_header_bytes: 5\n  identity2: {}", 1)
	require.Len(t, Check([]byte(src), withSecret), 8, "a field the decoder cannot place hides nothing")
	src = strings.Replace(src, "  identity2: {}", "  credit: {share: -1}\n  outbox: {max_batch: -1}", 1)
	var fields []string
	for _, p := range Check([]byte(src), withSecret) {
		require.NotZero(t, p.Line, p)
		fields = append(fields, p.Field)
	}
	require.Equal(t, []string{"edge.max_header_bytes", "edge.credit.share", "edge.outbox.max_batch",
		"policies[0].limit", "policies[0].key", "policies[1].overrides[0].identity", "policies[1].overrides[1].limit",
		"routes[0].methods[0]", "routes[0].methods[2]"}, fields)
}

// The environment's problems are reported with the file's, last; the key
// prefix is not judged by a secret that is missing.
func TestCheckEnvironmentProblems(t *testing.T) {
	got := Check([]byte(good), nil)
	require.Len(t, got, 1)
	require.Equal(t, 0, got[0].Line)
	require.Empty(t, got[0].Field)
	require.True(t, strings.HasPrefix(got[0].Msg, "TALLY_KEY_SECRET is not set: "), got[0].Msg)

	src := strings.Replace(good, "  url: nats://127.0.0.1:4222", "  url: nats://", 1)
	got = Check([]byte(src), nil)
	require.Len(t, got, 2)
	require.Equal(t, Problem{10, "nats.url", `"nats://": want nats://host:port, or several separated by commas`}, got[0])
	require.Zero(t, got[1].Line)
}

func TestProblemString(t *testing.T) {
	for want, p := range map[string]Problem{
		"line 12: policies[1].limit: -1: want 1 to 1000000000": {12, "policies[1].limit", "-1: want 1 to 1000000000"},
		"policies: the edge needs at least one policy":         {0, "policies", "the edge needs at least one policy"},
		"line 3: did not find expected key":                    {3, "", "did not find expected key"},
		"TALLY_KEY_SECRET is not set":                          {0, "", "TALLY_KEY_SECRET is not set"},
	} {
		require.Equal(t, want, p.String())
	}
}
