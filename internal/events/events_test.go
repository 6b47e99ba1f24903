package events_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/events"
)

func sample(kind events.Kind) events.Event {
	return events.Event{
		ID: events.EventID("req-1", kind), Kind: kind, Source: "edge-checker/test",
		Time: time.Date(2026, 11, 21, 10, 0, 0, 123_000_000, time.UTC), Shard: "s0",
		Data: events.Request{RequestID: "req-1", Key: strings.Repeat("ab", 16), Policy: "core", Limit: 100,
			WindowSeconds: 60, Cost: 2, StartedAt: time.Date(2026, 11, 21, 10, 0, 0, 100_000_000, time.UTC), Status: 304},
		TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	e := sample(events.KindFinished)
	m, err := events.Encode("tally.events", e)
	require.NoError(t, err)
	require.Equal(t, "tally.events.s0.finished", m.Subject)
	require.Equal(t, "req-1.finished", m.Header.Get(events.HeaderMsgID))
	// Exact, lower-case CloudEvents binary-mode headers.
	for _, h := range []string{"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-time", "ce-datacontenttype", "ce-subject", "ce-tallyshard", "traceparent"} {
		require.NotEmpty(t, m.Header[h], h)
	}
	require.Equal(t, events.TypeFinished, m.Header["ce-type"][0])
	require.JSONEq(t, `{"request_id":"req-1","key":"`+strings.Repeat("ab", 16)+`","policy":"core","limit":100,"window_s":60,"cost":2,"started_at":"2026-11-21T10:00:00.1Z","status":304}`, string(m.Data))

	got, err := events.Decode(m.Header, m.Data)
	require.NoError(t, err)
	require.Equal(t, e.ID, got.ID)
	require.Equal(t, e.Data, got.Data)
	require.True(t, e.Time.Equal(got.Time))
	require.Equal(t, e.TraceParent, got.TraceParent)

	s, err := events.Encode("tally.events", sample(events.KindStarted))
	require.NoError(t, err)
	require.NotEqual(t, s.Header.Get(events.HeaderMsgID), m.Header.Get(events.HeaderMsgID), "start and finish ids differ")
}

func TestDecodeRejects(t *testing.T) {
	good, err := events.Encode("tally.events", sample(events.KindStarted))
	require.NoError(t, err)
	cases := map[string]func(h nats.Header) []byte{
		"no specversion":      func(h nats.Header) []byte { delete(h, "ce-specversion"); return good.Data },
		"canonicalised names": func(h nats.Header) []byte { h["Ce-Type"] = h["ce-type"]; delete(h, "ce-type"); return good.Data },
		"unknown type":        func(h nats.Header) []byte { h["ce-type"] = []string{"dev.tally.request.started.v9"}; return good.Data },
		"bad time":            func(h nats.Header) []byte { h["ce-time"] = []string{"yesterday"}; return good.Data },
		"xml":                 func(h nats.Header) []byte { h["ce-datacontenttype"] = []string{"application/xml"}; return good.Data },
		"not json":            func(nats.Header) []byte { return []byte("{") },
		"id mismatch":         func(h nats.Header) []byte { h["ce-id"] = []string{"other.started"}; return good.Data },
		"identity as key": func(nats.Header) []byte {
			return []byte(strings.Replace(string(good.Data), strings.Repeat("ab", 16), "alice", 1))
		},
		"cost over limit": func(nats.Header) []byte {
			return []byte(strings.Replace(string(good.Data), `"cost":2`, `"cost":101`, 1))
		},
		"no start": func(nats.Header) []byte {
			return []byte(strings.Replace(string(good.Data), `"started_at":"2026-11-21T10:00:00.1Z"`, `"x":1`, 1))
		},
		"bad shard": func(h nats.Header) []byte { h["ce-tallyshard"] = []string{"S 0"}; return good.Data },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			h := nats.Header{}
			for k, v := range good.Header {
				h[k] = append([]string(nil), v...)
			}
			_, err := events.Decode(h, mutate(h))
			require.ErrorIs(t, err, events.ErrInvalidEvent)
		})
	}
	// A finished event needs a status.
	f := sample(events.KindFinished)
	f.Data.Status = 0
	_, err = events.Encode("tally.events", f)
	require.ErrorIs(t, err, events.ErrInvalidEvent)
	// Request ids cannot smuggle subject tokens or spaces.
	bad := sample(events.KindStarted)
	bad.Data.RequestID, bad.ID = "a b", events.EventID("a b", events.KindStarted)
	_, err = events.Encode("tally.events", bad)
	require.ErrorIs(t, err, events.ErrInvalidEvent)
}

func FuzzDecode(f *testing.F) {
	good, err := events.Encode("tally.events", sample(events.KindStarted))
	require.NoError(f, err)
	f.Add(good.Header.Get("ce-type"), good.Header.Get("ce-time"), good.Data)
	f.Fuzz(func(t *testing.T, typ, ts string, body []byte) {
		h := nats.Header{}
		for k, v := range good.Header {
			h[k] = v
		}
		h["ce-type"], h["ce-time"] = []string{typ}, []string{ts}
		e, err := events.Decode(h, body)
		if err == nil {
			if verr := e.Validate(); verr != nil {
				t.Fatalf("decoded an invalid event: %v", verr)
			}
		}
	})
}
