package events_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

var (
	at    = time.Date(2026, 11, 21, 10, 0, 0, 123_000_000, time.UTC)
	reset = time.Date(2026, 11, 21, 10, 1, 1, 0, time.UTC)
	key   = strings.Repeat("ab", 16)
	tp    = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	keyID = "0123456789abcdef"
)

func sample(kind events.Kind, seq uint64) events.Accounting {
	e := events.Accounting{Kind: kind, Producer: "edge.7f3a", Seq: seq, KeyID: keyID, Source: "edge-checker/host-1", Time: at,
		TraceParent: tp, Key: key, Policy: "core", Limit: 100, WindowSeconds: 60, Units: 2,
		ResetAt: reset, StartedAt: at.Add(-time.Millisecond), RequestID: "edge.7f3a-42"}
	switch kind {
	case events.Finished:
		e.Status, e.ChargeProducer, e.ChargeSeq = 304, "edge.7f3a", seq-1
	case events.Released:
		e.RequestID, e.TraceParent = "", ""
	}
	return e
}

func TestAccountingRoundTrip(t *testing.T) {
	batch := []events.Accounting{sample(events.Started, 1), sample(events.Finished, 2), sample(events.Released, 3)}
	batch[1].ChargeProducer, batch[1].ChargeSeq = "", 0 // refund of a reservation
	m, err := events.AccountingMsg("tally.accounting", "s0", batch, nil)
	require.NoError(t, err)
	require.Equal(t, "tally.accounting.s0.edge.7f3a", m.Subject, "the producer's own subject")
	require.Equal(t, "edge.7f3a", events.ProducerOfSubject("tally.accounting", "s0", m.Subject))
	require.Equal(t, "edge.7f3a.s0.1-3", m.Header.Get(events.HeaderMsgID))
	require.Equal(t, events.ContentTypeBatch, m.Header.Get(events.HeaderContentType))

	got, err := events.DecodeAccounting("s0", "edge.7f3a", m.Header, m.Data)
	require.NoError(t, err)
	require.Len(t, got, 3)
	for i := range batch {
		require.True(t, batch[i].Time.Equal(got[i].Time))
		require.True(t, batch[i].StartedAt.Equal(got[i].StartedAt))
		require.True(t, batch[i].ResetAt.Equal(got[i].ResetAt))
		got[i].Time, got[i].StartedAt, got[i].ResetAt = batch[i].Time, batch[i].StartedAt, batch[i].ResetAt
		require.Equal(t, batch[i], got[i])
	}

	// Every element is a valid CloudEvent to the CloudEvents SDK, with the
	// documented type, id, subject and extensions.
	var ces []event.Event
	require.NoError(t, json.Unmarshal(m.Data, &ces))
	require.Len(t, ces, 3)
	for i, ce := range ces {
		require.NoError(t, ce.Validate())
		require.Equal(t, batch[i].Kind.String(), ce.Type())
		require.Equal(t, batch[i].ID("s0"), ce.ID())
		require.Equal(t, key, ce.Subject())
		require.Equal(t, "edge.7f3a", ce.Extensions()["tallyproducer"])
		require.Equal(t, "s0", ce.Extensions()["tallyshard"])
		require.Equal(t, keyID, ce.Extensions()["tallykeyid"])
		require.Equal(t, "application/json", ce.DataContentType())
	}
	require.Equal(t, tp, ces[0].Extensions()["traceparent"])
	require.JSONEq(t, `{"key":"`+key+`","policy":"core","limit":100,"window_s":60,"units":2,
		"started_at":"2026-11-21T10:00:00.122000Z","reset_at":"2026-11-21T10:01:01.000000Z","request_id":"edge.7f3a-42"}`, string(ces[0].Data()))

	// One structured event (not a batch) decodes too.
	one := events.AppendAccounting(nil, "s0", &batch[0])
	got, err = events.DecodeAccounting("s0", "edge.7f3a", nil, one)
	require.NoError(t, err)
	require.Len(t, got, 1)

	// A traceparent that is not a valid one is dropped, not a reason to
	// refuse the events.
	bad := strings.Replace(string(one), tp, "00-"+strings.Repeat("x", 52), 1)
	got, err = events.DecodeAccounting("s0", "edge.7f3a", nil, []byte(bad))
	require.NoError(t, err)
	require.Empty(t, got[0].TraceParent)
}

