package descriptors

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/limiter"
)

func load(t *testing.T, files ...string) *Config {
	t.Helper()
	var fs []File
	for i, f := range files {
		fs = append(fs, File{Name: "f" + string(rune('0'+i)) + ".yaml", Data: []byte(f)})
	}
	c, err := Load(fs, Options{})
	require.NoError(t, err)
	return c
}

func entries(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// The examples of envoyproxy/ratelimit's README, each request and the rule
// (by full key, limit and unit) it falls under; "" for none.
func TestReadmeExamples(t *testing.T) {
	type want struct {
		domain  string
		entries []Entry
		key     string
		limit   int64
		unit    Unit
	}
	cases := []struct {
		name  string
		files []string
		wants []want
	}{
		{"1: key and value", []string{`
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`}, []want{
			{"mongo_cps", entries("database", "users"), "mongo_cps.database_users", 500, Second},
			{"mongo_cps", entries("database", "default"), "mongo_cps.database_default", 500, Second},
			{"mongo_cps", entries("database", "other"), "", 0, ""},
			{"other_domain", entries("database", "users"), "", 0, ""},
		}},
		{"2: nested, and several descriptors", []string{`
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`}, []want{
			{"messaging", entries("message_type", "marketing", "to_number", "2061111111"), "messaging.message_type_marketing.to_number", 5, Day},
			{"messaging", entries("to_number", "2061111111"), "messaging.to_number", 100, Day},
			{"messaging", entries("message_type", "marketing"), "", 0, ""},
			{"messaging", entries("message_type", "transactional", "to_number", "1"), "", 0, ""},
		}},
		{"3: key_value before key", []string{`
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`}, []want{
			{"edge_proxy_per_ip", entries("remote_address", "50.0.0.1"), "edge_proxy_per_ip.remote_address", 10, Second},
			{"edge_proxy_per_ip", entries("remote_address", "50.0.0.5"), "edge_proxy_per_ip.remote_address_50.0.0.5", 0, Second},
		}},
		{"4: depth must match", []string{`
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`}, []want{
			{"example4", entries("key", "value", "subkey", "subvalue"), "", 0, ""},
			{"example4", entries("key", "value"), "example4.key_value", 300, Second},
		}},
		{"4: nested depth", []string{`
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`}, []want{
			{"example4", entries("key", "value", "subkey", "subvalue"), "example4.key_value.subkey", 300, Second},
			{"example4", entries("key", "value"), "", 0, ""},
		}},
		{"9: wildcards", []string{`
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: route
    value: /api/*/resource/*/action
    rate_limit: {unit: minute, requests_per_unit: 22}
`}, []want{
			{"example9", entries("key1", "value1"), "example9.key1_value*", 20, Minute},
			{"example9", entries("key1", "value"), "example9.key1_value*", 20, Minute},
			{"example9", entries("key1", "valu"), "", 0, ""},
			{"example9", entries("path", "/api/123/action"), "example9.path_/api/*/action", 21, Minute},
			{"example9", entries("path", "/api/123/other"), "", 0, ""},
			{"example9", entries("route", "/api/v1/resource/123/action"), "example9.route_/api/*/resource/*/action", 22, Minute},
			{"example9", entries("route", "/api/v1/resource/action"), "", 0, ""},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, tc.files...)
			for _, w := range tc.wants {
				m := c.Match(w.domain, w.entries)
				if w.key == "" {
					assert.Nil(t, m.Rule, "%v", w.entries)
					continue
				}
				if assert.NotNil(t, m.Rule, "%v", w.entries) {
					assert.Equal(t, w.key, m.Rule.Key)
					assert.Equal(t, w.limit, m.Rule.Limit)
					assert.Equal(t, w.unit, m.Rule.Unit)
				}
			}
		})
	}
}

