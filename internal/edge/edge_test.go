package edge_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/testutil"
)

// Through the proxy: each request charged once, a 304 refunded, and a 429
// whose headers come from the decision that denied it (invariants 3 and 5).
func TestProxyChargesRefundsAndDenies(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)

	r1 := get(t, e.proxy.URL, "token-a")
	require.Equal(t, 200, r1.StatusCode)
	require.Equal(t, "2", r1.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "1", r1.Header.Get("X-RateLimit-Used"))
	reset := r1.Header.Get("X-RateLimit-Reset")
	require.NotEmpty(t, reset)
	require.Equal(t, `"core";r=2;t=60`, r1.Header.Get("RateLimit"), "t never exceeds the window")

	r2 := get(t, e.proxy.URL, "token-a", "If-None-Match", `"v1"`)
	require.Equal(t, 304, r2.StatusCode)
	require.Equal(t, reset, r2.Header.Get("X-RateLimit-Reset"))
	require.Equal(t, "1", r2.Header.Get("X-RateLimit-Remaining"))

	// The 304 was given back: two more requests fit.
	require.Equal(t, "1", get(t, e.proxy.URL, "token-a").Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "0", get(t, e.proxy.URL, "token-a").Header.Get("X-RateLimit-Remaining"))
	r5 := get(t, e.proxy.URL, "token-a")
	require.Equal(t, 429, r5.StatusCode)
	require.Equal(t, "application/problem+json", r5.Header.Get("Content-Type"))
	require.Equal(t, "0", r5.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "3", r5.Header.Get("X-RateLimit-Used"))
	require.Equal(t, reset, r5.Header.Get("X-RateLimit-Reset"))
	ra, err := strconv.Atoi(r5.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, ra, 1)

	// The window on the primary holds exactly the three charges.
	k := pl.keys.Key("core", "h:token-a")
	require.EqualValues(t, 3, pl.used(k))
	// Another client is untouched.
	require.Equal(t, 200, get(t, e.proxy.URL, "token-b").StatusCode)

	// Decision latency, by path: one observation per decision.
	m, err := metrics.Scrape(e.admin.URL + "/metrics")
	require.NoError(t, err)
	var decided float64
	for _, p := range []string{"credit", "reserve", "cache", "borrow", "fail-open"} {
		decided += m[`tally_edge_decision_duration_seconds_count{path="`+p+`"}`]
	}
	require.Equal(t, 6.0, decided)
	require.Greater(t, m[`tally_edge_decision_duration_seconds_count{path="reserve"}`], 0.0, "mode exact: each request reserves")
	require.Equal(t, m[`tally_edge_decision_duration_seconds_count{path="reserve"}`],
		m[`tally_edge_decision_duration_seconds_bucket{path="reserve",le="1"}`], "none longer than a second")
	require.Zero(t, m["tally_edge_script_reloads_total"], "the scripts were loaded before the edge said it was ready")
	require.Contains(t, m, "tally_edge_decision_records_queued")
}

// One client's sequential burst: exactly the limit is allowed, Remaining
// falls by one on every response, every response shows the same reset, and
// every allowed request is charged.
func TestSequentialBurstIsExact(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 40, Window: time.Minute}
	e := pl.edge(nil)
	allowed := 0
	var reset string
	for i := range 80 {
		r := get(t, e.proxy.URL, "burst")
		if i == 0 {
			reset = r.Header.Get("X-RateLimit-Reset")
		}
		require.Equal(t, reset, r.Header.Get("X-RateLimit-Reset"))
		if i < 40 {
			require.Equal(t, 200, r.StatusCode, "request %d", i)
			require.Equal(t, strconv.Itoa(39-i), r.Header.Get("X-RateLimit-Remaining"), "request %d", i)
			allowed++
		} else {
			require.Equal(t, 429, r.StatusCode, "request %d", i)
			require.Equal(t, "0", r.Header.Get("X-RateLimit-Remaining"))
		}
	}
	require.Equal(t, 40, allowed)
	require.EqualValues(t, 40, pl.used(pl.keys.Key("core", "h:burst")))
}