// Accounting events arrive in the CloudEvents NATS binding's binary mode,
// as one structured event, or as a batch; the headers say which, and a body
// that does not match its declared mode is refused.
func TestAccountingModes(t *testing.T) {
	refund := sample(events.Finished, 7)
	m, err := events.AccountingEventMsg("tally.accounting", "s0", &refund)
	require.NoError(t, err)
	require.Equal(t, "tally.accounting.s0.edge.7f3a", m.Subject)
	require.Equal(t, "edge.7f3a.s0.7-7", m.Header.Get(events.HeaderMsgID))
	require.Equal(t, events.ContentTypeData, m.Header.Get(events.HeaderContentType))
	for h, want := range map[string]string{"ce-specversion": "1.0", "ce-id": "edge.7f3a.s0.7", "ce-type": "dev.tally.request.finished.v2",
		"ce-source": refund.Source, "ce-subject": key, "ce-tallyproducer": "edge.7f3a", "ce-tallyseq": "7", "ce-tallyshard": "s0",
		"ce-tallykeyid": keyID, "ce-traceparent": tp} {
		require.Equal(t, want, m.Header.Get(h), h)
	}
	require.JSONEq(t, `{"key":"`+key+`","policy":"core","limit":100,"window_s":60,"units":2,
		"started_at":"2026-11-21T10:00:00.122000Z","reset_at":"2026-11-21T10:01:01.000000Z","request_id":"edge.7f3a-42",
		"status":304,"charge":{"producer":"edge.7f3a","seq":6}}`, string(m.Data))
	got, err := events.DecodeAccounting("s0", "edge.7f3a", m.Header, m.Data)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.True(t, refund.Time.Equal(got[0].Time))
	got[0].Time, got[0].StartedAt, got[0].ResetAt = refund.Time, refund.StartedAt, refund.ResetAt
	require.Equal(t, refund, got[0])

	// Binary mode is held to the same contract as the other modes.
	for name, change := range map[string]func(nats.Header) []byte{
		"another producer":   func(h nats.Header) []byte { h.Set("ce-tallyproducer", "edge.other"); return m.Data },
		"another shard":      func(h nats.Header) []byte { h.Set("ce-tallyshard", "s1"); return m.Data },
		"seq not a number":   func(h nats.Header) []byte { h.Set("ce-tallyseq", "7a"); return m.Data },
		"no specversion 1.0": func(h nats.Header) []byte { h.Set("ce-specversion", "0.3"); return m.Data },
		"data not JSON":      func(h nats.Header) []byte { h.Set(events.HeaderContentType, "text/plain"); return m.Data },
		"bad time":           func(h nats.Header) []byte { h.Set("ce-time", "yesterday"); return m.Data },
		"bad body":           func(h nats.Header) []byte { return []byte("[1]") },
		"subject not the key": func(h nats.Header) []byte {
			h.Set("ce-subject", strings.Repeat("0", 32))
			return m.Data
		},
	} {
		h := nats.Header{}
		for k, v := range m.Header {
			h[k] = append([]string(nil), v...)
		}
		body := change(h)
		_, err := events.DecodeAccounting("s0", "edge.7f3a", h, body)
		require.ErrorIs(t, err, events.ErrInvalidEvent, name)
	}

	// Structured: one event, declared as such; a batch's content type on
	// an object, or an event's on an array, is refused.
	one := events.AppendAccounting(nil, "s0", &refund)
	got, err = events.DecodeAccounting("s0", "edge.7f3a", nats.Header{events.HeaderContentType: {events.ContentTypeEvent}}, one)
	require.NoError(t, err)
	require.Len(t, got, 1)
	_, err = events.DecodeAccounting("s0", "edge.7f3a", nats.Header{events.HeaderContentType: {events.ContentTypeBatch}}, one)
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	batch := append(append([]byte{'['}, one...), ']')
	_, err = events.DecodeAccounting("s0", "edge.7f3a", nats.Header{events.HeaderContentType: {events.ContentTypeEvent}}, batch)
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	got, err = events.DecodeAccounting("s0", "edge.7f3a", nats.Header{events.HeaderContentType: {events.ContentTypeBatch}}, batch)
	require.NoError(t, err)
	require.Len(t, got, 1)
	_, err = events.DecodeAccounting("s0", "edge.7f3a", nats.Header{events.HeaderContentType: {"application/xml"}}, batch)
	require.ErrorContains(t, err, "Content-Type")
}

// Subjects name producers: a subject that names none, or a producer id
// whose tokens could not be a subject's, is no producer's.
func TestProducerOfSubject(t *testing.T) {
	for subject, want := range map[string]string{
		"tally.accounting.s0.billing":       "billing",
		"tally.accounting.s0.billing.7":     "billing.7",
		"tally.accounting.s0":               "",
		"tally.accounting.s1.billing":       "",
		"tally.accounting.s0.":              "",
		"tally.accounting.s0.a..b":          "",
		"tally.accounting.s0.a b":           "",
		"tally.accountingX.s0.billing":      "",
		"other.accounting.s0.edge.1234abcd": "",
	} {
		require.Equal(t, want, events.ProducerOfSubject("tally.accounting", "s0", subject), subject)
	}
}

