package edge_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/testutil"
)

// gatewayEdge is an edge whose forward-auth answers the gateways given
// (loopback: the tests are the gateway) and whose access-log listener
// reads a UDP port.
func gatewayEdge(t *testing.T, pl *pipeline, gateways ...string) (*edgeUnderTest, *httptest.Server, string) {
	t.Helper()
	e, fa, logAddr, _ := gatewayEdgeLogged(t, pl, gateways...)
	return e, fa, logAddr
}

// gatewayEdgeLogged is gatewayEdge with the edge's log, as JSON lines.
func gatewayEdgeLogged(t *testing.T, pl *pipeline, gateways ...string) (*edgeUnderTest, *httptest.Server, string, *testutil.Buffer) {
	t.Helper()
	var gws []netip.Prefix
	for _, g := range gateways {
		gws = append(gws, netip.MustParsePrefix(g))
	}
	logs := &testutil.Buffer{}
	e := pl.edge(func(o *edge.Options) {
		o.Gateways = gws
		o.Log = slog.New(slog.NewJSONHandler(logs, nil))
	})
	fa := httptest.NewServer(e.srv.ForwardAuthHandler())
	t.Cleanup(fa.Close)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = e.srv.ServeAccessLog(ctx, pc); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, fa, pc.LocalAddr().String(), logs
}

// ask sends a gateway's auth request about a GET of uri by the client
// token from address client.
func askGateway(t *testing.T, fa *httptest.Server, path, uri, token, client string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", fa.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set("X-Forwarded-Method", "GET")
	req.Header.Set("X-Forwarded-Uri", uri)
	req.Header.Set("X-Forwarded-Host", "api.example.com")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("X-Forwarded-For", client)
	if token != "" {
		req.Header.Set("Authorization", token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// Traefik and Caddy: the original request is decided as the proxy would;
// allowed, 200 with the rate-limit headers to copy and the request's id;
// denied, 429 with Retry-After, which they pass to the client. nginx: the
// same, but 403 (error_page turns it into a 429).
func TestForwardAuth(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 3, Window: time.Minute}
	_, fa, _ := gatewayEdge(t, pl, "127.0.0.1/32")
	for _, tc := range []struct {
		path   string
		denied int
	}{{"/auth/traefik", 429}, {"/auth/caddy", 429}, {"/auth/nginx", 403}} {
		t.Run(tc.path, func(t *testing.T) {
			token := "Bearer " + tc.path
			for i := range 3 {
				resp := askGateway(t, fa, tc.path, "/repos?page=2", token, "203.0.113.5")
				require.Equal(t, 200, resp.StatusCode, "request %d", i+1)
				assert.Equal(t, "3", resp.Header.Get("X-RateLimit-Limit"))
				assert.Equal(t, itoa(2-i), resp.Header.Get("X-RateLimit-Remaining"))
				assert.NotEmpty(t, resp.Header.Get("RateLimit"))
				assert.NotEmpty(t, resp.Header.Get(edge.RequestIDHeader))
			}
			resp := askGateway(t, fa, tc.path, "/repos", token, "203.0.113.5")
			require.Equal(t, tc.denied, resp.StatusCode)
			assert.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
			assert.NotEmpty(t, resp.Header.Get("Retry-After"))
			assert.Empty(t, resp.Header.Get(edge.RequestIDHeader))
		})
	}
}

// What a gateway's auth request says is believed only from a configured
// gateway: anyone else is refused before anything is decided or charged,
// with an answer of its own that no gateway takes for a rate limit (421:
// nginx makes it a 500, not the 429 its error_page makes of a 403), and a
// warning naming the address, once a minute per address. A malformed or
// ambiguous original request is refused too.
func TestForwardAuthTrust(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 3, Window: time.Minute}
	_, elsewhere, _, logs := gatewayEdgeLogged(t, pl, "10.0.0.0/8")
	window := pl.keys.Key("core", limiter.HeaderIdentity("Authorization", "Bearer x")).String()
	opened := func() bool {
		n, err := pl.primary.Client().Exists(context.Background(), window).Result()
		require.NoError(t, err)
		return n == 1
	}
	for _, path := range []string{"/auth/traefik", "/auth/nginx", "/auth/caddy", "/auth/nginx"} {
		resp := askGateway(t, elsewhere, path, "/repos", "Bearer x", "203.0.113.5")
		require.Equal(t, 421, resp.StatusCode, path)
		require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
		require.Empty(t, resp.Header.Get("Retry-After"), "not a rate limit")
	}
	require.False(t, opened(), "nothing decided: the client's window was not opened")
	warned := strings.Count(logs.String(), `"level":"WARN","msg":"a forward-auth request from an address that is not a gateway's`)
	require.Equal(t, 1, warned, "one warning for four requests: %s", logs.String())
	require.Contains(t, logs.String(), `"addr":"127.0.0.1"`)

	_, fa, _ := gatewayEdge(t, pl, "127.0.0.1/32")
	resp := askGateway(t, fa, "/auth/traefik", "/repos", "Bearer x", "203.0.113.5")
	require.Equal(t, 200, resp.StatusCode)
	require.True(t, opened(), "from a gateway, the same request is decided")
	for _, tc := range []struct {
		path, uri string
		want      int
	}{
		{"/auth/traefik", "/search/..%2Fcats", 400},
		{"/auth/nginx", "/search/../cats", 403},
		{"/auth/caddy", "", 400},
		{"/auth/caddy", "not a uri", 400},
	} {
		resp := askGateway(t, fa, tc.path, tc.uri, "Bearer y", "203.0.113.5")
		assert.Equal(t, tc.want, resp.StatusCode, "%s %q", tc.path, tc.uri)
	}
}

// The client is the right-most address of X-Forwarded-For that is not a
// gateway's: an entry the client wrote itself, left of it, changes nothing.
func TestForwardAuthClientAddress(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 2, Window: time.Minute}
	e, fa, _ := gatewayEdge(t, pl, "127.0.0.1/32")
	_ = e
	allowed := func(xff string) int {
		n := 0
		for range 4 {
			if askGateway(t, fa, "/auth/traefik", "/repos", "", xff).StatusCode == 200 {
				n++
			}
		}
		return n
	}
	require.Equal(t, 2, allowed("198.51.100.7"))
	require.Equal(t, 0, allowed("1.1.1.1, 198.51.100.7"), "a forged entry left of the client's changes nothing")
	require.Equal(t, 2, allowed("198.51.100.8"), "another client")
}

