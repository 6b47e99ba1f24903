package service_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/testpki"
	"github.com/tallyhq/tally/internal/testutil"
)

// pki is a throwaway CA with a server certificate for 127.0.0.1 and a
// client certificate, as PEM files.
type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey string
	pool                                             *x509.CertPool
}

func newPKI(t *testing.T) pki {
	t.Helper()
	ca := testpki.NewCA(t, "tally test CA")
	p := pki{ca: ca.File, pool: ca.Pool()}
	p.serverCert, p.serverKey = ca.Server("server")
	p.clientCert, p.clientKey = ca.Client("client")
	return p
}

// load parses a configuration with one shard at redisAddr and NATS at
// natsURL, each section with extra YAML lines, in env.
func load(t *testing.T, redisAddr, redisExtra, natsURL, natsExtra string) (*config.File, error) {
	t.Helper()
	src := "redis:\n" + redisExtra + "  shards:\n    - name: s0\n      primary: {addr: \"" + redisAddr + "\"}\n" +
		"nats:\n  url: " + natsURL + "\n" + natsExtra
	return config.Parse([]byte(src), env)
}

// secret is a valid TALLY_KEY_SECRET.
var secret = strings.Repeat("5e", 32)

// env is the tests' environment: the key secret and the NATS operator's
// credentials of the shipped permissions (natstest).
func env(k string) string {
	return map[string]string{config.EnvKeySecret: secret, config.EnvNATSUser: "operator",
		config.EnvNATSPassword: natstest.Password("operator")}[k]
}

// refused connects once with cfg's NATS options (no retries) and returns
// the server's refusal, or nil when it let the client in.
func refused(cfg *config.File) error {
	nc, err := nats.Connect(cfg.NATS.URL, append(cfg.NATSOptions(), nats.Timeout(5*time.Second))...)
	if err == nil {
		nc.Close()
	}
	return err
}

func connected(t *testing.T, cfg *config.File, log *slog.Logger, within time.Duration) bool {
	t.Helper()
	nc, err := service.ConnectNATS(cfg, "test", "degraded", log)
	require.NoError(t, err)
	defer nc.Close()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if nc.IsConnected() {
			return true
		}
	}
	return false
}

var discard = slog.New(slog.NewTextHandler(&testutil.Buffer{}, nil))

// A NATS server that requires TLS with client certificates: reached with
// the configured CA and client certificate, refused without them.
func TestNATSOverTLSWithClientCertificates(t *testing.T) {
	p := newPKI(t)
	ns := natstest.StartWith(t, func(o *server.Options) {
		tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: p.serverCert, KeyFile: p.serverKey, CaFile: p.ca, Verify: true})
		require.NoError(t, err)
		o.TLSConfig, o.TLS, o.TLSVerify = tc, true, true
		o.Users = nil // authenticated by certificate alone
	})
	url := strings.Replace(ns.ClientURL(), "nats://", "tls://", 1)
	cfg, err := load(t, "127.0.0.1:1", "", url, "  tls: {ca_file: "+p.ca+", cert_file: "+p.clientCert+", key_file: "+p.clientKey+"}\n")
	require.NoError(t, err)
	require.True(t, connected(t, cfg, discard, 5*time.Second))

	noCert, err := load(t, "127.0.0.1:1", "", url, "  tls: {ca_file: "+p.ca+"}\n")
	require.NoError(t, err)
	require.Error(t, refused(noCert), "a client without a certificate is refused")
}

// A NATS server that authenticates by nkey: reached with the seed file.
func TestNATSWithNKey(t *testing.T) {
	user, err := nkeys.CreateUser()
	require.NoError(t, err)
	pub, err := user.PublicKey()
	require.NoError(t, err)
	seed, err := user.Seed()
	require.NoError(t, err)
	seedFile := filepath.Join(t.TempDir(), "tally.nk")
	require.NoError(t, os.WriteFile(seedFile, seed, 0o600))
	ns := natstest.StartWith(t, func(o *server.Options) { o.Users, o.Nkeys = nil, []*server.NkeyUser{{Nkey: pub}} })

	cfg, err := load(t, "127.0.0.1:1", "", ns.ClientURL(), "  nkey_file: "+seedFile+"\n")
	require.NoError(t, err)
	require.True(t, connected(t, cfg, discard, 5*time.Second))
	anon, err := load(t, "127.0.0.1:1", "", ns.ClientURL(), "")
	require.NoError(t, err)
	require.Error(t, refused(anon), "no nkey, no connection")
}

