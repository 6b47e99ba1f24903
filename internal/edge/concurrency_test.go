package edge_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// inflightPolicy is a concurrency limit of n requests in flight with a
// lease of lease (as config.Policy.Limiter makes it).
func inflightPolicy(n int64, lease time.Duration) limiter.Policy {
	return limiter.Policy{Name: "core", Algorithm: limiter.Concurrency, Limit: n, Window: lease, Slices: 2, Align: true}
}

// slowUpstream serves each request after hold, counting the requests it
// serves at once; a path of /fail answers 500.
type slowUpstream struct {
	hold          atomic.Int64 // ns
	now, most     atomic.Int64
	served, fails atomic.Int64
	srv           *httptest.Server
}

func newSlowUpstream(t *testing.T, hold time.Duration) *slowUpstream {
	u := &slowUpstream{}
	u.hold.Store(int64(hold))
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.now.Add(1)
		for m := u.most.Load(); n > m && !u.most.CompareAndSwap(m, n); m = u.most.Load() {
		}
		time.Sleep(time.Duration(u.hold.Load()))
		u.now.Add(-1)
		u.served.Add(1)
		if r.URL.Path == "/fail" {
			u.fails.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("done\n"))
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *slowUpstream) url() *url.URL {
	v, _ := url.Parse(u.srv.URL)
	return v
}