func TestAccountingRejects(t *testing.T) {
	for name, c := range map[string]struct {
		mutate func(e *events.Accounting)
		want   string
	}{
		"bad producer":            {func(e *events.Accounting) { e.Producer = "a b" }, "tallyproducer"},
		"producer with a dot end": {func(e *events.Accounting) { e.Producer = "edge." }, "tallyproducer"},
		"zero seq":                {func(e *events.Accounting) { e.Seq = 0 }, "tallyseq"},
		"no key id":               {func(e *events.Accounting) { e.KeyID = "" }, "tallykeyid"},
		"reset before the start":  {func(e *events.Accounting) { e.StartedAt = reset }, "reset_at"},
		"reset far after start":   {func(e *events.Accounting) { e.StartedAt = reset.Add(-62*time.Second - time.Minute) }, "reset_at"},
		"reset beyond the scripts": {func(e *events.Accounting) {
			e.StartedAt, e.ResetAt = time.UnixMilli(limiter.MaxMS-1000), time.UnixMilli(limiter.MaxMS+60000)
		}, "reset_at"},
		"refund of another producer's charge": {func(e *events.Accounting) {
			e.Kind, e.Status, e.ChargeProducer, e.ChargeSeq, e.Seq = events.Finished, 304, "billing", 1, 2
		}, "charge"},
		"refund of a later charge": {func(e *events.Accounting) {
			e.Kind, e.Status, e.ChargeProducer, e.ChargeSeq = events.Finished, 304, e.Producer, 2
		}, "charge"},
		"no source":               {func(e *events.Accounting) { e.Source = "" }, "source"},
		"bad traceparent":         {func(e *events.Accounting) { e.TraceParent = "00-" + strings.Repeat("x", 52) }, "traceparent"},
		"long traceparent":        {func(e *events.Accounting) { e.TraceParent = tp + strings.Repeat("0", 16<<10) }, "traceparent"},
		"identity as key":         {func(e *events.Accounting) { e.Key = "alice" }, "key"},
		"bad policy":              {func(e *events.Accounting) { e.Policy = "Core" }, "policy"},
		"zero limit":              {func(e *events.Accounting) { e.Limit = 0 }, "limit"},
		"huge window":             {func(e *events.Accounting) { e.WindowSeconds = 400 * 86400 }, "window_s"},
		"units over 10^9":         {func(e *events.Accounting) { e.Units = limiter.MaxLimit + 1 }, "units"},
		"no start":                {func(e *events.Accounting) { e.StartedAt = time.Time{} }, "started_at"},
		"fractional reset":        {func(e *events.Accounting) { e.ResetAt = reset.Add(time.Millisecond) }, "reset_at"},
		"bad request id":          {func(e *events.Accounting) { e.RequestID = "a/b" }, "request_id"},
		"status on a start":       {func(e *events.Accounting) { e.Status = 200 }, "status"},
		"charge on a start":       {func(e *events.Accounting) { e.ChargeProducer, e.ChargeSeq = "p", 1 }, "charge"},
		"release without a reset": {func(e *events.Accounting) { e.Kind, e.ResetAt = events.Released, time.Time{} }, "reset_at"},
	} {
		t.Run(name, func(t *testing.T) {
			e := sample(events.Started, 1)
			c.mutate(&e)
			_, err := events.AccountingMsg("tally.accounting", "s0", []events.Accounting{e}, nil)
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			require.ErrorContains(t, err, c.want)
			// The same problem in a message published by someone else is
			// refused by the decoder.
			body := string(events.AppendAccounting([]byte("["), "s0", &e)) + "]"
			if e.Status != 0 { // the encoder writes status on finished events only
				body = strings.Replace(body, `"units":`, `"status":200,"units":`, 1)
			}
			got, err := events.DecodeAccounting("s0", "edge.7f3a", nil, []byte(body))
			if strings.Contains(name, "traceparent") { // dropped, not refused
				require.NoError(t, err)
				require.Empty(t, got[0].TraceParent)
				return
			}
			require.ErrorIs(t, err, events.ErrInvalidEvent)
			// One order for every reason (the accountant's own checks say
			// the same): what is wrong, then which event, then why.
			require.True(t, strings.HasPrefix(err.Error(), "events: invalid event: event 1: "), "%v", err)
			require.ErrorContains(t, err, c.want)
		})
	}
	good := events.AppendAccounting(nil, "s0", ptr(sample(events.Started, 1)))
	for name, body := range map[string]string{
		"not json":         `{`,
		"empty batch":      `[]`,
		"not an object":    `[1]`,
		"wrong shard":      string(events.AppendAccounting(nil, "s1", ptr(sample(events.Started, 1)))),
		"unknown type":     strings.Replace(string(good), events.TypeStarted, "dev.tally.request.started.v1", 1),
		"spec version":     strings.Replace(string(good), `"specversion":"1.0"`, `"specversion":"0.3"`, 1),
		"content type":     strings.Replace(string(good), `"datacontenttype":"application/json"`, `"datacontenttype":"text/plain"`, 1),
		"subject mismatch": strings.Replace(string(good), `"subject":"`+key, `"subject":"`+strings.Repeat("cd", 16), 1),
		"out of order":     "[" + string(events.AppendAccounting(nil, "s0", ptr(sample(events.Started, 2)))) + "," + string(good) + "]",
		"two producers": "[" + string(good) + "," + strings.ReplaceAll(string(events.AppendAccounting(nil, "s0",
			ptr(sample(events.Started, 2)))), "edge.7f3a", "edge.other") + "]",
		"another producer's events": strings.ReplaceAll(string(good), "edge.7f3a", "edge.other"),
	} {
		_, err := events.DecodeAccounting("s0", "edge.7f3a", nil, []byte(body))
		require.ErrorIs(t, err, events.ErrInvalidEvent, name)
	}
	// An error never quotes what may be a secret: a token a service put
	// where the digest belongs.
	token := "Bearer sk_live_0123456789abcdef"
	body := strings.Replace(string(good), `"key":"`+key, `"key":"`+token, 1)
	_, err := events.DecodeAccounting("s0", "edge.7f3a", nil, []byte(body))
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	require.NotContains(t, err.Error(), "sk_live")
	_, err = events.AccountingMsg("tally.accounting", "S0", []events.Accounting{sample(events.Started, 1)}, nil)
	require.ErrorIs(t, err, events.ErrInvalidEvent, "shard names are subject tokens")
}

