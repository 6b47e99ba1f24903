package edge_test

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/metrics"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/outbox"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/testutil"
	"github.com/tallyhq/tally/lua"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// testSecret is the tests' key secret (32 bytes).
const testSecret = "edge-tests-secret-0123456789abcd"

// pipeline: one shard (a primary and a replica), JetStream, an accountant,
// an upstream that serves ETags and 304s, and edges in front of it.
type pipeline struct {
	t        *testing.T
	primary  *redistest.Server
	replica  *redistest.Server
	nats     *natstest.Server
	shards   []shard.Config
	keys     *limiter.KeySpace
	store    *redisstore.Store
	upstream *httptest.Server
	policies map[string]limiter.Policy
	acc      *accountant.Accountant
	stopAcc  func()
	// accConfig, when set, changes the configuration of the accountants
	// started after it was; storeOpts the stores made after it was.
	accConfig func(*accountant.Config)
	storeOpts redisstore.Options
	// js is the test's own JetStream connection (as the operator).
	js jetstream.JetStream
}

func newPipeline(t *testing.T) *pipeline {
	t.Helper()
	p, r := redistest.StartPair(t)
	pl := &pipeline{t: t, primary: p, replica: r, nats: natstest.Start(t),
		shards:   []shard.Config{{Name: "s0", Primary: shard.Node{Addr: p.Addr}, Replicas: []shard.Node{{Addr: r.Addr}}}},
		policies: map[string]limiter.Policy{"core": {Name: "core", Limit: 3, Window: time.Minute}},
	}
	var err error
	pl.keys, err = limiter.NewKeySpace("tally", []byte(testSecret))
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
	pl.startAccountant()
	return pl
}

// startAccountant runs an accountant until the test ends (or stopAcc),
// with the streams' configuration when given.
func (pl *pipeline) startAccountant(streams ...events.Streams) {
	_, js := pl.nats.ConnectAs("accountant")
	cfg := accountant.Config{LeaseTTL: time.Second, PurgeEvery: 20 * time.Millisecond}
	if len(streams) > 0 {
		cfg.Streams = streams[0]
	}
	if pl.accConfig != nil {
		pl.accConfig(&cfg)
	}
	pl.acc = accountant.New(js, pl.newStore(), pl.keys, cfg, quiet)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	acc := pl.acc
	go func() { _ = acc.Run(ctx); close(done) }()
	stopped := false
	pl.stopAcc = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	pl.t.Cleanup(pl.stopAcc)
}

func (pl *pipeline) newStore() *redisstore.Store {
	o := pl.storeOpts
	o.WaitTimeout = 200 * time.Millisecond
	st, err := redisstore.NewStore(pl.shards, pl.keys, o)
	require.NoError(pl.t, err)
	pl.t.Cleanup(func() { _ = st.Close() })
	return st
}

type edgeUnderTest struct {
	srv   *edge.Server
	proxy *httptest.Server
	api   *httptest.Server
	admin *httptest.Server
	nc    *nats.Conn
	store *redisstore.Store

	closeOnce sync.Once
}

// edge starts an edge with its own store and NATS connection; mut may
// change its options.
func (pl *pipeline) edge(mut func(*edge.Options)) *edgeUnderTest {
	pl.t.Helper()
	nc, _ := pl.nats.ConnectAs("edge")
	u, _ := url.Parse(pl.upstream.URL)
	st := pl.newStore()
	o := edge.Options{
		Store: st, Keys: pl.keys, NATS: nc, Limits: edge.Limits{Policies: pl.policies, DefaultPolicy: "core"},
		Identity: edge.Identifier{Header: "Authorization", IPv4Prefix: 32, IPv6Prefix: 64},
		Upstream: u, Log: quiet,
		Outbox: outbox.Config{PublishTimeout: 200 * time.Millisecond},
		Credit: credit.Config{Recheck: 200 * time.Millisecond, RedisBudget: 200 * time.Millisecond},
	}
	if mut != nil {
		mut(&o)
	}
	srv, err := edge.New(o)
	require.NoError(pl.t, err)
	e := &edgeUnderTest{srv: srv, proxy: httptest.NewServer(srv.ProxyHandler()), api: httptest.NewServer(srv.APIHandler()),
		admin: httptest.NewServer(srv.AdminHandler()), nc: nc, store: st}
	testutil.WaitFor(pl.t, "the edge ready", func() bool { return readyz(pl.t, e) == http.StatusOK })
	pl.t.Cleanup(func() { e.close(pl.t) })
	return e
}

// close stops the edge as a deploy would (its credit given back, its
// events delivered, then its Redis connections closed); closing it again
// does nothing.
func (e *edgeUnderTest) close(t *testing.T) {
	e.closeOnce.Do(func() {
		e.proxy.Close()
		e.api.Close()
		e.admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.srv.Close(ctx); err != nil {
			t.Logf("edge closed: %v", err)
		}
		_ = e.store.Close()
	})
}

