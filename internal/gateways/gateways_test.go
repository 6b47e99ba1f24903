package gateways_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/testutil"
)

const limit = 5

// tally runs an edge-checker whose forward-auth listener answers loopback
// gateways, with one policy of limit requests an hour (mode exact: the
// primary counts exactly what was admitted), in front of an upstream that
// serves ETags and 304s. It returns the forward-auth and access-log
// addresses and the upstream's.
func tally(t *testing.T) (fa, logAddr, upstream string) {
	t.Helper()
	return tallyFor(t, "127.0.0.1", "")
}

// tallyFor is tally answering the gateways given (a YAML list's items),
// with the identity's trusted proxies given (likewise; "" for none).
func tallyFor(t *testing.T, gateways, trustedProxies string) (fa, logAddr, upstream string) {
	t.Helper()
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"v1"`)
		if r.Header.Get("If-None-Match") == `"v1"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		_, _ = w.Write([]byte("hello\n"))
	}))
	t.Cleanup(up.Close)
	fa, admin, logAddr := freeAddr(t), freeAddr(t), freeAddr(t)
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  admin_listen: " + admin + "\n  default_policy: core\n  identity: {header: Authorization, trusted_proxies: [" + trustedProxies + "]}\n" +
		"  forward_auth:\n    listen: " + fa + "\n    gateways: [" + gateways + "]\n    log_listen: " + logAddr + "\n" +
		fmt.Sprintf("policies:\n  - {name: core, limit: %d, window: 1h, mode: exact}\n", limit)
	cfg, err := config.Parse([]byte(src), func(k string) string {
		return map[string]string{config.EnvKeySecret: strings.Repeat("6a", 32), config.EnvNATSUser: "edge",
			config.EnvNATSPassword: natstest.Password("edge"), config.EnvNATSInbox: natstest.InboxPrefix("edge")}[k]
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.RunEdge(ctx, cfg, slog.New(slog.NewJSONHandler(io.Discard, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, "the edge ready", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return fa, logAddr, strings.TrimPrefix(up.URL, "http://")
}

// example reads a configuration Tally ships and puts the test's addresses
// where the example's are.
func example(t *testing.T, path string, addrs map[string]string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := string(b)
	for from, to := range addrs {
		require.Contains(t, s, from, "the example names %s", from)
		s = strings.ReplaceAll(s, from, to)
	}
	return s
}

// start runs a gateway until the test ends, and waits for its port.
func start(t *testing.T, addr string, name string, args ...string) {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start(), "%s: run make test, which installs Debian's nginx and caddy", name)
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	testutil.WaitFor(t, name+" listening", func() bool {
		select {
		case <-exited:
			t.Fatalf("%s exited: %s", name, out.String())
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return false
		}
		c.Close()
		return true
	})
}

// get sends a GET through the gateway as client token, revalidating when
// etag is set.
func get(t *testing.T, gateway, token, etag string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("GET", "http://"+gateway+"/repos", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+token)
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// exactlyN: a client gets exactly limit requests through, each with the
// rate-limit headers, then 429s with Retry-After; its 304s come back from
// the gateway's access log, after which it gets that many more.
func exactlyN(t *testing.T, gateway string) {
	t.Helper()
	for i := range limit {
		resp := get(t, gateway, "alice", "")
		require.Equal(t, 200, resp.StatusCode, "request %d", i+1)
		require.Equal(t, fmt.Sprint(limit), resp.Header.Get("X-RateLimit-Limit"))
		require.Equal(t, fmt.Sprint(limit-1-i), resp.Header.Get("X-RateLimit-Remaining"))
		require.NotEmpty(t, resp.Header.Get("RateLimit"))
	}
	for range 3 {
		resp := get(t, gateway, "alice", "")
		require.Equal(t, 429, resp.StatusCode)
		require.Equal(t, "0", resp.Header.Get("X-RateLimit-Remaining"))
		require.NotEmpty(t, resp.Header.Get("Retry-After"))
	}

	// Revalidations: charged when they start, given back when the access
	// log says 304.
	for range 3 {
		require.Equal(t, 304, get(t, gateway, "bob", `"v1"`).StatusCode)
	}
	testutil.WaitFor(t, "the 304s given back", func() bool {
		resp := get(t, gateway, "bob", `"v1"`)
		return resp.StatusCode == 304 && resp.Header.Get("X-RateLimit-Remaining") == fmt.Sprint(limit-1)
	})
	n := 0
	for range limit + 2 {
		if get(t, gateway, "bob", "").StatusCode == 200 {
			n++
		}
	}
	// The probe's last revalidation may or may not have come back yet.
	require.Contains(t, []int{limit - 1, limit}, n)
}

func TestNginx(t *testing.T) {
	fa, logAddr, upstream := tally(t)
	listen, _ := startNginx(t, fa, logAddr, upstream)
	exactlyN(t, listen)
}

func TestCaddy(t *testing.T) {
	fa, logAddr, upstream := tally(t)
	listen := startCaddy(t, fa, logAddr, upstream)
	exactlyN(t, listen)
}

// startNginx runs deploy/nginx/nginx.conf with the test's addresses, and
// returns where it listens and its directory (error.log is there).
func startNginx(t *testing.T, fa, logAddr, upstream string) (listen, dir string) {
	t.Helper()
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		nginx = "/usr/sbin/nginx"
	}
	listen, dir = freeAddr(t), t.TempDir()
	conf := example(t, "../../deploy/nginx/nginx.conf", map[string]string{"127.0.0.1:9000": upstream, "127.0.0.1:8082": fa,
		"127.0.0.1:5514": logAddr, "127.0.0.1:8080": listen})
	path := filepath.Join(dir, "nginx.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	start(t, listen, nginx, "-p", dir, "-c", path, "-g", "daemon off; master_process off;")
	return listen, dir
}

// startCaddy runs deploy/caddy/Caddyfile with the test's addresses, and
// returns where it listens.
func startCaddy(t *testing.T, fa, logAddr, upstream string) string {
	t.Helper()
	listen := freeAddr(t)
	conf := example(t, "../../deploy/caddy/Caddyfile", map[string]string{"127.0.0.1:9000": upstream, "127.0.0.1:8082": fa,
		"127.0.0.1:5515": logAddr, "127.0.0.1:8081": listen})
	path := filepath.Join(t.TempDir(), "Caddyfile")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	start(t, listen, "caddy", "run", "--adapter", "caddyfile", "--config", path)
	return listen
}

// The Caddyfile's site listens where docs/caddy.md says, on loopback only:
// a site address only matches requests, and without bind Caddy listens on
// the port on every interface.
func TestCaddyListensOnLoopbackOnly(t *testing.T) {
	cmd := exec.Command("caddy", "adapt", "--adapter", "caddyfile", "--config", "../../deploy/caddy/Caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	out, err := cmd.Output()
	require.NoError(t, err, "caddy adapt")
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Listen []string `json:"listen"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	require.NoError(t, json.Unmarshal(out, &cfg))
	require.NotEmpty(t, cfg.Apps.HTTP.Servers)
	for name, s := range cfg.Apps.HTTP.Servers {
		require.NotEmpty(t, s.Listen, name)
		for _, l := range s.Listen {
			host, _, err := net.SplitHostPort(l)
			require.NoError(t, err, l)
			require.Equal(t, "127.0.0.1", host, "server %s listens on %s", name, l)
		}
	}
}

// A gateway whose address is not in edge.forward_auth.gateways does not
// look like rate limiting: nginx answers 500 (Tally's 421 is not the 403
// its error_page makes a 429) and logs why; Caddy passes the 421 on.
func TestGatewayNotInTheList(t *testing.T) {
	fa, logAddr, upstream := tallyFor(t, "10.9.9.9", "")
	nginx, dir := startNginx(t, fa, logAddr, upstream)
	resp := get(t, nginx, "alice", "")
	require.Equal(t, 500, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Retry-After"))
	testutil.WaitFor(t, "nginx's error log", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		return strings.Contains(string(b), "auth request unexpected status: 421")
	})
	caddy := startCaddy(t, fa, logAddr, upstream)
	resp = get(t, caddy, "alice", "")
	require.Equal(t, 421, resp.StatusCode)
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
}

func freeAddr(t *testing.T) string {
	t.Helper()
	a, err := freeport.Addr()
	require.NoError(t, err)
	return a
}