// Unlimited, shadow_mode, quota_mode, name and replaces are carried to the
// rule (examples 5, 6 and 7).
func TestRuleFlags(t *testing.T) {
	c := load(t, `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: second}
        shadow_mode: true
        quota_mode: true
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`)
	ldap := c.Match("internal", entries("ldap", "x")).Rule
	require.NotNil(t, ldap)
	assert.True(t, ldap.Unlimited)
	assert.Equal(t, Unit(""), ldap.Unit)
	a := c.Match("internal", entries("service", "auth", "user", "user-a")).Rule
	require.NotNil(t, a)
	assert.True(t, a.Shadow)
	assert.True(t, a.Quota)
	assert.Equal(t, time.Second, a.Window())
	s := c.Match("internal", entries("key_1", "value_1", "user", "bkthomps")).Rule
	r := c.Match("internal", entries("key_2", "value_2", "user", "bkthomps")).Rule
	require.NotNil(t, s)
	require.NotNil(t, r)
	assert.Equal(t, "specific_limit", s.Name)
	assert.Equal(t, []string{"specific_limit"}, r.Replaces)
	assert.Len(t, c.Rules(), 4)
}

// Each list of values counts on its own; values a share_threshold wildcard
// matches count together (example 11); no two lists share a counter.
func TestCounters(t *testing.T) {
	c := load(t, `
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    share_threshold: false
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: hour, requests_per_unit: 10}
`)
	counter := func(kv ...string) string {
		m := c.Match("example11", entries(kv...))
		require.NotNil(t, m.Rule, "%v", kv)
		return m.Counter
	}
	assert.Equal(t, counter("files", "files/a.pdf"), counter("files", "files/b.csv"))
	assert.NotEqual(t, counter("files_no_share", "files_no_share/a.pdf"), counter("files_no_share", "files_no_share/b.csv"))
	assert.Equal(t, counter("files_no_share", "files_no_share/a.pdf"), counter("files_no_share", "files_no_share/a.pdf"))
	// Entries that would run together if joined without lengths.
	assert.NotEqual(t, counter("a", "x_b", "b", "y"), counter("a", "x", "b", "b_y"))
	assert.NotEqual(t, counter("a", "x", "b", "y"), counter("a", "x", "b", "y2"))
}

// What envoyproxy/ratelimit refuses, Tally refuses, with the file and line.
func TestRefusals(t *testing.T) {
	cases := []refusal{
		{"unknown key", "domain: d\ndescriptors:\n  - key: k\n    rate_limits: {unit: second}\n", "f0.yaml:4: config error, unknown key 'rate_limits'"},
		{"empty domain", "descriptors:\n  - key: k\n", "cannot have empty domain"},
		{"empty file", "", "cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "f0.yaml:3: descriptor has empty key"},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", "f0.yaml:4: duplicate descriptor composite key 'd.k'"},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", "f0.yaml:5: invalid rate limit unit 'fortnight'"},
		{"no unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 1}\n", "invalid rate limit unit ''"},
		{"unlimited with a unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n", "should not specify rate limit unit when unlimited"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: ''}]}\n", "empty replaces entry"},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}\n", "replaces should not contain name of same descriptor"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "share_threshold can only be used with wildcard values"},
		{"negative limit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n", "f0.yaml:4: requests_per_unit \"-1\""},
		{"limit too large", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 4294967296}\n", "want a whole number from 0 to 4294967295"},
		{"list of scalars", "domain: d\ndescriptors:\n  - k\n", "list of type other than map"},
		{"not yaml", "domain: [\n", "error loading config file"},
		{"bool", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: maybe\n", "\"maybe\": want true or false"},
	}
	requireRefused(t, cases)
}

// A domain in two files is refused unless domains merge; merged, both
// files' rules apply.
func TestDomainsInSeveralFiles(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}
	b := File{Name: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n")}
	_, err := Load([]File{a, b}, Options{})
	require.ErrorContains(t, err, "b.yaml:1: duplicate domain \"d\"")
	c, err := Load([]File{a, b}, Options{MergeDomains: true})
	require.NoError(t, err)
	assert.Equal(t, int64(1), c.Match("d", entries("a", "x")).Rule.Limit)
	assert.Equal(t, int64(2), c.Match("d", entries("b", "x")).Rule.Limit)
}