// One hot key, 64 concurrent clients, one edge: exactly the limit.
func TestHotKeyOneEdgeNeverOver(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	e := pl.edge(patient)
	allowed := hammer(t, []*edgeUnderTest{e}, "hot", 64, 8)
	require.EqualValues(t, 100, allowed)
	require.EqualValues(t, 100, pl.used(pl.keys.Key("core", "h:hot")))
}

// Four edges race on one key near its limit: never over, and (with demand
// on every edge to the end) not under either.
func TestFourEdgesRacingNeverOver(t *testing.T) {
	for _, mode := range []limiter.Mode{limiter.ModeAuto, limiter.ModeExact} {
		t.Run(string(mode), func(t *testing.T) {
			pl := newPipeline(t)
			pl.policies["core"] = limiter.Policy{Name: "core", Limit: 500, Window: time.Minute, Mode: mode}
			var edges []*edgeUnderTest
			for range 4 {
				edges = append(edges, pl.edge(patient))
			}
			// Warm up: the key is busy before it nears its limit.
			allowed := hammer(t, edges, "race", 16, 12)
			require.EqualValues(t, 500, allowed, "exactly the limit")
			require.EqualValues(t, 500, pl.used(pl.keys.Key("core", "h:race")))
		})
	}
}

// patient lets requests wait for Redis as long as a loaded test machine
// may take: the exactness tests measure reservations, not what an edge
// does when Redis is slower than its budget (admissions charged by events,
// which the fault suite and TestPrimaryDownFollowsPolicy cover).
func patient(o *edge.Options) { o.Credit.RedisBudget = 5 * time.Second }

// hammer sends requests for identity from workers per edge through the
// decision API until each worker has seen stop denials in a row, and
// returns how many were allowed.
func hammer(t *testing.T, edges []*edgeUnderTest, identity string, workers, stop int) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for _, e := range edges {
		for range workers {
			wg.Go(func() {
				denied := 0
				for range 5000 {
					resp, m := check(t, e, identity)
					switch resp.StatusCode {
					case 200:
						allowed.Add(1)
						denied = 0
						require.Equal(t, true, m["allowed"])
					case 429:
						require.NotEqual(t, m["limit"], m["remaining"])
						if denied++; denied == stop {
							return
						}
					default:
						t.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			})
		}
	}
	wg.Wait()
	return allowed.Load()
}

// Over the limit is remembered: once the window is full, denials cost no
// Redis call at all, on the edge that filled it and on the others (told by
// a notice).
func TestFullWindowsCostNoRedisCall(t *testing.T) {
	pl := newPipeline(t)
	pl.stopAcc()                                                        // nothing but the edges talks to Redis
	noRecheck := func(o *edge.Options) { o.Credit.Recheck = time.Hour } // only the request path counts here
	a, b := pl.edge(noRecheck), pl.edge(noRecheck)
	for range 3 {
		require.Equal(t, 200, get(t, a.proxy.URL, "full").StatusCode)
	}
	require.Equal(t, 429, get(t, a.proxy.URL, "full").StatusCode)
	// b saw the key once before (it knows its window) and learns from a's
	// notice that it is full.
	testutil.WaitFor(t, "b told", func() bool { return metric(t, b, `tally_edge_notices_total{direction="received"}`) > 0 })
	// The first denial may have come from a reservation the primary refused
	// or from memory, depending on when a's reservations returned; from
	// here on, every one comes from memory.
	const cached = `tally_edge_decisions_total{path="cache",result="denied"}`
	pl.stopAcc() // its lease renewals are script calls too: nothing but the edges talks to Redis
	calls, cachedBefore := pl.scriptCalls(), metric(t, a, cached)
	for range 50 {
		require.Equal(t, 429, get(t, a.proxy.URL, "full").StatusCode)
	}
	require.Zero(t, calls(), "denials from memory")
	require.Equal(t, 50.0, metric(t, a, cached)-cachedBefore)
}

// Far from the limit, requests are answered from credit: after the first
// few, the edge makes a reservation now and then, not per request.
func TestFarFromTheLimitFewRedisCalls(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1_000_000, Window: time.Minute}
	pl.stopAcc() // nothing but the edge talks to Redis
	e := pl.edge(nil)
	for range 20 {
		require.Equal(t, 200, get(t, e.proxy.URL, "busy").StatusCode)
	}
	since := pl.scriptCalls()
	for range 500 {
		require.Equal(t, 200, get(t, e.proxy.URL, "busy").StatusCode)
	}
	calls := since()
	require.LessOrEqual(t, calls, int64(25), "500 requests, %d Redis calls", calls)
	t.Logf("500 requests from one key far from its limit: %d Redis calls", calls)
}