// Four edges in front of an upstream that takes its time, one client
// sending from 16 connections at once through all of them: the upstream
// never serves more than the limit of the client's requests at once, every
// finish gives its unit back (the client is served again and again), and
// once the edges stop, nothing is left held on the primary.
func TestConcurrencyFourEdgesNeverOver(t *testing.T) {
	pl := newPipeline(t)
	p := inflightPolicy(5, time.Minute)
	pl.policies["core"] = p
	up := newSlowUpstream(t, 15*time.Millisecond)
	var edges []*edgeUnderTest
	for range 4 {
		edges = append(edges, pl.edge(func(o *edge.Options) { patient(o); o.Upstream = up.url() }))
	}
	var wg sync.WaitGroup
	var allowed, denied atomic.Int64
	for c := range 16 {
		wg.Go(func() {
			for i := range 12 {
				path := "/repos"
				if i%4 == 3 {
					path = "/fail" // a failed response finishes the request too
				}
				switch getPath(t, edges[(c+i)%4].proxy.URL, path, "inflight").StatusCode {
				case 429:
					denied.Add(1)
				default:
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	t.Logf("allowed %d, denied %d, most in flight %d", allowed.Load(), denied.Load(), up.most.Load())
	require.LessOrEqual(t, up.most.Load(), int64(5), "never more than the limit in flight")
	require.EqualValues(t, allowed.Load(), up.served.Load())
	require.Greater(t, up.fails.Load(), int64(0))
	// 192 requests of 15 ms each, at most 5 at once, from 16 connections:
	// were the units of finished requests not given back, 5 would pass.
	require.Greater(t, allowed.Load(), int64(10), "finished requests gave their units back")

	k := pl.keys.Key("core", "h:inflight")
	for _, e := range edges {
		e.close(t) // each gives back the credit it holds
	}
	testutil.WaitFor(t, "every unit given back", func() bool {
		now := time.Now()
		return pl.span(p, k, now) == 0
	})
}

// Every door finishes a request, whatever its status: the proxy when its
// response is written, the decision API's /v1/finish, and a gateway's
// access-log entry after forward-auth. A limit of one in flight lets a
// client's requests through one after another, and not two at once.
func TestConcurrencyFinishAtEveryDoor(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = inflightPolicy(1, time.Minute)
	up := newSlowUpstream(t, 0)

	e := pl.edge(func(o *edge.Options) { o.Upstream = up.url() })
	for i := range 4 {
		path := []string{"/repos", "/fail"}[i%2]
		require.NotEqual(t, 429, getPath(t, e.proxy.URL, path, "proxied").StatusCode, "request %d: the one before it finished", i)
	}

	// The decision API: the unit is held from the check to the finish.
	resp, m := check(t, e, "api-client")
	require.Equal(t, 200, resp.StatusCode)
	id := m["request_id"].(string)
	resp, _ = check(t, e, "api-client")
	require.Equal(t, 429, resp.StatusCode, "one in flight already")
	resp, _ = post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":200,"cost":3}`, id))
	require.Equal(t, 400, resp.StatusCode, "a concurrency limit's finish has no cost")
	resp, _ = post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":500}`, id))
	require.Equal(t, 200, resp.StatusCode)
	resp, _ = post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":500}`, id))
	require.Equal(t, 409, resp.StatusCode, "finished once")
	testutil.WaitFor(t, "the finish gave the unit back", func() bool {
		r, m := check(t, e, "api-client")
		if r.StatusCode != 200 {
			return false
		}
		resp, _ := post(t, e.api.URL+"/v1/finish", fmt.Sprintf(`{"request_id":%q,"status":200}`, m["request_id"].(string)))
		return resp.StatusCode == 200
	})

	// Forward-auth, finished by the gateway's access log (status 200).
	g, fa, logAddr := gatewayEdge(t, pl, "127.0.0.1/32")
	r := askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5")
	require.Equal(t, 200, r.StatusCode)
	gid := r.Header.Get(edge.RequestIDHeader)
	require.NotEmpty(t, gid)
	require.NotEqual(t, 200, askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5").StatusCode, "one in flight already")
	c, err := net.Dial("udp", logAddr)
	require.NoError(t, err)
	_, err = c.Write([]byte("<190>Nov 27 00:00:00 tally: " + gid + " 200"))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	testutil.WaitFor(t, "the access log's entry finished the request", func() bool {
		return metric(t, g, `tally_edge_access_log_entries_total{outcome="refunded"}`) == 1
	})
	require.Equal(t, 200, askGateway(t, fa, "/auth/nginx", "/repos", "gated", "203.0.113.5").StatusCode)
}

// An edge that dies holding units — requests it admitted and never
// finished — holds nobody back for longer than two leases: the units count
// until the sub-window they were taken in leaves the span, and another
// edge admits again then, without a word from the dead one.
func TestConcurrencyDeadEdgeUnitsComeBack(t *testing.T) {
	pl := newPipeline(t)
	p := inflightPolicy(2, 10*time.Second)
	pl.policies["core"] = p
	start := p.WindowAt(time.Now()).ResetAt.Add(2 * time.Second)
	clock := limiter.NewManualClock(start)
	withClock := func(o *edge.Options) { patient(o); o.Clock = clock }

	a := pl.edge(withClock)
	for range 2 {
		resp, _ := check(t, a, "stuck")
		require.Equal(t, 200, resp.StatusCode)
	}
	// a dies: nothing it admitted is finished, nothing it holds released.
	a.proxy.Close()
	a.api.Close()
	a.admin.Close()
	a.nc.Close()

	b := pl.edge(withClock)
	resp, _ := check(t, b, "stuck")
	require.Equal(t, 429, resp.StatusCode, "two in flight on the dead edge")
	clock.Set(start.Add(p.Window)) // the lease: the next sub-window
	resp, _ = check(t, b, "stuck")
	require.Equal(t, 429, resp.StatusCode, "within the lease the units still count")
	clock.Set(start.Add(2 * p.Window)) // the sub-window they were taken in left the span
	resp, _ = check(t, b, "stuck")
	require.Equal(t, 200, resp.StatusCode, "the dead edge's units came back")
	resp, _ = check(t, b, "stuck")
	require.Equal(t, 200, resp.StatusCode)
	resp, _ = check(t, b, "stuck")
	require.Equal(t, 429, resp.StatusCode, "the limit, exactly")
}

// Envoy's rate-limit service with a rule in Tally's extension
// rate_limit.concurrency: the request path's call holds a unit and answers
// the request's ticket as dynamic metadata; the call Envoy makes when the
// stream is done sends it back in a tally_finish descriptor, on any edge,
// and the unit is free again. A ticket finishes once, and one that is not
// a ticket changes nothing.
func TestRLSConcurrencyAcrossEdges(t *testing.T) {
	pl := newPipeline(t)
	const file = `
domain: api
descriptors:
  - key: api_key
    rate_limit:
      unit: minute
      requests_per_unit: 2
      concurrency: {}
`
	// Mode exact: no edge holds units ahead of its requests, so that what
	// is left is the same from either edge at once.
	exact := func(o *edge.Options) { o.RLS.Mode = limiter.ModeExact }
	a, ca := rlsEdge(t, pl, exact, file)
	_, cb := rlsEdge(t, pl, exact, file)
	hold := func(c rlsv3.RateLimitServiceClient) (rlsv3.RateLimitResponse_Code, string) {
		resp := ask(t, c, "api", desc("api_key", "k1"))
		st := resp.Statuses[0]
		require.Equal(t, uint32(2), st.CurrentLimit.RequestsPerUnit)
		require.LessOrEqual(t, st.DurationUntilReset.AsDuration(), time.Minute, "to the end of the lease")
		if resp.OverallCode != ok {
			require.Nil(t, resp.DynamicMetadata, "a denied request holds nothing")
			return resp.OverallCode, ""
		}
		return ok, resp.DynamicMetadata.GetFields()[edge.RLSTicketsField].GetStringValue()
	}
	code, t1 := hold(ca)
	require.Equal(t, ok, code)
	require.NotEmpty(t, t1)
	code, t2 := hold(cb)
	require.Equal(t, ok, code)
	code, _ = hold(ca)
	require.NotEqual(t, ok, code, "two in flight, from two edges")

	done := func(c rlsv3.RateLimitServiceClient, tickets string) {
		resp := ask(t, c, "api", desc(edge.RLSFinishKey, tickets))
		require.Equal(t, ok, resp.OverallCode)
	}
	done(cb, t1) // finished on the other edge
	done(ca, t1) // again: nothing more
	done(ca, "not-a-ticket")
	// probe holds a unit on c and gives it back at once.
	probe := func(c rlsv3.RateLimitServiceClient) bool {
		code, tk := hold(c)
		if code == ok {
			done(c, tk)
		}
		return code == ok
	}
	testutil.WaitFor(t, "the unit given back, on both edges", func() bool { return probe(ca) && probe(cb) })
	code, t3 := hold(cb)
	require.Equal(t, ok, code)
	code, _ = hold(ca)
	require.NotEqual(t, ok, code, "the finish gave back one unit, once")
	done(ca, t2+" "+t3)
	testutil.WaitFor(t, "both units given back", func() bool { return probe(ca) && probe(cb) })
	code, _ = hold(ca)
	require.Equal(t, ok, code)
	code, _ = hold(cb)
	require.Equal(t, ok, code)
	code, _ = hold(ca)
	require.NotEqual(t, ok, code, "the limit, exactly")
	require.GreaterOrEqual(t, metric(t, a, "tally_edge_bad_requests_total"), 1.0, "the stray ticket was counted")

	// A finish descriptor naming many values is read for its first 16 only:
	// each costs a ticket's check, and no caller needs more.
	before := metric(t, a, "tally_edge_bad_requests_total")
	done(ca, strings.TrimSpace(strings.Repeat("x.y ", 40)))
	require.Equal(t, before+17, metric(t, a, "tally_edge_bad_requests_total"), "16 values read, and the call counted once more")
}

// An edge that restarts with requests in flight finishes them as they are
// answered and gives back what it holds as it stops: the edge that serves
// the client next has the whole limit.
func TestConcurrencyEdgeRestart(t *testing.T) {
	pl := newPipeline(t)
	p := inflightPolicy(2, time.Minute)
	pl.policies["core"] = p
	up := newSlowUpstream(t, 300*time.Millisecond)
	a := pl.edge(func(o *edge.Options) { patient(o); o.Upstream = up.url() })
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { require.Equal(t, 200, getPath(t, a.proxy.URL, "/repos", "restart").StatusCode) })
	}
	testutil.WaitFor(t, "two requests in flight", func() bool { return up.now.Load() == 2 })
	a.close(t) // waits for the two to be answered, then stops
	wg.Wait()
	k := pl.keys.Key("core", "h:restart")
	testutil.WaitFor(t, "every unit given back", func() bool { return pl.span(p, k, time.Now()) == 0 })

	b := pl.edge(func(o *edge.Options) { patient(o); o.Upstream = up.url() })
	up.hold.Store(int64(2 * time.Second)) // the three below are in flight together
	var allowed, denied atomic.Int64
	for range 3 {
		wg.Go(func() {
			if getPath(t, b.proxy.URL, "/repos", "restart").StatusCode == 429 {
				denied.Add(1)
			} else {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, 2, allowed.Load(), "the whole limit, on the next edge")
	require.EqualValues(t, 1, denied.Load())
}

// A response the proxy cannot finish copying — the upstream breaks off in
// the middle of its body, and the proxy aborts the client's response — still
// finishes the request: its unit is given back.
func TestConcurrencyAbortedResponseFinishes(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = inflightPolicy(1, time.Minute)
	var broken atomic.Bool
	broken.Store(true)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !broken.Load() {
			_, _ = w.Write([]byte("whole\n"))
			return
		}
		w.Header().Set("Content-Length", "1000")
		_, _ = w.Write([]byte("part of it"))
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	e := pl.edge(func(o *edge.Options) { o.Upstream = u })

	req, err := http.NewRequest("GET", e.proxy.URL+"/repos", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "aborted")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		require.Error(t, err, "the body was cut short")
	}
	broken.Store(false)
	testutil.WaitFor(t, "the aborted request's unit given back", func() bool {
		return getPath(t, e.proxy.URL, "/repos", "aborted").StatusCode == 200
	})
	require.Equal(t, 200, getPath(t, e.proxy.URL, "/repos", "aborted").StatusCode)
}

// A client whose requests move from one edge to another: the first edge,
// which held the whole limit after a burst and still sees one request of
// the client at a time, gives back the units it no longer needs within
// two idle_release, and the second edge admits the rest of the limit. The
// upstream never serves more than the limit at once.
func TestConcurrencyClientMovesBetweenEdges(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = inflightPolicy(4, time.Hour)
	release := make(chan struct{}) // lets the slow requests finish
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	var now, most, slow atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := now.Add(1)
		defer now.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		switch r.URL.Path {
		case "/burst":
			time.Sleep(300 * time.Millisecond)
		case "/slow":
			slow.Add(1)
			defer slow.Add(-1)
			select {
			case <-release:
			case <-time.After(time.Minute):
			}
		default:
			time.Sleep(20 * time.Millisecond)
		}
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	a := pl.edge(func(o *edge.Options) { patient(o); o.Upstream = u })
	b := pl.edge(func(o *edge.Options) { patient(o); o.Upstream = u })

	// A burst of the limit at once on a: it holds all four units after.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			require.Equal(t, 200, getPath(t, a.proxy.URL, "/burst", "mover").StatusCode, "the burst is within the limit")
		})
	}
	wg.Wait()

	// One request at a time goes on through a, never quiet there.
	stop := make(chan struct{})
	var trickle sync.WaitGroup
	var trickled atomic.Int64
	trickle.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if getPath(t, a.proxy.URL, "/fast", "mover").StatusCode == 200 {
				trickled.Add(1)
			}
		}
	})

	// The rest of the client's requests come to b, and stay in flight.
	began := time.Now()
	deadline := began.Add(20 * time.Second)
	var movers sync.WaitGroup
	for range 3 {
		movers.Go(func() {
			for time.Now().Before(deadline) {
				if getPath(t, b.proxy.URL, "/slow", "mover").StatusCode != 429 {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
	testutil.WaitForWithin(t, "b admits three while a still sees one at a time", 20*time.Second, func() bool { return slow.Load() == 3 })
	moved := time.Since(began)
	letGo()
	movers.Wait()
	close(stop)
	trickle.Wait()
	t.Logf("b admitted three %v after the client moved; a passed %d one at a time; most in flight %d", moved.Round(time.Millisecond),
		trickled.Load(), most.Load())
	require.LessOrEqual(t, most.Load(), int64(4), "never more than the limit in flight")
	require.Greater(t, trickled.Load(), int64(5), "a went on admitting the client's requests")
}
