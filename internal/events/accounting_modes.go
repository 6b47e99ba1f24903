package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// This file reads accounting events in each of the CloudEvents NATS
// binding's modes (a batch, one structured event, binary mode) and writes
// one in binary mode; accounting.go has the event, its rules and the batch.

// wireEvent is a structured CloudEvent as DecodeAccounting reads it.
type wireEvent struct {
	SpecVersion     string    `json:"specversion"`
	ID              string    `json:"id"`
	Source          string    `json:"source"`
	Type            string    `json:"type"`
	Time            time.Time `json:"time"`
	Subject         string    `json:"subject"`
	DataContentType string    `json:"datacontenttype"`
	Producer        string    `json:"tallyproducer"`
	Seq             uint64    `json:"tallyseq"`
	Shard           string    `json:"tallyshard"`
	KeyID           string    `json:"tallykeyid"`
	TraceParent     string    `json:"traceparent"`
	Data            struct {
		Key       string    `json:"key"`
		Policy    string    `json:"policy"`
		Limit     int64     `json:"limit"`
		Window    int64     `json:"window_s"`
		Slices    int       `json:"slices"`
		Units     int64     `json:"units"`
		StartedAt time.Time `json:"started_at"`
		ResetAt   time.Time `json:"reset_at"`
		RequestID string    `json:"request_id"`
		Status    int       `json:"status"`
		Charge    *struct {
			Producer string `json:"producer"`
			Seq      uint64 `json:"seq"`
		} `json:"charge"`
	} `json:"data"`
}

// DecodeAccounting reads a message that producer published to shard's
// subject (AccountingSubject), in any of the CloudEvents NATS binding's
// modes, told apart by its headers (h may be nil):
//
//	ce-specversion header       binary mode: one event, its attributes in
//	                            ce-* headers, its data the body
//	Content-Type ContentTypeBatch  a JSON array of structured events
//	Content-Type ContentTypeEvent  one structured event
//	neither                     a JSON array or one JSON object, by its
//	                            first character
//
// Every event is validated, and all are that producer's, in increasing
// sequence. A traceparent that is not a valid W3C one is dropped (the event
// is applied without it). Errors wrap ErrInvalidEvent and name the first
// problem, never quoting a value that may be a secret.
func DecodeAccounting(shard, producer string, h nats.Header, body []byte) ([]Accounting, error) {
	var wire []wireEvent
	ct := ""
	if h != nil {
		ct = h.Get(HeaderContentType)
	}
	first := firstNonSpace(body)
	switch {
	case h != nil && h.Get(HeaderSpecVersion) != "":
		w, err := binaryEvent(h, body)
		if err != nil {
			return nil, err
		}
		wire = []wireEvent{w}
	case ct == ContentTypeBatch || (ct == "" && (first >= len(body) || body[first] != '{')):
		if err := json.Unmarshal(body, &wire); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidEvent, ContentTypeBatch, err)
		}
	case ct == ContentTypeEvent || ct == "":
		wire = make([]wireEvent, 1)
		if err := json.Unmarshal(body, &wire[0]); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalidEvent, ContentTypeEvent, err)
		}
	default:
		return nil, fmt.Errorf("%w: Content-Type %s: want %s, %s, or ce-* headers with the data as %s", ErrInvalidEvent,
			quote(ct), ContentTypeBatch, ContentTypeEvent, ContentTypeData)
	}
	if len(wire) == 0 || len(wire) > MaxBatch {
		return nil, fmt.Errorf("%w: %d events in a batch: want 1 to %d", ErrInvalidEvent, len(wire), MaxBatch)
	}
	out := make([]Accounting, len(wire))
	for i := range wire {
		w := &wire[i]
		e := &out[i]
		if !ValidTraceParent(w.TraceParent) {
			w.TraceParent = ""
		}
		*e = Accounting{Kind: kindOf(w.Type), Producer: w.Producer, Seq: w.Seq, KeyID: w.KeyID, Source: w.Source, Time: w.Time,
			TraceParent: w.TraceParent, Key: w.Data.Key, Policy: w.Data.Policy, Limit: w.Data.Limit,
			WindowSeconds: w.Data.Window, Slices: w.Data.Slices, Units: w.Data.Units, ResetAt: w.Data.ResetAt, StartedAt: w.Data.StartedAt,
			RequestID: w.Data.RequestID, Status: w.Data.Status}
		if c := w.Data.Charge; c != nil {
			e.ChargeProducer, e.ChargeSeq = c.Producer, c.Seq
		}
		// where names the event in a reason as the accountant's checks do:
		// "events: invalid event: event 2: …", one order for every reason.
		where := func(err error) error {
			return fmt.Errorf("%w: event %d: %s", ErrInvalidEvent, i+1, strings.TrimPrefix(err.Error(), ErrInvalidEvent.Error()+": "))
		}
		switch {
		case w.SpecVersion != "1.0":
			return nil, where(fmt.Errorf("%w: specversion %s: want 1.0", ErrInvalidEvent, quote(w.SpecVersion)))
		case e.Kind == 0:
			return nil, where(fmt.Errorf("%w: type %s", ErrInvalidEvent, quote(w.Type)))
		case w.ID == "" || len(w.ID) > MaxSourceLen:
			return nil, where(fmt.Errorf("%w: id: want 1 to %d bytes", ErrInvalidEvent, MaxSourceLen))
		case w.DataContentType != "" && w.DataContentType != ContentTypeData:
			return nil, where(fmt.Errorf("%w: datacontenttype %s: want %s", ErrInvalidEvent, quote(w.DataContentType), ContentTypeData))
		case w.Shard != shard:
			return nil, where(fmt.Errorf("%w: tallyshard %s on shard %s's subject", ErrInvalidEvent, quote(w.Shard), shard))
		case e.Producer != producer:
			return nil, where(fmt.Errorf("%w: tallyproducer %s published on the subject of producer %s: a producer publishes on its own subject only",
				ErrInvalidEvent, quote(e.Producer), quote(producer)))
		case w.Subject != "" && w.Subject != w.Data.Key:
			return nil, where(fmt.Errorf("%w: subject and data.key differ", ErrInvalidEvent))
		case i > 0 && (e.Producer != out[0].Producer || e.Seq <= out[i-1].Seq):
			return nil, where(fmt.Errorf("%w: a batch holds one producer's events in increasing tallyseq", ErrInvalidEvent))
		}
		if err := e.Validate(); err != nil {
			return nil, where(err)
		}
	}
	return out, nil
}

