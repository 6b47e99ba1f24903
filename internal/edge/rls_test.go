package edge_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// rls serves an edge's rate-limit service on a loopback port and returns a
// client of it, generated from Envoy's protocol.
func rls(t *testing.T, e *edgeUnderTest) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, e.srv.RateLimitService())
	go func() { _ = gs.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		gs.Stop()
	})
	return rlsv3.NewRateLimitServiceClient(conn)
}

func rules(t *testing.T, files ...string) *descriptors.Config {
	t.Helper()
	var fs []descriptors.File
	for _, f := range files {
		fs = append(fs, descriptors.File{Name: "rules.yaml", Data: []byte(f)})
	}
	c, err := descriptors.Load(fs, descriptors.Options{})
	require.NoError(t, err)
	return c
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *rlv3.RateLimitDescriptor {
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

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, ds ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	require.NoError(t, err)
	require.Len(t, resp.Statuses, len(ds))
	return resp
}

// rlsEdge starts an edge serving the rules of files, and a client of its
// rate-limit service.
func rlsEdge(t *testing.T, pl *pipeline, mut func(*edge.Options), files ...string) (*edgeUnderTest, rlsv3.RateLimitServiceClient) {
	t.Helper()
	c := rules(t, files...)
	e := pl.edge(func(o *edge.Options) {
		o.Descriptors = c
		if mut != nil {
			mut(o)
		}
	})
	return e, rls(t, e)
}

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// envoyproxy/ratelimit's README example 2 through the generated client: a
// request with two descriptors is allowed only if both pass; each status
// says its limit, what is left and when it resets; the counts are exact.
func TestRLSNestedAndSeveralDescriptors(t *testing.T) {
	pl := newPipeline(t)
	_, c := rlsEdge(t, pl, nil, `
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
`)
	marketing := func() *rlsv3.RateLimitResponse {
		return ask(t, c, "messaging", desc("message_type", "marketing", "to_number", "2061111111"), desc("to_number", "2061111111"))
	}
	for i := range 5 {
		resp := marketing()
		require.Equal(t, ok, resp.OverallCode, "request %d", i+1)
		s := resp.Statuses[0]
		assert.Equal(t, uint32(5), s.CurrentLimit.RequestsPerUnit)
		assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, s.CurrentLimit.Unit)
		assert.Equal(t, uint32(4-i), s.LimitRemaining)
		assert.InDelta(t, (24 * time.Hour).Seconds(), s.DurationUntilReset.AsDuration().Seconds(), 2)
		assert.Equal(t, uint32(99-i), resp.Statuses[1].LimitRemaining)
	}
	resp := marketing()
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, over, resp.Statuses[0].Code)
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
	assert.Equal(t, ok, resp.Statuses[1].Code)
	assert.Equal(t, uint32(95), resp.Statuses[1].LimitRemaining, "the denied request charged nothing on the other limit")
	// Another number has its own windows; the per-number limit alone still
	// counts what was allowed.
	resp = ask(t, c, "messaging", desc("to_number", "2061111111"))
	assert.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(94), resp.Statuses[0].LimitRemaining)
	resp = ask(t, c, "messaging", desc("message_type", "marketing", "to_number", "2062222222"))
	assert.Equal(t, uint32(4), resp.Statuses[0].LimitRemaining)
}