func ptr[T any](v T) *T { return &v }

func TestTraceParent(t *testing.T) {
	require.True(t, events.ValidTraceParent(tp))
	for _, bad := range []string{"", tp[:54], tp + "0", "01" + tp[2:], strings.ToUpper(tp),
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		strings.Replace(tp, "-", "_", 1)} {
		require.False(t, events.ValidTraceParent(bad), bad)
	}
}

// Notices are signed and recent: a notice from anyone without the
// deployment's secret, altered, or sent again long after, is refused.
func TestNotices(t *testing.T) {
	ns := events.NewNotices([]byte("notice-key-0123456789abcdef012345"))
	now := time.Now()
	var b []byte
	b = ns.Append(b, events.Notice{Full: true, Key: key, ResetAt: reset, Used: 100}, now)
	b = ns.Append(b, events.Notice{Key: key, ResetAt: reset, Used: 97}, now)
	got, err := ns.Decode(b, now.Add(time.Second))
	require.NoError(t, err)
	require.Equal(t, []events.Notice{{Full: true, Key: key, ResetAt: reset, Used: 100}, {Key: key, ResetAt: reset, Used: 97}},
		[]events.Notice{{Full: got[0].Full, Key: got[0].Key, ResetAt: got[0].ResetAt.UTC(), Used: got[0].Used},
			{Full: got[1].Full, Key: got[1].Key, ResetAt: got[1].ResetAt.UTC(), Used: got[1].Used}})

	forger := events.NewNotices([]byte("someone-else-0123456789abcdef0123"))
	good := string(ns.Append(nil, events.Notice{Key: key, ResetAt: reset, Used: 0}, now))
	for name, bad := range map[string]string{
		"unsigned (the old format)": "room " + key + " " + fmt.Sprint(reset.UnixMilli()) + " 0\n",
		"signed with another key":   string(forger.Append(nil, events.Notice{Key: key, ResetAt: reset, Used: 0}, now)),
		"altered":                   strings.Replace(good, "room", "full", 1),
		"altered count":             strings.Replace(good, " 0 ", " 5 ", 1),
		"malformed":                 "full alice 1 1 1 " + strings.Repeat("0", 32),
	} {
		got, err := ns.Decode([]byte(bad), now)
		require.ErrorIs(t, err, events.ErrInvalidEvent, name)
		require.Empty(t, got, name)
	}
	// Replayed: good then, not now.
	_, err = ns.Decode([]byte(good), now.Add(events.NoticeMaxAge+time.Second))
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	_, err = ns.Decode([]byte(good), now.Add(-events.NoticeMaxAge-time.Second))
	require.ErrorIs(t, err, events.ErrInvalidEvent, "nor from the future")
	// A good line among bad ones is kept.
	got, err = ns.Decode([]byte("garbage\n"+good), now)
	require.Error(t, err)
	require.Len(t, got, 1)
}

