package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tallyhq/tally/client"
	"github.com/tallyhq/tally/internal/tallytest"
	"github.com/tallyhq/tally/internal/testutil"
)

// The analysis from records alone: admissions joined to what was given
// back and to the charges that place fail-open admissions in their window;
// refunds of requests not recorded as admitted, and refunds that were late,
// count for nothing.
func TestAnalysis(t *testing.T) {
	const k = "9f3c2a7d0b1e4c6a8d5f7e9a1b3c5d7e"
	batch := `[
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"credit","reset_at":"2026-11-21T11:00:00Z","request_id":"e-1"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"credit","reset_at":"2026-11-21T11:00:00Z","request_id":"e-2"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"reserve","reset_at":"2026-11-21T11:00:00Z","request_id":"e-3"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":2,"allowed":true,"path":"fail-open","request_id":"e-4"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":false,"path":"cache","reset_at":"2026-11-21T11:00:00Z","request_id":"e-5"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"credit","reset_at":"2026-11-21T11:00:00Z","outcome":"refunded","request_id":"e-2"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":2,"allowed":true,"path":"accountant","reset_at":"2026-11-21T11:00:00Z","outcome":"charged_over_limit","request_id":"e-4"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"accountant","outcome":"late","request_id":"e-3"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"accountant","reset_at":"2026-11-21T11:00:00Z","outcome":"refunded","request_id":"e-9"}},
	 {"data":{"key":"` + k + `","policy":"core","limit":3,"cost":1,"allowed":true,"path":"credit","reset_at":"2026-11-21T12:00:00Z","request_id":"e-10"}}
	]`
	var recs []record
	if err := json.Unmarshal([]byte(batch), &recs); err != nil {
		t.Fatal(err)
	}
	var a Analysis
	a.Add(recs...)
	got := a.Windows()
	reset := time.Date(2026, 11, 21, 11, 0, 0, 0, time.UTC)
	want := []Window{
		{Key: k, Policy: "core", ResetAt: reset, Limit: 3, Admitted: 5, Refunded: 1, Net: 4, Overshoot: 1},
		{Key: k, Policy: "core", ResetAt: reset.Add(time.Hour), Limit: 3, Admitted: 1, Net: 1},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d windows, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if !got[i].ResetAt.Equal(want[i].ResetAt) {
			t.Fatalf("window %d: reset %v, want %v", i, got[i].ResetAt, want[i].ResetAt)
		}
		got[i].ResetAt = want[i].ResetAt
		if got[i] != want[i] {
			t.Errorf("window %d: got %+v, want %+v", i, got[i], want[i])
		}
	}
}

// A service's own charges count in their window as edges' admissions do:
// named ones joined to their refunds by request id, unnamed ones with
// their refunds by window; a charge netted by a refund that came first
// counts for nothing.
func TestAnalysisCountsServicesCharges(t *testing.T) {
	const k = "9f3c2a7d0b1e4c6a8d5f7e9a1b3c5d7e"
	rec := func(cost int, path, outcome, id string) string {
		return `{"data":{"key":"` + k + `","policy":"core","limit":5,"cost":` + string(rune('0'+cost)) + `,"allowed":true,"path":"` + path +
			`","reset_at":"2026-11-21T11:00:00Z","outcome":"` + outcome + `","request_id":"` + id + `"}}`
	}
	batch := "[" + strings.Join([]string{
		rec(1, "reserve", "", "e-1"),                  // an edge's admission
		rec(2, "accountant", "charged", "billing-1"),  // a service's charge, named
		rec(2, "accountant", "refunded", "billing-1"), // and its refund
		rec(3, "accountant", "charged", "billing-2"),  // another, kept
		rec(1, "accountant", "charged", ""),           // a charge without a request id
		rec(1, "accountant", "charged", ""),           // another
		rec(1, "accountant", "refunded", ""),          // the refund of one of them
		rec(2, "accountant", "pending", "billing-3"),  // a refund before its charge
		rec(2, "accountant", "netted", "billing-3"),   // the charge, netted: nothing counted
		rec(1, "accountant", "charged_over_limit", "billing-4"),
	}, ",") + "]"
	var recs []record
	if err := json.Unmarshal([]byte(batch), &recs); err != nil {
		t.Fatal(err)
	}
	var a Analysis
	a.Add(recs...)
	got := a.Windows()
	want := Window{Key: k, Policy: "core", Limit: 5, Admitted: 1 + 2 + 3 + 1 + 1 + 1, Refunded: 2 + 1, Net: 6, Overshoot: 1}
	if len(got) != 1 {
		t.Fatalf("got %d windows, want 1: %+v", len(got), got)
	}
	got[0].ResetAt = time.Time{}
	if got[0] != want {
		t.Errorf("got %+v, want %+v", got[0], want)
	}
}

