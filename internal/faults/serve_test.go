package faults

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/redistest"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

// Two tally serve processes (the binary) over one Redis, their embedded
// NATS servers one cluster, admit exactly a rule's limit together under
// concurrent calls to both, and stop cleanly on SIGTERM with everything
// delivered.
func TestTwoServeProcessesOverOneRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("runs tally serve as processes")
	}
	rs := redistest.Start(t)
	st := stack.New(t.TempDir(), bin, deploy.NATSRoutePasswordEnv+"=route-secret")
	t.Cleanup(st.StopAll)
	rules := filepath.Join(st.Dir, "rules")
	require.NoError(t, os.MkdirAll(rules, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(rules, "api.yaml"),
		[]byte("domain: api\ndescriptors:\n  - key: client\n    rate_limit: {unit: hour, requests_per_unit: 100}\n"), 0o600))
	routes := []string{stack.FreeAddr(), stack.FreeAddr()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var procs []*stack.Proc
	var rlsAddrs []string
	for i := range 2 {
		f := &config.File{KeyPrefix: "tally", Redis: config.Redis{Shards: []shard.Config{{Name: "s0", Primary: shard.Node{Addr: rs.Addr}}}}}
		f.Edge.AdminListen = stack.FreeAddr()
		// The last of two stops without a quorum: what it cannot deliver
		// through the stream it applies itself, within this bound, well
		// inside the stack's 15 s before it kills a process.
		f.Edge.ShutdownTimeout = 5 * time.Second
		f.Edge.RLS = config.RLS{Listen: stack.FreeAddr(), Config: rules}
		f.Serve = config.Serve{DataDir: filepath.Join(st.Dir, "data", string(rune('a'+i)))}
		f.Serve.NATS.Name = "tally-" + string(rune('a'+i))
		f.Serve.NATS.Cluster = config.EmbeddedCluster{Listen: routes[i], Routes: []string{routes[1-i]}}
		path, err := st.WriteConfig(f.Serve.NATS.Name, f)
		require.NoError(t, err)
		p, err := st.Start(ctx, f.Serve.NATS.Name, filepath.Join(bin, "tally"), "serve", "-config", path)
		require.NoError(t, err)
		procs, rlsAddrs = append(procs, p), append(rlsAddrs, f.Edge.RLS.Listen)
		defer func() {
			if t.Failed() {
				b, _ := os.ReadFile(p.LogFile())
				t.Logf("%s's log:\n%s", p.Name, b)
			}
		}()
		adminAddr := f.Edge.AdminListen
		procs[i].AdminAddr = adminAddr
	}
	for _, p := range procs {
		require.NoError(t, stack.WaitHTTP(ctx, "http://"+p.AdminAddr+"/readyz", nil), "%s ready", p.Name)
	}
	var clients []rlsv3.RateLimitServiceClient
	for _, a := range rlsAddrs {
		cc, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		defer cc.Close()
		clients = append(clients, rlsv3.NewRateLimitServiceClient(cc))
	}
	var allowed, denied atomic.Int64
	var wg sync.WaitGroup
	for w := range 8 {
		c := clients[w%2]
		wg.Go(func() {
			for range 40 {
				cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := c.ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{Domain: "api",
					Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "shared"}}}}})
				ccancel()
				if !assert.NoError(t, err) {
					return
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					allowed.Add(1)
				} else {
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, int64(100), allowed.Load(), "two processes together admit exactly the limit")
	assert.Equal(t, int64(220), denied.Load())
	// SIGTERM to one, then the other, as a rollout does: the first
	// delivers everything while the cluster is whole (the last of two has
	// no quorum left: its accounting goes to the primary itself).
	for i, p := range procs {
		p.Stop()
		b, err := os.ReadFile(p.LogFile())
		require.NoError(t, err)
		log := string(b)
		assert.Contains(t, log, `"msg":"embedded NATS stopped"`, p.Name)
		assert.Contains(t, log, `"routes":1`, p.Name)
		if i == 0 {
			assert.False(t, strings.Contains(log, "not everything was delivered"), "%s delivered everything", p.Name)
		}
	}
}
