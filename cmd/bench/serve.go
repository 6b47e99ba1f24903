package main

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/shard"
	"github.com/tallyhq/tally/internal/stack"
)

// tally serve measured beside the separate processes: the edge, the
// accountant and an embedded NATS JetStream in one process, on a Redis
// primary and replica of its own (the topology envoyproxy/ratelimit gets
// here), answering the gRPC door from the same rules. Its memory is
// measured beside theirs.

// serveName names it in the report.
const serveName = "tally serve (one process): Envoy's rate-limit service (gRPC)"

// startServe starts tally serve from the bin directory and returns its
// gRPC address and the processes whose CPU and memory a run accounts for.
func (b *bench) startServe(ctx context.Context) (string, map[string][]*stack.Proc, error) {
	primary, err := b.stack.Redis(ctx, "serve-redis", "")
	if err != nil {
		return "", nil, err
	}
	replica, err := b.stack.Redis(ctx, "serve-redis-replica", primary.Addr)
	if err != nil {
		return "", nil, err
	}
	f := *b.cfg
	f.Redis.Shards = []shard.Config{{Name: "s0", Primary: shard.Node{Addr: primary.Addr}, Replicas: []shard.Node{{Addr: replica.Addr}}}}
	f.Redis.Placement, f.Redis.PreviousPlacement = nil, nil
	f.NATS.URL = "" // embedded
	f.Edge.Listen, f.Edge.Upstream, f.Edge.APIListen = "", "", ""
	f.Edge.ForwardAuth = config.ForwardAuth{}
	f.Edge.AdminListen = stack.FreeAddr()
	f.Edge.RLS.Listen, f.Edge.RLS.Config = stack.FreeAddr(), b.rlsDir
	f.Accountant.AdminListen = ""
	f.Serve = config.Serve{DataDir: filepath.Join(b.stack.Dir, "serve-data")}
	path, err := b.stack.WriteConfig("serve", &f)
	if err != nil {
		return "", nil, err
	}
	p, err := b.stack.Start(ctx, "tally-serve", filepath.Join(b.stack.Bin, "tally"), "serve", "-config", path)
	if err != nil {
		return "", nil, err
	}
	if err := stack.WaitHTTP(ctx, "http://"+f.Edge.AdminListen+"/readyz", nil); err != nil {
		return "", nil, fmt.Errorf("tally serve not ready (see %s): %w", p.LogFile(), err)
	}
	for _, r := range []*stack.Proc{primary, replica} {
		b.rdb = append(b.rdb, redis.NewClient(&redis.Options{Addr: r.Addr, DisableIdentity: true}))
	}
	return f.Edge.RLS.Listen, map[string][]*stack.Proc{"tally serve": {p}, "redis (2)": {primary, replica}}, nil
}

// memory is the resident memory of procs, in MB, by process name (Redis
// left out: it holds the windows, whoever decides).
func memory(procs map[string][]*stack.Proc) map[string]float64 {
	out := map[string]float64{}
	for name, ps := range procs {
		if len(name) >= 5 && name[:5] == "redis" {
			continue
		}
		for _, p := range ps {
			out[name] += float64(rss(p.Pid())) / (1 << 20)
		}
	}
	return out
}
