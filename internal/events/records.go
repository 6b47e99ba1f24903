package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// DecisionRecord is one record of the decisions stream as a reader gets it
// back: the Decision its writer appended (AppendDecision), its CloudEvents
// id, and its JSON as the message holds it.
type DecisionRecord struct {
	// Decision is the record's fields. RequestID holds the record's
	// request_id (RequestNum is left zero); Seq is read from an id of the
	// form "<edge>.d.<seq>", else left zero.
	Decision
	// ID is the record's CloudEvents id.
	ID string
	// Raw is the record's JSON, as stored.
	Raw json.RawMessage
}

// wireDecision is a decision record's JSON (docs/decision.schema.json).
type wireDecision struct {
	SpecVersion string    `json:"specversion"`
	ID          string    `json:"id"`
	Source      string    `json:"source"`
	Type        string    `json:"type"`
	Time        time.Time `json:"time"`
	TraceParent string    `json:"traceparent"`
	Data        *struct {
		Key       string    `json:"key"`
		Policy    string    `json:"policy"`
		Limit     int64     `json:"limit"`
		Window    int64     `json:"window_s"`
		Cost      int64     `json:"cost"`
		Allowed   bool      `json:"allowed"`
		Path      string    `json:"path"`
		Used      int64     `json:"used"`
		ResetAt   time.Time `json:"reset_at"`
		Outcome   string    `json:"outcome"`
		LagMS     float64   `json:"lag_ms"`
		RequestID string    `json:"request_id"`
		Shadow    bool      `json:"shadow"`
		Until     time.Time `json:"until"`
		Strikes   int       `json:"strikes"`
		Note      string    `json:"note"`
		Domain    string    `json:"domain"`
		Rule      string    `json:"rule"`
		Edge      string    `json:"edge"`
		Shard     string    `json:"shard"`
	} `json:"data"`
}

// ParseDecisions reads one message of the decisions stream: a JSON array
// of decision records (dev.tally.decision.v1 structured CloudEvents, as
// AppendDecision writes them). Unknown fields are ignored. It fails on a
// body that is not such an array, or a record that is not a decision
// record with a valid key, naming the record.
func ParseDecisions(body []byte) ([]DecisionRecord, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		return nil, fmt.Errorf("decision records: want a JSON array of records: %w", err)
	}
	out := make([]DecisionRecord, 0, len(raws))
	for i, raw := range raws {
		r, err := parseDecision(raw)
		if err != nil {
			return nil, fmt.Errorf("decision record %d: %w", i+1, err)
		}
		out = append(out, r)
	}
	return out, nil
}

func parseDecision(raw json.RawMessage) (DecisionRecord, error) {
	var w wireDecision
	if err := json.Unmarshal(raw, &w); err != nil {
		return DecisionRecord{}, err
	}
	switch {
	case w.SpecVersion != "1.0":
		return DecisionRecord{}, fmt.Errorf("specversion %s: want 1.0", quote(w.SpecVersion))
	case w.Type != TypeDecision:
		return DecisionRecord{}, fmt.Errorf("type %s: want %s", quote(w.Type), TypeDecision)
	case w.Data == nil:
		return DecisionRecord{}, fmt.Errorf("no data")
	}
	dg, err := limiter.ParseDigest(w.Data.Key)
	if err != nil { // not quoted: it could be a secret put in its place
		return DecisionRecord{}, fmt.Errorf("data.key: %d bytes: want 32 lower-case hex digits", len(w.Data.Key))
	}
	d := w.Data
	r := DecisionRecord{ID: w.ID, Raw: append(json.RawMessage(nil), bytes.TrimSpace(raw)...), Decision: Decision{
		Time: w.Time, Source: w.Source, Edge: d.Edge, Shard: d.Shard, TraceParent: w.TraceParent,
		Key: dg, Policy: d.Policy, Limit: d.Limit, WindowSeconds: d.Window, Cost: d.Cost, Allowed: d.Allowed,
		Path: d.Path, Used: d.Used, ResetAt: d.ResetAt, Outcome: d.Outcome, RequestID: d.RequestID,
		Shadow: d.Shadow, Until: d.Until, Strikes: d.Strikes, Note: d.Note, Domain: d.Domain, Rule: d.Rule,
	}}
	if d.LagMS > 0 {
		r.Lag = time.Duration(math.Round(d.LagMS*1000)) * time.Microsecond
	}
	if rest, ok := strings.CutPrefix(w.ID, d.Edge+".d."); ok && d.Edge != "" {
		if n, err := strconv.ParseUint(rest, 10, 64); err == nil {
			r.Seq = n
		}
	}
	return r, nil
}
