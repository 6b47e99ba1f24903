package cli_test

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/client"
	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/tallytest"
	"github.com/tallyhq/tally/internal/testutil"
)

// decDigest is the window digest of a decision-API identity under policy.
func decDigest(t *testing.T, policy, identity string) string {
	t.Helper()
	ks, err := limiter.NewKeySpace("tally", tallytest.Secret)
	require.NoError(t, err)
	return ks.Sum(policy, limiter.APIIdentity(identity)).String()
}

// decCheck asks the decision API for one request of identity under core,
// and says whether it was allowed.
func decCheck(t *testing.T, d *deployment, identity string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := client.NewDecisionClient(d.API, d.Token, nil).Check(ctx, client.CheckRequest{Policy: "core", Identity: identity})
	require.NoError(t, err)
	return got.Allowed
}

// decLines are the lines of out.
func decLines(out string) []string {
	return strings.Split(strings.TrimSuffix(out, "\n"), "\n")
}

// The decisions stream, read back: every record a line, filtered by
// client, result and path, or as stored in JSON.
func TestDecisions(t *testing.T) {
	d := start(t, "- {name: core, limit: 2, window: 1m}")
	alice, carol := decDigest(t, "core", "alice"), decDigest(t, "core", "carol")

	// Nothing recorded yet: it says nothing, and ends at once.
	began := time.Now()
	r := d.run(t, "decisions", "--all")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.Less(t, time.Since(began), 3*time.Second, "an empty stream is caught up at once")

	require.True(t, decCheck(t, d, "alice"))
	require.True(t, decCheck(t, d, "alice"))
	require.False(t, decCheck(t, d, "alice"), "alice is past her limit of 2")
	require.True(t, decCheck(t, d, "carol"))

	// The edge publishes its records in batches: wait for all four.
	testutil.WaitFor(t, "the four decisions on the stream", func() bool {
		r = d.run(t, "decisions")
		return r.code == 0 && strings.Count(r.stdout, alice) == 3 && strings.Count(r.stdout, carol) == 1
	})
	line := regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (allowed|denied ) [a-z-]{1,10} +[0-9a-f]{32} core used \d+/2 `)
	for _, l := range decLines(r.stdout) {
		require.Regexp(t, line, l)
		require.Contains(t, l, " reset ")
		require.Regexp(t, ` request \S+ edge \S+$`, l)
	}
	require.Regexp(t, `denied  (cache|reserve) +`+alice+` core used [23]/2 `, r.stdout)

	r = d.run(t, "decisions", "--result", "denied")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, decLines(r.stdout), 1)
	require.Contains(t, r.stdout, " denied  ")
	require.Contains(t, r.stdout, alice)

	r = d.run(t, "decisions", "--policy", "core", "--identity", "api:alice")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, decLines(r.stdout), 3)
	require.Equal(t, 3, strings.Count(r.stdout, alice))
	require.NotContains(t, r.stdout, carol)

	r = d.run(t, "decisions", "--digest", carol, "--result", "allowed", "--all")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, decLines(r.stdout), 1)
	require.Contains(t, r.stdout, carol)

	r = d.run(t, "decisions", "--policy", "other")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout, "another policy's records only: none")

	r = d.run(t, "decisions", "--json", "--policy", "core")
	require.Equal(t, 0, r.code, r.stderr)
	lines := decLines(r.stdout)
	require.Len(t, lines, 4)
	for _, l := range lines {
		var rec struct {
			Type string `json:"type"`
			Data struct {
				Key     string `json:"key"`
				Policy  string `json:"policy"`
				Allowed bool   `json:"allowed"`
				Path    string `json:"path"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(l), &rec), l)
		require.Equal(t, "dev.tally.decision.v1", rec.Type)
		require.Equal(t, "core", rec.Data.Policy)
		require.Contains(t, []string{alice, carol}, rec.Data.Key)
	}

	// Reading the stream is all it needs: the analytics user will do.
	var out, errOut testutil.Buffer
	analytics := d.Env("analytics")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := cli.Main(ctx, cli.Env{Stdout: &out, Stderr: &errOut, Getenv: func(k string) string {
		if k == "TALLY_CONFIG" {
			return d.path
		}
		return analytics(k)
	}}, []string{"decisions", "--result", "denied"})
	require.Equal(t, 0, code, errOut.String())
	require.Contains(t, out.String(), alice)

	// Records from a millisecond ago on only: none of these.
	r = d.run(t, "decisions", "--since", "1ms")
	require.Equal(t, 0, r.code, r.stderr)
	require.NotContains(t, r.stdout, alice)
}

// --follow prints what comes after it caught up, until interrupted.
func TestDecisionsFollow(t *testing.T) {
	d := start(t, "- {name: core, limit: 1, window: 1m}")
	require.True(t, decCheck(t, d, "alice"))
	require.False(t, decCheck(t, d, "alice"))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out testutil.Buffer
	done := make(chan result, 1)
	go func() { done <- d.tallyTo(ctx, "", &out, "decisions", "--follow", "--policy", "core") }()
	testutil.WaitFor(t, "the earlier denial", func() bool { return strings.Contains(out.String(), " denied ") })

	dave := decDigest(t, "core", "dave")
	require.True(t, decCheck(t, d, "dave"))
	testutil.WaitFor(t, "dave's decision, made after following began", func() bool {
		return strings.Contains(out.String(), dave)
	})
	require.Regexp(t, `allowed (credit|reserve) +`+dave+` core used 1/1 `, out.String())

	cancel()
	select {
	case r := <-done:
		require.Equal(t, 0, r.code, r.stderr)
	case <-time.After(10 * time.Second):
		t.Fatal("tally decisions --follow still running 10s after its context ended")
	}
}

// Mistakes in how decisions is called are usage errors (exit 2) that say
// what would do, before anything is reached.
func TestDecisionsMistakes(t *testing.T) {
	d := start(t, "- {name: core, limit: 2, window: 1m}")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--result", "maybe"}, "want allowed or denied"},
		{[]string{"--path", "teleport"}, "want one of credit, reserve, cache"},
		{[]string{"--since", "-5m"}, "want a positive duration"},
		{[]string{"--since", "1h", "--all"}, "not both"},
		{[]string{"--identity", "api:alice"}, "--identity needs --policy"},
		{[]string{"--policy", "core", "--identity", "api:alice", "--digest", decDigest(t, "core", "alice")}, "one of them"},
		{[]string{"--digest", "Bearer abc"}, "32 lower-case hex digits"},
		{[]string{"alice"}, "filters are flags"},
	} {
		r := d.run(t, append([]string{"decisions"}, c.args...)...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, c.args)
	}
	r := d.run(t, "decisions", "--policy", "nope", "--identity", "api:alice")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, `unknown policy "nope"`)
}
