package events

import (
	mrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/internal/limiter"
)

// TypeDecision is the CloudEvents type of a decision record.
const TypeDecision = "dev.tally.decision.v1"

// Decision is one rate-limit decision as analytics consumers read it from
// the decisions stream.
type Decision struct {
	// Time is when the request was decided.
	Time time.Time
	// Source is the deciding edge's CloudEvents source; Edge its producer
	// id; Seq numbers its decisions (with Edge, the event id).
	Source, Edge string
	Seq          uint64
	Shard        string
	// RequestNum numbers the request at its edge: its request id is
	// "<Edge>-<RequestNum>".
	RequestNum  uint64
	TraceParent string
	// Key is the window key's digest; Policy, Limit, WindowSeconds and Cost
	// the terms applied.
	Key           limiter.Digest
	Policy        string
	Limit         int64
	WindowSeconds int64
	Cost          int64
	Allowed       bool
	// Path says how the edge decided: "credit" (from units it had
	// reserved), "reserve" (a reservation on the primary), "cache" (a
	// window known to be full), "borrow" (mode async, over its credit),
	// "fail-open" or "fail-closed" (Redis could not be reached).
	Path string
	// Used and ResetAt are what the response said (an accountant's record:
	// the window after the event).
	Used    int64
	ResetAt time.Time
	// Outcome is set on an accountant's records: what applying an
	// accounting event did (charged, refunded, released, duplicate, late,
	// netted, pending). Path is then "accountant" and Edge the
	// accountant's id; RequestID joins it to the edge's record.
	Outcome string
	// RequestID, when set, is the request id (an accountant's record
	// carries the event's); otherwise it is "<Edge>-<RequestNum>".
	RequestID string
	// Lag is an accountant's record's time from the event's creation to its
	// effect in Redis.
	Lag time.Duration
	// Shadow marks a decision of a limit in shadow mode: Allowed says what
	// the limit decided, and the request was let through whatever it said.
	Shadow bool
	// Until is a backoff denial's Retry-After as a time, a block's end, or
	// (an operator's record) when a temporary limit lifts itself. Strikes counts the requests the
	// client sent before the Retry-After it was given, in a row. Note says
	// who took an operator's action, and why.
	Until   time.Time
	Strikes int
	Note    string
	// Domain and Rule are set on decisions of Envoy's rate-limit service:
	// the request's domain and the full key of the descriptor rule that
	// limited it (envoyproxy/ratelimit's name for it: the domain and each
	// level's key or key_value, joined by dots). The descriptor's values
	// that are not written in the rule are in Key only (hashed).
	Domain, Rule string
}

// AppendDecision appends d as a structured CloudEvent (JSON) to b.
func AppendDecision(b []byte, d *Decision) []byte {
	b = append(b, '{')
	b = appendStringField(b, "specversion", "1.0")
	b = appendField(b, "id")
	b = append(b, '"')
	b = append(b, d.Edge...)
	b = append(b, ".d."...)
	b = strconv.AppendUint(b, d.Seq, 10)
	b = append(b, '"')
	b = appendStringField(b, "source", d.Source)
	b = appendStringField(b, "type", TypeDecision)
	b = appendTimeField(b, "time", d.Time)
	b = append(appendField(b, "subject"), '"')
	b = append(d.Key.AppendHex(b), '"')
	b = appendStringField(b, "datacontenttype", "application/json")
	if d.TraceParent != "" {
		b = appendStringField(b, "traceparent", d.TraceParent)
	}
	b = append(appendField(b, "data"), '{')
	b = append(appendField(b, "key"), '"')
	b = append(d.Key.AppendHex(b), '"')
	b = appendStringField(b, "policy", d.Policy)
	b = appendIntField(b, "limit", d.Limit)
	b = appendIntField(b, "window_s", d.WindowSeconds)
	b = appendIntField(b, "cost", d.Cost)
	b = append(appendField(b, "allowed"), strconv.FormatBool(d.Allowed)...)
	b = appendStringField(b, "path", d.Path)
	b = appendIntField(b, "used", d.Used)
	if !d.ResetAt.IsZero() {
		b = appendTimeField(b, "reset_at", d.ResetAt)
	}
	if d.Outcome != "" {
		b = appendStringField(b, "outcome", d.Outcome)
	}
	if d.Lag > 0 {
		b = append(appendField(b, "lag_ms"), strconv.FormatFloat(float64(d.Lag)/float64(time.Millisecond), 'f', 3, 64)...)
	}
	if d.RequestID != "" {
		b = appendStringField(b, "request_id", d.RequestID)
	} else if d.RequestNum != 0 {
		b = appendStringField(b, "request_id", d.Edge)
		b = strconv.AppendUint(append(b[:len(b)-1], '-'), d.RequestNum, 10)
		b = append(b, '"')
	}
	if d.Shadow {
		b = append(appendField(b, "shadow"), "true"...)
	}
	if !d.Until.IsZero() {
		b = appendTimeField(b, "until", d.Until)
	}
	if d.Strikes > 0 {
		b = appendIntField(b, "strikes", int64(d.Strikes))
	}
	if d.Note != "" {
		b = appendStringField(b, "note", d.Note)
	}
	if d.Rule != "" {
		b = appendStringField(b, "domain", d.Domain)
		b = appendStringField(b, "rule", d.Rule)
	}
	b = appendStringField(b, "edge", d.Edge)
	b = appendStringField(b, "shard", d.Shard)
	return append(b, '}', '}')
}

// Sampled says whether to record one record of a kind sampled at rate: a
// share from 0 to 1, where 0 (unset) and 1 record all and a negative rate
// none.
func Sampled(rate float64) bool {
	return rate == 0 || rate >= 1 || (rate > 0 && mrand.Float64() < rate)
}

// DecisionsMsg wraps a JSON batch body (a JSON array of AppendDecision
// records) as a message on subject.
func DecisionsMsg(subject string, body []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header = nats.Header{HeaderContentType: {ContentTypeBatch}}
	m.Data = body
	return m
}
