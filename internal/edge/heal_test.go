package edge_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/backoff"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/testutil"
)

func retryAfter(t *testing.T, r *http.Response) time.Duration {
	t.Helper()
	n, err := strconv.Atoi(r.Header.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", r.Header.Get("Retry-After"))
	return time.Duration(n) * time.Second
}

// A client that keeps sending while denied is told to wait longer each
// time (factor 2), denied from memory until then and not a moment longer,
// and every such denial is recorded with its strikes; once it waits as told
// it is decided as usual, and a later denial tells it the window's own wait
// again. The edge's clock is injected: nothing sleeps.
func TestProgressiveBackoff(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 2, Window: time.Minute}
	clock := limiter.NewManualClock(time.Now())
	e := pl.edge(func(o *edge.Options) {
		o.Clock = clock
		o.Backoff = map[string]backoff.Config{"core": {Factor: 2, Max: 10 * time.Minute}}
	})
	records := decisionRecords(t, pl)
	for range 2 {
		require.Equal(t, 200, get(t, e.proxy.URL, "hammer").StatusCode)
	}
	r := get(t, e.proxy.URL, "hammer")
	require.Equal(t, 429, r.StatusCode)
	first := retryAfter(t, r)
	require.InDelta(t, 60, first.Seconds(), 1, "the window's own wait")

	// What the core decided, and what the window holds: backoff denials
	// change neither (the accountant's lease renewals are Redis calls too,
	// so calls are not what is counted).
	coreDecisions := func() float64 {
		n := 0.0
		for _, path := range []string{"credit", "reserve", "cache", "borrow", "fail-open"} {
			for _, result := range []string{"allowed", "denied"} {
				n += metric(t, e, `tally_edge_decisions_total{path="`+path+`",result="`+result+`"}`)
			}
		}
		return n
	}
	k := pl.keys.Key("core", "h:hammer")
	decided, used := coreDecisions(), pl.used(k)
	told := first
	for strike := 1; strike <= 3; strike++ {
		clock.Advance(time.Second) // came back long before it was told
		r = get(t, e.proxy.URL, "hammer")
		require.Equal(t, 429, r.StatusCode)
		ra := retryAfter(t, r)
		require.Greater(t, ra, told+told/2, "strike %d: the wait grows", strike)
		require.LessOrEqual(t, ra, first<<strike+time.Second, "strike %d: base × 2^strikes", strike)
		told = ra
	}
	require.Equal(t, decided, coreDecisions(), "backoff denials are decided before the core is asked")
	require.Equal(t, used, pl.used(k), "backoff denials charge nothing")
	testutil.WaitFor(t, "the backoff denials recorded", func() bool {
		return slices.ContainsFunc(records(), func(d decisionRecord) bool { return d.Path == "backoff" && d.Strikes == 3 })
	})
	for _, d := range records() {
		if d.Path == "backoff" {
			require.False(t, d.Allowed)
			require.NotEmpty(t, d.Until)
		}
	}
	require.Equal(t, 3.0, metric(t, e, `tally_edge_decisions_total{path="backoff",result="denied"}`))

	// Waiting exactly as told: decided as usual (the window reset long ago).
	clock.Advance(told)
	require.Equal(t, 200, get(t, e.proxy.URL, "hammer").StatusCode)
	require.Equal(t, 200, get(t, e.proxy.URL, "hammer").StatusCode)
	r = get(t, e.proxy.URL, "hammer")
	require.Equal(t, 429, r.StatusCode)
	require.InDelta(t, 60, retryAfter(t, r).Seconds(), 1, "no strike for a client that waited as told")

	// Another client of the same policy is not affected.
	require.Equal(t, 200, get(t, e.proxy.URL, "polite").StatusCode)
}