// What envoyproxy/ratelimit answers where no rule applies, for unlimited
// rules, for a rule of 0 requests (example 3), and for malformed requests.
func TestRLSAnswersWithoutALimit(t *testing.T) {
	pl := newPipeline(t)
	e, c := rlsEdge(t, pl, nil, `
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
`)
	// What the edge asked of Redis: reservations, and reads.
	calls := func() float64 {
		return metric(t, e, "tally_edge_reservations_total") + metric(t, e, "tally_edge_rechecks_total")
	}
	before := calls()
	// No rule, unknown domain: OK, no limit, nothing left to say.
	for _, resp := range []*rlsv3.RateLimitResponse{
		ask(t, c, "edge_proxy_per_ip", desc("path", "/x")),
		ask(t, c, "no_such_domain", desc("remote_address", "50.0.0.1")),
		ask(t, c, "edge_proxy_per_ip", desc("remote_address", "50.0.0.1", "path", "/x")), // deeper than the rule
	} {
		assert.Equal(t, ok, resp.OverallCode)
		assert.Nil(t, resp.Statuses[0].CurrentLimit)
		assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
	}
	resp := ask(t, c, "edge_proxy_per_ip", desc("ldap", "cn=admin"))
	assert.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(math.MaxUint32), resp.Statuses[0].LimitRemaining)
	resp = ask(t, c, "edge_proxy_per_ip", desc("remote_address", "50.0.0.5"))
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, uint32(0), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
	resp = ask(t, c, "edge_proxy_per_ip", withHits(desc("remote_address", "50.0.0.5"), 0))
	assert.Equal(t, ok, resp.OverallCode, "a check against a rule of 0 requests passes, as in the reference")
	assert.Equal(t, before, calls(), "none of these needs Redis")
	ask(t, c, "edge_proxy_per_ip", desc("remote_address", "50.0.0.1"))
	assert.Greater(t, calls(), before, "a limited descriptor does (the count above counts)")

	for _, req := range []*rlsv3.RateLimitRequest{
		{Descriptors: []*rlv3.RateLimitDescriptor{desc("a", "b")}},
		{Domain: "edge_proxy_per_ip"},
		{Domain: "edge_proxy_per_ip", Descriptors: make([]*rlv3.RateLimitDescriptor, 65)},
		{Domain: "edge_proxy_per_ip", Descriptors: []*rlv3.RateLimitDescriptor{desc(strings.Split(strings.Repeat("k,v,", 33), ",")[:66]...)}},
		{Domain: "edge_proxy_per_ip", Descriptors: []*rlv3.RateLimitDescriptor{desc("remote_address", strings.Repeat("1", 1025))}},
	} {
		_, err := c.ShouldRateLimit(context.Background(), req)
		assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
	}
}