// A directory is read as the reference reads its config directory: every
// regular file but dot files; a known key in a place where it means nothing
// is a warning, not an error.
func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "one.yaml"), []byte("domain: one\ndescriptors:\n  - key: k\n    unit: minute\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "two.conf"), []byte("domain: two\n"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".swap"), []byte("not: [yaml"), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o700))
	c, err := LoadDir(dir, Options{})
	require.NoError(t, err)
	assert.Equal(t, []string{"one", "two"}, c.Domains())
	require.Len(t, c.Warnings, 1)
	assert.Contains(t, c.Warnings[0], "one.yaml:4: \"unit\" has no meaning in a descriptor")
	_, err = LoadDir(t.TempDir(), Options{})
	assert.ErrorContains(t, err, "has no configuration files")
	_, err = LoadDir(filepath.Join(dir, "missing"), Options{})
	assert.True(t, errors.Is(err, ErrInvalid))
}

func TestWildcardMatch(t *testing.T) {
	cases := []struct {
		pattern, value string
		want           bool
	}{
		{"k_v*", "k_v", true}, {"k_v*", "k_vx", true}, {"k_v*", "k_", false},
		{"k_/a/*/b", "k_/a/x/b", true}, {"k_/a/*/b", "k_/a//b", true}, {"k_/a/*/b", "k_/a/b", false},
		{"k_*x*x", "k_xx", true}, {"k_*x*x", "k_x", false}, {"k_a*b*c", "k_acb", false}, {"k_a*b*c", "k_abc", true},
		{"k_*", "k_", true}, {"k_plain", "k_plain", true}, {"k_plain", "k_plainx", false},
	}
	for _, tc := range cases {
		assert.Equal(t, tc.want, wildcardMatch(strings.Split(tc.pattern, "*"), tc.value), "%s ~ %s", tc.pattern, tc.value)
	}
}

func FuzzMatch(f *testing.F) {
	c, err := Load([]File{{Name: "f.yaml", Data: []byte(`
domain: d
descriptors:
  - key: k
    value: "a*b*"
    share_threshold: true
    descriptors:
      - key: n
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 2}
`)}}, Options{})
	require.NoError(f, err)
	f.Add("k", "axb", "n", "1")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		m := c.Match("d", entries(k1, v1, k2, v2))
		if m.Rule != nil && m.Counter == "" {
			t.Fatal("a rule without a counter")
		}
	})
}

// Diff names each rule added, removed or changed.
func TestDiff(t *testing.T) {
	a := load(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: c\n    rate_limit: {unit: second, requests_per_unit: 3}\n")
	b := load(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 2}\n  - key: e\n    rate_limit: {unlimited: true}\n")
	assert.Equal(t, []string{"changed d.b: 2/SECOND → 2/MINUTE shadow", "added d.e: unlimited", "removed d.c"}, Diff(a, b))
	assert.Empty(t, Diff(a, a))
	assert.Len(t, Diff(nil, a), 3)
}

// Tally's extension rate_limit.calendar: a rule's windows are periods of a
// time zone's calendar. Each accepted form, and the rule it makes.
func TestCalendarRules(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	cases := []struct {
		name, rateLimit string
		unit            Unit
		zone            string
	}{
		{"month in a zone", "{unit: month, requests_per_unit: 1000000, calendar: {time_zone: Europe/Berlin}}", Month, "Europe/Berlin"},
		{"day in UTC", "{unit: day, requests_per_unit: 5, calendar: {}}", Day, "UTC"},
		{"week, block style", "\n      unit: week\n      requests_per_unit: 5\n      calendar:\n        time_zone: America/New_York\n", Week, "America/New_York"},
		{"year, zone UTC", "{unit: YEAR, requests_per_unit: 5, calendar: {time_zone: UTC}}", Year, "UTC"},
		{"a limit of 0", "{unit: day, requests_per_unit: 0, calendar: {}}", Day, "UTC"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tc.rateLimit+"\n")
			r := c.Match("d", entries("k", "v")).Rule
			require.NotNil(t, r)
			assert.True(t, r.Calendar)
			assert.Equal(t, tc.unit, r.Unit)
			require.NotNil(t, r.Location)
			assert.Equal(t, tc.zone, r.Location.String())
		})
	}
	// Without the extension, a rule is the reference's.
	r := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5}\n").Match("d", entries("k", "v")).Rule
	require.NotNil(t, r)
	assert.False(t, r.Calendar)
	assert.Nil(t, r.Location)
	assert.Equal(t, 30*24*time.Hour, r.Window())
	// A zone read again is the same zone: policies of unchanged rules
	// compare equal across a reload.
	a := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5, calendar: {time_zone: Europe/Berlin}}\n")
	b := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5, calendar: {time_zone: Europe/Berlin}}\n")
	assert.Same(t, a.Rules()[0].Location, b.Rules()[0].Location)
	assert.Equal(t, berlin.String(), a.Rules()[0].Location.String())
}

