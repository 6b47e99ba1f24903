package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
)

// CloudEvents types, versioned: a change that breaks consumers gets a new
// version suffix and both are published until consumers move.
const (
	TypeStarted  = "dev.tally.request.started.v1"
	TypeFinished = "dev.tally.request.finished.v1"
	TypeRejected = "dev.tally.request.rejected.v1"
)

// Kind is the last token of an event's subject: <prefix>.<shard>.<kind>.
type Kind string

const (
	KindStarted  Kind = "started"
	KindFinished Kind = "finished"
	KindRejected Kind = "rejected"
)

var kindOfType = map[string]Kind{TypeStarted: KindStarted, TypeFinished: KindFinished, TypeRejected: KindRejected}
var typeOfKind = map[Kind]string{KindStarted: TypeStarted, KindFinished: TypeFinished, KindRejected: TypeRejected}

// ErrInvalidEvent is wrapped by every decoding and validation error. An
// event that fails to decode will never decode: consumers dead-letter it.
var ErrInvalidEvent = errors.New("events: invalid event")

// Header names. nats.Header is case-sensitive: these exact spellings are the
// contract.
const (
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderTraceParent = "traceparent"
	hSpecVersion      = "ce-specversion"
	hID               = "ce-id"
	hSource           = "ce-source"
	hType             = "ce-type"
	hTime             = "ce-time"
	hSubject          = "ce-subject"
	hContentType      = "ce-datacontenttype"
	hShard            = "ce-tallyshard"
)

// Limits on fields, checked on encode and decode.
const (
	MaxRequestIDLen = 128
	maxSourceLen    = 256
)

var (
	digestRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
	policyRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)
	shardRE  = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)
	idRE     = regexp.MustCompile(`^[A-Za-z0-9._:-]+$`)
)

// Request is the data of every event type: what the accountant needs to
// charge or refund, and what analytics needs to explain a decision.
type Request struct {
	// RequestID names the request. The charge and the refund of one request
	// carry the same RequestID; their event ids differ.
	RequestID string `json:"request_id"`
	// Key is the window key's digest (32 hex): never the identity.
	Key string `json:"key"`
	// Policy is the policy name; Limit, WindowSeconds and Cost its terms
	// for this request.
	Policy        string `json:"policy"`
	Limit         int64  `json:"limit"`
	WindowSeconds int64  `json:"window_s"`
	Cost          int64  `json:"cost"`
	// StartedAt is when the request started (the window it is charged to).
	StartedAt time.Time `json:"started_at"`
	// Status is the response status; finished events only.
	Status int `json:"status,omitempty"`
	// Used and ResetAt are what the deciding read saw (rejected events, and
	// started events for telemetry).
	Used    int64     `json:"used,omitempty"`
	ResetAt time.Time `json:"reset_at,omitzero"`
}

// Event is one Tally event.
type Event struct {
	// ID is the CloudEvents id and the JetStream Nats-Msg-Id:
	// "<request id>.<kind>", so a request's start and finish differ.
	ID     string
	Kind   Kind
	Source string // who published: "edge-checker/<host>", a service name
	Time   time.Time
	Shard  string
	Data   Request
	// TraceParent is the W3C trace context of the request, when traced.
	TraceParent string
}

// EventID is the event id of a request's event of a kind.
func EventID(requestID string, k Kind) string { return requestID + "." + string(k) }

// Subject is where an event of a kind for a shard is published.
func Subject(prefix, shard string, k Kind) string { return prefix + "." + shard + "." + string(k) }