// An operator's temporary limits reach every edge through the limits
// stream: a block set through one edge's admin API denies the client at
// both edges within the documented bound, a tighter limit applies its
// number, each change is recorded on the decisions stream, a clear lifts it
// at once, and a limit lifts itself at its expiry with no one acting.
func TestTemporaryLimitsAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	clock := limiter.NewManualClock(time.Now())
	withClock := func(o *edge.Options) { o.Clock = clock }
	a, b := pl.edge(withClock), pl.edge(withClock)
	records := decisionRecords(t, pl)
	require.Equal(t, 200, get(t, a.proxy.URL, "abuser").StatusCode)

	resp, body := adminLimits(t, a, "POST", `{"policy":"core","identity":"abuser","block":true,"for":"10m","by":"ops","reason":"scraping"}`)
	require.Equal(t, 200, resp.StatusCode, "%s", body)
	var set events.TemporaryLimit
	require.NoError(t, json.Unmarshal(body, &set))
	require.True(t, set.Block)
	start := time.Now()
	testutil.WaitForWithin(t, "the block at both edges", temporaryBound, func() bool {
		return get(t, a.proxy.URL, "abuser").StatusCode == 429 && get(t, b.proxy.URL, "abuser").StatusCode == 429
	})
	t.Logf("a block reached both edges in %v", time.Since(start))
	r := get(t, b.proxy.URL, "abuser")
	require.InDelta(t, 600, retryAfter(t, r).Seconds(), 1, "told to come back when the block lifts")
	require.Equal(t, 200, get(t, b.proxy.URL, "bystander").StatusCode)
	testutil.WaitFor(t, "the change and the denials recorded", func() bool {
		rs := records()
		return slices.ContainsFunc(rs, func(d decisionRecord) bool {
			return d.Path == "operator" && d.Outcome == "limit_set" && d.Note == "ops: scraping" && d.Key == set.Key.String()
		}) && slices.ContainsFunc(rs, func(d decisionRecord) bool { return d.Path == "blocked" && d.Key == set.Key.String() })
	})

	// Listed at both edges; cleared through the other edge: lifted at once.
	for _, e := range []*edgeUnderTest{a, b} {
		resp, body = adminLimits(t, e, "GET", "")
		require.Equal(t, 200, resp.StatusCode)
		var list []events.TemporaryLimit
		require.NoError(t, json.Unmarshal(body, &list))
		require.Len(t, list, 1)
		require.Equal(t, set.Key, list[0].Key)
	}
	clock.Advance(time.Second)
	resp, body = adminLimits(t, b, "DELETE", `{"policy":"core","digest":"`+set.Key.String()+`","by":"ops"}`)
	require.Equal(t, 200, resp.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "the block lifted at both edges", temporaryBound, func() bool {
		return get(t, a.proxy.URL, "abuser").StatusCode == 200 && get(t, b.proxy.URL, "abuser").StatusCode == 200
	})
	// The block sent again (a replay of what was signed before the clear)
	// brings nothing back: the edges hold a later entry for the key.
	_, js := pl.nats.Connect()
	dg := set.Key
	replayed, err := events.NewLimits(pl.keys.Derive(events.LimitKeyLabel)).Msg("tally.limits",
		events.TemporaryLimit{Policy: "core", Key: dg, Block: true, Set: set.Set, Expires: set.Expires})
	require.NoError(t, err)
	_, err = js.PublishMsg(context.Background(), replayed)
	require.NoError(t, err)
	resp, body = adminLimits(t, a, "POST", `{"policy":"core","identity":"marker","limit":7,"for":"1m"}`)
	require.Equal(t, 200, resp.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "a later entry at b", temporaryBound, func() bool { return len(b.srv.Temporary(clock.Now())) == 1 })
	require.Equal(t, 200, get(t, b.proxy.URL, "abuser").StatusCode, "the replayed block is ignored")
	resp, _ = adminLimits(t, a, "DELETE", `{"policy":"core","identity":"marker"}`)
	require.Equal(t, 200, resp.StatusCode)
	testutil.WaitForWithin(t, "the marker cleared at b", temporaryBound, func() bool { return len(b.srv.Temporary(clock.Now())) == 0 })

	// A tighter limit for a minute: 3 requests in the window, at both edges
	// together; then it lifts itself when the clock passes its expiry.
	resp, body = adminLimits(t, a, "POST", `{"policy":"core","identity":"tight","limit":3,"for":"1m"}`)
	require.Equal(t, 200, resp.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "the limit at both edges", temporaryBound, func() bool {
		return len(a.srv.Temporary(clock.Now())) == 1 && len(b.srv.Temporary(clock.Now())) == 1
	})
	allowed := 0
	for i := range 8 {
		if get(t, []*edgeUnderTest{a, b}[i%2].proxy.URL, "tight").StatusCode == 200 {
			allowed++
		}
	}
	require.Equal(t, 3, allowed, "the temporary limit, across both edges")
	testutil.WaitFor(t, "the change recorded naming who: the edge asked, when the caller named no one", func() bool {
		return slices.ContainsFunc(records(), func(d decisionRecord) bool {
			return d.Outcome == "limit_set" && d.Note == "admin API of "+a.srv.Producer()
		})
	})
	clock.Advance(time.Minute + time.Second) // expired (and the window reset)
	require.Empty(t, a.srv.Temporary(clock.Now()))
	for range 5 {
		require.Equal(t, 200, get(t, b.proxy.URL, "tight").StatusCode, "the policy's own limit again")
	}

	// A looser limit: 120 where the policy says 100, for this client only.
	resp, body = adminLimits(t, b, "POST", `{"policy":"core","identity":"partner","limit":120,"for":"10m","reason":"migration"}`)
	require.Equal(t, 200, resp.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "the looser limit at a", temporaryBound, func() bool { return len(a.srv.Temporary(clock.Now())) == 1 })
	allowed = 0
	for range 130 {
		if get(t, a.proxy.URL, "partner").StatusCode == 200 {
			allowed++
		}
	}
	require.Equal(t, 120, allowed, "the looser limit")

	// Refused: unsigned entries published by a NATS neighbour, and bad
	// requests to the API.
	forged, err := events.NewLimits([]byte("not the deployment's key")).Msg("tally.limits", events.TemporaryLimit{
		Policy: "core", Key: pl.keys.Sum("core", "h:bystander"), Block: true, Set: clock.Now(), Expires: clock.Now().Add(time.Hour)})
	require.NoError(t, err)
	_, err = js.PublishMsg(context.Background(), forged)
	require.NoError(t, err)
	testutil.WaitFor(t, "the forged entry refused", func() bool {
		return metric(t, a, "tally_edge_temporary_limits_refused_total") == 1
	})
	require.Equal(t, 200, get(t, a.proxy.URL, "bystander").StatusCode)
	for _, bad := range []string{`{"policy":"nope","identity":"x","block":true,"for":"1m"}`,
		`{"policy":"core","block":true,"for":"1m"}`, `{"policy":"core","identity":"x","limit":5,"for":"8d"}`,
		`{"policy":"core","identity":"x","for":"1m"}`, `{"policy":"core","identity":"x","block":true,"for":"soon"}`} {
		resp, body = adminLimits(t, a, "POST", bad)
		require.Equal(t, 400, resp.StatusCode, "%s: %s", bad, body)
	}
}

