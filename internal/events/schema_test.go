package events_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// decisionSchema compiles the documented schema of a decision record
// (docs/decision.schema.json), formats asserted.
func decisionSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile("../../docs/decision.schema.json")
	require.NoError(t, err)
	return s
}

// Every kind of record an edge or an accountant writes validates against
// the documented schema, and the schema refuses what is not documented.
func TestDecisionRecordsMatchTheSchema(t *testing.T) {
	schema := decisionSchema(t)
	dg, err := limiter.ParseDigest(key)
	require.NoError(t, err)
	at := time.Date(2026, 11, 21, 10, 0, 0, 123e6, time.UTC)
	reset := at.Add(time.Minute).Truncate(time.Second)
	edge := events.Decision{Time: at, Source: "edge-checker/host-1", Edge: "edge-7f3a", Seq: 9, Shard: "s0",
		RequestNum: 42, Key: dg, Policy: "core", Limit: 100, WindowSeconds: 60, Cost: 1, Allowed: true,
		Path: "credit", Used: 7, ResetAt: reset}
	traced := edge
	traced.TraceParent = tp
	denied := edge
	denied.Allowed, denied.Path, denied.Used = false, "cache", 100
	failOpen := edge
	failOpen.Path, failOpen.Used, failOpen.ResetAt = "fail-open", 0, time.Time{}
	absorbed := edge
	absorbed.Outcome = "refunded"
	acc := events.Decision{Time: at, Source: "accountant", Edge: "accountant-1c9e", Seq: 3, Shard: "s0", Key: dg,
		Policy: "core", Limit: 100, WindowSeconds: 60, Cost: 2, Allowed: true, Path: "accountant",
		Outcome: "charged_over_limit", RequestID: "edge-7f3a-41", Used: 101, ResetAt: reset, Lag: 1200 * time.Microsecond}
	late := acc
	late.Outcome, late.ResetAt, late.Lag, late.Used = "late", time.Time{}, 0, 0
	notHeld := late
	notHeld.Outcome = "not_held"
	finished := edge
	finished.Path, finished.Outcome, finished.Edge, finished.RequestID = "finish", "refunded", "edge-9b1d", "edge-7f3a-42"
	pending := finished
	pending.Outcome, pending.Used, pending.ResetAt = "pending", 0, time.Time{}

	valid := func(d events.Decision) error {
		v, err := jsonschema.UnmarshalJSON(bytes.NewReader(events.AppendDecision(nil, &d)))
		require.NoError(t, err)
		return schema.Validate(v)
	}
	// Progressive backoff, a block, and operators' actions.
	backoff := denied
	backoff.Path, backoff.Until, backoff.Strikes = "backoff", reset.Add(time.Minute), 2
	blocked := edge
	blocked.Allowed, blocked.Path, blocked.Limit, blocked.Used, blocked.ResetAt = false, "blocked", 0, 0, time.Time{}
	blocked.Until = at.Add(time.Hour)
	reset0 := events.Decision{Time: at, Source: "tally/cli", Edge: "operator", Seq: 1, Shard: "s0", Key: dg,
		Policy: "core", Limit: 100, WindowSeconds: 60, Allowed: true, Path: "operator", Outcome: "reset", Note: "ops: a stuck client"}
	limitSet := reset0
	limitSet.Outcome, limitSet.Limit, limitSet.Allowed, limitSet.Until = "limit_set", 0, false, at.Add(time.Hour)
	limitCleared := reset0
	limitCleared.Outcome = "limit_cleared"
	discarded := reset0
	discarded.Outcome, discarded.RequestID, discarded.Note = "discarded", "billing-7-1001", "ops: another deployment's events (dead letter 12)"
	undecodable := discarded
	undecodable.Key, undecodable.Policy, undecodable.Limit, undecodable.WindowSeconds = limiter.Digest{}, "-", 0, 1
	for name, d := range map[string]events.Decision{"allowed": edge, "traced": traced, "denied": denied,
		"fail-open": failOpen, "absorbed refund": absorbed, "accountant": acc, "late": late, "not held": notHeld,
		"finished": finished, "finish pending": pending, "backoff": backoff, "blocked": blocked,
		"reset": reset0, "limit set": limitSet, "limit cleared": limitCleared, "discarded": discarded,
		"discarded, undecodable": undecodable} {
		require.NoError(t, valid(d), name)
	}
	noStrikes := backoff
	noStrikes.Strikes = 0
	require.Error(t, valid(noStrikes), "a backoff names its strikes")
	allowedBlock := blocked
	allowedBlock.Allowed = true
	require.Error(t, valid(allowedBlock), "a block denies")
	opNoOutcome := reset0
	opNoOutcome.Outcome = ""
	require.Error(t, valid(opNoOutcome), "an operator's record says what it did")

	// Envoy's rate-limit service: the domain and rule; a check that charges
	// nothing (cost 0, no window yet); a limit in shadow mode; a rule of 0
	// requests.
	rls := edge
	rls.Domain, rls.Rule = "messaging", "messaging.message_type_marketing.to_number"
	look := rls
	look.Cost, look.Path, look.ResetAt, look.Used = 0, "reserve", time.Time{}, 0
	shadow := denied
	shadow.Shadow = true
	refused := rls
	refused.Limit, refused.Allowed, refused.Path, refused.Used, refused.ResetAt = 0, false, "rule", 0, time.Time{}
	for name, d := range map[string]events.Decision{"rate-limit service": rls, "a look": look, "shadow": shadow, "a rule of 0": refused} {
		require.NoError(t, valid(d), name)
	}
	bad := refused
	bad.Rule = ""
	require.Error(t, valid(bad), "a rule's decision names the rule")
	bad = rls
	bad.Limit = 0
	require.Error(t, valid(bad), "a limit of 0 is decided by the rule alone")

	// What the schema refuses: an undocumented path or outcome, a raw
	// identity where the digest goes, an edge record without its window.
	bad = edge
	bad.Path = "guess"
	require.Error(t, valid(bad), "unknown path")
	bad = acc
	bad.Outcome = "applied"
	require.Error(t, valid(bad), "unknown outcome")
	bad = acc
	bad.Outcome = ""
	require.Error(t, valid(bad), "an accountant's record says what the event did")
	bad = edge
	bad.ResetAt = time.Time{}
	require.Error(t, valid(bad), "a decided request's window")
	bad = failOpen
	bad.Used = 3
	require.Error(t, valid(bad), "nothing was known of a fail-open admission's window")
	bad = late
	bad.ResetAt = reset
	require.Error(t, valid(bad), "an event that changed nothing names no window")
	bad = finished
	bad.Outcome = "charged"
	require.Error(t, valid(bad), "a finish refunds or waits")
	bad = denied
	bad.Outcome = "refunded"
	require.Error(t, valid(bad), "a denial refunds nothing")
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(bytes.Replace(events.AppendDecision(nil, &edge),
		[]byte(`"key":"`+key+`"`), []byte(`"key":"alice@example.com"`), 1)))
	require.NoError(t, err)
	require.Error(t, schema.Validate(v), "an identity instead of a digest")
}

// Sampling: unset and 1 keep every record, a negative rate none, a share
// about that share.
func TestSampled(t *testing.T) {
	for _, rate := range []float64{0, 1} {
		require.True(t, events.Sampled(rate), rate)
	}
	require.False(t, events.Sampled(-1))
	kept := 0
	for range 10000 {
		if events.Sampled(0.1) {
			kept++
		}
	}
	require.InDelta(t, 1000, kept, 200)
}
