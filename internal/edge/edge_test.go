package edge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// pipeline: one shard, JetStream, an accountant, an upstream that serves
// ETags and 304s, and edges in front of it.
type pipeline struct {
	t        *testing.T
	primary  *redistest.Server
	replica  *redistest.Server
	nats     *natstest.Server
	shards   []shard.Config
	keys     *limiter.KeySpace
	store    *limiter.Store
	acc      *accountant.Accountant
	upstream *httptest.Server
	policies map[string]limiter.Policy
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	p, r := redistest.StartPair(t)
	pl := &pipeline{t: t, primary: p, replica: r, nats: natstest.Start(t),
		shards:   []shard.Config{{Name: "s0", Primary: shard.Node{Addr: p.Addr}, Replicas: []shard.Node{{Addr: r.Addr}}}},
		policies: map[string]limiter.Policy{"core": {Name: "core", Limit: 3, Window: time.Minute}},
	}
	var err error
	pl.keys, err = limiter.NewKeySpace("tally", []byte("secret"))
	require.NoError(t, err)
	pl.store = pl.newStore()
	pl.upstream = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = w.Write([]byte("hello\n"))
	}))
	t.Cleanup(pl.upstream.Close)
	_, js := pl.nats.Connect()
	pl.acc = accountant.New(js, pl.store, pl.keys, accountant.Config{
		Consumer: events.ConsumerConfig{AckWait: 2 * time.Second, PinnedTTL: time.Second},
	}, quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = pl.acc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return pl
}

func (pl *pipeline) newStore() *limiter.Store {
	st, err := limiter.NewStore(pl.shards, limiter.Options{})
	require.NoError(pl.t, err)
	pl.t.Cleanup(func() { _ = st.Close() })
	return st
}

type edgeUnderTest struct {
	srv   *edge.Server
	proxy *httptest.Server
	api   *httptest.Server
	pub   *events.Publisher
}

func (pl *pipeline) edge(mut func(*edge.Options)) *edgeUnderTest {
	pl.t.Helper()
	nc, _ := pl.nats.Connect()
	pub, err := events.NewPublisher(nc, events.PublisherConfig{})
	require.NoError(pl.t, err)
	pl.t.Cleanup(func() { _ = pub.Close(context.Background()) })
	u, _ := url.Parse(pl.upstream.URL)
	o := edge.Options{
		Store: pl.newStore(), Keys: pl.keys, Publisher: pub, Policies: pl.policies,
		DefaultPolicy: "core", Identity: edge.Identifier{Header: "Authorization", IPv4Prefix: 32, IPv6Prefix: 64},
		Upstream: u, TicketSecret: []byte("secret"), Log: quiet,
	}
	if mut != nil {
		mut(&o)
	}
	srv, err := edge.New(o)
	require.NoError(pl.t, err)
	e := &edgeUnderTest{srv: srv, proxy: httptest.NewServer(srv.ProxyHandler()), api: httptest.NewServer(srv.APIHandler()), pub: pub}
	pl.t.Cleanup(e.proxy.Close)
	pl.t.Cleanup(e.api.Close)
	return e
}

func get(t *testing.T, base, token string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", base+"/repos", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp
}