// What the calendar extension refuses, with the file and line; elsewhere
// its keys are unknown, as the reference finds them.
func TestCalendarRefusals(t *testing.T) {
	rule := func(rl string) string { return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n" + rl }
	cases := []refusal{
		{"second", rule("      unit: second\n      requests_per_unit: 1\n      calendar: {}\n"),
			"f0.yaml:7: calendar: unit 'second': a calendar window is a day, week, month or year"},
		{"minute", rule("      unit: minute\n      requests_per_unit: 1\n      calendar: {time_zone: Europe/Berlin}\n"),
			"f0.yaml:7: calendar: unit 'minute': a calendar window is a day"},
		{"hour", rule("      unit: hour\n      requests_per_unit: 1\n      calendar: {}\n"), "f0.yaml:7: calendar: unit 'hour'"},
		{"unlimited", rule("      unlimited: true\n      calendar: {}\n"), "f0.yaml:6: calendar: an unlimited rule has no windows"},
		{"unknown zone", rule("      unit: day\n      requests_per_unit: 1\n      calendar:\n        time_zone: Europe/Berln\n"),
			"f0.yaml:8: calendar.time_zone: \"Europe/Berln\": unknown time zone: want an IANA name"},
		{"Local", rule("      unit: day\n      requests_per_unit: 1\n      calendar: {time_zone: Local}\n"),
			"f0.yaml:7: calendar.time_zone: \"Local\": the machine's zone differs between machines"},
		{"empty zone", rule("      unit: day\n      requests_per_unit: 1\n      calendar: {time_zone: ''}\n"),
			"f0.yaml:7: calendar.time_zone: empty"},
		{"not a map", rule("      unit: day\n      requests_per_unit: 1\n      calendar: true\n"), "f0.yaml:7: calendar: want a map"},
		{"left empty", rule("      unit: day\n      requests_per_unit: 1\n      calendar:\n"), "calendar: want a map"},
		{"zone not a string", rule("      unit: day\n      requests_per_unit: 1\n      calendar: {time_zone: {}}\n"), "f0.yaml:7: want a string"},
		{"unknown key in calendar", rule("      unit: day\n      requests_per_unit: 1\n      calendar: {time_zone: UTC, start: monday}\n"),
			"f0.yaml:7: config error, unknown key 'start'"},
		{"a reference key in calendar", rule("      unit: day\n      requests_per_unit: 1\n      calendar: {unit: day}\n"),
			"f0.yaml:7: config error, unknown key 'unit'"},
		{"calendar on a descriptor", "domain: d\ndescriptors:\n  - key: k\n    calendar: {}\n    rate_limit: {unit: day, requests_per_unit: 1}\n",
			"f0.yaml:4: config error, unknown key 'calendar'"},
		{"calendar at the top", "domain: d\ncalendar: {}\n", "f0.yaml:2: config error, unknown key 'calendar'"},
		{"time_zone in rate_limit", rule("      unit: day\n      requests_per_unit: 1\n      time_zone: UTC\n"),
			"f0.yaml:7: config error, unknown key 'time_zone'"},
		{"a bad unit first", rule("      unit: fortnight\n      requests_per_unit: 1\n      calendar: {}\n"), "f0.yaml:5: invalid rate limit unit 'fortnight'"},
	}
	requireRefused(t, cases)
}

// A rule whose calendar changes — added, removed, another zone — is a
// changed rule.
func TestDiffCalendar(t *testing.T) {
	rule := func(extra string) *Config {
		return load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, requests_per_unit: 5"+extra+"}\n")
	}
	plain, utc, berlin := rule(""), rule(", calendar: {}"), rule(", calendar: {time_zone: Europe/Berlin}")
	assert.Equal(t, []string{"changed d.k: 5/MONTH → 5/MONTH calendar=UTC"}, Diff(plain, utc))
	assert.Equal(t, []string{"changed d.k: 5/MONTH calendar=UTC → 5/MONTH calendar=Europe/Berlin"}, Diff(utc, berlin))
	assert.Equal(t, []string{"changed d.k: 5/MONTH calendar=Europe/Berlin → 5/MONTH"}, Diff(berlin, plain))
	assert.Empty(t, Diff(berlin, rule(", calendar: {time_zone: Europe/Berlin}")))
}

