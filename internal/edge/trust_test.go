package edge_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/outbox"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/testutil"
)

// A request is finished once: the same request_id sent again, to the same
// edge or another, changes nothing and is answered 409; whatever status
// came first. An id nobody issued, or spelled another way, is a 400; one
// whose window has reset a 410.
func TestRequestIsFinishedOnce(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 10, Window: time.Minute}
	clock := limiter.NewManualClock(time.Now())
	e := pl.edge(func(o *edge.Options) { o.Clock = clock })
	other := pl.edge(func(o *edge.Options) { o.Clock = clock })
	k := pl.keys.Key("core", "h:once")
	finish := func(e *edgeUnderTest, ticket string, status int) int {
		resp, _ := post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":%d}`, ticket, status))
		return resp.StatusCode
	}
	var tickets []string
	for range 4 {
		_, m := check(t, e, "once")
		tickets = append(tickets, m["request_id"].(string))
	}
	require.EqualValues(t, 4, pl.used(k))

	// The attack: one 304's request id sent again and again, to every edge.
	require.Equal(t, 200, finish(e, tickets[0], 304))
	for range 5 {
		require.Equal(t, 409, finish(e, tickets[0], 304))
		require.Equal(t, 409, finish(other, tickets[0], 304))
	}
	require.EqualValues(t, 3, pl.used(k), "one refund")

	// A request that finished with 200 is finished: no refund later.
	require.Equal(t, 200, finish(other, tickets[1], 200))
	require.Equal(t, 409, finish(e, tickets[1], 304))
	require.EqualValues(t, 3, pl.used(k))

	// Other spellings of a genuine ticket are not that ticket: base64's
	// unused bits in the signature's last character, a line break, padding.
	sig := tickets[2][strings.LastIndexByte(tickets[2], '.')+1:]
	raw, err := base64.RawURLEncoding.DecodeString(sig)
	require.NoError(t, err)
	for name, spelling := range map[string]string{
		"unused bits":  tickets[2][:len(tickets[2])-1] + string(flipUnusedBits(sig[len(sig)-1])),
		"a line break": tickets[2][:len(tickets[2])-3] + "\n" + tickets[2][len(tickets[2])-3:],
		"padding":      tickets[2] + "==",
		"std alphabet": tickets[2][:len(tickets[2])-len(sig)] + base64.RawStdEncoding.EncodeToString(raw),
	} {
		if spelling == tickets[2] {
			continue // the std alphabet spells this signature the same way
		}
		require.Equal(t, 400, finish(e, spelling, 304), name)
	}
	require.Equal(t, 400, finish(e, "forged.c2ln", 304))
	require.EqualValues(t, 3, pl.used(k))
	require.Equal(t, 200, finish(e, tickets[2], 304), "the genuine spelling")
	require.EqualValues(t, 2, pl.used(k))

	// Once the window has reset, nothing is left to finish.
	clock.Advance(time.Minute + 2*time.Second)
	require.Equal(t, 410, finish(e, tickets[3], 304))
	require.Equal(t, 1.0, metric(t, e, `tally_edge_finishes_total{result="expired"}`))
	require.Equal(t, 6.0, metric(t, e, `tally_edge_finishes_total{result="already_finished"}`))
}

// flipUnusedBits returns the base64url character whose value differs from
// c's in its two lowest bits: the bits a 16-byte value's last character
// does not use.
func flipUnusedBits(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, c)
	return alphabet[i^1]
}

// A request held to several limits is checked against all of them before
// any reserves: a client rotating tokens behind its address's full window
// opens no window for any of its tokens.
func TestDeniedRequestOpensNothing(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute}
	pl.policies["per-address"] = limiter.Policy{Name: "per-address", Limit: 3, Window: time.Minute}
	e := pl.edge(func(o *edge.Options) {
		o.GlobalPolicies = []string{"per-address"}
		o.AddressKeyed = map[string]bool{"per-address": true}
	})
	for i := range 3 {
		require.Equal(t, 200, get(t, e.proxy.URL, fmt.Sprintf("rotate-%d", i)).StatusCode)
	}
	ctx := context.Background()
	for i := 3; i < 53; i++ {
		require.Equal(t, 429, get(t, e.proxy.URL, fmt.Sprintf("rotate-%d", i)).StatusCode)
	}
	require.EqualValues(t, 4, metric(t, e, "tally_edge_keys"), "the address's window and the three tokens': none for a denied request")
	for i := 3; i < 53; i++ {
		n, err := pl.primary.Client().Exists(ctx, pl.keys.Key("core", fmt.Sprintf("h:rotate-%d", i)).String()).Result()
		require.NoError(t, err)
		require.Zero(t, n)
	}
}

