package limiter_test

import (
	"testing"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// ParseCompact accepts what lua/compact.lua's decode accepts and nothing
// else: `tally inspect` calls no window what every script refuses.
func TestParseCompactIsTheScriptsForm(t *testing.T) {
	for v, want := range map[string]limiter.CompactWindow{
		"1:1795000060:60:edge-a.1":        {Used: 1, ResetAt: time.Unix(1795000060, 0), Start: time.Unix(1795000000, 0), Holder: "edge-a.1", Producer: "edge-a"},
		"0:1795000060:60:edge.x-1.7:3":    {Used: 0, ResetAt: time.Unix(1795000060, 0), Start: time.Unix(1795000000, 0), Holder: "edge.x-1.7", Producer: "edge.x-1"},
		"1:1795000060:60:edge-a.1::4":     {Used: 1, ResetAt: time.Unix(1795000060, 0), Start: time.Unix(1795000000, 0), Holder: "edge-a.1", Producer: "edge-a"},
		"5:1795000060:60:edge-a.1:12:900": {Used: 5, ResetAt: time.Unix(1795000060, 0), Start: time.Unix(1795000000, 0), Holder: "edge-a.1", Producer: "edge-a"},
	} {
		got, ok := limiter.ParseCompact(v)
		if !ok || got != want {
			t.Errorf("ParseCompact(%q) = %+v, %v; want %+v", v, got, ok, want)
		}
	}
	for _, v := range []string{
		"", "hello", "1:1795000060:60", "1:1795000060:60:intruder", "1:1795000060:60:edge-a.",
		"1:1795000060:60:.1", "1:1795000060:60:edge a.1", "1:1795000060:60:edge-a.1:",
		"1:1795000060:60:edge-a.1:3:", "1:1795000060:60:edge-a.1:3:4:5", "1:1795000060:60:edge-a.1::1234567890123456",
		"+1:1795000060:60:edge-a.1", "-1:1795000060:60:edge-a.1", "12345678901:1795000060:60:edge-a.1",
		"1:1795000060:0x3c:edge-a.1", "1:1795000060:60:edge-a.1:-3", "1:1795000060:60:edge-a.1:a:4",
	} {
		if w, ok := limiter.ParseCompact(v); ok {
			t.Errorf("ParseCompact(%q) = %+v, a window", v, w)
		}
	}
}
