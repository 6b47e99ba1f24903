package edge_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// One path: a request path whose meaning depends on who decodes or
// normalises it is refused, whatever it would have matched, and nothing is
// charged for it; every other path is matched as the upstream receives it,
// in its canonical encoding.
func TestOnePath(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["search"] = limiter.Policy{Name: "search", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	var mu sync.Mutex
	var received []string
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		received = append(received, r.RequestURI)
		mu.Unlock()
	}))
	t.Cleanup(upstream.Close)
	u, _ := url.Parse(upstream.URL)
	e := pl.edge(func(o *edge.Options) {
		o.Upstream = u
		o.Routes = []edge.Route{{Path: "/search/", Policies: []string{"search"}}}
	})
	for _, p := range []string{
		"/search/..%2F..%2Fcats", "/search/%2e%2e/cats", "/search/%2E%2E/cats", "/search/../cats", "/search/..\\cats",
		"/search/%252e%252e/cats", "/search%2fcats", "/search%2Fcats", "/search%5ccats", "/search/.%2e/cats",
		"//search", "/./search", "/x/../search", "/search/./code", "/a/b/../../search//x", "/search;x=1",
		"/search/%00", "/search/%0a", "/cats/..", "*",
	} {
		status, _ := rawGet(t, e.proxy.URL, p, "paths")
		require.Equal(t, 400, status, p)
	}
	mu.Lock()
	require.Empty(t, received, "nothing refused reached the upstream")
	mu.Unlock()
	require.Zero(t, pl.used(pl.keys.Key("search", "h:paths")), "nothing refused was charged")
	require.Zero(t, pl.used(pl.keys.Key("core", "h:paths")))

	for _, c := range []struct{ path, resource, forwarded string }{
		{"/search", "search", "/search"},
		{"/search/", "search", "/search/"},
		{"/search/code", "search", "/search/code"},
		{"/sear%63h/code", "search", "/search/code"}, // what it decodes to, as the upstream gets it
		{"/search/a%20b", "search", "/search/a%20b"},
		{"/searching", "core", "/searching"},
		{"/cats", "core", "/cats"},
	} {
		mu.Lock()
		received = nil
		mu.Unlock()
		status, h := rawGet(t, e.proxy.URL, c.path, "paths")
		require.Equal(t, 200, status, c.path)
		require.Equal(t, c.resource, h.Get("X-RateLimit-Resource"), c.path)
		mu.Lock()
		require.Equal(t, []string{c.forwarded}, received, c.path)
		mu.Unlock()
	}
	require.EqualValues(t, 5, pl.used(pl.keys.Key("search", "h:paths")))
}