// A lost notice: an edge that missed "room" converges by reading.
func TestLostNoticeConverges(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 5, Window: time.Minute}
	a := pl.edge(nil)
	// b's reservations may take their time on a busy machine: one that ran
	// out of budget would be read again (resolveLost), which is not the
	// recheck under test.
	b := pl.edge(func(o *edge.Options) { o.Credit.Recheck, o.Credit.RedisBudget = 2*time.Second, 5*time.Second })
	var tickets []string
	for range 5 {
		resp, m := check(t, a, "lost")
		require.Equal(t, 200, resp.StatusCode)
		tickets = append(tickets, m["request_id"].(string))
	}
	require.Equal(t, 429, get(t, b.proxy.URL, "lost").StatusCode)
	// b stops hearing notices; two 304s finished at a make room, and a's
	// room notice is lost on b.
	require.NoError(t, b.nc.Drain())
	// Drain unsubscribes in the background: a notice published before the
	// server heard it would still reach b.
	testutil.WaitFor(t, "b's notices stopped", b.nc.IsClosed)
	for _, tk := range tickets[:2] {
		resp, _ := post(t, a.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304}`, tk))
		require.Equal(t, 200, resp.StatusCode)
	}
	pl.waitUsed(pl.keys.Key("core", "h:lost"), 3)
	require.Equal(t, 429, get(t, b.proxy.URL, "lost").StatusCode, "b still believes the window full")
	testutil.WaitFor(t, "b reads again and admits", func() bool { return get(t, b.proxy.URL, "lost").StatusCode == 200 })
	require.GreaterOrEqual(t, metric(t, b, "tally_edge_rechecks_total"), 1.0)
}

// The first responses of a fresh window carry its final reset on every
// edge: edge b answers 1.5 s after edge a (by its clock), so a reset it
// computed itself would differ.
func TestFreshWindowResetIsFinalOnEveryEdge(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	now := time.Now().Truncate(time.Second).Add(100 * time.Millisecond)
	clockA, clockB := limiter.NewManualClock(now), limiter.NewManualClock(now.Add(1500*time.Millisecond))
	a := pl.edge(func(o *edge.Options) { o.Clock = clockA })
	b := pl.edge(func(o *edge.Options) { o.Clock = clockB })
	var resets []string
	for i := range 6 {
		e := a
		if i%2 == 1 {
			e = b
		}
		r := get(t, e.proxy.URL, "token-fresh")
		require.Equal(t, 200, r.StatusCode)
		resets = append(resets, r.Header.Get("X-RateLimit-Reset"))
	}
	for _, r := range resets {
		require.Equal(t, resets[0], r, "all: %v", resets)
	}
	require.Equal(t, strconv.FormatInt(now.Truncate(time.Second).Add(time.Minute).Unix(), 10), resets[0],
		"the window opened at the second of edge a's first request")
}

// mode: exact charges each request atomically; its 304 refund still works
// (through the accountant).
func TestRefundOfAnAtomicCharge(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 3, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:exact")
	require.Equal(t, 200, get(t, e.proxy.URL, "exact").StatusCode)
	require.EqualValues(t, 1, pl.used(k), "charged before the answer")
	require.Equal(t, 304, get(t, e.proxy.URL, "exact", "If-None-Match", `"v1"`).StatusCode)
	pl.waitUsed(k, 1) // charged 2, refunded 1
	testutil.WaitFor(t, "the refund applied", func() bool { return pl.acc.Stats().Refunded == 1 })
	for range 2 {
		require.Equal(t, 200, get(t, e.proxy.URL, "exact").StatusCode)
	}
	require.Equal(t, 429, get(t, e.proxy.URL, "exact").StatusCode)
	require.EqualValues(t, 3, pl.used(k))
}

func TestDecisionAPI(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	other := pl.edge(nil)
	k := pl.keys.Key("core", "h:svc-user")
	resp, m := check(t, e, "svc-user")
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, true, m["allowed"])
	require.Equal(t, "2", resp.Header.Get("X-RateLimit-Remaining"))
	require.EqualValues(t, 2, m["remaining"])
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	// Not storable by a cache: an answer to a POST without explicit
	// freshness (RFC 9110 §9.3.3, RFC 9111 §3).
	for _, h := range []string{"Cache-Control", "Expires", "Content-Location"} {
		require.Empty(t, resp.Header.Values(h), h)
	}
	ticket := m["request_id"].(string)
	require.EqualValues(t, 1, pl.used(k))

	// The finish goes to another edge: any edge takes a ticket.
	resp, m = post(t, other.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304}`, ticket))
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, map[string]any{"finished": true, "refunded": 1.0}, m)
	require.EqualValues(t, 0, pl.used(k), "given back before the answer")

	// Malformed requests: clear 4xx, nothing charged.
	for _, c := range []struct{ path, body, want string }{
		{"/v1/check", `{`, "body"},
		{"/v1/check", `{"policy":"core"}`, "identity"},
		{"/v1/check", `{"policy":"nope","identity":"x"}`, "unknown policy"},
		{"/v1/check", `{"policy":"core","identity":"x","cost":99}`, "cost"},
		{"/v1/check", `{"policy":"core","identity":"x","extra":1}`, "unknown field"},
		{"/v1/check", `{"policy":"core","identity":"x"} {}`, "one JSON object"},
		{"/v1/finish", `{"request_id":"forged.sig","status":304}`, "request_id"},
		{"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":999}`, ticket), "status"},
		{"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304}`, tamper(ticket)), "request_id"},
	} {
		resp, m := post(t, e.api.URL+c.path, c.body)
		require.Equal(t, 400, resp.StatusCode, c.body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Contains(t, m["detail"], c.want, c.body)
	}
	resp, _ = post(t, e.api.URL+"/v1/check", `{"policy":"core","identity":"`+strings.Repeat("x", 70<<10)+`"}`)
	require.Equal(t, 413, resp.StatusCode)
	require.Zero(t, pl.used(k))
}

