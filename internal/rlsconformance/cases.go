package rlsconformance

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Case is one behaviour: its rules (a file of envoyproxy/ratelimit's
// YAML, one domain) and what the server must answer.
type Case struct {
	Name, Domain, Rules string
	Check               func(t *testing.T, c rlsv3.RateLimitServiceClient)
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// Desc is a descriptor of key, value pairs.
func Desc(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *rlv3.RateLimitDescriptor, n uint64) *rlv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// Ask sends one request of descriptors ds in domain and requires an answer.
func Ask(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	require.NoError(t, err)
	require.Len(t, resp.Statuses, len(ds))
	return resp
}

// Cases are the suite.
var Cases = []Case{
	{Name: "windows aligned to the clock", Domain: "clock", Rules: `
domain: clock
descriptors:
  - key: per
    value: second
    rate_limit:
      unit: second
      requests_per_unit: 1000
  - key: per
    value: minute
    rate_limit:
      unit: minute
      requests_per_unit: 1000
  - key: per
    value: hour
    rate_limit:
      unit: hour
      requests_per_unit: 1000
  - key: per
    value: day
    rate_limit:
      unit: day
      requests_per_unit: 1000
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		// The reference answers duration_until_reset = unit − now mod unit,
		// in whole seconds: its windows are the clock's.
		for unit, secs := range map[string]int64{"second": 1, "minute": 60, "hour": 3600, "day": 86400} {
			for range 3 {
				before := time.Now().Unix()
				resp := Ask(t, c, "clock", Desc("per", unit))
				after := time.Now().Unix()
				require.Equal(t, ok, resp.OverallCode, unit)
				d := int64(resp.Statuses[0].DurationUntilReset.AsDuration() / time.Second)
				match := false
				for now := before; now <= after; now++ {
					match = match || d == secs-now%secs
				}
				assert.True(t, match, "%s: duration_until_reset %ds, want %d − now mod %d for now in [%d, %d]", unit, d, secs, secs, before, after)
			}
		}
	}},
	{Name: "nested and several descriptors", Domain: "messaging", Rules: `
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
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		marketing := func() *rlsv3.RateLimitResponse {
			return Ask(t, c, "messaging", Desc("message_type", "marketing", "to_number", "2061111111"), Desc("to_number", "2061111111"))
		}
		for i := range 5 {
			resp := marketing()
			require.Equal(t, ok, resp.OverallCode, "request %d", i+1)
			s := resp.Statuses[0]
			assert.Equal(t, uint32(5), s.CurrentLimit.RequestsPerUnit)
			assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, s.CurrentLimit.Unit)
			assert.Equal(t, uint32(4-i), s.LimitRemaining)
			d := s.DurationUntilReset.AsDuration()
			assert.True(t, d > 0 && d <= 24*time.Hour, "duration_until_reset %v within the unit", d)
			assert.Equal(t, uint32(99-i), resp.Statuses[1].LimitRemaining)
		}
		resp := marketing()
		assert.Equal(t, over, resp.OverallCode)
		assert.Equal(t, over, resp.Statuses[0].Code)
		assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
		assert.Equal(t, ok, resp.Statuses[1].Code)
		// Tally's deliberate difference: the denied request charged
		// nothing on the other limit (the reference would say 94).
		assert.Equal(t, uint32(95), resp.Statuses[1].LimitRemaining)
		resp = Ask(t, c, "messaging", Desc("message_type", "marketing", "to_number", "2062222222"))
		assert.Equal(t, uint32(4), resp.Statuses[0].LimitRemaining, "another number has its own window")
	}},
	{Name: "answers without a limit", Domain: "edge_proxy_per_ip", Rules: `
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
  - key: ldap
    rate_limit:
      unlimited: true
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		for _, resp := range []*rlsv3.RateLimitResponse{
			Ask(t, c, "edge_proxy_per_ip", Desc("path", "/x")),
			Ask(t, c, "no_such_domain", Desc("remote_address", "50.0.0.1")),
			Ask(t, c, "edge_proxy_per_ip", Desc("remote_address", "50.0.0.1", "path", "/x")), // deeper than the rule
		} {
			assert.Equal(t, ok, resp.OverallCode)
			assert.Nil(t, resp.Statuses[0].CurrentLimit)
			assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
		}
		resp := Ask(t, c, "edge_proxy_per_ip", Desc("ldap", "cn=admin"))
		assert.Equal(t, ok, resp.OverallCode)
		assert.Equal(t, uint32(math.MaxUint32), resp.Statuses[0].LimitRemaining)
		resp = Ask(t, c, "edge_proxy_per_ip", Desc("remote_address", "50.0.0.5"))
		assert.Equal(t, over, resp.OverallCode)
		assert.Equal(t, uint32(0), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
		resp = Ask(t, c, "edge_proxy_per_ip", withHits(Desc("remote_address", "50.0.0.5"), 0))
		assert.Equal(t, ok, resp.OverallCode, "a check against a rule of 0 requests passes")
		for _, req := range []*rlsv3.RateLimitRequest{
			{Descriptors: []*rlv3.RateLimitDescriptor{Desc("a", "b")}},
			{Domain: "edge_proxy_per_ip"},
		} {
			_, err := c.ShouldRateLimit(context.Background(), req)
			assert.Error(t, err, "an empty domain or descriptor list is refused")
			assert.NotEqual(t, codes.OK, status.Code(err))
		}
		_, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge_proxy_per_ip",
			Descriptors: []*rlv3.RateLimitDescriptor{Desc("remote_address", strings.Repeat("1", 1025))}})
		assert.Error(t, err, "a value beyond Tally's bound is refused")
	}},
	{Name: "hits_addend", Domain: "tokens", Rules: `
domain: tokens
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		cases := []struct {
			name      string
			hits      uint32
			desc      *rlv3.RateLimitDescriptor
			code      rlsv3.RateLimitResponse_Code
			remaining uint32
		}{
			{"request's hits", 30, Desc("user", "u"), ok, 70},
			{"descriptor's own", 30, withHits(Desc("user", "u"), 50), ok, 20},
			{"check only", 1, withHits(Desc("user", "u"), 0), ok, 20},
			{"more than is left", 0, withHits(Desc("user", "u"), 21), over, 0},
			{"beyond the limit", 0, withHits(Desc("user", "u"), 101), over, 0},
			{"what is left", 0, withHits(Desc("user", "u"), 20), ok, 0},
			{"check at the limit", 0, withHits(Desc("user", "u"), 0), ok, 0},
			{"one more", 0, Desc("user", "u"), over, 0},
		}
		for _, tc := range cases {
			resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokens", HitsAddend: tc.hits,
				Descriptors: []*rlv3.RateLimitDescriptor{tc.desc}})
			require.NoError(t, err, tc.name)
			assert.Equal(t, tc.code, resp.OverallCode, tc.name)
			assert.Equal(t, tc.remaining, resp.Statuses[0].LimitRemaining, tc.name)
		}
	}},
	{Name: "shadow_mode and replaces", Domain: "example", Rules: `
domain: example
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 2, unit: minute}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 2, unit: minute}
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 1
          unit: minute
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 3
          unit: minute
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		for i := range 4 {
			resp := Ask(t, c, "example", Desc("service", "auth", "user", "user-a"))
			assert.Equal(t, ok, resp.OverallCode, "shadow never denies (request %d)", i+1)
			assert.Equal(t, ok, resp.Statuses[0].Code)
			assert.Equal(t, uint32(max(0, 1-i)), resp.Statuses[0].LimitRemaining)
		}
		var seen []rlsv3.RateLimitResponse_Code
		for range 3 {
			seen = append(seen, Ask(t, c, "example", Desc("service", "auth", "user", "user-b")).OverallCode)
		}
		assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over}, seen)
		both := func() *rlsv3.RateLimitResponse {
			return Ask(t, c, "example", Desc("key_1", "value_1", "user", "bkthomps"), Desc("key_2", "value_2", "user", "bkthomps"))
		}
		for i := range 3 {
			resp := both()
			require.Equal(t, ok, resp.OverallCode, "request %d", i+1)
			assert.Nil(t, resp.Statuses[0].CurrentLimit, "the replaced rule answers no limit")
			assert.Equal(t, uint32(2-i), resp.Statuses[1].LimitRemaining)
		}
		assert.Equal(t, over, both().OverallCode)
		resp := Ask(t, c, "example", Desc("key_1", "value_1", "user", "bkthomps"))
		assert.Equal(t, ok, resp.OverallCode, "the replaced rule's window was not charged")
		assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
	}},
	{Name: "wildcards", Domain: "files", Rules: `
domain: files
descriptors:
  - key: own
    value: own/*
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: any
    value: "*"
    rate_limit: {unit: hour, requests_per_unit: 1}
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		got := func(kv ...string) rlsv3.RateLimitResponse_Code { return Ask(t, c, "files", Desc(kv...)).OverallCode }
		for range 2 {
			assert.Equal(t, ok, got("own", "own/a"))
		}
		assert.Equal(t, over, got("own", "own/a"))
		assert.Equal(t, ok, got("own", "own/b"), "each value counts apart")
		assert.Equal(t, ok, got("any", ""), "* matches the empty string")
		assert.Equal(t, over, got("any", ""))
	}},
	{Name: "limit override", Domain: "override", Rules: `
domain: override
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 100}
`, Check: func(t *testing.T, c rlsv3.RateLimitServiceClient) {
		d := func() *rlv3.RateLimitDescriptor {
			x := Desc("k", "v")
			x.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
			return x
		}
		resp := Ask(t, c, "override", d())
		assert.Equal(t, ok, resp.OverallCode)
		assert.Equal(t, uint32(1), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
		assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, resp.Statuses[0].CurrentLimit.Unit)
		assert.Equal(t, over, Ask(t, c, "override", d()).OverallCode)
		assert.Equal(t, uint32(99), Ask(t, c, "override", Desc("k", "v")).Statuses[0].LimitRemaining)
	}},
}

// Run runs every case against c, as subtests.
func Run(t *testing.T, c rlsv3.RateLimitServiceClient) {
	for _, tc := range Cases {
		t.Run(tc.Name, func(t *testing.T) { tc.Check(t, c) })
	}
}