// A lost NATS connection is logged with what it means.
func TestNATSDisconnectIsLogged(t *testing.T) {
	ns := natstest.Start(t)
	cfg, err := load(t, "127.0.0.1:1", "", ns.ClientURL(), "")
	require.NoError(t, err)
	var logs testutil.Buffer
	nc, err := service.ConnectNATS(cfg, "test", "events go to the primaries", slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)
	defer nc.Close()
	require.Eventually(t, nc.IsConnected, 5*time.Second, 20*time.Millisecond)
	ns.Shutdown()
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "NATS disconnected: events go to the primaries")
	}, 5*time.Second, 20*time.Millisecond)
}

// A Redis primary that accepts TLS only, with client certificates: the
// store reaches it with the configured files, and not without them.
func TestRedisOverTLS(t *testing.T) {
	p := newPKI(t)
	cert, err := tls.LoadX509KeyPair(p.clientCert, p.clientKey)
	require.NoError(t, err)
	rs := redistest.StartTLS(t, redistest.TLS{CertFile: p.serverCert, KeyFile: p.serverKey, CAFile: p.ca,
		Client: &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}})
	keys, err := limiter.NewKeySpace("tally", []byte(secret))
	require.NoError(t, err)
	ping := func(extra string) error {
		cfg, err := load(t, rs.Addr, extra, "nats://127.0.0.1:4222", "")
		require.NoError(t, err)
		opts := cfg.StoreOptions()
		opts.DialTimeout, opts.ReadTimeout = time.Second, time.Second
		st, err := redisstore.NewStore(cfg.Redis.Shards, keys, opts)
		require.NoError(t, err)
		defer st.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return st.Ping(ctx)
	}
	require.NoError(t, ping("  tls: {ca_file: "+p.ca+", cert_file: "+p.clientCert+", key_file: "+p.clientKey+"}\n"))
	require.Error(t, ping(""), "plain text to a TLS port")
	require.Error(t, ping("  tls: {ca_file: "+p.ca+"}\n"), "no client certificate")
}

// The start-up check refuses primaries that may evict Tally's keys, and
// lets a primary it cannot ask through with a warning.
func TestCheckRedisRefusesEvictingPolicies(t *testing.T) {
	rs := redistest.Start(t)
	keys, err := limiter.NewKeySpace("tally", []byte(secret))
	require.NoError(t, err)
	cfg, err := load(t, rs.Addr, "", "nats://127.0.0.1:4222", "")
	require.NoError(t, err)
	st, err := redisstore.NewStore(cfg.Redis.Shards, keys, cfg.StoreOptions())
	require.NoError(t, err)
	defer st.Close()
	ctx := context.Background()
	c := rs.Client()
	for policy, ok := range map[string]bool{"noeviction": true, "allkeys-lru": false, "volatile-ttl": false, "allkeys-random": false} {
		require.NoError(t, c.ConfigSet(ctx, "maxmemory-policy", policy).Err())
		err := service.CheckRedis(ctx, st, discard)
		if ok {
			require.NoError(t, err, policy)
		} else {
			require.ErrorIs(t, err, redisstore.ErrEvictingPolicy, policy)
			require.ErrorContains(t, err, policy)
		}
	}
	rs.Stop()
	var logs testutil.Buffer
	require.NoError(t, service.CheckRedis(ctx, st, slog.New(slog.NewTextHandler(&logs, nil))), "unreachable: start degraded")
	require.Contains(t, logs.String(), "could not be checked")
}

