package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
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