// binaryEvent reads one event in binary mode: attributes from the ce-*
// headers (exact lower-case names: nats.Header is case-sensitive), data
// from the body, datacontenttype from Content-Type.
func binaryEvent(h nats.Header, body []byte) (wireEvent, error) {
	w := wireEvent{SpecVersion: h.Get(HeaderSpecVersion), ID: h.Get("ce-id"), Source: h.Get("ce-source"), Type: h.Get("ce-type"),
		Subject: h.Get("ce-subject"), DataContentType: h.Get(HeaderContentType), Producer: h.Get("ce-tallyproducer"),
		Shard: h.Get("ce-tallyshard"), KeyID: h.Get("ce-tallykeyid"), TraceParent: h.Get("ce-traceparent")}
	if w.DataContentType == "" {
		w.DataContentType = h.Get("ce-datacontenttype")
	}
	if w.TraceParent == "" {
		w.TraceParent = h.Get("traceparent")
	}
	bad := func(format string, args ...any) (wireEvent, error) {
		return wireEvent{}, fmt.Errorf("%w: binary mode: %s", ErrInvalidEvent, fmt.Sprintf(format, args...))
	}
	seq := h.Get("ce-tallyseq")
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return bad("ce-tallyseq %s: want a decimal number", quote(seq))
	}
	w.Seq = n
	if t := h.Get("ce-time"); t != "" {
		if w.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return bad("ce-time %s: want RFC 3339", quote(t))
		}
	}
	if err := json.Unmarshal(body, &w.Data); err != nil {
		return bad("data: %v", err)
	}
	return w, nil
}

// AccountingEventMsg renders one event of shard as a NATS message in the
// CloudEvents NATS binding's binary mode (attributes in ce-* headers, the
// data as the body), with the Nats-Msg-Id of a batch of one. The event is
// validated first; errors wrap ErrInvalidEvent.
func AccountingEventMsg(prefix, shard string, e *Accounting) (*nats.Msg, error) {
	if !validShard(shard) {
		return nil, fmt.Errorf("%w: shard %q", ErrInvalidEvent, clip(shard))
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	m := nats.NewMsg(AccountingSubject(prefix, shard, e.Producer))
	m.Header = nats.Header{
		HeaderMsgID:        {e.ID(shard) + "-" + strconv.FormatUint(e.Seq, 10)},
		HeaderContentType:  {ContentTypeData},
		HeaderSpecVersion:  {"1.0"},
		"ce-id":            {e.ID(shard)},
		"ce-source":        {e.Source},
		"ce-type":          {e.Kind.String()},
		"ce-time":          {e.Time.UTC().Format(time.RFC3339Nano)},
		"ce-subject":       {e.Key},
		"ce-tallyproducer": {e.Producer},
		"ce-tallyseq":      {strconv.FormatUint(e.Seq, 10)},
		"ce-tallyshard":    {shard},
		"ce-tallykeyid":    {e.KeyID},
	}
	if e.TraceParent != "" {
		m.Header["ce-traceparent"] = []string{e.TraceParent}
	}
	// The data is the structured form's data member.
	full := AppendAccounting(nil, shard, e)
	i := bytes.Index(full, []byte(`"data":`))
	m.Data = full[i+len(`"data":`) : len(full)-1]
	return m, nil
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return i
		}
	}
	return len(b)
}
