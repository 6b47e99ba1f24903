package cli_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/client"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/tallytest"
	"github.com/tallyhq/tally/internal/testutil"
)

// dlEntry is a dead letter as "dead-letters list --json" prints it.
type dlEntry struct {
	Seq         uint64    `json:"seq"`
	Stored      time.Time `json:"stored"`
	Shard       string    `json:"shard"`
	Subject     string    `json:"original_subject"`
	OriginalSeq uint64    `json:"original_seq"`
	Producer    string    `json:"producer"`
	Events      *int      `json:"events"`
	Reason      string    `json:"reason"`
}

func dlList(t *testing.T, d *deployment) []dlEntry {
	t.Helper()
	r := d.run(t, "dead-letters", "list", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var out []dlEntry
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
	return out
}

// A message the accountant could not apply (bob's window key is not a
// window in Redis) is listed with its reason; once the key is fixed, a
// replay applies it, and the dead-letter stream is empty again.
func TestDeadLettersListAndReplay(t *testing.T) {
	d := start(t, "- {name: core, limit: 5, window: 1h}")
	ctx := context.Background()

	r := d.run(t, "dead-letters", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no dead letters\n", r.stdout)
	require.Empty(t, dlList(t, d))
	r = d.run(t, "dead-letters", "replay", "--all", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no dead letters\n", r.stdout)

	// A service charges 2 units to bob's window, whose key holds a string:
	// Redis refuses the charge (WRONGTYPE) until the accountant sets it
	// aside.
	ks, err := limiter.NewKeySpace("tally", tallytest.Secret)
	require.NoError(t, err)
	bob := ks.Key("core", limiter.APIIdentity("bob")).String()
	rdb := d.Redis.Client()
	require.NoError(t, rdb.RPush(ctx, bob, "not a window").Err())
	_, js := d.NATS.ConnectAs("billing")
	keys, err := client.NewKeys("tally", tallytest.Secret, d.Shards)
	require.NoError(t, err)
	pub, err := client.NewPublisher(js, client.PublisherConfig{Namespace: "billing", Source: "billing-api", Keys: keys})
	require.NoError(t, err)
	_, err = pub.Charge(ctx, client.Charge{Policy: "core", Limit: 5, Window: time.Hour,
		Identity: client.APIIdentity("bob"), Units: 2, RequestID: "billing-1"})
	require.NoError(t, err)
	subject := "tally.accounting.s0." + pub.Producer()

	testutil.WaitFor(t, "the dead letter", func() bool { return len(dlList(t, d)) == 1 })
	dl := dlList(t, d)[0]
	require.Equal(t, "s0", dl.Shard)
	require.Equal(t, subject, dl.Subject)
	require.Equal(t, pub.Producer(), dl.Producer)
	require.NotZero(t, dl.OriginalSeq)
	require.NotNil(t, dl.Events)
	require.Equal(t, 1, *dl.Events)
	require.Contains(t, dl.Reason, "WRONGTYPE")
	require.WithinDuration(t, time.Now(), dl.Stored, time.Minute)
	seq := strconv.FormatUint(dl.Seq, 10)

	r = d.run(t, "dead-letters", "list")
	require.Equal(t, 0, r.code, r.stderr)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, 2, r.stdout)
	require.Regexp(t, `^SEQ +STORED \(UTC\) +SHARD +FROM \(SUBJECT #SEQUENCE\) +EVENTS +REASON$`, lines[0])
	require.Regexp(t, `^`+seq+` +\d{4}-\d\d-\d\dT\S+Z +s0 +`+strings.ReplaceAll(subject, ".", `\.`)+` #\d+ +1 +.*WRONGTYPE`, lines[1])

	// Not confirmed: nothing is replayed.
	r = d.tally(ctx, "no\n", "dead-letters", "replay", "--all")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, subject, "it shows what it would replay")
	require.Contains(t, r.stdout, "Replay 1 dead letter")
	require.Contains(t, r.stderr, "not confirmed")
	require.Equal(t, []dlEntry{dl}, dlList(t, d))

	// A sequence the stream does not hold is named, and nothing is done.
	r = d.run(t, "dead-letters", "replay", "--seq", seq+",999", "--yes")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no dead letter 999")
	require.Contains(t, r.stderr, "nothing was replayed")
	require.Equal(t, []dlEntry{dl}, dlList(t, d))

	// Fixed, replayed: the accountant applies the charge.
	require.NoError(t, rdb.Del(ctx, bob).Err())
	r = d.run(t, "dead-letters", "replay", "--seq", seq, "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "dead letter "+seq+": replayed on "+subject+" (1 event) as TALLY_ACCOUNTING message ")
	require.Contains(t, r.stdout, "deleted from TALLY_DLQ")
	testutil.WaitFor(t, "the replayed charge applied to bob's window", func() bool {
		u, err := rdb.HGet(ctx, bob, "u").Result()
		return err == nil && u == "2"
	})
	r = d.run(t, "dead-letters", "list")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, "no dead letters\n", r.stdout)
	// The accountant's record of it joins the service's request id.
	testutil.WaitFor(t, "the accountant's record", func() bool {
		r = d.run(t, "decisions", "--policy", "core", "--identity", "api:bob", "--path", "accountant")
		return strings.Contains(r.stdout, " outcome charged ") && strings.Contains(r.stdout, " request billing-1 ")
	})

	// Replayed once: it is no longer there to replay again.
	r = d.run(t, "dead-letters", "replay", "--seq", seq, "--yes")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "no dead letter "+seq)
	u, err := rdb.HGet(ctx, bob, "u").Result()
	require.NoError(t, err)
	require.Equal(t, "2", u)
}

