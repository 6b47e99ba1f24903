package service_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/testpki"
	"github.com/tallyhq/tally/internal/testutil"
)

// Every listener of both binaries serves TLS when given a certificate:
// the proxy, the decision API, Envoy's gRPC door, forward-auth and the
// admin listeners. Where a client CA is given, a client without a
// certificate of that CA is refused before any request is read, and the
// bearer tokens are still required on top. The proxy's certificate,
// rotated on disk, is served to the next connection without a restart.
func TestEveryListenerServesTLS(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	ca, other := testpki.NewCA(t, "tally CA"), testpki.NewCA(t, "another CA")
	dir := t.TempDir()
	proxyCert, proxyKey := filepath.Join(dir, "proxy.crt"), filepath.Join(dir, "proxy.key")
	first := ca.IssueTo(proxyCert, proxyKey, "proxy-1", x509.ExtKeyUsageServerAuth)
	cert, key := ca.Server("edge")
	gwCert, gwKey := ca.Client("gateway")
	badCert, badKey := other.Client("intruder")

	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("upstream")) }))
	defer upstream.Close()
	proxy, api, admin, rls, fa, accAdmin := freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t), freeAddr(t)
	server := "{cert_file: " + cert + ", key_file: " + key + "}"
	mutual := "{cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca.File + "}"
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  listen: " + proxy + "\n  upstream: " + upstream.URL + "\n  tls: {cert_file: " + proxyCert + ", key_file: " + proxyKey + "}\n" +
		"  api_listen: " + api + "\n  api_tls: " + mutual + "\n" +
		"  admin_listen: " + admin + "\n  admin_tls: " + server + "\n" +
		"  rls: {listen: " + rls + ", config: " + filepath.Join("..", "..", "deploy", "envoy", "ratelimit") + ", tls: " + mutual + "}\n" +
		"  forward_auth: {listen: " + fa + ", gateways: [127.0.0.1], tls: " + mutual + "}\n" +
		"accountant:\n  admin_listen: " + accAdmin + "\n  admin_tls: " + mutual + "\n" +
		"policies:\n  - {name: core, limit: 10, window: 1m}\n"
	src += "routes:\n  - {path: /, policy: core}\n"
	cfg, err := config.Parse([]byte(src), func(k string) string {
		return map[string]string{config.EnvKeySecret: secret, config.EnvNATSUser: "operator", config.EnvAPIToken: "api-token",
			config.EnvAdminToken: "admin-token", config.EnvNATSPassword: natstest.Password("operator")}[k]
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	edgeDone, accDone := make(chan error, 1), make(chan error, 1)
	go func() { edgeDone <- service.RunEdge(ctx, cfg, discard) }()
	go func() { accDone <- service.RunAccountant(ctx, cfg, discard) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-edgeDone); require.NoError(t, <-accDone) })

	client := func(tc *tls.Config) *http.Client {
		return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	anon, gateway, intruder := client(testpki.ClientTLS(t, ca, "", "")), client(testpki.ClientTLS(t, ca, gwCert, gwKey)),
		client(testpki.ClientTLS(t, ca, badCert, badKey))
	do := func(c *http.Client, method, url, token string, header http.Header, body string) (int, string, error) {
		req, err := http.NewRequest(method, url, bytes.NewBufferString(body))
		require.NoError(t, err)
		for k, v := range header {
			req.Header[k] = v
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	testutil.WaitForWithin(t, "the edge ready over TLS", 20*time.Second, func() bool {
		code, _, err := do(anon, "GET", "https://"+admin+"/readyz", "", nil, "")
		return err == nil && code == 200
	})
	_, _, err = do(http.DefaultClient, "GET", "http://"+admin+"/readyz", "", nil, "")
	require.NoError(t, err, "plain HTTP reaches a TLS listener…")
	code, _, _ := do(http.DefaultClient, "GET", "http://"+admin+"/readyz", "", nil, "")
	require.Equal(t, http.StatusBadRequest, code, "…and is told to speak TLS")
	code, _, err = do(anon, "GET", "https://"+admin+"/metrics", "", nil, "")
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "the admin token still guards /metrics")

	// The proxy, over TLS.
	code, body, err := do(anon, "GET", "https://"+proxy+"/x", "", nil, "")
	require.NoError(t, err)
	require.Equal(t, 200, code)
	require.Equal(t, "upstream", body)

	// The decision API, with mTLS and the token on top.
	check := `{"policy":"core","identity":"alice"}`
	for name, c := range map[string]*http.Client{"no certificate": anon, "another CA's certificate": intruder} {
		_, _, err = do(c, "POST", "https://"+api+"/v1/check", "api-token", nil, check)
		require.Error(t, err, "decision API, %s", name)
	}
	code, _, err = do(gateway, "POST", "https://"+api+"/v1/check", "", nil, check)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, code, "a certificate does not replace the token")
	code, body, err = do(gateway, "POST", "https://"+api+"/v1/check", "api-token", nil, check)
	require.NoError(t, err)
	require.Equal(t, 200, code, body)

	// Forward-auth, with mTLS.
	fwd := http.Header{"X-Forwarded-Method": {"GET"}, "X-Forwarded-Uri": {"/x"}, "X-Forwarded-Host": {"api.example"}}
	_, _, err = do(anon, "GET", "https://"+fa+"/auth/traefik", "", fwd, "")
	require.Error(t, err, "forward-auth without a certificate")
	code, body, err = do(gateway, "GET", "https://"+fa+"/auth/traefik", "", fwd, "")
	require.NoError(t, err)
	require.Equal(t, 200, code, body)

	// The accountant's admin listener, with mTLS.
	_, _, err = do(anon, "GET", "https://"+accAdmin+"/healthz", "", nil, "")
	require.Error(t, err, "the accountant's admin listener without a certificate")
	testutil.WaitFor(t, "the accountant's /healthz over mTLS", func() bool {
		code, _, err := do(gateway, "GET", "https://"+accAdmin+"/healthz", "", nil, "")
		return err == nil && code == 200
	})

	// Envoy's gRPC door, with mTLS.
	health := func(tc *tls.Config) (healthpb.HealthCheckResponse_ServingStatus, error) {
		conn, err := grpc.NewClient(rls, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		require.NoError(t, err)
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false))
		if err != nil {
			return 0, err
		}
		return resp.Status, nil
	}
	_, err = health(testpki.ClientTLS(t, ca, "", ""))
	require.Error(t, err, "gRPC without a certificate")
	st, err := health(testpki.ClientTLS(t, ca, gwCert, gwKey))
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, st)

	// The proxy's certificate rotated on disk: the next connection gets it.
	second := ca.IssueTo(proxyCert, proxyKey, "proxy-2", x509.ExtKeyUsageServerAuth)
	require.NotEqual(t, first.SerialNumber, second.SerialNumber)
	testutil.WaitFor(t, "the rotated certificate served", func() bool {
		c := client(testpki.ClientTLS(t, ca, "", ""))
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + proxy + "/x")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.TLS.PeerCertificates[0].SerialNumber.Cmp(second.SerialNumber) == 0
	})
}

// A listener whose TLS files cannot be used stops the edge at start with
// the file and the reason (config refuses them first; a file that went
// away between the check and the start is caught here).
func TestUnusableTLSStopsTheEdge(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	ca := testpki.NewCA(t, "tally CA")
	cert, key := ca.Server("edge")
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  admin_listen: " + freeAddr(t) + "\n  admin_tls: {cert_file: " + cert + ", key_file: " + key + ", client_ca_file: " + ca.File + "}\n" +
		"policies:\n  - {name: core, limit: 10, window: 1m}\n"
	cfg, err := config.Parse([]byte(src), env)
	require.NoError(t, err)
	cfg.Edge.AdminTLS.ClientCAFile = filepath.Join(t.TempDir(), "gone.pem")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = service.RunEdge(ctx, cfg, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "client_ca_file: open "+cfg.Edge.AdminTLS.ClientCAFile)
	require.NoError(t, ctx.Err(), "it stopped by itself")
}