// One credential is one identity: the Authorization scheme is compared
// without case and the whitespace after it normalised; a header listed in
// Connection never reaches the upstream, so it is not an identity either;
// two identity headers are refused.
func TestIdentitiesAreNormalised(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(nil)
	for _, v := range []string{"Bearer tok", "bearer tok", "BEARER tok", "Bearer  tok", "Bearer\ttok", " Bearer tok ", "bEaReR \t tok"} {
		require.Equal(t, 200, get(t, e.proxy.URL, v).StatusCode, "%q", v)
	}
	require.EqualValues(t, 7, pl.used(pl.keys.Key("core", "h:bearer tok")), "one window for every spelling")
	require.Equal(t, 200, get(t, e.proxy.URL, "Bearer TOK").StatusCode)
	require.EqualValues(t, 1, pl.used(pl.keys.Key("core", "h:bearer TOK")), "credentials keep their case")

	// Named in Connection: removed before the upstream, so keyed by address.
	require.Equal(t, 200, get(t, e.proxy.URL, "Bearer hop", "Connection", "authorization").StatusCode)
	require.Zero(t, pl.used(pl.keys.Key("core", "h:bearer hop")))
	require.EqualValues(t, 1, pl.used(pl.keys.Key("core", "ip:127.0.0.1/32")))

	req, err := http.NewRequest("GET", e.proxy.URL+"/repos", nil)
	require.NoError(t, err)
	req.Header.Add("Authorization", "Bearer one")
	req.Header.Add("Authorization", "Bearer two")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 400, resp.StatusCode, "which of two credentials the upstream believes is its choice")
}

// Notices are signed: a "full" or "room" from anyone without the
// deployment's secret, or one recorded and sent again later, changes no
// decision.
func TestForgedNoticesChangeNothing(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 5, Window: time.Minute, Mode: limiter.ModeAsync}
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:noticed")
	r1 := get(t, e.proxy.URL, "noticed")
	require.Equal(t, 200, r1.StatusCode)
	reset := time.Unix(mustInt(t, r1.Header.Get("X-RateLimit-Reset")), 0)
	nc, _ := pl.nats.Connect() // a neighbour who can publish anywhere
	forger := events.NewNotices([]byte("not-the-deployment-secret-012345"))
	send := func(b []byte) {
		require.NoError(t, nc.Publish("tally.notices.s0", b))
		require.NoError(t, nc.Flush())
	}
	refusedBefore := metric(t, e, `tally_edge_notices_total{direction="refused"}`)
	// A forged "full": the client would be denied until the reset.
	send(forger.Append(nil, events.Notice{Full: true, Key: k.Digest().String(), ResetAt: reset, Used: 5}, time.Now()))
	// Unsigned, in the old format.
	send([]byte(fmt.Sprintf("full %s %d 5\n", k.Digest(), reset.UnixMilli())))
	testutil.WaitFor(t, "both refused", func() bool {
		return metric(t, e, `tally_edge_notices_total{direction="refused"}`) >= refusedBefore+2
	})
	require.Equal(t, 200, get(t, e.proxy.URL, "noticed").StatusCode, "not denied")

	// Fill the window; a genuine "room" recorded now and replayed later
	// (after the window filled again) is refused.
	genuine := events.NewNotices(pl.keys.Derive(events.NoticeKeyLabel))
	old := genuine.Append(nil, events.Notice{Key: k.Digest().String(), ResetAt: reset, Used: 0}, time.Now().Add(-events.NoticeMaxAge-time.Second))
	for range 3 {
		require.Equal(t, 200, get(t, e.proxy.URL, "noticed").StatusCode)
	}
	require.Equal(t, 429, get(t, e.proxy.URL, "noticed").StatusCode)
	send(old)
	// A forged "room" in mode async would let the edge admit from what it
	// believes.
	send(forger.Append(nil, events.Notice{Key: k.Digest().String(), ResetAt: reset, Used: 0}, time.Now()))
	testutil.WaitFor(t, "both refused", func() bool {
		return metric(t, e, `tally_edge_notices_total{direction="refused"}`) >= refusedBefore+4
	})
	for range 5 {
		require.Equal(t, 429, get(t, e.proxy.URL, "noticed").StatusCode)
	}
	pl.waitUsed(k, 5)
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var v int64
	_, err := fmt.Sscan(s, &v)
	require.NoError(t, err)
	return v
}

// Mode async with one edge admits exactly the limit, from sequential and
// from concurrent clients: the edge remembers what it admitted over its
// credit (charged by events) until the primary has applied it, and a
// reservation never takes that room again.
func TestAsyncOneEdgeIsExact(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 5, Window: time.Minute, Mode: limiter.ModeAsync}
	e := pl.edge(nil)
	allowed := 0
	var trace []string
	for range 20 {
		r := get(t, e.proxy.URL, "async-seq")
		trace = append(trace, fmt.Sprint(r.StatusCode, r.Header.Get("RateLimit")))
		if r.StatusCode == 200 {
			allowed++
		}
	}
	require.Equal(t, 5, allowed, "sequential: %v", trace)
	pl.waitUsed(pl.keys.Key("core", "h:async-seq"), 5)

	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 50, Window: time.Minute, Mode: limiter.ModeAsync}
	e = pl.edge(nil)
	var mu sync.Mutex
	allowed = 0
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 10 {
				if get(t, e.proxy.URL, "async-conc").StatusCode == 200 {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, 50, allowed, "16 concurrent clients")
	// What the edge reserved and could not spend (a reservation made while
	// its admissions over credit were on their way) goes back once idle.
	pl.waitUsed(pl.keys.Key("core", "h:async-conc"), 50)
}