// Mistakes in how dead-letters is called are usage errors (exit 2).
func TestDeadLettersMistakes(t *testing.T) {
	d := start(t, "- {name: core, limit: 5, window: 1h}")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay"}, "--seq N[,M…]"},
		{[]string{"replay", "--seq", "3", "--all"}, "one of them"},
		{[]string{"replay", "--seq", "3,x"}, "want dead-letter stream sequences"},
		{[]string{"replay", "--seq", "0"}, "want dead-letter stream sequences"},
		{[]string{"replay", "3"}, "unexpected argument"},
		{[]string{"list", "all"}, "unexpected argument"},
	} {
		r := d.run(t, append([]string{"dead-letters"}, c.args...)...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want, c.args)
	}
}

// A dead letter that can never apply is discarded with a reason: deleted
// from the dead-letter stream, and recorded on the decisions stream with
// who and why — per event with its window, or, for a body that does not
// decode, once, with no window.
func TestDeadLettersDiscard(t *testing.T) {
	d := start(t, "- {name: core, limit: 5, window: 1h}")
	ctx := context.Background()
	ks, err := limiter.NewKeySpace("tally", tallytest.Secret)
	require.NoError(t, err)
	bob := ks.Key("core", limiter.APIIdentity("bob"))
	require.NoError(t, d.Redis.Client().RPush(ctx, bob.String(), "not a window").Err())
	nc, js := d.NATS.ConnectAs("billing")
	keys, err := client.NewKeys("tally", tallytest.Secret, d.Shards)
	require.NoError(t, err)
	pub, err := client.NewPublisher(js, client.PublisherConfig{Namespace: "billing", Source: "billing-api", Keys: keys})
	require.NoError(t, err)
	_, err = pub.Charge(ctx, client.Charge{Policy: "core", Limit: 5, Window: time.Hour,
		Identity: client.APIIdentity("bob"), Units: 2, RequestID: "billing-1"})
	require.NoError(t, err)
	require.NoError(t, nc.Publish("tally.accounting.s0.billing.junk", []byte("not an event")))
	testutil.WaitFor(t, "two dead letters", func() bool { return len(dlList(t, d)) == 2 })
	var charge, junk dlEntry
	for _, dl := range dlList(t, d) {
		if dl.Events != nil {
			charge = dl
		} else {
			junk = dl
		}
	}
	require.NotZero(t, charge.Seq)
	require.NotZero(t, junk.Seq)

	r := d.run(t, "dead-letters", "discard", "--all", "--by", "ops")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "--reason")
	r = d.tally(ctx, "no\n", "dead-letters", "discard", "--all", "--by", "ops", "--reason", "x")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stdout, "Discard 2 dead letters")
	require.Len(t, dlList(t, d), 2, "not confirmed: nothing discarded")

	r = d.run(t, "dead-letters", "discard", "--seq", strconv.FormatUint(junk.Seq, 10), "--by", "ops", "--reason", "garbage", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "discarded (its body does not decode")
	require.Equal(t, []dlEntry{charge}, dlList(t, d))
	r = d.run(t, "dead-letters", "discard", "--all", "--by", "ops", "--reason", "the window is broken", "--yes")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, dlList(t, d))

	var discarded []map[string]any
	for _, rec := range operatorRecords(t, d) {
		if rec["outcome"] == "discarded" {
			discarded = append(discarded, rec)
		}
	}
	require.Len(t, discarded, 2)
	byKey := map[string]map[string]any{}
	for _, rec := range discarded {
		byKey[rec["key"].(string)] = rec
	}
	nothing := byKey[strings.Repeat("0", 32)]
	require.NotNil(t, nothing, "the undecodable one: no window")
	require.Equal(t, "-", nothing["policy"])
	require.Equal(t, "ops: garbage (dead letter "+strconv.FormatUint(junk.Seq, 10)+")", nothing["note"])
	ev := byKey[bob.Digest().String()]
	require.NotNil(t, ev, "the charge: its window")
	require.Equal(t, "core", ev["policy"])
	require.Equal(t, "billing-1", ev["request_id"])
	require.Contains(t, ev["note"], "ops: the window is broken (dead letter "+strconv.FormatUint(charge.Seq, 10)+": ")
	require.Contains(t, ev["note"], ": a charge of 2 units, "+pub.Producer()+" #1)")
}