func TestDecisionRecord(t *testing.T) {
	dg, err := limiter.ParseDigest(key)
	require.NoError(t, err)
	d := events.Decision{Time: at, Source: "edge-checker/h", Edge: "edge-7f3a", Seq: 9, Shard: "s0", RequestNum: 17,
		TraceParent: tp, Key: dg, Policy: "core", Limit: 100, WindowSeconds: 60, Cost: 1, Allowed: false, Path: "cache",
		Used: 100, ResetAt: reset}
	body := append(events.AppendDecision([]byte("["), &d), ']')
	var ces []event.Event
	require.NoError(t, json.Unmarshal(body, &ces))
	require.NoError(t, ces[0].Validate())
	require.Equal(t, events.TypeDecision, ces[0].Type())
	require.JSONEq(t, `{"key":"`+key+`","policy":"core","limit":100,"window_s":60,"cost":1,"allowed":false,"path":"cache",
		"used":100,"reset_at":"2026-11-21T10:01:01.000000Z","request_id":"edge-7f3a-17","edge":"edge-7f3a","shard":"s0"}`, string(ces[0].Data()))
	// Strings from outside are escaped.
	d.Source = "edge \"quoted\"\n\x01ü\xff"
	body = events.AppendDecision(nil, &d)
	var m map[string]any
	require.NoError(t, json.Unmarshal(body, &m))
	require.Equal(t, "edge \"quoted\"\n\x01ü\uFFFD", m["source"])
}

func TestStreamsConfig(t *testing.T) {
	require.NoError(t, events.Streams{}.Validate())
	for name, s := range map[string]events.Streams{
		"storage":        {Storage: "tape"},
		"replicas":       {Replicas: 7},
		"stream name":    {Accounting: events.StreamConfig{Name: "a.b"}},
		"subject prefix": {Decisions: events.StreamConfig{SubjectPrefix: "tally.>"}},
		"same prefix":    {Decisions: events.StreamConfig{SubjectPrefix: "tally.accounting"}},
		"notice prefix":  {NoticePrefix: "tally..x"},
		"duplicates":     {Duplicates: 48 * time.Hour},
		"negative age":   {DeadLetters: events.StreamConfig{MaxAge: -time.Second}},
	} {
		require.ErrorIs(t, s.Validate(), events.ErrInvalidConfig, name)
	}
}

func FuzzDecodeAccounting(f *testing.F) {
	good, _ := events.AccountingMsg("tally.accounting", "s0", []events.Accounting{sample(events.Started, 1), sample(events.Finished, 2)}, nil)
	f.Add(good.Data)
	f.Add([]byte(`[{"specversion":"1.0"}]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		evs, err := events.DecodeAccounting("s0", "edge.7f3a", nil, body)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes and decodes to the same events.
		m, err := events.AccountingMsg("tally.accounting", "s0", evs, nil)
		if err != nil {
			t.Fatalf("decoded events do not encode: %v", err)
		}
		again, err := events.DecodeAccounting("s0", "edge.7f3a", m.Header, m.Data)
		if err != nil || len(again) != len(evs) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// A span context survives a NATS message's headers and a traceparent.
func TestTraceAcrossHeaders(t *testing.T) {
	sc, ok := events.SpanContextOf(tp)
	require.True(t, ok)
	require.Equal(t, tp, events.TraceParent(sc))
	m := &nats.Msg{Subject: "x"}
	events.InjectTrace(trace.ContextWithSpanContext(context.Background(), sc), m)
	require.Equal(t, tp, m.Header.Get("traceparent"))
	got := trace.SpanContextFromContext(events.ExtractTrace(context.Background(), m.Header))
	require.True(t, got.Equal(sc.WithRemote(true)), "%v", got)
	_, ok = events.SpanContextOf("00-" + strings.Repeat("0", 32) + "-0123456789abcdef-01")
	require.False(t, ok)
	require.Empty(t, events.TraceParent(trace.SpanContext{}))
	require.Len(t, events.Links([]events.Accounting{{TraceParent: tp}, {}, {TraceParent: "junk"}}), 1)
}
