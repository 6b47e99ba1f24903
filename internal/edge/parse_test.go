package edge

import (
	"bytes"
	"encoding/json"
	"testing"
)

// The fast path agrees with encoding/json whenever it answers, and defers
// to it otherwise.
func TestParseCheckAgreesWithEncodingJSON(t *testing.T) {
	for _, body := range []string{
		`{"policy":"core","identity":"alice"}`,
		` { "identity" : "bob" , "policy":"search", "cost": 3 } `,
		`{"policy":"core","identity":"alice","cost":0}`,
		`{}`,
		`{"policy":"core","identity":"al\"ice"}`,
		`{"policy":"core","identity":"ü"}`,
		`{"policy":"core","policy":"x","identity":"a"}`,
		`{"policy":"core","identity":"a","extra":1}`,
		`{"policy":"core","identity":"a"} {}`,
		`{"policy":"core","identity":"a","cost":-1}`,
		`{"policy":"core","identity":"a","cost":1.5}`,
		`{"policy":"core","identity":"a","cost":01}`,
		`{"policy":"core","identity":"a","cost":12345678901}`,
		`{"policy":"core",}`,
		`{"policy":"core" "identity":"a"}`,
		`[]`, ``, `{`, `{"policy":1}`,
	} {
		got, ok := parseCheck([]byte(body))
		if !ok {
			continue
		}
		var want CheckRequest
		dec := json.NewDecoder(bytes.NewReader([]byte(body)))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil || dec.More() {
			t.Errorf("%s: fast path accepted what encoding/json refuses (%v)", body, err)
			continue
		}
		if got != want {
			t.Errorf("%s: %+v, encoding/json %+v", body, got, want)
		}
	}
	if _, ok := parseCheck([]byte(`{"policy":"core","identity":"alice"}`)); !ok {
		t.Error("the common shape must take the fast path")
	}
}

func FuzzParseCheck(f *testing.F) {
	f.Add([]byte(`{"policy":"core","identity":"alice","cost":2}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := parseCheck(body)
		if !ok {
			return
		}
		var want CheckRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&want); err != nil || dec.More() || got != want {
			t.Fatalf("%q: fast path %+v, encoding/json %+v (%v)", body, got, want, err)
		}
	})
}
