package config

import (
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/outbox"
	"github.com/tallyhq/tally/internal/redisstore"
)

// negativeMeansNone are the numeric settings where a negative value is a
// documented choice (record none), not a mistake.
var negativeMeansNone = map[string]bool{
	"edge.decisions.sample_allowed":       true,
	"accountant.decisions.sample_applied": true,
}

// numericSettings walks t's YAML fields (inline structs included, lists
// left to the table tests) and returns the path of every number and
// duration.
func numericSettings(t reflect.Type, prefix string) []string {
	var out []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		path := prefix
		if opts != "inline" {
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			path = strings.TrimPrefix(prefix+"."+name, ".")
		}
		switch f.Type.Kind() {
		case reflect.Struct:
			out = append(out, numericSettings(f.Type, path)...)
		case reflect.Int, reflect.Int64, reflect.Float64:
			out = append(out, path)
		}
	}
	return out
}

// set writes v at a dotted path of a YAML document held as nested maps.
func set(doc map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	m := doc
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}

// Every number and duration in the file, set to a negative value, is
// refused with its line and its path: no setting is silently replaced by
// its default, and a new setting without a check fails this test.
func TestEveryNegativeSettingIsRefusedWithItsLine(t *testing.T) {
	paths := numericSettings(reflect.TypeOf(File{}), "")
	require.Greater(t, len(paths), 40, "the walk found the settings")
	for _, path := range paths {
		if negativeMeansNone[path] {
			continue
		}
		t.Run(path, func(t *testing.T) {
			var doc map[string]any
			require.NoError(t, yaml.Unmarshal([]byte(good), &doc))
			var v any = -5
			if strings.HasSuffix(path, "_timeout") || strings.HasSuffix(path, "max_age") || durationField(path) {
				v = "-5s"
			}
			set(doc, path, v)
			b, err := yaml.Marshal(doc)
			require.NoError(t, err)
			_, err = Parse(b, withSecret)
			require.ErrorIs(t, err, ErrInvalid)
			field := path
			if strings.HasPrefix(path, "redis.") && strings.HasSuffix(path, "timeout") && path != "redis.wait_timeout" {
				field = "redis.timeout"
			}
			require.Regexp(t, regexp.MustCompile(`line \d+: `+regexp.QuoteMeta(field)+`: `), err.Error())
		})
	}
}

// durationField reports whether path names a time.Duration in File.
func durationField(path string) bool {
	t := reflect.TypeOf(File{})
	for _, part := range strings.Split(path, ".") {
		f, ok := fieldByTag(t, part)
		if !ok {
			return false
		}
		t = f.Type
	}
	return t == reflect.TypeOf(time.Duration(0))
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if opts == "inline" {
			if g, ok := fieldByTag(f.Type, name); ok {
				return g, true
			}
		}
		if tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// Values past what a component can work with are refused, not clamped.
func TestOutOfRangeSettingsAreRefused(t *testing.T) {
	for _, c := range []struct{ path, value, want string }{
		{"accountant.batch_size", "100000", "accountant.batch_size: 100000: want 1 to"},
		{"accountant.retry_max", "10ms", "accountant.retry_max: 10ms: want at least retry_min (50ms)"},
		{"edge.credit.share", "5000", "edge.credit.share: 5000: want 1 to 1000"},
		{"edge.outbox.max_batch", "5000", "edge.outbox.max_batch: 5000: want 1 to 1024"},
		{"edge.decisions.max_batch", "5000", "edge.decisions.max_batch: 5000"},
		{"redis.grace", "500ms", "redis.grace: 500ms: want 1s to 24h"},
		{"redis.read_policy", "replica", "redis.read_policy: \"replica\": want primary or fail"},
		{"nats.streams.duplicates", "48h", "nats.streams.duplicates: 48h0m0s: want a positive duration within"},
		{"nats.streams.decisions.name", "TALLY_ACCOUNTING", "nats.streams.decisions.name: \"TALLY_ACCOUNTING\": another stream"},
		{"edge.shutdown_timeout", "2h", "edge.shutdown_timeout: 2h0m0s: want 100ms to 1h"},
	} {
		t.Run(c.path, func(t *testing.T) {
			var doc map[string]any
			require.NoError(t, yaml.Unmarshal([]byte(good), &doc))
			var v any = c.value
			var n float64
			if _, err := fmt.Sscan(c.value, &n); err == nil && !strings.ContainsAny(c.value, "smh") {
				v = n
				if n == float64(int64(n)) {
					v = int64(n)
				}
			}
			set(doc, c.path, v)
			b, err := yaml.Marshal(doc)
			require.NoError(t, err)
			_, err = Parse(b, withSecret)
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, c.want)
			require.Contains(t, err.Error(), "line ")
		})
	}
}

// Each section's defaults are set in one place, its WithDefaults: applying
// them twice changes nothing, they pass their own Validate, and the file
// leaves a section's zero values to it (a loaded file's sections hold
// what was written).
func TestDefaultsLiveInTheirSection(t *testing.T) {
	sections := []struct {
		name     string
		defaults func() (any, any)
		validate func() error
	}{
		{"credit", func() (any, any) {
			d := credit.Config{}.WithDefaults()
			return d, d.WithDefaults()
		}, func() error { return credit.Config{}.WithDefaults().Validate() }},
		{"outbox", func() (any, any) {
			d := outbox.Config{}.WithDefaults()
			return d, d.WithDefaults()
		}, func() error { return outbox.Config{}.WithDefaults().Validate() }},
		{"decisions", func() (any, any) {
			d := edge.DecisionsConfig{}.WithDefaults()
			return d, d.WithDefaults()
		}, func() error { return edge.DecisionsConfig{}.WithDefaults().Validate() }},
		{"streams", func() (any, any) {
			d := events.Streams{}.WithDefaults()
			return d, d.WithDefaults()
		}, func() error { return events.Streams{}.WithDefaults().Validate() }},
		{"store", func() (any, any) {
			d := redisstore.Options{}.WithDefaults()
			return d, d.WithDefaults()
		}, func() error { return redisstore.Options{}.WithDefaults().Validate() }},
		{"accountant", func() (any, any) {
			d := accountant.Config{Owner: "a"}.WithDefaults()
			return d, d.WithDefaults()
		}, func() error { return accountant.Config{}.WithDefaults().Validate() }},
	}
	for _, s := range sections {
		once, twice := s.defaults()
		require.Equal(t, once, twice, s.name)
		require.NoError(t, s.validate(), s.name)
	}
	f, err := Parse([]byte(good), withSecret)
	require.NoError(t, err)
	require.Zero(t, f.Edge.Credit, "the file leaves the credit section's defaults to it")
	require.Zero(t, f.Edge.Outbox)
	require.Zero(t, f.Accountant.Config)
}