// TestDecisionAPIAnswersAreTheirOwn: requests served at once, whose bodies
// and answers reuse memory, each get their own answer: every ticket is
// finished once and gives back its one unit (a ticket handed to two
// clients would be finished twice: 409), every answer is whole, and bodies
// of every size (the encoding/json path, a body past the reused buffers)
// are read whole.
func TestDecisionAPIAnswersAreTheirOwn(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	const clients, rounds = 8, 25
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			errs <- ownAnswers(e.api.URL, fmt.Sprintf("own-%d", c), c, rounds)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// ownAnswers checks and finishes (304) rounds requests of one identity, one
// after the other, and reports the first answer that is not its own.
func ownAnswers(api, identity string, c, rounds int) error {
	for i := range rounds {
		body := fmt.Sprintf(`{"policy":"core","identity":%q}`, identity)
		switch c % 3 {
		case 1: // the encoding/json path
			body = fmt.Sprintf(`{"identity":%q, "policy":"core", "tier":""}`, identity)
		case 2: // larger than a reused buffer
			body = fmt.Sprintf(`{"policy":"core","identity":%q}%s`, identity, strings.Repeat(" ", 5000))
		}
		resp, err := http.Post(api+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		var cr edge.CheckResponse
		err = json.NewDecoder(resp.Body).Decode(&cr)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || !cr.Allowed || cr.Used+cr.Remaining != cr.Limit || cr.Resource != "core" {
			return fmt.Errorf("%s round %d: status %d, %+v, %v", identity, i, resp.StatusCode, cr, err)
		}
		resp, err = http.Post(api+"/v1/finish", "application/json",
			strings.NewReader(fmt.Sprintf(`{"request_id":%q,"status":304}`, cr.RequestID)))
		if err != nil {
			return err
		}
		var fr edge.FinishResponse
		err = json.NewDecoder(resp.Body).Decode(&fr)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || fr.Refunded != 1 {
			return fmt.Errorf("%s round %d: finish status %d, %+v, %v", identity, i, resp.StatusCode, fr, err)
		}
	}
	return nil
}

// tamper changes one signature character that carries only data bits, so the
// ticket differs from the signed one whatever its signature happens to be.
func tamper(ticket string) string {
	b := []byte(ticket)
	i := len(b) - 3
	if b[i] == 'x' {
		b[i] = 'y'
	} else {
		b[i] = 'x'
	}
	return string(b)
}

func TestOversizedHeaderIsRefused(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	big := httptest.NewUnstartedServer(e.srv.ProxyHandler())
	big.Config.MaxHeaderBytes = 4096
	big.Start()
	defer big.Close()
	resp := get(t, big.URL, strings.Repeat("t", 20000)) // Go allows 4 KiB of slack above the limit
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	// An identity over 4 KiB within the header limit: 400, no crash.
	resp = get(t, e.proxy.URL, strings.Repeat("t", edge.MaxIdentityLen+1))
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, 200, get(t, e.proxy.URL, "ok").StatusCode)
}

// Memory is bounded: beyond the configured number of keys the least
// recently used are forgotten (their credit given back), and counted.
func TestKeysAreBounded(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	e := pl.edge(func(o *edge.Options) { o.Credit.Keys = 512 })
	for i := range 2000 {
		resp, _ := check(t, e, fmt.Sprintf("client-%d", i))
		require.Equal(t, 200, resp.StatusCode)
	}
	require.LessOrEqual(t, metric(t, e, "tally_edge_keys"), 512.0)
	require.GreaterOrEqual(t, metric(t, e, "tally_edge_keys_evicted_total"), 1488.0)
}

// A decision-API request whose cost is known only at its end checks an
// estimate and finishes with its actual cost: the excess comes back, a
// shortfall is charged in full (past the limit if need be), once.
func TestFinishTruesUpAnEstimate(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:llm")
	checkCost := func(cost int) (int, string) {
		resp, m := post(t, e.api.URL+"/v1/check", fmt.Sprintf(`{"policy":"core","identity":"llm","cost":%d}`, cost))
		id, _ := m["request_id"].(string)
		return resp.StatusCode, id
	}
	finish := func(id string, cost int) (int, map[string]any) {
		resp, m := post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":200,"cost":%d}`, id, cost))
		return resp.StatusCode, m
	}
	status, id := checkCost(40)
	require.Equal(t, 200, status)
	code, m := finish(id, 10)
	require.Equal(t, 200, code, "%v", m)
	require.EqualValues(t, 30, m["refunded"])
	pl.waitUsed(k, 10)
	code, _ = finish(id, 10)
	require.Equal(t, 409, code, "finished once")

	status, id = checkCost(50)
	require.Equal(t, 200, status)
	code, m = finish(id, 120) // far beyond the estimate, and the limit
	require.Equal(t, 200, code, "%v", m)
	require.EqualValues(t, 70, m["charged"])
	pl.waitUsed(k, 130)
	status, _ = checkCost(1)
	require.Equal(t, 429, status, "the window is spent")

	resp, _ := post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304,"cost":5}`, id))
	require.Equal(t, 400, resp.StatusCode, "a 304 costs nothing")
}