// hits_addend: the request's, a descriptor's own (which may be 0: a check
// that charges nothing), and a cost beyond the limit (denied, charging
// nothing).
func TestRLSHitsAddend(t *testing.T) {
	pl := newPipeline(t)
	_, c := rlsEdge(t, pl, nil, `
domain: tokens
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	cases := []struct {
		name      string
		hits      uint32
		desc      *rlv3.RateLimitDescriptor
		code      rlsv3.RateLimitResponse_Code
		remaining uint32
	}{
		{"request's hits", 30, desc("user", "u"), ok, 70},
		{"descriptor's own", 30, withHits(desc("user", "u"), 50), ok, 20},
		{"check only", 1, withHits(desc("user", "u"), 0), ok, 20},
		{"more than is left", 0, withHits(desc("user", "u"), 21), over, 0},
		{"beyond the limit", 0, withHits(desc("user", "u"), 101), over, 0},
		{"what is left", 0, withHits(desc("user", "u"), 20), ok, 0},
		{"check at the limit", 0, withHits(desc("user", "u"), 0), ok, 0},
		{"one more", 0, desc("user", "u"), over, 0},
	}
	for _, tc := range cases {
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "tokens", HitsAddend: tc.hits,
			Descriptors: []*rlv3.RateLimitDescriptor{tc.desc}})
		require.NoError(t, err, tc.name)
		assert.Equal(t, tc.code, resp.OverallCode, tc.name)
		assert.Equal(t, tc.remaining, resp.Statuses[0].LimitRemaining, tc.name)
	}
}

// A rule's window lasts its unit, as the reference's do: a 3/SECOND rule
// admits 3 in every second, and every answer's duration_until_reset lies
// in (0, unit]; a descriptor over its limit has nothing left
// (limit_remaining 0), even when a request of a smaller cost would pass.
// The edge's clock is injected, starting 200 ms into a second: nothing
// sleeps.
func TestRLSWindowsLastTheirUnit(t *testing.T) {
	pl := newPipeline(t)
	second := time.Now().Truncate(time.Second)
	clock := limiter.NewManualClock(second.Add(200 * time.Millisecond))
	_, c := rlsEdge(t, pl, func(o *edge.Options) { o.Clock = clock }, `
domain: api
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	within := func(resp *rlsv3.RateLimitResponse, unit time.Duration, what string) {
		t.Helper()
		for _, st := range resp.Statuses {
			d := st.DurationUntilReset.AsDuration()
			require.True(t, d > 0 && d <= unit, "%s: duration_until_reset %v outside (0, %v]", what, d, unit)
		}
	}
	for k := range 4 {
		admitted := 0
		for _, off := range []time.Duration{200, 450, 700, 900, 999} {
			clock.Set(second.Add(time.Duration(k)*time.Second + off*time.Millisecond))
			resp := ask(t, c, "api", desc("client", "c1"))
			what := fmt.Sprintf("second %d, +%d ms", k, off)
			within(resp, time.Second, what)
			if resp.OverallCode == ok {
				admitted++
				continue
			}
			require.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, what)
		}
		require.Equal(t, 3, admitted, "second %d: a 3/SECOND rule admits 3 a second", k)
	}

	// A minute's rule, opened 200 ms into a second: never more than 60 s.
	clock.Set(second.Add(10*time.Second + 200*time.Millisecond))
	resp := ask(t, c, "api", withHits(desc("user", "u1"), 98))
	require.Equal(t, ok, resp.OverallCode)
	within(resp, time.Minute, "a minute's rule")
	require.Equal(t, uint32(2), resp.Statuses[0].LimitRemaining)
	for _, off := range []time.Duration{time.Second, 30 * time.Second, 49*time.Second + 799*time.Millisecond} {
		clock.Set(second.Add(10*time.Second + off))
		resp = ask(t, c, "api", withHits(desc("user", "u1"), 3))
		require.Equal(t, over, resp.OverallCode, "+%v", off)
		within(resp, time.Minute, "a minute's rule, over")
		require.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, "3 asked, 2 left: over, nothing left")
	}
	clock.Set(second.Add(70 * time.Second)) // the minute's window reset
	require.Equal(t, ok, ask(t, c, "api", withHits(desc("user", "u1"), 3)).OverallCode)
}

// shadow_mode decides and never denies; replaces takes the place of the
// named rule (README examples 6 and 7).
func TestRLSShadowAndReplaces(t *testing.T) {
	pl := newPipeline(t)
	_, c := rlsEdge(t, pl, nil, `
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
`)
	for i := range 4 {
		resp := ask(t, c, "example", desc("service", "auth", "user", "user-a"))
		assert.Equal(t, ok, resp.OverallCode, "shadow never denies (request %d)", i+1)
		assert.Equal(t, ok, resp.Statuses[0].Code)
		assert.Equal(t, uint32(max(0, 1-i)), resp.Statuses[0].LimitRemaining)
	}
	var seen []rlsv3.RateLimitResponse_Code
	for range 3 {
		seen = append(seen, ask(t, c, "example", desc("service", "auth", "user", "user-b")).OverallCode)
	}
	assert.Equal(t, []rlsv3.RateLimitResponse_Code{ok, ok, over}, seen)

	// Both apply: only the replacing one counts (3 a minute), and the
	// replaced rule's window is untouched.
	both := func() *rlsv3.RateLimitResponse {
		return ask(t, c, "example", desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps"))
	}
	for i := range 3 {
		resp := both()
		require.Equal(t, ok, resp.OverallCode, "request %d", i+1)
		assert.Nil(t, resp.Statuses[0].CurrentLimit)
		assert.Equal(t, uint32(2-i), resp.Statuses[1].LimitRemaining)
	}
	assert.Equal(t, over, both().OverallCode)
	resp := ask(t, c, "example", desc("key_1", "value_1", "user", "bkthomps"))
	assert.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
}

// Wildcards: each value its own counter, or one shared (share_threshold).
func TestRLSWildcards(t *testing.T) {
	pl := newPipeline(t)
	_, c := rlsEdge(t, pl, nil, `
domain: files
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: own
    value: own/*
    rate_limit: {unit: hour, requests_per_unit: 2}
`)
	got := func(kv ...string) rlsv3.RateLimitResponse_Code { return ask(t, c, "files", desc(kv...)).OverallCode }
	assert.Equal(t, ok, got("files", "files/a.pdf"))
	assert.Equal(t, ok, got("files", "files/b.csv"))
	assert.Equal(t, over, got("files", "files/c.txt"), "shared")
	for range 2 {
		assert.Equal(t, ok, got("own", "own/a"))
	}
	assert.Equal(t, over, got("own", "own/a"))
	assert.Equal(t, ok, got("own", "own/b"), "each value counts apart")
}

// A limit override in the request (Envoy's route-level override) limits
// its descriptor, apart from the configured rule.
func TestRLSLimitOverride(t *testing.T) {
	pl := newPipeline(t)
	_, c := rlsEdge(t, pl, nil, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 100}\n")
	d := func() *rlv3.RateLimitDescriptor {
		x := desc("k", "v")
		x.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
		return x
	}
	resp := ask(t, c, "d", d())
	assert.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(1), resp.Statuses[0].CurrentLimit.RequestsPerUnit)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, resp.Statuses[0].CurrentLimit.Unit)
	assert.Equal(t, over, ask(t, c, "d", d()).OverallCode)
	assert.Equal(t, uint32(99), ask(t, c, "d", desc("k", "v")).Statuses[0].LimitRemaining)
}

