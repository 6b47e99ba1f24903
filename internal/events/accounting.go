package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/internal/limiter"
)

// Accounting event types: CloudEvents types, versioned. A change that breaks
// consumers gets a new version and both are accepted until publishers move.
const (
	TypeStarted  = "dev.tally.request.started.v2"
	TypeFinished = "dev.tally.request.finished.v2"
	TypeReleased = "dev.tally.credit.released.v1"
)

// Kind is an accounting event's type.
type Kind uint8

const (
	// Started: a request started; charge its units.
	Started Kind = iota + 1
	// Finished: a request finished with Status; a 304 refunds its charge.
	Finished
	// Released: an edge gives back units it reserved and did not use.
	Released
)

var typeOfKind = [...]string{Started: TypeStarted, Finished: TypeFinished, Released: TypeReleased}

func kindOf(typ string) Kind {
	for k, t := range typeOfKind {
		if t == typ && t != "" {
			return Kind(k)
		}
	}
	return 0
}

// String is the CloudEvents type.
func (k Kind) String() string {
	if int(k) < len(typeOfKind) && typeOfKind[k] != "" {
		return typeOfKind[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// ErrInvalidEvent is wrapped by every decoding and validation error. An
// event that fails to decode will never decode: the accountant dead-letters
// its message.
var ErrInvalidEvent = errors.New("events: invalid event")

// Header names. nats.Header is case-sensitive: these exact spellings are the
// contract.
const (
	HeaderMsgID       = "Nats-Msg-Id"
	HeaderContentType = "Content-Type"
	// ContentTypeBatch is CloudEvents' JSON batch format: a JSON array of
	// structured events.
	ContentTypeBatch = "application/cloudevents-batch+json"
	// ContentTypeEvent is CloudEvents' JSON format: one structured event.
	ContentTypeEvent = "application/cloudevents+json"
	// ContentTypeData is the content type of an event's data: in binary
	// mode, the message's Content-Type.
	ContentTypeData = "application/json"
	// HeaderSpecVersion marks a message in the CloudEvents NATS binding's
	// binary mode: each attribute is a header "ce-<name>", the body is the
	// event's data.
	HeaderSpecVersion = "ce-specversion"
)

// Limits on fields, checked on encode and decode.
const (
	MaxRequestIDLen = 128
	MaxSourceLen    = 256
	// MaxBatch is the most events one message carries.
	MaxBatch = 1024
)

// Accounting is one accounting event: a producer's numbered change to one
// window, as docs/events.md describes it for services that publish their own.
type Accounting struct {
	Kind Kind
	// Producer and Seq identify the event: each producer (an edge-checker
	// process, or a service) numbers its events per shard 1, 2, 3, ... and
	// publishes them in that order, on its own subject (AccountingSubject).
	// The accountant applies each number once.
	Producer string
	Seq      uint64
	// KeyID names the key secret the event's digest was made with
	// (limiter.KeySpace.KeyID): an accountant holding another secret refuses
	// the event.
	KeyID string
	// Source is the CloudEvents source: who published.
	Source string
	// Time is when the event was created; accounting lag counts from it.
	Time time.Time
	// TraceParent is the request's W3C trace context, when traced.
	TraceParent string
	// Key is the window key's digest (32 hex): never the identity.
	Key string
	// Policy, Limit and WindowSeconds are the policy's terms.
	Policy        string
	Limit         int64
	WindowSeconds int64
	// Slices, above 0, says the policy is a sliding window of that many
	// sub-windows of WindowSeconds (limiter.Policy.Slices): the event
	// belongs to the sub-window ResetAt names, or, without ResetAt, the one
	// StartedAt falls in (sub-windows are aligned to the clock).
	Slices int
	// Units is what the event charges, refunds or releases.
	Units int64
	// ResetAt is the window as the response showed it; zero places the
	// event by StartedAt.
	ResetAt   time.Time
	StartedAt time.Time
	// RequestID names the request (optional).
	RequestID string
	// Status is a finished request's response status; only 304 refunds.
	Status int
	// ChargeProducer and ChargeSeq name the started event a Finished event
	// refunds: one of the same producer (ChargeProducer is Producer),
	// numbered before it. Empty: the request was charged by an edge's
	// reservation (ResetAt is then required).
	ChargeProducer string
	ChargeSeq      uint64
}

// Quote quotes a field's value in an error when it is short and made of
// characters that cannot carry a secret's shape (names, ids); anything else
// is described by its length only. Errors end up in logs and dead-letter
// headers: a service that put an API token where a digest belongs must not
// see it written down.
func quote(s string) string {
	if len(s) <= 64 {
		ok := true
		for i := 0; i < len(s); i++ {
			if c := s[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != '-' && c != '/' {
				ok = false
				break
			}
		}
		if ok {
			return strconv.Quote(s)
		}
	}
	return "(" + strconv.Itoa(len(s)) + " bytes, not shown)"
}

// Validate reports the first problem with e, wrapping ErrInvalidEvent.
// Errors never quote a value that may be a secret (see quote).
func (e *Accounting) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	window := time.Duration(e.WindowSeconds) * time.Second
	switch {
	case e.Kind < Started || e.Kind > Released:
		return bad("unknown type")
	case !limiter.ValidProducer(e.Producer):
		return bad("tallyproducer %s: want 1 to %d of [A-Za-z0-9_.-] in dot-separated tokens", quote(e.Producer), limiter.MaxProducerLen)
	case e.Seq < 1 || e.Seq > limiter.MaxSeq:
		return bad("tallyseq %d: want 1 to %d", e.Seq, uint64(limiter.MaxSeq))
	case !validKeyID(e.KeyID):
		return bad("tallykeyid %s: want the 16 hex digits that name the deployment's key secret", quote(e.KeyID))
	case e.Source == "" || len(e.Source) > MaxSourceLen:
		return bad("source: want 1 to %d bytes", MaxSourceLen)
	case e.Time.IsZero():
		return bad("time missing")
	case e.TraceParent != "" && !ValidTraceParent(e.TraceParent):
		return bad("traceparent: want W3C version 00")
	case !validDigest(e.Key):
		return bad("key: want 32 lower-case hex digits (%d bytes given, not shown)", len(e.Key))
	case !limiter.ValidPolicyName(e.Policy):
		return bad("policy %s", quote(e.Policy))
	case e.Limit < 1 || e.Limit > limiter.MaxLimit:
		return bad("limit %d", e.Limit)
	case e.WindowSeconds < 1 || e.WindowSeconds > int64(limiter.MaxSpan/time.Second):
		return bad("window_s %d", e.WindowSeconds)
	case e.Slices != 0 && (e.Slices < 2 || e.Slices > limiter.MaxSlices || int64(e.Slices)*e.WindowSeconds > int64(limiter.MaxWindow/time.Second)):
		return bad("slices %d: want 2 to %d sub-windows of window_s, spanning at most %v", e.Slices, limiter.MaxSlices, limiter.MaxWindow)
	case e.Slices != 0 && !e.ResetAt.IsZero() && e.ResetAt.Unix()%e.WindowSeconds != 0:
		return bad("reset_at: a sliding window's sub-windows end at multiples of window_s")
	case e.Units < 1 || e.Units > limiter.MaxLimit:
		// Not bounded by the limit: a charge may take a window past it (an
		// overdraft), and a release gives back what was reserved under the
		// terms in force then, which may have been lowered since.
		return bad("units %d: want 1 to %d", e.Units, limiter.MaxLimit)
	case e.StartedAt.IsZero() || e.StartedAt.Unix() < 0 || e.StartedAt.UnixMilli() > limiter.MaxMS:
		return bad("started_at missing or out of range")
	case !e.ResetAt.IsZero() && (e.ResetAt.UnixMilli() <= 0 || e.ResetAt.UnixMilli()%1000 != 0 || e.ResetAt.UnixMilli() > limiter.MaxMS):
		return bad("reset_at: want a whole second, before the year 5138")
	case !e.ResetAt.IsZero() && (!e.StartedAt.Before(e.ResetAt) || e.ResetAt.Sub(e.StartedAt) > window+limiter.MaxResetAhead):
		return bad("reset_at: want after started_at, and at most window_s and %v later", limiter.MaxResetAhead)
	case e.RequestID != "" && !validRequestID(e.RequestID):
		return bad("request_id %s: want 1 to %d of [A-Za-z0-9._:-]", quote(e.RequestID), MaxRequestIDLen)
	case e.Kind == Finished && (e.Status < 100 || e.Status > 599):
		return bad("status %d: want 100 to 599", e.Status)
	case e.Kind != Finished && e.Status != 0:
		return bad("status on a %s event", e.Kind)
	case e.Kind != Finished && (e.ChargeProducer != "" || e.ChargeSeq != 0):
		return bad("charge on a %s event", e.Kind)
	case e.ChargeProducer != "" && (e.ChargeProducer != e.Producer || e.ChargeSeq < 1 || e.ChargeSeq >= e.Seq):
		return bad("charge: want an earlier event of the same producer (a producer refunds only its own charges)")
	case e.ChargeProducer == "" && e.ChargeSeq != 0:
		return bad("charge: want a producer and a seq")
	case e.Kind == Released && e.ResetAt.IsZero():
		return bad("reset_at is required on %s", TypeReleased)
	case e.Kind == Finished && e.Status == 304 && e.ChargeProducer == "" && e.ResetAt.IsZero():
		return bad("a 304 without a charge needs reset_at")
	}
	return nil
}

func validKeyID(s string) bool { return len(s) == 16 && limiter.IsLowerHex(s) }

// ID is the event's CloudEvents id: "<producer>.<shard>.<seq>".
func (e *Accounting) ID(shard string) string {
	return e.Producer + "." + shard + "." + strconv.FormatUint(e.Seq, 10)
}

// AccountingSubject is where a producer publishes its accounting events for
// a shard: <prefix>.<shard>.<producer>, the producer id's dot-separated
// tokens being the subject's last tokens. NATS permissions grant a
// publisher the subjects of its own producer ids (deploy/nats), and an
// accountant applies an event only when its producer is the one its
// subject names: nobody can publish as another producer.
func AccountingSubject(prefix, shard, producer string) string {
	return prefix + "." + shard + "." + producer
}

// ShardSubjects is the filter of every producer's subject of a shard.
func ShardSubjects(prefix, shard string) string { return prefix + "." + shard + ".>" }

// ProducerOfSubject is the producer a subject of shard names ("" when it
// names none).
func ProducerOfSubject(prefix, shard, subject string) string {
	p, ok := strings.CutPrefix(subject, prefix+"."+shard+".")
	if !ok || !limiter.ValidProducer(p) {
		return ""
	}
	return p
}

// AppendAccounting appends one event of shard as a structured CloudEvent
// (JSON) to b. It does not validate e.
func AppendAccounting(b []byte, shard string, e *Accounting) []byte {
	b = append(b, '{')
	b = appendStringField(b, "specversion", "1.0")
	b = appendField(b, "id")
	b = append(b, '"')
	b = append(b, e.Producer...)
	b = append(b, '.')
	b = append(b, shard...)
	b = append(b, '.')
	b = strconv.AppendUint(b, e.Seq, 10)
	b = append(b, '"')
	b = appendStringField(b, "source", e.Source)
	b = appendStringField(b, "type", e.Kind.String())
	b = appendTimeField(b, "time", e.Time)
	b = appendStringField(b, "subject", e.Key)
	b = appendStringField(b, "datacontenttype", "application/json")
	b = appendStringField(b, "tallyproducer", e.Producer)
	b = appendUintField(b, "tallyseq", e.Seq)
	b = appendStringField(b, "tallyshard", shard)
	b = appendStringField(b, "tallykeyid", e.KeyID)
	if e.TraceParent != "" {
		b = appendStringField(b, "traceparent", e.TraceParent)
	}
	b = append(appendField(b, "data"), '{')
	b = appendStringField(b, "key", e.Key)
	b = appendStringField(b, "policy", e.Policy)
	b = appendIntField(b, "limit", e.Limit)
	b = appendIntField(b, "window_s", e.WindowSeconds)
	if e.Slices > 0 {
		b = appendIntField(b, "slices", int64(e.Slices))
	}
	b = appendIntField(b, "units", e.Units)
	b = appendTimeField(b, "started_at", e.StartedAt)
	if !e.ResetAt.IsZero() {
		b = appendTimeField(b, "reset_at", e.ResetAt)
	}
	if e.RequestID != "" {
		b = appendStringField(b, "request_id", e.RequestID)
	}
	if e.Kind == Finished {
		b = appendIntField(b, "status", int64(e.Status))
	}
	if e.ChargeProducer != "" {
		b = append(appendField(b, "charge"), '{')
		b = appendStringField(b, "producer", e.ChargeProducer)
		b = appendUintField(b, "seq", e.ChargeSeq)
		b = append(b, '}')
	}
	return append(b, '}', '}')
}

// AccountingMsg renders events of one producer for one shard as one NATS
// message in CloudEvents' JSON batch format, on the shard's subject, with a
// Nats-Msg-Id naming the producer and the first and last sequence (so that
// JetStream drops a repeated publish). buf is reused for the body when it
// is large enough. Every event is validated first; errors wrap
// ErrInvalidEvent.
func AccountingMsg(prefix, shard string, evs []Accounting, buf []byte) (*nats.Msg, error) {
	if len(evs) == 0 || len(evs) > MaxBatch {
		return nil, fmt.Errorf("%w: %d events in a batch: want 1 to %d", ErrInvalidEvent, len(evs), MaxBatch)
	}
	if !validShard(shard) {
		return nil, fmt.Errorf("%w: shard %q", ErrInvalidEvent, clip(shard))
	}
	b := append(buf[:0], '[')
	for i := range evs {
		if err := evs[i].Validate(); err != nil {
			return nil, err
		}
		if evs[i].Producer != evs[0].Producer {
			return nil, fmt.Errorf("%w: one producer per batch", ErrInvalidEvent)
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = AppendAccounting(b, shard, &evs[i])
	}
	b = append(b, ']')
	first, last := evs[0], evs[len(evs)-1]
	m := nats.NewMsg(AccountingSubject(prefix, shard, first.Producer))
	m.Header = nats.Header{
		HeaderMsgID:       {first.ID(shard) + "-" + strconv.FormatUint(last.Seq, 10)},
		HeaderContentType: {ContentTypeBatch},
	}
	m.Data = b
	return m, nil
}

// AccountingOf is the event that carries entry e, numbered seq of
// producer, with the key id and source of its publisher: the wire form of
// what an edge's decision core leaves to account for.
func AccountingOf(e limiter.Entry, producer string, seq uint64, source, keyID string) Accounting {
	reset, window := e.Placed()
	a := Accounting{Producer: producer, Seq: seq, KeyID: keyID, Source: source, Time: e.Time, TraceParent: e.TraceParent,
		Key: e.Key.Digest().String(), Policy: e.Policy.Name, Limit: e.Policy.Limit,
		WindowSeconds: int64(window / time.Second), Slices: e.Policy.Slices, Units: e.Units, ResetAt: reset, StartedAt: e.Start,
		RequestID: e.RequestID}
	switch e.Kind {
	case limiter.Charge:
		a.Kind = Started
	case limiter.Release:
		a.Kind = Released
	case limiter.Refund:
		a.Kind, a.Status = Finished, 304
		if e.ChargeSeq != 0 {
			a.ChargeProducer, a.ChargeSeq = producer, e.ChargeSeq
		}
	}
	return a
}

// Op is the window operation e asks for, with its key rebuilt in keys; ok
// is false for a finish with nothing to refund (any status but 304).
func (e *Accounting) Op(keys *limiter.KeySpace) (op limiter.Event, ok bool, err error) {
	k, err := keys.KeyFromDigest(e.Key)
	if err != nil {
		return op, false, fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	op = limiter.Event{Producer: e.Producer, Seq: e.Seq, Key: k, ResetAt: e.ResetAt, Start: e.StartedAt,
		Window: time.Duration(e.WindowSeconds) * time.Second, Units: e.Units, Slices: e.Slices}
	if e.Slices > 0 && e.ResetAt.IsZero() {
		// The sub-window the start falls in: they are aligned to the clock.
		op.ResetAt = limiter.Policy{Window: op.Window, Align: true}.WindowAt(e.StartedAt).ResetAt
	}
	switch {
	case e.Kind == Started:
		op.Kind = limiter.Charge
	case e.Kind == Released:
		op.Kind = limiter.Release
	case e.Kind == Finished && e.Status == 304:
		op.Kind, op.RefProducer, op.RefSeq = limiter.Refund, e.ChargeProducer, e.ChargeSeq
	default:
		return op, false, nil
	}
	return op, true, nil
}

// ValidTraceParent reports whether s is a W3C traceparent of version 00:
// "00-" 32 hex "-" 16 hex "-" 2 hex, lower case, ids not all zero.
func ValidTraceParent(s string) bool {
	if len(s) != 55 || s[0] != '0' || s[1] != '0' || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return false
	}
	return limiter.IsLowerHex(s[3:35]) && limiter.IsLowerHex(s[36:52]) && limiter.IsLowerHex(s[53:55]) &&
		s[3:35] != "00000000000000000000000000000000" && s[36:52] != "0000000000000000"
}

func validDigest(s string) bool { return len(s) == 32 && limiter.IsLowerHex(s) }

// validShard reports whether s can name a shard in a subject: 1 to 32 of
// [a-z0-9_-] (shard.Validate's rule).
func validShard(s string) bool {
	if len(s) < 1 || len(s) > 32 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func validRequestID(s string) bool {
	if len(s) < 1 || len(s) > MaxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '.' && c != '_' && c != ':' && c != '-' {
			return false
		}
	}
	return true
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