// temporaryBound is the documented bound for a temporary limit to reach
// every edge (docs/operations.md): a JetStream delivery, well under it.
const temporaryBound = 2 * time.Second

func adminLimits(t *testing.T, e *edgeUnderTest, method, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.admin.URL+"/v1/limits", bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// An operator lowers a client's limit below the credit an edge holds for
// it: the credit the new limit leaves no room for goes back by the stream
// (an event of more units than the new limit, which an edge could not
// encode before), and an accountant configured with the deployment's
// policies applies it although the client's limit is not the policy's.
// The window then counts exactly what was admitted.
func TestLoweredLimitGivesCreditBackThroughTheStream(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute}
	pl.stopAcc()
	pl.accConfig = func(c *accountant.Config) { c.Policies = pl.policies }
	pl.startAccountant()
	clock := limiter.NewManualClock(time.Now())
	var logs testutil.Buffer
	e := pl.edge(func(o *edge.Options) {
		o.Clock = clock
		o.Log = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	admitted := 0
	for range 40 { // a busy client: the edge reserves ahead of it
		clock.Advance(10 * time.Millisecond)
		if get(t, e.proxy.URL, "busy").StatusCode == 200 {
			admitted++
		}
	}
	require.Equal(t, 40, admitted)
	k := pl.keys.Key("core", "h:busy")
	require.Greater(t, pl.used(k), int64(admitted), "the edge holds credit")

	resp, body := adminLimits(t, e, "POST", `{"policy":"core","identity":"busy","limit":3,"for":"1m","by":"ops"}`)
	require.Equal(t, 200, resp.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "the limit at the edge", temporaryBound, func() bool { return len(e.srv.Temporary(clock.Now())) == 1 })
	require.Equal(t, 429, get(t, e.proxy.URL, "busy").StatusCode, "40 of 3")
	clock.Advance(2 * time.Second) // the credit idle: the edge gives it back
	pl.waitUsed(k, int64(admitted))
	testutil.WaitFor(t, "the release applied by the accountant", func() bool { return pl.acc.Stats().Released > 0 })
	require.Zero(t, metric(t, e, `tally_edge_accounting_events_total{outcome="applied_directly"}`), "published, not applied by the edge")
	require.Zero(t, pl.acc.Stats().DeadLettered)
	require.NotContains(t, logs.String(), "could not be encoded")
	require.NotContains(t, logs.String(), `"level":"ERROR"`)
}

// A fresh edge whose NATS is not up yet does not warn that the limits
// stream cannot be read: it reads it once its streams exist, and says so
// when it does.
func TestLimitsStreamIsReadOnceTheStreamsExist(t *testing.T) {
	pl := newPipeline(t)
	port, err := freeport.Port()
	require.NoError(t, err)
	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d", port), append(natstest.Options("edge"), nats.RetryOnFailedConnect(true))...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	var logs testutil.Buffer
	srv, err := edge.New(edge.Options{Store: pl.newStore(), Keys: pl.keys, NATS: nc,
		Limits: edge.Limits{Policies: pl.policies, DefaultPolicy: "core"}, Log: slog.New(slog.NewJSONHandler(&logs, nil))})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	testutil.WaitFor(t, "the edge to try its streams", func() bool {
		return strings.Contains(logs.String(), "the streams cannot be found or created yet")
	})
	natstest.StartWith(t, func(o *server.Options) { o.Port = port })
	testutil.WaitFor(t, "the edge ready", srv.Ready)
	testutil.WaitFor(t, "the limits stream read", func() bool {
		return strings.Contains(logs.String(), `"msg":"the limits stream is read; temporary limits apply"`)
	})
	require.NotContains(t, logs.String(), "the limits stream cannot be read")
}

// Backoff's answers: Retry-After grows up to the cap and never past it
// (factor 2, max 12 s, a window of 5 s), never earlier than RateLimit's t;
// X-RateLimit-Reset stays the window's reset on every answer, also once the
// window has reset while the client is still backed off. The edge's clock
// is injected, starting 300 ms into a second.
func TestBackoffRetryAfterAtItsCapAndTheWindowsReset(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 2, Window: 5 * time.Second}
	clock := limiter.NewManualClock(time.Now().Truncate(time.Second).Add(300 * time.Millisecond))
	e := pl.edge(func(o *edge.Options) {
		o.Clock = clock
		o.Backoff = map[string]backoff.Config{"core": {Factor: 2, Max: 12 * time.Second}}
	})
	var reset string
	for range 2 {
		r := get(t, e.proxy.URL, "eager")
		require.Equal(t, 200, r.StatusCode)
		reset = r.Header.Get("X-RateLimit-Reset")
	}
	r := get(t, e.proxy.URL, "eager")
	require.Equal(t, 429, r.StatusCode)
	require.Equal(t, reset, r.Header.Get("X-RateLimit-Reset"))
	require.LessOrEqual(t, retryAfter(t, r), 5*time.Second)
	resetAt, err := strconv.ParseInt(reset, 10, 64)
	require.NoError(t, err)
	var told []time.Duration
	for clock.Now().Before(time.Unix(resetAt, 0).Add(2 * time.Second)) { // past the window's reset too
		clock.Advance(700 * time.Millisecond)
		r = get(t, e.proxy.URL, "eager")
		require.Equal(t, 429, r.StatusCode, "came back early")
		ra := retryAfter(t, r)
		told = append(told, ra)
		require.LessOrEqual(t, ra, 12*time.Second, "never past the cap: %v", told)
		require.Equal(t, reset, r.Header.Get("X-RateLimit-Reset"), "the window's reset, not the backoff's end")
		_, tv, ok := strings.Cut(r.Header.Get("RateLimit"), ";t=")
		require.True(t, ok)
		tsec, err := strconv.Atoi(tv)
		require.NoError(t, err)
		require.GreaterOrEqual(t, ra, time.Duration(tsec)*time.Second, "never earlier than t")
	}
	require.Contains(t, told, 12*time.Second, "the cap was reached: %v", told)
}

// A blocked client's answer agrees with itself: the decision API's body
// says the limit its headers say (0: blocked), and X-RateLimit-Reset is
// the window's reset the client saw before; Retry-After says when the
// block lifts.
func TestBlockAnswersAgree(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute}
	clock := limiter.NewManualClock(time.Now())
	e := pl.edge(func(o *edge.Options) { o.Clock = clock })
	resp, _ := check(t, e, "blocked-client")
	require.Equal(t, 200, resp.StatusCode)
	reset := resp.Header.Get("X-RateLimit-Reset")
	r, body := adminLimits(t, e, "POST", `{"policy":"core","identity":"blocked-client","block":true,"for":"2h","by":"ops"}`)
	require.Equal(t, 200, r.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "the block at the edge", temporaryBound, func() bool { return len(e.srv.Temporary(clock.Now())) == 1 })
	resp, m := check(t, e, "blocked-client") // check asserts the body's limit and remaining are the headers'
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "0", resp.Header.Get("X-RateLimit-Limit"))
	require.EqualValues(t, 0, m["limit"])
	require.Equal(t, reset, resp.Header.Get("X-RateLimit-Reset"), "the window's reset")
	require.InDelta(t, 7200, retryAfter(t, resp).Seconds(), 1, "when the block lifts")
	require.EqualValues(t, retryAfter(t, resp).Seconds(), m["retry_after"])
}

