package events_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// What AppendDecision writes, ParseDecisions reads back field for field,
// with each record's JSON as stored.
func TestParseDecisionsReadsWhatIsWritten(t *testing.T) {
	dg, err := limiter.ParseDigest(key)
	require.NoError(t, err)
	when := time.Date(2026, 11, 26, 10, 0, 0, 123_456_000, time.UTC)
	window := when.Add(time.Minute).Truncate(time.Second)
	denied := events.Decision{Time: when, Source: "edge-checker/host-1", Edge: "edge.5f2c", Seq: 9, Shard: "s0",
		RequestNum: 42, TraceParent: tp, Key: dg, Policy: "core", Limit: 100, WindowSeconds: 60, Cost: 1,
		Path: "backoff", Used: 100, ResetAt: window, Until: window.Add(2 * time.Minute), Strikes: 2}
	acc := events.Decision{Time: when, Source: "accountant", Edge: "accountant-1c9e", Seq: 3, Shard: "s0", Key: dg,
		Policy: "core", Limit: 100, WindowSeconds: 60, Cost: 2, Allowed: true, Path: "accountant",
		Outcome: "refunded", RequestID: "edge.5f2c-41", Used: 98, ResetAt: window, Lag: 1204 * time.Microsecond}
	op := events.Decision{Time: when, Source: "tally-cli", Edge: "operator", Seq: 1764151200000000000, Shard: "s0",
		Key: dg, Policy: "core", Limit: 0, WindowSeconds: 60, Path: "operator", Outcome: "limit_set",
		Until: window.Add(time.Hour), Note: `ops: "abuse"`}
	envoy := events.Decision{Time: when, Source: "edge", Edge: "edge.5f2c", Seq: 10, Shard: "s0", RequestNum: 43,
		Key: dg, Policy: "sms", Limit: 5, WindowSeconds: 3600, Cost: 1, Path: "rule", Shadow: true,
		Domain: "messaging", Rule: "messaging.message_type_marketing.to_number"}
	body := []byte("[")
	for i, d := range []*events.Decision{&denied, &acc, &op, &envoy} {
		if i > 0 {
			body = append(body, ',')
		}
		body = events.AppendDecision(body, d)
	}
	body = append(body, ']')

	got, err := events.ParseDecisions(body)
	require.NoError(t, err)
	require.Len(t, got, 4)
	for i, want := range []events.Decision{denied, acc, op, envoy} {
		if want.RequestNum != 0 { // read back as the request id it stands for
			want.RequestID, want.RequestNum = want.Edge+"-"+strconv.FormatUint(want.RequestNum, 10), 0
		}
		require.Equal(t, want, got[i].Decision, "record %d", i+1)
		require.Equal(t, want.Edge+".d."+strconv.FormatUint(want.Seq, 10), got[i].ID)
		require.JSONEq(t, string(events.AppendDecision(nil, &[]events.Decision{denied, acc, op, envoy}[i])), string(got[i].Raw))
		require.True(t, json.Valid(got[i].Raw))
	}

	// Unknown fields are ignored; an empty batch is no record.
	more, err := events.ParseDecisions([]byte(`[{"specversion":"1.0","id":"x","source":"s","type":"dev.tally.decision.v1",
		"time":"2026-11-26T10:00:00Z","data":{"key":"` + key + `","policy":"core","path":"cache","edge":"e","new":1}}]`))
	require.NoError(t, err)
	require.Equal(t, "cache", more[0].Path)
	require.Zero(t, more[0].Seq, "an id not of the form <edge>.d.<seq>")
	none, err := events.ParseDecisions([]byte(" [ ] "))
	require.NoError(t, err)
	require.Empty(t, none)
}

func TestParseDecisionsRefuses(t *testing.T) {
	for name, body := range map[string]string{
		"not JSON":       `[{"specversion"`,
		"not an array":   `{"specversion":"1.0"}`,
		"another type":   `[{"specversion":"1.0","type":"dev.tally.request.started.v2","data":{"key":"` + key + `"}}]`,
		"no specversion": `[{"type":"dev.tally.decision.v1","data":{"key":"` + key + `"}}]`,
		"no data":        `[{"specversion":"1.0","type":"dev.tally.decision.v1"}]`,
		"a bad key":      `[{"specversion":"1.0","type":"dev.tally.decision.v1","data":{"key":"Bearer secret"}}]`,
	} {
		_, err := events.ParseDecisions([]byte(body))
		require.Error(t, err, name)
		require.NotContains(t, err.Error(), "secret", "a value that may be a secret is not quoted")
	}
	_, err := events.ParseDecisions([]byte(`[{"specversion":"1.0","type":"dev.tally.decision.v1","data":{"key":"` + key + `"}},
		{"specversion":"1.0","type":"dev.tally.decision.v1","data":{"key":"nope"}}]`))
	require.ErrorContains(t, err, "decision record 2")
}