// The decision API takes only requests with its bearer token; the admin
// listener's probes stay open while its metrics and temporary limits need
// the admin token.
func TestTokens(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	api := httptest.NewServer(service.RequireToken("api-secret", ok))
	defer api.Close()
	admin := httptest.NewServer(service.GuardAdmin("admin-secret", ok))
	defer admin.Close()
	status := func(url, auth string) int {
		req, err := http.NewRequest("GET", url, nil)
		require.NoError(t, err)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		if resp.StatusCode == 401 {
			require.Equal(t, `Bearer realm="tally"`, resp.Header.Get("WWW-Authenticate"))
		}
		return resp.StatusCode
	}
	require.Equal(t, 401, status(api.URL+"/v1/check", ""))
	require.Equal(t, 401, status(api.URL+"/v1/check", "Bearer wrong"))
	require.Equal(t, 401, status(api.URL+"/v1/check", "api-secret"))
	require.Equal(t, 200, status(api.URL+"/v1/check", "Bearer api-secret"))
	require.Equal(t, 200, status(admin.URL+"/healthz", ""))
	require.Equal(t, 200, status(admin.URL+"/readyz", ""))
	require.Equal(t, 401, status(admin.URL+"/metrics", ""))
	require.Equal(t, 401, status(admin.URL+"/metrics", "Bearer api-secret"))
	require.Equal(t, 200, status(admin.URL+"/metrics", "Bearer admin-secret"))
	// The edge's temporary limits (block any client for days) need the admin token too.
	require.Equal(t, 401, status(admin.URL+"/v1/limits", ""))
	require.Equal(t, 401, status(admin.URL+"/v1/limits", "Bearer api-secret"))
	require.Equal(t, 200, status(admin.URL+"/v1/limits", "Bearer admin-secret"))
	open := httptest.NewServer(service.RequireToken("", ok))
	defer open.Close()
	require.Equal(t, 200, status(open.URL, ""), "no token configured: loopback only, open")
}

// An edge whose listener cannot listen stops with the error (its main then
// exits non-zero) instead of running without it.
func TestEdgeStopsWhenAListenerFails(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  listen: " + busy.Addr().String() + "\n  upstream: http://127.0.0.1:9\n  admin_listen: 127.0.0.1:0\n" +
		"policies:\n  - {name: core, limit: 10, window: 1m}\n"
	cfg, err := config.Parse([]byte(src), env)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = service.RunEdge(ctx, cfg, discard)
	require.ErrorContains(t, err, "address already in use")
	require.NoError(t, ctx.Err(), "it stopped by itself")
}

// Slow clients are cut off by the listeners' timeouts: headers that never
// end, a body that never comes. Neither holds its connection beyond them.
func TestSlowClientsAreCutOff(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	proxy, api, admin := freeAddr(t), freeAddr(t), freeAddr(t)
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  listen: " + proxy + "\n  upstream: http://127.0.0.1:9\n  api_listen: " + api + "\n  admin_listen: " + admin +
		"\n  read_header_timeout: 300ms\n  read_timeout: 600ms\n" +
		"policies:\n  - {name: core, limit: 10, window: 1m}\n"
	cfg, err := config.Parse([]byte(src), func(k string) string {
		return map[string]string{config.EnvKeySecret: secret, config.EnvNATSUser: "edge",
			config.EnvNATSPassword: natstest.Password("edge"), config.EnvNATSInbox: natstest.InboxPrefix("edge")}[k]
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.RunEdge(ctx, cfg, discard) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, 20*time.Second, 50*time.Millisecond, "the edge ready, as the shipped NATS permissions' edge")

	cutOff := func(addr, partial string) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_, err = c.Write([]byte(partial))
		require.NoError(t, err)
		// Far beyond the timeouts: the server, not this deadline, must end it.
		require.NoError(t, c.SetReadDeadline(time.Now().Add(15*time.Second)))
		b, err := io.ReadAll(c)
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "the connection was held: %q", b)
	}
	cutOff(proxy, "GET /repos HTTP/1.1\r\nHost: x\r\nX-Slow: ")
	cutOff(api, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"policy\":")
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}

// Closing the connection, as a clean stop does, is not a disconnect: no
// warning.
func TestNATSCloseIsNotAWarning(t *testing.T) {
	ns := natstest.Start(t)
	cfg, err := load(t, "127.0.0.1:1", "", ns.ClientURL(), "")
	require.NoError(t, err)
	var logs testutil.Buffer
	nc, err := service.ConnectNATS(cfg, "test", "events go to the primaries", slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	require.Eventually(t, nc.IsConnected, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, nc.Drain())
	// The closed callback comes after the disconnect one, on the same queue.
	testutil.WaitFor(t, "the connection closed", func() bool { return strings.Contains(logs.String(), "NATS connection closed") })
	require.NotContains(t, logs.String(), "NATS disconnected")
	require.NotContains(t, logs.String(), "level=WARN")
}