// Against a running Tally: edges' admissions (one given back by a 304) and
// a service's charges (one refunded, one without a request id) in one
// window; the analysis of the stream says what the primary counts.
func TestAnalysisAgreesWithThePrimaryWhenAServiceCharges(t *testing.T) {
	tl := tallytest.Start(t, "- {name: core, limit: 100, window: 1h, mode: exact}")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	api := func(path, body string) map[string]any {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, "POST", tl.API+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tl.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if resp.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
			t.Fatalf("%s: %d %s", path, resp.StatusCode, b)
		}
		return m
	}
	var ids []string
	for range 3 {
		ids = append(ids, api("/v1/check", `{"policy":"core","identity":"alice"}`)["request_id"].(string))
	}
	api("/v1/finish", `{"request_id":"`+ids[0]+`","status":304}`)

	keys, err := client.NewKeys(tl.Prefix, tl.Secret, tl.Shards)
	if err != nil {
		t.Fatal(err)
	}
	_, js := tl.NATS.ConnectAs("billing")
	pub, err := client.NewPublisher(js, client.PublisherConfig{Namespace: "billing", Source: "billing-api", Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	charge := func(id string, units int64) client.Receipt {
		t.Helper()
		r, err := pub.Charge(ctx, client.Charge{Policy: "core", Limit: 100, Window: time.Hour, Identity: client.APIIdentity("alice"),
			Units: units, RequestID: id})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	named, _, unnamed := charge("billing-1", 2), charge("billing-2", 3), charge("", 4)
	for _, r := range []client.Receipt{named, unnamed} {
		if _, err := pub.Refund(ctx, r); err != nil {
			t.Fatal(err)
		}
	}

	w := keys.Window("core", client.APIIdentity("alice"))
	used := func() int64 {
		n, _ := tl.Redis.Client().HGet(ctx, tl.Prefix+":{"+w.Digest+"}", "u").Int64()
		return n
	}
	const want = 3 - 1 + 2 + 3 + 4 - 2 - 4
	testutil.WaitFor(t, "the service's events applied", func() bool { return used() == want })
	_, analytics := tl.NATS.ConnectAs("analytics")
	var a *Analysis
	testutil.WaitFor(t, "every record on the stream", func() bool {
		a, err = analyse(ctx, analytics, "TALLY_DECISIONS", 300*time.Millisecond)
		// 3 charges; refunds: the 304's and the service's 2.
		return err == nil && len(a.charges) == 3 && len(a.refunds) == 3
	})
	got := a.Windows()
	if len(got) != 1 {
		t.Fatalf("%d windows: %+v", len(got), got)
	}
	if got[0].Key != w.Digest || got[0].Net != used() {
		t.Fatalf("the stream says %+v; the primary counts %d", got[0], used())
	}
}

// The reading loop docs/events.md shows is this program's, line for line
// (one tab less: it is shown outside its function).
func TestDocumentedLoopIsThisProgram(t *testing.T) {
	doc, err := os.ReadFile("../../docs/events.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "Its reading loop:\n\n```go\n")
	if !ok {
		t.Fatal("docs/events.md: no reading loop")
	}
	block, _, _ = strings.Cut(block, "```")
	var indented []string
	for _, l := range strings.Split(strings.TrimSuffix(block, "\n"), "\n") {
		indented = append(indented, "\t"+l)
	}
	if len(indented) < 20 || !strings.Contains(string(src), strings.Join(indented, "\n")+"\n") {
		t.Fatalf("the loop in docs/events.md is not main.go's:\n%s", block)
	}
}