// Many clients on two edges at once: no window admits more than its limit,
// and what each edge said adds up to what the primary counts.
func TestRLSIsExactAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	const file = "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 50}\n"
	_, a := rlsEdge(t, pl, nil, file)
	_, b := rlsEdge(t, pl, nil, file)
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for i := range 16 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Go(func() {
			for range 10 {
				resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "hot")}})
				if err == nil && resp.OverallCode == ok {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(50), allowed.Load())
}

// Redis down, nothing known of the window: as configured, fail open (OK,
// charged once it is back) or an error Envoy answers by failure_mode_deny.
func TestRLSWhenRedisIsDown(t *testing.T) {
	pl := newPipeline(t)
	const file = "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 50}\n"
	_, open := rlsEdge(t, pl, nil, file)
	_, closed := rlsEdge(t, pl, func(o *edge.Options) { o.DenyOnRedisError = true }, file)
	pl.primary.Pause()
	defer pl.primary.Resume()
	resp := ask(t, open, "api", desc("client", "c1"))
	assert.Equal(t, ok, resp.OverallCode)
	_, err := closed.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
		Descriptors: []*rlv3.RateLimitDescriptor{desc("client", "c2")}})
	assert.Equal(t, codes.Unavailable, status.Code(err))
}

// Every decision of the rate-limit service is on the decisions stream with
// its domain and rule (never a descriptor value the rule does not name): an
// allowed request's for each limit, a denied one's denial alone, a shadow
// limit's marked as such, a rule of 0 requests' by the rule.
func TestRLSDecisionsAreRecorded(t *testing.T) {
	pl := newPipeline(t)
	records := decisionRecords(t, pl)
	_, c := rlsEdge(t, pl, nil, `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: beta
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: blocked
    value: me
    rate_limit: {unit: minute, requests_per_unit: 0}
`)
	assert.Equal(t, ok, ask(t, c, "d", desc("user", "secret-token-1"), desc("tenant", "acme")).OverallCode)
	assert.Equal(t, over, ask(t, c, "d", desc("user", "secret-token-1"), desc("tenant", "acme")).OverallCode)
	ask(t, c, "d", desc("beta", "x"))
	assert.Equal(t, ok, ask(t, c, "d", desc("beta", "x")).OverallCode)
	assert.Equal(t, over, ask(t, c, "d", desc("blocked", "me")).OverallCode)
	var got []decisionRecord
	testutil.WaitFor(t, "the decisions recorded", func() bool { got = records(); return len(got) == 6 })
	type seen struct {
		rule    string
		allowed bool
		shadow  bool
		path    string
	}
	var summary []seen
	for _, r := range got {
		require.Equal(t, "d", r.Domain)
		require.NotContains(t, r.Rule, "secret-token-1")
		summary = append(summary, seen{r.Rule, r.Allowed, r.Shadow, r.Path})
	}
	assert.ElementsMatch(t, []seen{
		{"d.user", true, false, "reserve"}, {"d.tenant", true, false, "reserve"},
		{"d.user", false, false, "cache"},
		{"d.beta", true, true, "reserve"}, {"d.beta", false, true, "cache"},
		{"d.blocked_me", false, false, "rule"},
	}, summary)
}