// Validate reports the first problem with e, wrapping ErrInvalidEvent.
func (e Event) Validate() error {
	d := e.Data
	switch {
	case typeOfKind[e.Kind] == "":
		return fmt.Errorf("%w: kind %q", ErrInvalidEvent, e.Kind)
	case e.ID != EventID(d.RequestID, e.Kind):
		return fmt.Errorf("%w: id %q: want %q", ErrInvalidEvent, clip(e.ID), EventID(clip(d.RequestID), e.Kind))
	case len(d.RequestID) < 1 || len(d.RequestID) > MaxRequestIDLen || !idRE.MatchString(d.RequestID):
		return fmt.Errorf("%w: request_id %q: want 1 to %d of [A-Za-z0-9._:-]", ErrInvalidEvent, clip(d.RequestID), MaxRequestIDLen)
	case e.Source == "" || len(e.Source) > maxSourceLen:
		return fmt.Errorf("%w: source: want 1 to %d bytes", ErrInvalidEvent, maxSourceLen)
	case !shardRE.MatchString(e.Shard):
		return fmt.Errorf("%w: shard %q", ErrInvalidEvent, clip(e.Shard))
	case !digestRE.MatchString(d.Key):
		return fmt.Errorf("%w: key %q: want 32 lower-case hex digits", ErrInvalidEvent, clip(d.Key))
	case !policyRE.MatchString(d.Policy):
		return fmt.Errorf("%w: policy %q", ErrInvalidEvent, clip(d.Policy))
	case d.Limit < 1 || d.Limit > 1_000_000_000:
		return fmt.Errorf("%w: limit %d", ErrInvalidEvent, d.Limit)
	case d.WindowSeconds < 1 || d.WindowSeconds > 366*24*3600:
		return fmt.Errorf("%w: window_s %d", ErrInvalidEvent, d.WindowSeconds)
	case d.Cost < 1 || d.Cost > d.Limit:
		return fmt.Errorf("%w: cost %d: want 1 to the limit", ErrInvalidEvent, d.Cost)
	case d.StartedAt.IsZero() || d.StartedAt.Unix() < 0:
		return fmt.Errorf("%w: started_at missing", ErrInvalidEvent)
	case e.Kind == KindFinished && (d.Status < 100 || d.Status > 599):
		return fmt.Errorf("%w: status %d: want 100 to 599", ErrInvalidEvent, d.Status)
	}
	return nil
}

// Encode renders e as a NATS message in CloudEvents binary mode: attributes
// as ce-* headers, data as the JSON body, Nats-Msg-Id = the event id.
func Encode(prefix string, e Event) (*nats.Msg, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	ce := event.New()
	ce.SetID(e.ID)
	ce.SetSource(e.Source)
	ce.SetType(typeOfKind[e.Kind])
	ce.SetTime(e.Time)
	ce.SetSubject(e.Data.Key)
	ce.SetExtension("tallyshard", e.Shard)
	if err := ce.SetData(event.ApplicationJSON, e.Data); err != nil {
		return nil, fmt.Errorf("events: encode data: %w", err)
	}
	if err := ce.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	m := nats.NewMsg(Subject(prefix, e.Shard, e.Kind))
	m.Header = nats.Header{
		hSpecVersion: {ce.SpecVersion()},
		hID:          {e.ID},
		hSource:      {e.Source},
		hType:        {ce.Type()},
		hTime:        {ce.Time().UTC().Format(time.RFC3339Nano)},
		hSubject:     {e.Data.Key},
		hContentType: {event.ApplicationJSON},
		hShard:       {e.Shard},
		HeaderMsgID:  {e.ID},
	}
	if e.TraceParent != "" {
		m.Header[HeaderTraceParent] = []string{e.TraceParent}
	}
	m.Data = ce.Data()
	return m, nil
}

// Decode reads a binary-mode CloudEvent from a NATS message's headers and
// body and validates it. Errors wrap ErrInvalidEvent.
func Decode(h nats.Header, body []byte) (Event, error) {
	get := func(k string) string {
		if v := h[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if v := get(hSpecVersion); v != event.CloudEventsVersionV1 {
		return Event{}, fmt.Errorf("%w: ce-specversion %q: want 1.0", ErrInvalidEvent, clip(v))
	}
	if ct := get(hContentType); ct != event.ApplicationJSON {
		return Event{}, fmt.Errorf("%w: ce-datacontenttype %q: want application/json", ErrInvalidEvent, clip(ct))
	}
	kind, ok := kindOfType[get(hType)]
	if !ok {
		return Event{}, fmt.Errorf("%w: ce-type %q", ErrInvalidEvent, clip(get(hType)))
	}
	ts, err := time.Parse(time.RFC3339Nano, get(hTime))
	if err != nil {
		return Event{}, fmt.Errorf("%w: ce-time %q", ErrInvalidEvent, clip(get(hTime)))
	}
	e := Event{ID: get(hID), Kind: kind, Source: get(hSource), Time: ts, Shard: get(hShard), TraceParent: get(HeaderTraceParent)}
	if err := json.Unmarshal(body, &e.Data); err != nil {
		return Event{}, fmt.Errorf("%w: data: %v", ErrInvalidEvent, err)
	}
	if err := e.Validate(); err != nil {
		return Event{}, err
	}
	return e, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
