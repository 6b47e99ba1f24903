package cli_test

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/testutil"
)

// apiCheck asks the deployment's decision API for one request of identity
// under policy core, and returns the status (200 allowed, 429 denied).
func apiCheck(t *testing.T, d *deployment, identity string) int {
	t.Helper()
	req, err := http.NewRequest("POST", d.API+"/v1/check", strings.NewReader(`{"policy":"core","identity":"`+identity+`"}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+d.Token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// operatorRecords are the operator's records on the decisions stream so
// far, as JSON objects.
func operatorRecords(t *testing.T, d *deployment) []map[string]any {
	t.Helper()
	_, js := d.NATS.Connect()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, "TALLY_DECISIONS", jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.Streams{}.OperatorDecisionsSubject()}})
	require.NoError(t, err)
	var out []map[string]any
	for {
		batch, err := cons.FetchNoWait(100)
		require.NoError(t, err)
		n := 0
		for m := range batch.Messages() {
			n++
			var recs []map[string]any
			require.NoError(t, json.Unmarshal(m.Data(), &recs))
			for _, r := range recs {
				out = append(out, r["data"].(map[string]any))
			}
		}
		if n == 0 {
			return out
		}
	}
}

func hasRecord(rs []map[string]any, outcome, note string) bool {
	for _, r := range rs {
		if r["path"] == "operator" && r["outcome"] == outcome && (note == "" || r["note"] == note) {
			return true
		}
	}
	return false
}

// inspect shows a client's window as its primary holds it; reset asks
// first, changes nothing unless confirmed, then empties the window, tells
// the edge (which stops answering 429 from memory) and is recorded.
func TestInspectAndReset(t *testing.T) {
	d := start(t, "- {name: core, limit: 3, window: 1h}")
	for range 3 {
		require.Equal(t, 200, apiCheck(t, d, "alice"))
	}
	require.Equal(t, 429, apiCheck(t, d, "alice"))

	who := []string{"--policy", "core", "--identity", "api:alice"}
	r := d.run(t, append([]string{"inspect"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "used 3 of 3 (0 left)")
	require.Contains(t, r.stdout, "held by edge.")
	require.Contains(t, r.stdout, "temporary limit: none")
	r = d.run(t, append([]string{"inspect", "--json"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var got struct {
		Digest string
		Live   bool
		Used   int64
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), r.stdout)
	require.True(t, got.Live)
	require.EqualValues(t, 3, got.Used)
	// The same window named by its digest, as records and alerts name it.
	r = d.run(t, "inspect", "--policy", "core", "--digest", got.Digest)
	require.Contains(t, r.stdout, "used 3 of 3")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r = d.tally(ctx, "no\n", append([]string{"reset", "--by", "ops"}, who...)...)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not confirmed")
	require.Contains(t, d.run(t, append([]string{"inspect"}, who...)...).stdout, "used 3 of 3", "nothing changed")
	require.Equal(t, 429, apiCheck(t, d, "alice"))

	r = d.tally(ctx, "yes\n", append([]string{"reset", "--reason", "ticket 12", "--by", "ops"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "reset: policy core")
	testutil.WaitFor(t, "the edge told: alice admitted again", func() bool { return apiCheck(t, d, "alice") == 200 })
	require.True(t, hasRecord(operatorRecords(t, d), "reset", "ops: ticket 12"), "the reset recorded")

	r = d.run(t, "reset", "--policy", "core", "--identity", "api:nobody", "--yes", "--by", "ops")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "nothing to reset")
}

// Mistakes get a message a person can act on and exit 2 (how it was
// called) or 1 (what it found).
func TestWindowCommandMistakes(t *testing.T) {
	d := start(t, "- {name: core, limit: 3, window: 1h}")
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"inspect", "--identity", "x"}, 2, "--policy is required"},
		{[]string{"inspect", "--policy", "core"}, 2, "--identity or by --digest"},
		{[]string{"inspect", "--policy", "core", "--identity", "x", "--digest", "00"}, 2, "one of them"},
		{[]string{"inspect", "--policy", "core", "--digest", "xyz"}, 2, "--digest"},
		{[]string{"inspect", "--policy", "nope", "--identity", "x"}, 1, `unknown policy "nope" (the configuration has: core)`},
		{[]string{"inspect", "--policy", "core", "--identity", "ip:not-an-address"}, 2, "ip: and an address"},
		{[]string{"inspect", "--bogus"}, 2, "flag provided but not defined"},
		{[]string{"inspect", "--config", "/nonexistent/tally.yaml", "--policy", "core", "--identity", "x"}, 1, "no such file"},
	} {
		r := d.run(t, c.args...)
		require.Equal(t, c.code, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.says, "%v", c.args)
	}
}

// inspect counts a temporary limit in what is left, and its JSON has one
// key style (snake case, as every Tally JSON) and no time that is not one.
func TestInspectUnderATemporaryLimit(t *testing.T) {
	d := start(t, "- {name: core, limit: 1000, window: 1h, mode: exact}")
	for range 5 {
		require.Equal(t, 200, apiCheck(t, d, "alice"))
	}
	who := []string{"--policy", "core", "--identity", "api:alice"}
	require.Contains(t, d.run(t, append([]string{"inspect"}, who...)...).stdout, "used 5 of 1000 (995 left)")
	r := d.run(t, append([]string{"limits", "set", "--limit", "3", "--for", "1h", "--by", "ops"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	r = d.run(t, append([]string{"inspect"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "used 5 of 3 (0 left; temporary limit 3, the policy's 1000)")

	r = d.run(t, append([]string{"inspect", "--json"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), r.stdout)
	require.EqualValues(t, 3, got["limit"])
	require.EqualValues(t, 1000, got["policy_limit"])
	require.EqualValues(t, 5, got["used"])
	require.EqualValues(t, 0, got["left"])
	require.NotNil(t, got["temporary_limit"])
	snake := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	var keys func(v any)
	keys = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				require.Regexp(t, snake, k, r.stdout)
				keys(x)
			}
		case []any:
			for _, x := range v {
				keys(x)
			}
		}
	}
	keys(got)
	require.NotContains(t, r.stdout, "0001-01-01", "no zero time")
	holders, ok := got["holders"].([]any)
	require.True(t, ok && len(holders) > 0, r.stdout)
	require.NotContains(t, holders[0], "until", "a holding has no expiry")

	// Blocked: nothing is left; and with no live window, no start or reset.
	r = d.run(t, append([]string{"limits", "set", "--block", "--for", "1h", "--by", "ops"}, who...)...)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, d.run(t, append([]string{"inspect"}, who...)...).stdout, "used 5 of 0 (0 left; blocked by an operator")
	r = d.run(t, "inspect", "--json", "--policy", "core", "--identity", "api:nobody")
	require.Equal(t, 0, r.code, r.stderr)
	got = nil
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got))
	require.Equal(t, false, got["live"])
	require.NotContains(t, got, "start")
	require.NotContains(t, got, "reset_at")
	require.EqualValues(t, 1000, got["left"])
}

// An operator's record always names who: without --by, $USER or $LOGNAME,
// an action that records is refused before anything changes.
func TestOperatorRecordsNameWho(t *testing.T) {
	d := start(t, "- {name: core, limit: 3, window: 1h}")
	require.Equal(t, 200, apiCheck(t, d, "alice"))
	who := []string{"--policy", "core", "--identity", "api:alice"}
	for _, args := range [][]string{
		append([]string{"limits", "set", "--block", "--for", "1h"}, who...),
		append([]string{"limits", "clear"}, who...),
		append([]string{"reset", "--yes"}, who...),
		{"dead-letters", "discard", "--all", "--reason", "stuck"},
	} {
		r := d.run(t, args...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "say who acts: --by NAME", args)
	}
	require.Equal(t, 200, apiCheck(t, d, "alice"), "nothing changed")

	// $USER, else $LOGNAME, names who when --by does not.
	env := d.Env("operator")
	var out, errOut testutil.Buffer
	code := cli.Main(context.Background(), cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		switch k {
		case "TALLY_CONFIG":
			return d.path
		case "LOGNAME":
			return "night-shift"
		}
		return env(k)
	}, Now: time.Now}, append([]string{"limits", "set", "--block", "--for", "1h", "--reason", "paging"}, who...))
	require.Equal(t, 0, code, errOut.String())
	testutil.WaitFor(t, "the record", func() bool { return hasRecord(operatorRecords(t, d), "limit_set", "night-shift: paging") })
}

// `tally windows compact` records the format on every shard, once asked
// (or with --yes), and says when it was there already.
func TestWindowsCompact(t *testing.T) {
	d := start(t, "- {name: core, limit: 3, window: 1h}")
	ctx := context.Background()
	rdb := d.Redis.Client()
	require.NoError(t, rdb.Del(ctx, "tally:windows").Err()) // a deployment upgraded from 0.1.0

	r := d.tally(ctx, "n\n", "windows", "compact")
	require.Equal(t, 1, r.code, r.stderr)
	require.Zero(t, rdb.Exists(ctx, "tally:windows").Val(), "nothing recorded without a yes")

	r = d.tally(ctx, "yes\n", "windows", "compact")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "compact, span records kept from now on")
	first := rdb.Get(ctx, "tally:windows").Val()
	require.Regexp(t, "^spans:[0-9a-f]{16}$", first)

	r = d.tally(ctx, "", "windows", "compact", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "span records kept already (a new level)")
	require.Regexp(t, "^spans:[0-9a-f]{16}$", rdb.Get(ctx, "tally:windows").Val())
	require.NotEqual(t, first, rdb.Get(ctx, "tally:windows").Val(), "each run begins a new level")
}