// refusal is a file Load refuses, and what its error says.
type refusal struct{ name, file, want string }

// requireRefused loads each case's file alone and requires it refused
// (ErrInvalid) with its message.
func requireRefused(t *testing.T, cases []refusal) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]File{{Name: "f0.yaml", Data: []byte(tc.file)}}, Options{})
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrInvalid), "%v", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// Tally's extension rate_limit.sliding: a rule counts in a sliding window
// of its unit, in slices sub-windows (10 by default). What it accepts, and
// what it refuses with the file and line; elsewhere its keys are unknown.
func TestSlidingRules(t *testing.T) {
	for _, tc := range []struct {
		name, rateLimit string
		slices          int
	}{
		{"default slices", "{unit: minute, requests_per_unit: 100, sliding: {}}", limiter.DefaultSlices},
		{"six slices of an hour", "{unit: hour, requests_per_unit: 100, sliding: {slices: 6}}", 6},
		{"block style", "\n      unit: day\n      requests_per_unit: 5\n      sliding:\n        slices: 24\n", 24},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+tc.rateLimit+"\n").Match("d", entries("k", "v")).Rule
			require.NotNil(t, r)
			assert.Equal(t, tc.slices, r.Slices)
			assert.False(t, r.Calendar)
			assert.True(t, RuleWindow(r.Window()/time.Duration(r.Slices), r.Slices), "its events' sub-windows are a rule's")
		})
	}
	assert.False(t, RuleWindow(7*time.Second, 10), "seventy seconds is no unit")
	rule := func(rl string) string { return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n" + rl }
	requireRefused(t, []refusal{
		{"a second", rule("      unit: second\n      requests_per_unit: 1\n      sliding: {}\n"),
			"f0.yaml:7: sliding.slices 10: a second does not divide into 10 whole seconds"},
		{"a minute in 7", rule("      unit: minute\n      requests_per_unit: 1\n      sliding: {slices: 7}\n"),
			"f0.yaml:7: sliding.slices 7: a minute does not divide"},
		{"one slice", rule("      unit: minute\n      requests_per_unit: 1\n      sliding: {slices: 1}\n"), "f0.yaml:7: sliding.slices 1: want 2 to 60"},
		{"unlimited", rule("      unlimited: true\n      sliding: {}\n"), "f0.yaml:6: sliding: an unlimited rule has no windows"},
		{"and a calendar", rule("      unit: day\n      requests_per_unit: 1\n      calendar: {}\n      sliding: {}\n"),
			"f0.yaml:8: sliding: a sliding window is aligned to the clock"},
		{"not a map", rule("      unit: minute\n      requests_per_unit: 1\n      sliding: true\n"), "f0.yaml:7: sliding: want a map"},
		{"unknown key in sliding", rule("      unit: minute\n      requests_per_unit: 1\n      sliding: {slices: 6, precision: 1}\n"),
			"f0.yaml:7: config error, unknown key 'precision'"},
		{"slices in rate_limit", rule("      unit: minute\n      requests_per_unit: 1\n      slices: 6\n"),
			"f0.yaml:7: config error, unknown key 'slices'"},
	})
	a := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	b := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5, sliding: {}}\n")
	assert.Len(t, Diff(a, b), 1, "a rule that becomes sliding is a changed rule")
}

