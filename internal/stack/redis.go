package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/shard"
)

// Redis starts a redis-server on a free loopback port (a replica of primary
// when primary is not empty) and returns once it answers, and for a replica
// once its link is up. It keeps nothing on disk: a restart starts empty.
func (s *Stack) Redis(ctx context.Context, name, primary string) (*Proc, error) {
	return s.RedisWith(ctx, name, primary, RedisOptions{})
}

// RedisOptions are settings of a redis-server beyond the stack's defaults
// (no persistence, no eviction).
type RedisOptions struct {
	// Durable keeps an append-only file fsynced before every write is
	// acknowledged, so that a server killed with SIGKILL and restarted
	// (Stack.Restart) has lost nothing it acknowledged. Slower; the stack's
	// default is for benchmarks and demos.
	Durable bool
}

// RedisWith is Redis with options.
func (s *Stack) RedisWith(ctx context.Context, name, primary string, o RedisOptions) (*Proc, error) {
	addr := FreeAddr()
	_, port, _ := net.SplitHostPort(addr)
	dir := filepath.Join(s.Dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	aof := []string{"--appendonly", "no"}
	if o.Durable {
		aof = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	args := append([]string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--dir", dir,
		"--repl-diskless-sync-delay", "0", "--maxmemory-policy", "noeviction"}, aof...)
	if primary != "" {
		h, p, _ := net.SplitHostPort(primary)
		args = append(args, "--replicaof", h, p)
	}
	p, err := s.Start(ctx, name, "redis-server", args...)
	if err != nil {
		return nil, err
	}
	p.Addr = addr
	p.ready = func(ctx context.Context) error {
		if err := WaitTCP(ctx, addr); err != nil {
			return err
		}
		if primary == "" {
			return waitRedis(ctx, name, port, "PING", "PONG")
		}
		return waitRedis(ctx, name, port, "INFO replication", "master_link_status:up")
	}
	return p, p.ready(ctx)
}

// waitRedis waits up to 10 seconds until the answer of the server on port
// to cmd contains want: a server loading its append-only file accepts
// connections before it serves, and a replica before its link is up.
func waitRedis(ctx context.Context, name, port, cmd, want string) error {
	for range 200 {
		out, _ := exec.CommandContext(ctx, "redis-cli", append([]string{"-p", port}, strings.Fields(cmd)...)...).Output()
		if strings.Contains(string(out), want) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: no %q in its answer to %s after 10s", name, want, cmd)
}

// Shards starts n shards named s0, s1, ..., each a primary and replicas.
// procs holds each shard's primary then its replicas, shard after shard.
func (s *Stack) Shards(ctx context.Context, n, replicas int) ([]shard.Config, []*Proc, error) {
	return s.ShardsWith(ctx, n, replicas, RedisOptions{})
}

// ShardsWith is Shards with options for the primaries (the replicas
// resynchronise from their primary when they restart, so they keep nothing
// on disk).
func (s *Stack) ShardsWith(ctx context.Context, n, replicas int, primaries RedisOptions) ([]shard.Config, []*Proc, error) {
	var out []shard.Config
	var procs []*Proc
	for i := range n {
		name := "s" + strconv.Itoa(i)
		p, err := s.RedisWith(ctx, name+"-primary", "", primaries)
		if err != nil {
			return nil, nil, err
		}
		procs = append(procs, p)
		sc := shard.Config{Name: name, Primary: shard.Node{Addr: p.Addr}}
		for j := range replicas {
			r, err := s.Redis(ctx, fmt.Sprintf("%s-replica%d", name, j), p.Addr)
			if err != nil {
				return nil, nil, err
			}
			procs = append(procs, r)
			sc.Replicas = append(sc.Replicas, shard.Node{Addr: r.Addr})
		}
		out = append(out, sc)
	}
	return out, procs, nil
}