// A gateway's access log gives a 304 its charge back, once, in nginx's
// syslog form and in Caddy's JSON form; other statuses, and entries from
// anyone but a gateway, change nothing.
func TestAccessLogRefunds(t *testing.T) {
	pl := newPipeline(t)
	pl.policies["core"] = limiter.Policy{Name: "core", Limit: 100, Window: time.Minute, Mode: limiter.ModeExact}
	e, fa, logAddr := gatewayEdge(t, pl, "127.0.0.1/32")
	k := pl.keys.Key("core", "h:bearer logs") // the scheme in lower case: identity.go
	send := func(line string) {
		c, err := net.Dial("udp", logAddr)
		require.NoError(t, err)
		_, err = c.Write([]byte(line))
		require.NoError(t, err)
		c.Close()
	}
	ids := make([]string, 5)
	for i := range ids {
		resp := askGateway(t, fa, "/auth/nginx", "/repos", "Bearer logs", "203.0.113.5")
		require.Equal(t, 200, resp.StatusCode)
		ids[i] = resp.Header.Get(edge.RequestIDHeader)
	}
	pl.waitUsed(k, 5)
	send("<190>Nov 26 00:00:00 tally: " + ids[0] + " 304")
	pl.waitUsed(k, 4)
	send("<190>Nov 26 00:00:01 tally: " + ids[0] + " 304") // the same again
	send("<190>Nov 26 00:00:02 tally: " + ids[1] + " 200") // not a 304
	caddy, err := json.Marshal(map[string]any{"logger": "http.log.access", "status": 304,
		"resp_headers": map[string][]string{edge.RequestIDHeader: {ids[2]}}})
	require.NoError(t, err)
	send(string(caddy))
	pl.waitUsed(k, 3)
	traefik, err := json.Marshal(map[string]any{"DownstreamStatus": 304, "RequestMethod": "GET",
		"request_Tally-Request-Id": ids[3]})
	require.NoError(t, err)
	send(string(traefik))
	pl.waitUsed(k, 2)
	send("garbage")
	count := func(outcome string) float64 {
		return metric(t, e, `tally_edge_access_log_entries_total{outcome="`+outcome+`"}`)
	}
	testutil.WaitFor(t, "every entry read", func() bool {
		return count("unreadable") == 1 && count("ignored") == 1 && count("repeated") == 1 && count("refunded") == 3
	})
	require.EqualValues(t, 2, pl.used(k), "the repeated 304 gave nothing back twice")

	// Entries from an address that is not a gateway's are not read, and
	// the address is named in the log.
	other, _, otherLog, otherLogs := gatewayEdgeLogged(t, pl, "10.0.0.0/8")
	c, err := net.Dial("udp", otherLog)
	require.NoError(t, err)
	_, _ = c.Write([]byte("<190>Nov 26 00:00:03 tally: " + ids[4] + " 304"))
	c.Close()
	testutil.WaitFor(t, "the entry refused", func() bool {
		return metric(t, other, `tally_edge_access_log_entries_total{outcome="not_gateway"}`) == 1
	})
	require.EqualValues(t, 2, pl.used(k))
	require.Contains(t, otherLogs.String(), `"msg":"an access-log entry from an address that is not a gateway's was refused`)
}

func itoa(n int) string { return string(rune('0' + n)) }