func get(t *testing.T, base, token string, hdr ...string) *http.Response {
	t.Helper()
	return getPath(t, base, "/repos", token, hdr...)
}

// getPath is get on a raw request path (sent as is, not cleaned).
func getPath(t *testing.T, base, path, token string, hdr ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", base, nil)
	require.NoError(t, err)
	req.URL.Path, req.URL.RawPath = path, ""
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

// check asks an edge's decision API.
// check asks the decision API for one request of identity under policy
// core. Its answer (200 or 429) must be exactly an edge.CheckResponse, the
// documented shape, agreeing with the rate-limit headers.
func check(t *testing.T, e *edgeUnderTest, identity string) (*http.Response, map[string]any) {
	t.Helper()
	resp, body := postRaw(t, e.api.URL+"/v1/check", `{"policy":"core","identity":"`+identity+`"}`)
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	if resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusTooManyRequests {
		var cr edge.CheckResponse
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		require.NoError(t, dec.Decode(&cr), "%s", body)
		require.Equal(t, resp.StatusCode == http.StatusOK, cr.Allowed)
		if h := resp.Header.Get("X-RateLimit-Remaining"); h != "" { // absent: admitted without knowing the window
			require.Equal(t, h, strconv.FormatInt(cr.Remaining, 10))
			require.Equal(t, resp.Header.Get("X-RateLimit-Limit"), strconv.FormatInt(cr.Limit, 10))
		}
	}
	return resp, m
}

func post(t *testing.T, url, body string) (*http.Response, map[string]any) {
	t.Helper()
	resp, b := postRaw(t, url, body)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return resp, m
}

func postRaw(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

// used reads the window's count on the primary (0 when none is live);
// while the shard reseeds (its primary changed) it waits, bounded, for the
// reseed's end.
func (pl *pipeline) used(k limiter.Key) int64 {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		g, err := pl.store.Take(context.Background(), k, time.Now(), limiter.TakeArgs{Window: time.Minute, Limit: 1, Producer: "reader"})
		if errors.Is(err, redisstore.ErrReseeding) && time.Now().Before(deadline) {
			continue
		}
		require.NoError(pl.t, err)
		return g.Used
	}
}

func (pl *pipeline) waitUsed(k limiter.Key, want int64) {
	pl.t.Helper()
	var got int64
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = pl.used(k); got == want {
			return
		}
	}
	pl.t.Fatalf("used = %d, want %d (after 30 s)", got, want)
}

// streamMsgs is how many messages the accounting stream holds.
func (pl *pipeline) streamMsgs() uint64 {
	if pl.js == nil {
		_, pl.js = pl.nats.Connect()
	}
	st, err := pl.js.Stream(context.Background(), events.Streams{}.WithDefaults().Accounting.Name)
	require.NoError(pl.t, err)
	info, err := st.Info(context.Background())
	require.NoError(pl.t, err)
	return info.State.Msgs
}

// readyz is the status of the edge's /readyz.
func readyz(t *testing.T, e *edgeUnderTest) int {
	t.Helper()
	resp, err := http.Get(e.admin.URL + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

// metric reads one value from an edge's /metrics ("name{labels}").
func metric(t *testing.T, e *edgeUnderTest, name string) float64 {
	t.Helper()
	m, err := metrics.Scrape(e.admin.URL + "/metrics")
	require.NoError(t, err)
	return m[name]
}

// scriptCalls starts counting the script calls the shard's nodes serve
// (EVAL, EVALSHA and their read-only forms), and returns how many there
// have been since. The reseed's epoch checks are not counted: every store
// makes one on each new connection to a primary (redisstore/reseed.go),
// whenever its pool or its probe opens one — background work, not any
// request's. Every command is logged (SLOWLOG, from 0 µs), so that each
// call can be told by its script.
func (pl *pipeline) scriptCalls() func() int64 {
	ctx := context.Background()
	sum := sha1.Sum([]byte(lua.Epoch))
	epochSHA := hex.EncodeToString(sum[:])
	nodes := []*redistest.Server{pl.primary, pl.replica}
	for _, s := range nodes {
		c := s.Client()
		require.NoError(pl.t, c.ConfigSet(ctx, "slowlog-max-len", "100000").Err())
		require.NoError(pl.t, c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err())
		require.NoError(pl.t, c.Do(ctx, "SLOWLOG", "RESET").Err())
	}
	return func() int64 {
		var n int64
		for _, s := range nodes {
			logs, err := s.Client().SlowLogGet(ctx, -1).Result()
			require.NoError(pl.t, err)
			for _, l := range logs {
				if len(l.Args) < 2 {
					continue
				}
				switch strings.ToLower(l.Args[0]) {
				case "evalsha", "evalsha_ro":
					if l.Args[1] != epochSHA {
						n++
					}
				case "eval", "eval_ro": // the script's text, cut to its first 128 bytes
					if !strings.HasPrefix(lua.Epoch, strings.SplitN(l.Args[1], "... (", 2)[0]) {
						n++
					}
				}
			}
		}
		return n
	}
}
