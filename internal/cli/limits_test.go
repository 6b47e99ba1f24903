package cli_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/tallytest"
	"github.com/tallyhq/tally/internal/testutil"
)

// A temporary limit set from the CLI reaches the edge within the
// documented bound, shows in list and inspect, is lifted by clear at once
// or by itself at its expiry, and every change is recorded.
func TestTemporaryLimitsFromTheCLI(t *testing.T) {
	d := start(t, "- {name: core, limit: 100, window: 1h}")
	require.Equal(t, 200, apiCheck(t, d, "alice"))
	alice := []string{"--policy", "core", "--identity", "api:alice"}

	r := d.run(t, append([]string{"limits", "set", "--block", "--for", "1h", "--by", "ops", "--reason", "scraping"}, alice...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "blocked until")
	testutil.WaitForWithin(t, "the block at the edge", 2*time.Second, func() bool { return apiCheck(t, d, "alice") == 429 })
	require.Equal(t, 200, apiCheck(t, d, "bob"), "another client")

	r = d.run(t, "limits", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "blocked until")
	require.Contains(t, r.stdout, "ops: scraping")
	require.Equal(t, 1, strings.Count(r.stdout, "\n"), r.stdout)
	require.Contains(t, d.run(t, append([]string{"inspect"}, alice...)...).stdout, "temporary limit: blocked until")

	r = d.run(t, append([]string{"limits", "clear", "--by", "ops"}, alice...)...)
	require.Equal(t, 0, r.code, r.stderr)
	testutil.WaitForWithin(t, "the block lifted", 2*time.Second, func() bool { return apiCheck(t, d, "alice") == 200 })
	require.Contains(t, d.run(t, "limits", "list").stdout, "no temporary limits in force")
	r = d.run(t, append([]string{"limits", "clear", "--by", "ops"}, alice...)...)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "nothing to clear")

	// A tighter limit for three seconds: two requests, then denied, until
	// it lifts itself with no one acting.
	r = d.run(t, "limits", "set", "--policy", "core", "--identity", "api:carol", "--limit", "2", "--for", "3s", "--by", "ops")
	require.Equal(t, 0, r.code, r.stderr)
	testutil.WaitForWithin(t, "the limit at the edge", 2*time.Second, func() bool {
		resp, err := http.Get("http://" + d.EdgeAdmin + "/v1/limits") // what the edge applies
		require.NoError(t, err)
		defer resp.Body.Close()
		var applied []map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&applied))
		return len(applied) == 1 && applied[0]["limit"] == 2.0
	})
	require.Contains(t, d.run(t, "limits", "list").stdout, "limit 2 until")
	require.Equal(t, 200, apiCheck(t, d, "carol"))
	require.Equal(t, 200, apiCheck(t, d, "carol"))
	require.Equal(t, 429, apiCheck(t, d, "carol"))
	testutil.WaitForWithin(t, "the limit lifted at its expiry", 10*time.Second, func() bool { return apiCheck(t, d, "carol") == 200 })

	rs := operatorRecords(t, d)
	require.True(t, hasRecord(rs, "limit_set", "ops: scraping"))
	require.True(t, hasRecord(rs, "limit_cleared", "ops"))
	for _, r := range rs {
		require.NotEmpty(t, r["note"], "every operator's record names who: %v", r)
	}

	for _, c := range []struct {
		args []string
		says string
	}{
		{[]string{"limits", "set", "--policy", "core", "--identity", "x", "--block"}, "--for"},
		{[]string{"limits", "set", "--policy", "core", "--identity", "x", "--block", "--limit", "3", "--for", "1m"}, "one of them"},
		{[]string{"limits", "set", "--policy", "core", "--identity", "x", "--limit", "3", "--for", "200h"}, "at most"},
		{[]string{"limits", "set", "--policy", "core", "--identity", "x", "--limit", "-3", "--for", "1m"}, "--limit -3"},
	} {
		r := d.run(t, c.args...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.says, "%v", c.args)
	}
}

// check-config lists every problem of a file with its line, and exits 1:
// those the YAML decoder finds (an unknown field, a value of the wrong
// type) hide none of the others, nor does a shard's bad address hide a
// duplicate shard name; a good file is ok. version and help say what they
// should.
func TestCheckConfigVersionAndHelp(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte(`redis:
  shards:
    - name: s0
      primary: {addr: "127.0.0.1"}
    - name: s0
      primary: {addr: "127.0.0.1:6380"}
policies:
  - {name: core, limit: -5, window: 1m}
  - {name: search, limit: 10, window: 1m, backoff: {factor: 50}}
  - {name: admin, limit: lots, window: 1m}
  - {name: other, limit: 5, window: 1m, mode: exact, moed: async}
edge:
  on_redis_error: maybe
  listen: 127.0.0.1:8080
  upstrem: http://127.0.0.1:9000
`), 0o600))
	env := func(k string) string {
		return map[string]string{"TALLY_KEY_SECRET": hex.EncodeToString(tallytest.Secret)}[k]
	}
	run := func(args ...string) result {
		var out, errOut testutil.Buffer
		code := cli.Main(context.Background(), cli.Env{Stdout: &out, Stderr: &errOut, Getenv: env}, args)
		return result{code: code, stdout: out.String(), stderr: errOut.String()}
	}
	r := run("check-config", bad)
	require.Equal(t, 1, r.code)
	for _, want := range []string{":4: redis.shards[0].primary: addr", ":5: redis.shards[1].name: \"s0\": duplicate shard name",
		":8: policies[0].limit: -5", ":9: policies[1].backoff.factor: 50", ":10: policies[2].limit: cannot unmarshal",
		":11: policies[3].moed: field moed not found", ":13: edge.on_redis_error", ":15: edge.upstrem: field upstrem not found",
		":12: edge.upstream: \"\": proxy mode (edge.listen) needs an http(s) upstream URL"} { // the misspelt one's: none
		require.Contains(t, r.stderr, bad+want)
	}
	require.Contains(t, r.stderr, "9 problems found", r.stderr)

	good := filepath.Join(dir, "good.yaml")
	require.NoError(t, os.WriteFile(good, []byte(`redis:
  shards:
    - name: s0
      primary: {addr: "127.0.0.1:6379"}
policies:
  - {name: core, limit: 5, window: 1m, backoff: {factor: 2, max: 10m}}
`), 0o600))
	r = run("check-config", good)
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, good+": ok\n", r.stdout)
	r = run("check-config", filepath.Join(dir, "missing.yaml"))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no such file")

	r = run("version")
	require.Equal(t, 0, r.code)
	require.True(t, strings.HasPrefix(r.stdout, "tally "), r.stdout)

	r = run()
	require.Equal(t, 2, r.code)
	for _, name := range []string{"check-config", "inspect", "reset", "decisions", "dead-letters list", "dead-letters replay",
		"dead-letters discard", "limits set", "limits list", "limits clear", "ship-access-log", "version"} {
		require.Contains(t, r.stdout, "tally "+name+" ", "the command list names %s", name)
	}
	r = run("help", "limits", "set")
	require.Equal(t, 0, r.code)
	require.Contains(t, r.stdout, "-block")
	require.Contains(t, r.stdout, "lifts")
	r = run("nope")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, `unknown command "nope"`)
}