// rawGet sends a GET with path exactly as given (no client cleans it) and
// returns the status and headers.
func rawGet(t *testing.T, base, path, token string) (int, http.Header) {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	c, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer c.Close()
	_, err = fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nConnection: close\r\n\r\n", path, u.Host, token)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// A request is held to every limit of its route and the global ones: a
// client that sends a new token with every request still meets its
// address's limit; a request one limit denies gives back what the others
// charged; a 304 refunds every charge; the response shows the limit with
// the least room.
func TestSeveralLimits(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	pl.policies["per-address"] = limiter.Policy{Name: "per-address", Limit: 4, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(func(o *edge.Options) {
		o.GlobalPolicies = []string{"per-address"}
		o.AddressKeyed = map[string]bool{"per-address": true}
	})
	addr := pl.keys.Key("per-address", "ip:127.0.0.1/32")
	core := func(token string) limiter.Key { return pl.keys.Key("core", "h:"+token) }
	records := decisionRecords(t, pl)

	resp := get(t, e.proxy.URL, "rotate-1")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "per-address", resp.Header.Get("X-RateLimit-Resource"), "the tighter limit is shown")
	require.Equal(t, "3", resp.Header.Get("X-RateLimit-Remaining"))

	resp = get(t, e.proxy.URL, "rotate-2", "If-None-Match", `"v1"`)
	require.Equal(t, 304, resp.StatusCode)
	pl.waitUsed(addr, 1)
	pl.waitUsed(core("rotate-2"), 0)

	for i := 3; i <= 5; i++ {
		require.Equal(t, 200, get(t, e.proxy.URL, "rotate-"+strconv.Itoa(i)).StatusCode)
	}
	resp = get(t, e.proxy.URL, "rotate-6")
	require.Equal(t, 429, resp.StatusCode, "a fresh token does not escape the address's limit")
	require.Equal(t, "per-address", resp.Header.Get("X-RateLimit-Resource"))
	pl.waitUsed(core("rotate-6"), 0) // given back: the request was not served
	require.EqualValues(t, 4, pl.used(addr))
	for _, tok := range []string{"rotate-1", "rotate-3", "rotate-4", "rotate-5"} {
		require.EqualValues(t, 1, pl.used(core(tok)), tok)
	}

	// Decision records: one per policy for each allowed request; the
	// denial alone for the denied one.
	byRequest := map[string][]string{}
	testutil.WaitFor(t, "the decision records", func() bool {
		for k := range byRequest {
			delete(byRequest, k)
		}
		for _, r := range records() {
			byRequest[r.RequestID] = append(byRequest[r.RequestID], fmt.Sprintf("%s:%v", r.Policy, r.Allowed))
		}
		return len(byRequest) == 6
	})
	var denied int
	for id, rs := range byRequest {
		if slices.Contains(rs, "per-address:false") {
			denied++
			require.Equal(t, []string{"per-address:false"}, rs, id)
			continue
		}
		require.ElementsMatch(t, []string{"core:true", "per-address:true"}, rs, id)
	}
	require.Equal(t, 1, denied)
}

// decisionRecord is what tests read of a decision on the decisions stream.
type decisionRecord struct {
	RequestID string `json:"request_id"`
	Policy    string `json:"policy"`
	Allowed   bool   `json:"allowed"`
	Path      string `json:"path"`
	Outcome   string `json:"outcome"`
	Used      int64  `json:"used"`
	Key       string `json:"key"`
	Cost      int64  `json:"cost"`
	Limit     int64  `json:"limit"`
	Shadow    bool   `json:"shadow"`
	Domain    string `json:"domain"`
	Rule      string `json:"rule"`
	Until     string `json:"until"`
	Strikes   int    `json:"strikes"`
	Note      string `json:"note"`
}

// decisionRecords subscribes to the decision records of edges (or, with
// subject, of others) and returns what has arrived so far, whenever called.
func decisionRecords(t *testing.T, pl *pipeline, subject ...string) func() []decisionRecord {
	nc, _ := pl.nats.Connect()
	var mu sync.Mutex
	var got []decisionRecord
	subj := events.Streams{}.DecisionsSubject()
	if len(subject) > 0 {
		subj = subject[0]
	}
	_, err := nc.Subscribe(subj, func(m *nats.Msg) {
		var batch []struct {
			Data decisionRecord `json:"data"`
		}
		if json.Unmarshal(m.Data, &batch) != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, b := range batch {
			got = append(got, b.Data)
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return func() []decisionRecord {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(got)
	}
}

// NATS and the primary both down: requests are still answered at once;
// the accounting events wait in the edge up to its capacity, beyond which
// they are dropped, counted and logged; the metrics say which dependency is
// gone; when the primary is back the waiting events are applied and the
// recovery is logged.
func TestNATSAndPrimaryDownQueueThenDrop(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute, Mode: limiter.ModeExact}
	var logs testutil.Buffer
	e := pl.edge(func(o *edge.Options) {
		o.Outbox.Capacity = 4
		o.Log = slog.New(slog.NewTextHandler(&logs, nil))
	})
	require.Equal(t, 200, get(t, e.proxy.URL, "both-down").StatusCode)
	require.EqualValues(t, 1, metric(t, e, "tally_edge_nats_connected"))
	require.EqualValues(t, 1, metric(t, e, `tally_edge_primary_reachable{shard="s0"}`))

	pl.nats.Shutdown()
	pl.primary.Stop()
	start := time.Now()
	for range 6 { // each: a charge by event (borrowed), then a refund by event (304)
		require.Equal(t, 304, get(t, e.proxy.URL, "both-down", "If-None-Match", `"v1"`).StatusCode)
	}
	require.Less(t, time.Since(start), 5*time.Second, "requests were held up")
	testutil.WaitFor(t, "NATS seen down", func() bool { return metric(t, e, "tally_edge_nats_connected") == 0 })
	require.EqualValues(t, 0, metric(t, e, `tally_edge_primary_reachable{shard="s0"}`))
	require.EqualValues(t, 4, metric(t, e, "tally_edge_accounting_queued"), "held up to the capacity")
	require.EqualValues(t, 8, metric(t, e, `tally_edge_accounting_events_total{outcome="dropped"}`))
	require.Contains(t, logs.String(), "accounting event dropped")

	pl.primary.Restart()
	// The next request's reservation finds the primary again.
	testutil.WaitFor(t, "the primary seen back", func() bool {
		get(t, e.proxy.URL, "both-down-probe")
		return metric(t, e, `tally_edge_primary_reachable{shard="s0"}`) == 1
	})
	testutil.WaitFor(t, "the queued events applied", func() bool {
		return metric(t, e, "tally_edge_accounting_queued") == 0 &&
			metric(t, e, `tally_edge_accounting_events_total{outcome="applied_directly"}`) == 4
	})
	require.Contains(t, logs.String(), "the primary answers again")
}

// A reservation sent just before the primary froze times out at the edge,
// which admits the request by borrowing (charged by an event); the primary
// makes the reservation when it wakes. The edge learns it from the window's
// count of what was reserved for it, and gives the units back: the window
// ends up holding what its client was allowed, not a request twice.
func TestLostReservationIsTakenBack(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:frozen")
	require.Equal(t, 200, get(t, e.proxy.URL, "frozen").StatusCode)
	pl.primary.Pause()
	resp := get(t, e.proxy.URL, "frozen")
	require.Equal(t, 200, resp.StatusCode, "admitted from what the edge knows")
	require.Equal(t, "98", resp.Header.Get("X-RateLimit-Remaining"))
	time.Sleep(100 * time.Millisecond)
	pl.primary.Resume()
	testutil.WaitFor(t, "the lost reservation taken back", func() bool {
		return metric(t, e, "tally_edge_recovered_units_total") == 1
	})
	pl.waitUsed(k, 2)
	// Everything the edge sent has been applied: nothing more lands.
	testutil.WaitFor(t, "nothing queued at the edge", func() bool { return metric(t, e, "tally_edge_accounting_queued") == 0 })
	testutil.WaitFor(t, "nothing left in the stream", func() bool { return pl.streamMsgs() == 0 })
	require.EqualValues(t, 2, pl.used(k))
}

// Decisions can be logged, sampled, at a chosen level: one JSON line each
// with the key's digest and the request and trace ids, never the identity.
func TestDecisionsAreLogged(t *testing.T) {
	pl := newPipeline(t)
	var logs testutil.Buffer
	e := pl.edge(func(o *edge.Options) {
		o.Decisions.LogSample, o.Decisions.LogLevel = 1, "info"
		o.Log = slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	for range 4 { // a limit of 3: the last is denied
		get(t, e.proxy.URL, "logged-client", "Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	}
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m), l)
		if m["msg"] == "decision" {
			lines = append(lines, m)
		}
	}
	require.Len(t, lines, 4)
	digest := pl.keys.Key("core", "h:logged-client").Digest().String()
	for i, m := range lines {
		require.Equal(t, "INFO", m["level"])
		require.Equal(t, digest, m["key"])
		require.Equal(t, "core", m["policy"])
		require.Equal(t, i < 3, m["allowed"], "decision %d", i)
		require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", m["trace_id"])
		require.Equal(t, e.srv.Producer()+"-"+strconv.Itoa(i+1), m["request_id"])
	}
	require.NotContains(t, logs.String(), "logged-client", "the identity is never logged")
}

// The decisions stream holds both views of a request, joined by its
// request id: the edge's decision and what the accountant did with the
// events it caused (here the refund of a 304), with the window after it.
func TestDecisionsJoinByRequestID(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 10, Window: time.Minute, Mode: limiter.ModeExact}
	edges := decisionRecords(t, pl)
	accountants := decisionRecords(t, pl, events.Streams{}.AccountantDecisionsSubject())
	e := pl.edge(nil)
	require.Equal(t, 200, get(t, e.proxy.URL, "joined").StatusCode)
	require.Equal(t, 304, get(t, e.proxy.URL, "joined", "If-None-Match", `"v1"`).StatusCode)
	k := pl.keys.Key("core", "h:joined")
	pl.waitUsed(k, 1)

	var refund decisionRecord
	testutil.WaitFor(t, "the accountant's record", func() bool {
		rs := accountants()
		if len(rs) == 0 {
			return false
		}
		refund = rs[0]
		return true
	})
	require.Equal(t, "refunded", refund.Outcome)
	require.Equal(t, "accountant", refund.Path)
	require.EqualValues(t, 1, refund.Used, "the window after the refund")
	require.Equal(t, k.Digest().String(), refund.Key)
	var allowed []decisionRecord
	testutil.WaitFor(t, "the edge's records", func() bool { allowed = edges(); return len(allowed) == 2 })
	require.Equal(t, e.srv.Producer()+"-2", refund.RequestID, "the refund names the request it gives back")
	require.True(t, slices.ContainsFunc(allowed, func(r decisionRecord) bool { return r.RequestID == refund.RequestID && r.Allowed }))
	// An analyst's count of the window from the stream alone: allowed
	// decisions less refunds is what the primary holds.
	var n int64
	for _, r := range allowed {
		if r.Key == refund.Key && r.Allowed {
			n++
		}
	}
	require.EqualValues(t, pl.used(k), n-1)
}

// A 304 refunded into the edge's own credit (mode auto: no accounting
// event, no accountant's record) is recorded by the edge, joined to its
// admission by request id.
func TestAbsorbedRefundIsRecorded(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	records := decisionRecords(t, pl)
	e := pl.edge(nil)
	require.Equal(t, 200, get(t, e.proxy.URL, "absorbed").StatusCode)
	require.Equal(t, 304, get(t, e.proxy.URL, "absorbed", "If-None-Match", `"v1"`).StatusCode)
	var rs []decisionRecord
	testutil.WaitFor(t, "three records", func() bool { rs = records(); return len(rs) >= 3 })
	id := e.srv.Producer() + "-2"
	require.Contains(t, rs, decisionRecord{RequestID: id, Policy: "core", Allowed: true, Path: "credit", Outcome: "refunded",
		Used: 1, Key: pl.keys.Key("core", "h:absorbed").Digest().String(), Cost: 1, Limit: 100})
	require.EqualValues(t, 1, metric(t, e, "tally_edge_refunds_absorbed_total"))
}

// A policy in shadow mode decides and records, and never denies: requests
// past its limit reach the upstream, charge nothing beyond the limit, show
// no headers of it, and their records say shadow.
func TestShadowPolicyNeverDenies(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 2, Window: time.Minute, Shadow: true}
	records := decisionRecords(t, pl)
	e := pl.edge(nil)
	for i := range 4 {
		resp := get(t, e.proxy.URL, "shadowed")
		require.Equal(t, 200, resp.StatusCode, "request %d", i+1)
		require.Empty(t, resp.Header.Get("X-RateLimit-Limit"), "a shadow limit is not shown")
	}
	var rs []decisionRecord
	testutil.WaitFor(t, "four records", func() bool { rs = records(); return len(rs) == 4 })
	allowed := 0
	for _, r := range rs {
		require.True(t, r.Shadow)
		if r.Allowed {
			allowed++
		}
	}
	require.Equal(t, 2, allowed, "two within the limit, two it would have denied")
	require.EqualValues(t, 2, pl.used(pl.keys.Key("core", "h:shadowed")))
}

// Routes by method and host as well as path: among routes of one path, the
// one naming the request's host wins, then the one naming its method.
func TestRoutesByMethodAndHost(t *testing.T) {
	pl := newPipeline(t)
	pl.policies = map[string]limiter.Policy{
		"core":   {Name: "core", Limit: 100, Window: time.Minute},
		"writes": {Name: "writes", Limit: 1, Window: time.Minute},
		"admin":  {Name: "admin", Limit: 2, Window: time.Minute},
	}
	e := pl.edge(func(o *edge.Options) {
		o.Routes = []edge.Route{
			{Path: "/repos", Methods: []string{"post", "DELETE"}, Policies: []string{"writes"}},
			{Path: "/repos", Host: "admin.example.com", Policies: []string{"admin"}},
			{Path: "/repos", Policies: []string{"core"}},
		}
	})
	do := func(method, host string) *http.Response {
		req, err := http.NewRequest(method, e.proxy.URL+"/repos", nil)
		require.NoError(t, err)
		req.Host = host
		req.Header.Set("Authorization", "Bearer routes")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	resp := do("GET", "api.example.com")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, "core", resp.Header.Get("X-RateLimit-Resource"))
	require.Equal(t, "writes", do("POST", "api.example.com").Header.Get("X-RateLimit-Resource"))
	require.Equal(t, 429, do("DELETE", "api.example.com").StatusCode, "writes: 1 a minute")
	resp = do("POST", "ADMIN.example.com:8443")
	require.Equal(t, "admin", resp.Header.Get("X-RateLimit-Resource"), "the host wins over the method")
}

// Tiers give a client's plan another limit: named by a header only a
// trusted proxy is believed with (anyone else's is ignored), or by the
// decision API's tier. An override gives one identity its own limit. The
// window is the client's whatever its terms.
func TestTiersAndOverrides(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 2, Window: time.Minute}
	mut := func(trusted bool) func(o *edge.Options) {
		return func(o *edge.Options) {
			o.Tiers = map[string]edge.Tiers{"core": {Header: "X-Plan", Limits: map[string]int64{"pro": 5}}}
			o.Overrides = map[string][]edge.Override{"core": {{Identity: "Bearer partner", Limit: 4}}}
			if trusted {
				o.Identity.Trusted = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
			}
		}
	}
	allowed := func(e *edgeUnderTest, token string, hdr ...string) int {
		n := 0
		for range 7 {
			if get(t, e.proxy.URL, token, hdr...).StatusCode == 200 {
				n++
			}
		}
		return n
	}
	trusted := pl.edge(mut(true))
	require.Equal(t, 5, allowed(trusted, "Bearer pro-user", "X-Plan", "pro"), "a pro plan from a trusted proxy")
	require.Equal(t, 2, allowed(trusted, "Bearer free-user", "X-Plan", "nonesuch"), "an unknown plan keeps the policy's limit")
	require.Equal(t, 4, allowed(trusted, "Bearer partner"), "an override")
	untrusted := pl.edge(mut(false))
	require.Equal(t, 2, allowed(untrusted, "Bearer claims-pro", "X-Plan", "pro"), "a plan named by anyone else is ignored")

	// The decision API: the caller vouches for the tier.
	n := 0
	for range 7 {
		resp, _ := post(t, untrusted.api.URL+"/v1/check", `{"policy":"core","identity":"api-pro","tier":"pro"}`)
		if resp.StatusCode == 200 {
			n++
		}
	}
	require.Equal(t, 5, n)
}