// Tokens counted at the end of a request (Envoy's apply_on_stream_done):
// the request path checks without charging (hits_addend 0), the end of
// the stream charges what the model answered with, in full even past the
// limit; the next check is denied on this edge at once and on another once
// the charge is applied.
func TestRLSChargeAtTheEnd(t *testing.T) {
	pl := newPipeline(t)
	const file = "domain: ai\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"
	atEnd := func(o *edge.Options) { o.RLS.ChargeAtEnd = map[string]bool{"ai": true} }
	_, a := rlsEdge(t, pl, atEnd, file)
	_, b := rlsEdge(t, pl, atEnd, file)
	check := func(c rlsv3.RateLimitServiceClient) rlsv3.RateLimitResponse_Code {
		return ask(t, c, "ai", withHits(desc("user", "u1"), 0)).OverallCode
	}
	require.Equal(t, ok, check(a))
	resp := ask(t, a, "ai", withHits(desc("user", "u1"), 60)) // the stream's end: 60 tokens
	require.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(40), resp.Statuses[0].LimitRemaining)
	require.Equal(t, ok, check(a))
	resp = ask(t, a, "ai", withHits(desc("user", "u1"), 70)) // 130 of 100: charged in full
	require.Equal(t, ok, resp.OverallCode, "a charge at the end is never denied")
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
	assert.Equal(t, over, check(a), "spent: denied on this edge at once")
	testutil.WaitFor(t, "the other edge to see the window spent", func() bool { return check(b) == over })
	// Outside the domain, a descriptor's own hits_addend is an ordinary
	// cost: more than is left is denied and charges nothing.
	_, c := rlsEdge(t, pl, nil, file)
	assert.Equal(t, over, ask(t, c, "ai", withHits(desc("user", "u2"), 101)).OverallCode)
}

// Windows aligned to the clock (edge.rls.clock_windows), as the reference's:
// a minute's rule counts the clock's minutes on every edge — exactly its
// limit in each from two edges, the last half second of one minute and the
// first of the next apart — and duration_until_reset is unit − now mod unit.
// The edges share an injected clock: nothing sleeps.
func TestRLSClockWindowsAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	minute := time.Now().Truncate(time.Minute).Add(time.Minute)
	clock := limiter.NewManualClock(minute.Add(-500 * time.Millisecond))
	const file = "domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 10}\n"
	aligned := func(o *edge.Options) { o.Clock, o.RLS.ClockWindows = clock, map[string]bool{"*": true} }
	_, a := rlsEdge(t, pl, aligned, file)
	_, b := rlsEdge(t, pl, aligned, file)
	for _, at := range []time.Time{minute.Add(-500 * time.Millisecond), minute.Add(200 * time.Millisecond)} {
		clock.Set(at)
		allowed := 0
		for i := range 16 {
			c := a
			if i%2 == 1 {
				c = b
			}
			resp := ask(t, c, "api", desc("client", "c1"))
			if resp.OverallCode == ok {
				allowed++
			}
			want := 60 - at.Unix()%60
			require.Equal(t, time.Duration(want)*time.Second, resp.Statuses[0].DurationUntilReset.AsDuration(), "at %v", at)
		}
		require.Equal(t, 10, allowed, "the clock's minute before %v: its limit, from two edges", at)
	}
}
