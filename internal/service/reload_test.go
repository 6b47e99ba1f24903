package service_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/testutil"
)

// The edge's own configuration is read again while requests go on: a
// lower limit takes effect for the next request without one request
// failing, windows keep what they counted and never admit past the limit
// in effect, a new route is taken, and an invalid file is refused with the
// configuration in effect kept.
func TestReloadUnderLoad(t *testing.T) {
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) }))
	defer upstream.Close()
	proxy, admin := freeAddr(t), freeAddr(t)
	cfgPath := filepath.Join(t.TempDir(), "tally.yaml")
	write := func(path, limit string) {
		t.Helper()
		src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
			"nats:\n  url: " + ns.ClientURL() + "\n" +
			"edge:\n  listen: " + proxy + "\n  upstream: " + upstream.URL + "\n  admin_listen: " + admin +
			"\n  default_policy: core\n  identity: {header: Authorization}\n" +
			"policies:\n  - {name: core, limit: " + limit + ", window: 1h}\n  - {name: tight, limit: 1, window: 1h}\n"
		if path != "" {
			src += "routes:\n  - {path: " + path + ", policy: tight}\n"
		}
		file := filepath.Join(t.TempDir(), "tally.yaml")
		require.NoError(t, os.WriteFile(file, []byte(src), 0o600))
		// One file, replaced whole (as an editor or a deploy writes it).
		require.NoError(t, os.Rename(file, cfgPath))
	}
	write("", "40")
	cfg, err := config.Load(cfgPath, func(k string) string {
		return map[string]string{config.EnvKeySecret: secret, config.EnvNATSUser: "edge",
			config.EnvNATSPassword: natstest.Password("edge"), config.EnvNATSInbox: natstest.InboxPrefix("edge")}[k]
	})
	require.NoError(t, err)
	log := &testutil.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.RunEdge(ctx, cfg, slog.New(slog.NewJSONHandler(log, nil))) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, "the edge ready", func() bool {
		resp, err := http.Get("http://" + admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})

	do := func(client, path string) int {
		req, _ := http.NewRequest("GET", "http://"+proxy+path, nil)
		req.Header.Set("Authorization", "Bearer "+client)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var allowed, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch do("under-load", "/repos") {
				case 200:
					allowed.Add(1)
				case 429:
				default:
					other.Add(1)
				}
			}
		})
	}
	// Lower the limit below what the window already counts, and add a
	// route, while the requests go on.
	testutil.WaitFor(t, "some requests allowed", func() bool { return allowed.Load() >= 25 })
	write("/admin", "20")
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	testutil.WaitFor(t, "the reload logged", func() bool {
		return strings.Contains(log.String(), "changed policy core: 40 per 1h0m0s → 20 per 1h0m0s")
	})
	atReload := allowed.Load()
	time.Sleep(200 * time.Millisecond) // requests go on under the new terms
	close(stop)
	wg.Wait()
	require.Zero(t, other.Load(), "no request failed")
	require.LessOrEqual(t, allowed.Load(), int64(40), "the window never admitted past the limit in effect")
	require.LessOrEqual(t, allowed.Load()-atReload, int64(8),
		"past the new limit, nothing is admitted but the requests in flight when it took effect")

	// A new client gets the new limit; the new route is in effect.
	n := 0
	for range 25 {
		if do("after", "/repos") == 200 {
			n++
		}
	}
	require.Equal(t, 20, n)
	require.Equal(t, 200, do("admin-user", "/admin"))
	require.Equal(t, 429, do("admin-user", "/admin"))

	// An invalid file is refused, and the terms in effect stay.
	require.NoError(t, os.WriteFile(cfgPath, []byte("policies: [{name: core, limit: -1}]\n"), 0o600))
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
	testutil.WaitFor(t, "the refusal logged", func() bool { return strings.Contains(log.String(), "the configuration was not reloaded") })
	n = 0
	for range 25 {
		if do("after-refusal", "/repos") == 200 {
			n++
		}
	}
	require.Equal(t, 20, n)
}