// A temporary limit below a request's cost denies it at every door as a
// block does, decided once in the core: 429, limit 0, and Retry-After when
// the temporary limit lifts; nothing is read or charged. Other clients and
// the configured terms are untouched.
func TestTemporaryLimitBelowTheCostAtEveryDoor(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Cost: 5}
	clock := limiter.NewManualClock(time.Now())
	e := pl.edge(func(o *edge.Options) { o.Clock = clock })
	r, body := adminLimits(t, e, "POST", `{"policy":"core","identity":"heavy","limit":3,"for":"1h","by":"ops"}`)
	require.Equal(t, 200, r.StatusCode, "%s", body)
	testutil.WaitForWithin(t, "the temporary limit at the edge", temporaryBound, func() bool { return len(e.srv.Temporary(clock.Now())) == 1 })

	proxied := get(t, e.proxy.URL, "heavy")
	require.Equal(t, 429, proxied.StatusCode, "the proxy")
	require.Equal(t, "0", proxied.Header.Get("X-RateLimit-Limit"))
	require.InDelta(t, 3600, retryAfter(t, proxied).Seconds(), 1, "when the temporary limit lifts")
	resp, m := check(t, e, "heavy")
	require.Equal(t, 429, resp.StatusCode, "the decision API")
	require.EqualValues(t, 0, m["limit"])
	require.InDelta(t, 3600, retryAfter(t, resp).Seconds(), 1)

	require.Equal(t, 200, get(t, e.proxy.URL, "light").StatusCode, "another client")
	resp, m = check(t, e, "light")
	require.Equal(t, 200, resp.StatusCode)
	require.EqualValues(t, 90, m["remaining"], "its two requests charged 5 each, in the configured terms")
}