// An edge learns from the refunds it applies itself: a client's 304s that
// made room are not answered 429 from a stale count until a reread.
func TestEdgeLearnsFromItsOwnRefunds(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 2, Window: time.Minute, Mode: limiter.ModeExact}
	e := pl.edge(func(o *edge.Options) {
		o.Outbox.Route = outbox.RouteDirect // the edge applies its refunds itself
		o.Credit.Recheck = time.Hour        // no reread comes to the rescue
	})
	require.Equal(t, 200, get(t, e.proxy.URL, "learner").StatusCode)
	require.Equal(t, 304, get(t, e.proxy.URL, "learner", "If-None-Match", `"v1"`).StatusCode)
	pl.waitUsed(pl.keys.Key("core", "h:learner"), 1)
	testutil.WaitFor(t, "the edge allows again", func() bool { return get(t, e.proxy.URL, "learner").StatusCode == 200 })

	// Through the decision API the same: the window full, a 304
	// finished, the next request allowed at once.
	var ticket string
	for range 2 {
		resp, m := check(t, e, "api-learner")
		require.Equal(t, 200, resp.StatusCode)
		ticket = m["request_id"].(string)
	}
	resp, _ := check(t, e, "api-learner")
	require.Equal(t, 429, resp.StatusCode)
	resp, _ = post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304}`, ticket))
	require.Equal(t, 200, resp.StatusCode)
	resp, _ = check(t, e, "api-learner")
	require.Equal(t, 200, resp.StatusCode, "allowed at once")
}

// An edge that has never reached a shard's primary is not ready, and says
// which; it does not admit everything while a load balancer sends it
// traffic.
func TestEdgeNotReadyUntilItReachedEveryPrimary(t *testing.T) {
	pl := newPipeline(t)
	st, err := redisstore.NewStore([]shard.Config{{Name: "s0", Primary: shard.Node{Addr: "127.0.0.1:1"}}}, pl.keys,
		redisstore.Options{DialTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	nc, _ := pl.nats.ConnectAs("edge")
	srv, err := edge.New(edge.Options{Store: st, Keys: pl.keys, NATS: nc, Limits: edge.Limits{Policies: pl.policies}, Log: quiet})
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Close(ctx)
	})
	admin := httptest.NewServer(srv.AdminHandler())
	t.Cleanup(admin.Close)
	resp, err := http.Get(admin.URL + "/readyz")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	require.Contains(t, string(body), "shard s0 primary never reached")
	require.NotContains(t, string(body), "127.0.0.1:1", "no address on an open endpoint")

	// Reached once and lost later: ready, degraded, and saying so.
	e := pl.edge(nil)
	pl.primary.Stop()
	testutil.WaitFor(t, "degraded", func() bool {
		_, _ = check(t, e, "down") // reservations fail: the request path marks the primary down
		resp, err = http.Get(e.admin.URL + "/readyz")
		require.NoError(t, err)
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		return strings.Contains(string(body), "degraded: shard s0 primary unreachable")
	})
}

// Bodies are read as they arrive, never allocated from what a client's
// Content-Length claims: two hundred clients that each claim 64 KiB and
// send ten bytes hold a few kilobytes each, not 64.
func TestClaimedBodiesAreNotAllocated(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	slowBodies(t, e.api.URL, 200, 64<<10)
	testutil.WaitFor(t, "every body being read", func() bool { return readingBodies() >= 200 })
	var during runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&during)
	grew := int64(during.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew %d bytes for 200 connections", grew)
	require.Less(t, grew, int64(200*64<<10)/2, "heap grew %d bytes", grew)
}

// slowBodies opens n connections to the decision API, each sending the
// headers of a check whose Content-Length claims claim bytes, and ten
// bytes of it; they stay open until the test ends.
func slowBodies(t *testing.T, base string, n, claim int) {
	t.Helper()
	u, err := url.Parse(base)
	require.NoError(t, err)
	for range n {
		c, err := net.Dial("tcp", u.Host)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		_, err = fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n{\"policy\":", u.Host, claim)
		require.NoError(t, err)
	}
}

// readingBodies is how many goroutines are reading a decision-API body.
func readingBodies() int {
	buf := make([]byte, 64<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "edge.(*Server).readBody")
}
