package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/stack"
)

// A peer measured beside Tally in the same run, when bench is given its
// binary (-ratelimit): envoyproxy/ratelimit, the rate-limit service most
// Envoy deployments run, on a Redis primary of its own with a replica (the
// topology of one of Tally's shards). It answers the same load through its
// HTTP JSON endpoint (POST /json, the gRPC service's request in JSON), with
// one limit far from being reached, like Tally's "far" policy: each
// request is a pipelined INCRBY and EXPIRE on its Redis.

// referenceName names the peer in the report.
const referenceName = "envoyproxy/ratelimit"

// startReference starts envoyproxy/ratelimit from the binary at bin, and
// the Redis primary and replica it counts on.
func (b *bench) startReference(ctx context.Context, bin string) error {
	primary, err := b.stack.Redis(ctx, "ratelimit-redis", "")
	if err != nil {
		return err
	}
	replica, err := b.stack.Redis(ctx, "ratelimit-redis-replica", primary.Addr)
	if err != nil {
		return err
	}
	root := filepath.Join(b.stack.Dir, "ratelimit-runtime")
	if err := os.MkdirAll(filepath.Join(root, "bench", "config"), 0o700); err != nil {
		return err
	}
	conf := fmt.Sprintf("domain: bench\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: hour\n      requests_per_unit: %d\n", limiter.MaxLimit)
	if err := os.WriteFile(filepath.Join(root, "bench", "config", "bench.yaml"), []byte(conf), 0o600); err != nil {
		return err
	}
	addr, grpc, debug := stack.FreeAddr(), stack.FreeAddr(), stack.FreeAddr()
	port := func(a string) string { return a[len("127.0.0.1:"):] }
	// Loopback only, no statsd, its file configuration read once.
	env := []string{"HOST=127.0.0.1", "PORT=" + port(addr), "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + port(grpc),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + port(debug), "USE_STATSD=false", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + primary.Addr, "RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=bench",
		"RUNTIME_WATCH_ROOT=false"}
	p, err := b.stack.Start(ctx, "ratelimit", "env", append(env, bin)...)
	if err != nil {
		return err
	}
	p.Addr = addr
	if err := stack.WaitHTTP(ctx, "http://"+addr+"/healthcheck", nil); err != nil {
		return fmt.Errorf("%s did not start (its log: %s): %w", referenceName, p.LogFile(), err)
	}
	b.referenceGRPC = grpc
	b.reference = &target{name: referenceName, addr: addr, procs: map[string][]*stack.Proc{
		"ratelimit": {p}, "redis (2)": {primary, replica}}}
	for _, r := range []*stack.Proc{primary, replica} {
		b.rdb = append(b.rdb, redis.NewClient(&redis.Options{Addr: r.Addr, DisableIdentity: true}))
	}
	return nil
}

// referenceRequest is envoyproxy/ratelimit's check of one key, as its JSON
// endpoint takes it.
func referenceRequest(identity string) []byte {
	body := `{"domain":"bench","descriptors":[{"entries":[{"key":"k","value":"` + identity + `"}]}]}`
	return []byte("POST /json HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}