// rate_limit.concurrency: {} makes a rule hold requests_per_unit requests in
// flight, each for a lease of one unit; it takes no fields and no windows.
func TestConcurrencyRules(t *testing.T) {
	r := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 4, concurrency: {}}\n").
		Match("d", entries("k", "v")).Rule
	require.NotNil(t, r)
	assert.True(t, r.Concurrency)
	assert.Zero(t, r.Slices)
	assert.Contains(t, r.terms(), " concurrency", "a rule that becomes one is a changed rule")
	assert.True(t, RuleWindow(time.Minute, 2), "its events' sub-windows, a lease of one unit each, are a rule's")
	rule := func(rl string) string { return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n" + rl }
	requireRefused(t, []refusal{
		{"a field", rule("      unit: minute\n      requests_per_unit: 1\n      concurrency: {lease: 1}\n"), "f0.yaml:7: config error, unknown key 'lease'"},
		{"not a map", rule("      unit: minute\n      requests_per_unit: 1\n      concurrency: true\n"), "f0.yaml:7: concurrency: want {}"},
		{"unlimited", rule("      unlimited: true\n      concurrency: {}\n"), "f0.yaml:6: concurrency: an unlimited rule holds nothing"},
		{"and sliding", rule("      unit: minute\n      requests_per_unit: 1\n      sliding: {}\n      concurrency: {}\n"),
			"f0.yaml:8: concurrency: a concurrency rule has no windows"},
		{"a lease of a year", rule("      unit: year\n      requests_per_unit: 1\n      concurrency: {}\n"),
			"f0.yaml:7: concurrency: unit 'year': a lease is one unit, at most 183 days"},
	})
}

func TestTokenBucketRules(t *testing.T) {
	r := load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10, token_bucket: {burst: 30}}\n").
		Match("d", entries("k", "v")).Rule
	require.NotNil(t, r)
	assert.EqualValues(t, 30, r.Burst)
	assert.EqualValues(t, 10, r.Limit, "requests_per_unit is the rate")
	assert.Contains(t, r.terms(), " token_bucket burst=30", "a rule that becomes one is a changed rule")
	assert.True(t, RuleWindow(time.Second, 2), "its events' periods are a rule's")
	r = load(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100, token_bucket: {}}\n").
		Match("d", entries("k", "v")).Rule
	require.NotNil(t, r)
	assert.EqualValues(t, 100, r.Burst, "the burst is requests_per_unit unless given")
	rule := func(rl string) string { return "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n" + rl }
	requireRefused(t, []refusal{
		{"a field", rule("      unit: minute\n      requests_per_unit: 1\n      token_bucket: {rate: 1}\n"), "f0.yaml:7: config error, unknown key 'rate'"},
		{"burst elsewhere", rule("      unit: minute\n      requests_per_unit: 1\n      burst: 3\n"), "f0.yaml:7: config error, unknown key 'burst'"},
		{"not a map", rule("      unit: minute\n      requests_per_unit: 1\n      token_bucket: true\n"), "f0.yaml:7: token_bucket: want a map"},
		{"a burst of 0", rule("      unit: minute\n      requests_per_unit: 1\n      token_bucket: {burst: 0}\n"), "token_bucket.burst 0: want 1 or more"},
		{"unlimited", rule("      unlimited: true\n      token_bucket: {}\n"), "f0.yaml:6: token_bucket: an unlimited rule has no bucket"},
		{"and sliding", rule("      unit: minute\n      requests_per_unit: 1\n      sliding: {}\n      token_bucket: {}\n"),
			"f0.yaml:8: token_bucket: a bucket refills continuously"},
		{"refilled every day", rule("      unit: day\n      requests_per_unit: 1\n      token_bucket: {}\n"),
			"f0.yaml:7: token_bucket: unit 'day': a bucket refills requests_per_unit every second, minute or hour"},
	})
}
