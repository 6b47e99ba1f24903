package tallytest

import (
	"context"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/freeport"
	"github.com/tallyhq/tally/internal/natstest"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/testutil"
)

// Tally is a running deployment.
type Tally struct {
	// API is the decision API's base URL; Token its bearer token.
	API, Token string
	// Secret is the key secret; Prefix the key prefix; Shards the shards'
	// names.
	Secret []byte
	Prefix string
	Shards []string
	Redis  *redistest.Server
	NATS   *natstest.Server
	// Config is the deployment's configuration file; Env(user) its
	// environment for a process connecting to NATS as user (the key
	// secret, the API token, NATS credentials).
	Config string
	Env    func(user string) func(string) string
	// EdgeAdmin is the edge's admin listener's address.
	EdgeAdmin string
}

// Secret is the key secret of every deployment Start runs.
var Secret = []byte(strings.Repeat("k", 32))

// Start runs a deployment of one shard, s0, whose policies are the YAML
// list items in policies ("- {name: core, limit: 3, window: 1h}").
func Start(t testing.TB, policies string) *Tally {
	t.Helper()
	rs := redistest.Start(t)
	ns := natstest.Start(t)
	api, edgeAdmin, accAdmin := freeAddr(t), freeAddr(t), freeAddr(t)
	tl := &Tally{API: "http://" + api, Token: "tallytest-api-token", Secret: Secret, Prefix: "tally",
		Shards: []string{"s0"}, Redis: rs, NATS: ns}
	src := "redis:\n  shards:\n    - name: s0\n      primary: {addr: \"" + rs.Addr + "\"}\n" +
		"nats:\n  url: " + ns.ClientURL() + "\n" +
		"edge:\n  admin_listen: " + edgeAdmin + "\n  api_listen: " + api + "\n" +
		"accountant:\n  admin_listen: " + accAdmin + "\n" +
		"policies:\n  " + strings.ReplaceAll(strings.TrimSpace(policies), "\n", "\n  ") + "\n"
	tl.Config, tl.EdgeAdmin = src, edgeAdmin
	tl.Env = func(user string) func(string) string {
		return func(k string) string {
			return map[string]string{config.EnvKeySecret: hex.EncodeToString(Secret), config.EnvAPIToken: tl.Token,
				config.EnvNATSUser: user, config.EnvNATSPassword: natstest.Password(user),
				config.EnvNATSInbox: natstest.InboxPrefix(user)}[k]
		}
	}
	parse := func(user string) *config.File {
		cfg, err := config.Parse([]byte(src), tl.Env(user))
		if err != nil {
			t.Fatalf("tallytest: %v", err)
		}
		return cfg
	}
	// The processes' logs are shown when the test fails.
	buf := &testutil.Buffer{}
	log := slog.New(slog.NewJSONHandler(buf, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("tallytest: the edge's and the accountant's logs:\n%s", buf.String())
		}
	})
	run := func(name string, f func(context.Context, *config.File, *slog.Logger) error, cfg *config.File, admin string) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- f(ctx, cfg, log) }()
		t.Cleanup(func() { cancel(); <-done })
		testutil.WaitFor(t, "the "+name+" ready", func() bool {
			resp, err := http.Get("http://" + admin + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK
		})
	}
	run("accountant", service.RunAccountant, parse("accountant"), accAdmin)
	run("edge", service.RunEdge, parse("edge"), edgeAdmin)
	return tl
}

func freeAddr(t testing.TB) string {
	t.Helper()
	a, err := freeport.Addr()
	if err != nil {
		t.Fatalf("tallytest: %v", err)
	}
	return a
}