func (pl *pipeline) waitUsed(k limiter.Key, want int64) {
	pl.t.Helper()
	var got int64
	for range 300 {
		pl.replica.WaitSynced(pl.primary)
		w, err := pl.store.Check(context.Background(), k)
		require.NoError(pl.t, err)
		if got = w.Used; got == want {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	pl.t.Fatalf("used = %d, want %d", got, want)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 300 {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// Through the proxy: each request charged once, a 304 refunded, and a 429
// whose headers come from the read that denied it.
func TestProxyChargesRefundsAndDenies(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:token-a")

	r1 := get(t, e.proxy.URL, "token-a")
	require.Equal(t, 200, r1.StatusCode)
	require.Equal(t, "2", r1.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "1", r1.Header.Get("X-RateLimit-Used"))
	reset := r1.Header.Get("X-RateLimit-Reset")
	require.NotEmpty(t, reset)
	pl.waitUsed(k, 1)

	r2 := get(t, e.proxy.URL, "token-a", "If-None-Match", `"v1"`)
	require.Equal(t, 304, r2.StatusCode)
	require.Equal(t, reset, r2.Header.Get("X-RateLimit-Reset"))
	waitFor(t, "the refund", func() bool { return pl.acc.Stats().Refunded == 1 })
	pl.waitUsed(k, 1)

	get(t, e.proxy.URL, "token-a")
	get(t, e.proxy.URL, "token-a")
	pl.waitUsed(k, 3)
	r5 := get(t, e.proxy.URL, "token-a")
	require.Equal(t, 429, r5.StatusCode)
	require.Equal(t, "application/problem+json", r5.Header.Get("Content-Type"))
	require.Equal(t, "0", r5.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "3", r5.Header.Get("X-RateLimit-Used"))
	require.NotEqual(t, r5.Header.Get("X-RateLimit-Limit"), r5.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, reset, r5.Header.Get("X-RateLimit-Reset"))
	ra, err := strconv.Atoi(r5.Header.Get("Retry-After"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, ra, 1)

	// The rejection is published, not charged.
	time.Sleep(200 * time.Millisecond)
	pl.waitUsed(k, 3)
	s := pl.acc.Stats()
	require.EqualValues(t, 4, s.Charged)
	require.Zero(t, s.Duplicates)
	// Another client is untouched.
	require.Equal(t, 200, get(t, e.proxy.URL, "token-b").StatusCode)
}

// The first responses of a fresh window carry its final reset on every edge,
// even before the first charge has reached Redis: edge b answers 1.5 s
// after edge a (by its clock), so a reset it computed itself would differ.
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
	require.Equal(t, strconv.FormatInt(now.Add(time.Minute+time.Second).Truncate(time.Second).Unix(), 10), resets[0],
		"the window opened at edge a's first request")
	k := pl.keys.Key("core", "h:token-fresh")
	pl.waitUsed(k, 6)
	w, err := pl.store.Check(context.Background(), k)
	require.NoError(t, err)
	require.Equal(t, resets[0], strconv.FormatInt(w.ResetAt.Unix(), 10))
}

func TestDecisionAPI(t *testing.T) {
	pl := newPipeline(t)
	e := pl.edge(nil)
	k := pl.keys.Key("core", "h:svc-user")
	post := func(path, body string) (*http.Response, map[string]any) {
		resp, err := http.Post(e.api.URL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp, m
	}
	resp, m := post("/v1/check", `{"policy":"core","identity":"svc-user"}`)
	require.Equal(t, 200, resp.StatusCode)
	require.Equal(t, true, m["allowed"])
	require.Equal(t, "2", resp.Header.Get("X-RateLimit-Remaining"))
	ticket := m["request_id"].(string)
	pl.waitUsed(k, 1)

	resp, _ = post("/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304}`, ticket))
	require.Equal(t, 202, resp.StatusCode)
	waitFor(t, "the refund", func() bool { return pl.acc.Stats().Refunded == 1 })
	pl.waitUsed(k, 0)

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
		{"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":304}`, ticket[:len(ticket)-2]+"AA"), "request_id"},
	} {
		resp, m := post(c.path, c.body)
		require.Equal(t, 400, resp.StatusCode, c.body)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Contains(t, m["detail"], c.want, c.body)
	}
	resp, _ = post("/v1/check", `{"policy":"core","identity":"`+strings.Repeat("x", 70<<10)+`"}`)
	require.Equal(t, 413, resp.StatusCode)
	pl.waitUsed(k, 0)
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

// NATS goes away: requests are still answered at once, events wait in the
// bounded buffer, and what does not fit is dropped and counted.
func TestNATSDownNeverBlocksRequests(t *testing.T) {
	pl := newPipeline(t)
	nc, err := nats.Connect(pl.nats.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectBufSize(1024))
	require.NoError(t, err)
	defer nc.Close()
	pub, err := events.NewPublisher(nc, events.PublisherConfig{Buffer: 8, MaxInFlight: 4, AckTimeout: 200 * time.Millisecond, Attempts: 2})
	require.NoError(t, err)
	u, _ := url.Parse(pl.upstream.URL)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 1000, Window: time.Minute}
	srv, err := edge.New(edge.Options{Store: pl.newStore(), Keys: pl.keys, Publisher: pub, Policies: pl.policies,
		DefaultPolicy: "core", Identity: edge.Identifier{IPv4Prefix: 32, IPv6Prefix: 64}, Upstream: u, Log: quiet})
	require.NoError(t, err)
	proxy := httptest.NewServer(srv.ProxyHandler())
	defer proxy.Close()

	pl.nats.Shutdown()
	start := time.Now()
	for range 100 {
		require.Equal(t, 200, get(t, proxy.URL, "").StatusCode)
	}
	require.Less(t, time.Since(start), 20*time.Second, "requests were held up")
	waitFor(t, "dropped events", func() bool { return pub.Stats().Dropped > 0 })
	st := pub.Stats()
	require.LessOrEqual(t, st.Queued, 8, "the buffer is bounded")
	require.Zero(t, st.Published)

	admin := httptest.NewServer(srv.AdminHandler())
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/metrics")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(body), "tally_edge_events_dropped_total ")
	require.NotContains(t, string(body), "tally_edge_events_dropped_total 0\n")
}

func TestRedisDownFollowsPolicy(t *testing.T) {
	pl := newPipeline(t)
	open := pl.edge(nil)
	closed := pl.edge(func(o *edge.Options) { o.DenyOnRedisError = true })
	pl.replica.Stop()
	pl.primary.Stop()
	r := get(t, open.proxy.URL, "t")
	require.Equal(t, 200, r.StatusCode, "fail open")
	require.Empty(t, r.Header.Get("X-RateLimit-Remaining"), "no headers without a read")
	r = get(t, closed.proxy.URL, "t")
	require.Equal(t, 503, r.StatusCode, "fail closed")
	require.Equal(t, "1", r.Header.Get("Retry-After"))

	admin := httptest.NewServer(open.srv.AdminHandler())
	defer admin.Close()
	resp, err := http.Get(admin.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 503, resp.StatusCode)
	resp, err = http.Get(admin.URL + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}
