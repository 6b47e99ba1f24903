package edge

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
)

// readiness is what an edge must have done before it decides normally:
// reached every shard's primary once (its scripts loaded there, so the
// first requests need no extra round trip), and, with NATS, connected and
// found (or created) its streams and read the temporary limits in force.
// Until then /readyz answers 503 and names what is missing. A dependency
// lost after that makes the edge degraded, not unready (failing every edge
// at once when a shared dependency blips would take the API down with it)
// — except a primary with on_redis_error deny: the edge then cannot decide
// a key it knows nothing of (every such request fails), and says so, so
// that Envoy's health checks and load balancers see what its answers are.
type readiness struct {
	reached []atomic.Bool // per shard: its primary answered once
	streams atomic.Bool   // the streams exist (NATS connected once)
	limits  atomic.Bool   // the temporary limits in the stream at start were read
	// down, per shard, with on_redis_error deny: the last probe of the
	// primary failed (watchPrimaries).
	down []atomic.Bool
}

func newReadiness(shards int) *readiness {
	return &readiness{reached: make([]atomic.Bool, shards), down: make([]atomic.Bool, shards)}
}

// probeEvery is how often an edge in mode deny probes the primaries the
// request path found unreachable, until they answer.
const probeEvery = 250 * time.Millisecond

// missing says what keeps the edge from being ready ("" when nothing).
// The reasons are in the logs: /readyz is open to probes, and names no
// address.
func (s *Server) missing() string {
	r := s.ready
	var out []string
	for i := range r.reached {
		if !r.reached[i].Load() {
			out = append(out, "shard "+s.o.Store.ShardName(i)+" primary never reached")
		}
	}
	if s.o.NATS != nil && !r.streams.Load() {
		out = append(out, "nats streams not found or created yet")
	}
	if s.o.NATS != nil && !r.limits.Load() {
		out = append(out, "temporary limits not read yet")
	}
	return strings.Join(out, "; ")
}

// undecidable says why the edge cannot decide a key it knows nothing of
// ("" when it can): with on_redis_error deny, a shard whose primary the
// request path stopped waiting for, or that the last probe could not reach.
// With allow it always can (such keys are admitted, charged later).
func (s *Server) undecidable() string {
	if !s.o.DenyOnRedisError {
		return ""
	}
	var out []string
	for i := range s.ready.down {
		if s.ready.down[i].Load() || s.core.Suspected(i) {
			out = append(out, "shard "+s.o.Store.ShardName(i)+" primary unreachable (on_redis_error: deny)")
		}
	}
	return strings.Join(out, "; ")
}

// Ready reports whether the edge decides normally (what /readyz answers
// 200 for) and is not draining: what the rate-limit service's gRPC health
// check reports. With on_redis_error deny it is not ready while a primary
// cannot be reached.
func (s *Server) Ready() bool {
	return !s.draining.Load() && s.missing() == "" && s.undecidable() == ""
}

// watchPrimaries, with on_redis_error deny, probes each primary the request
// path has stopped waiting for (loading the scripts there, as warm does)
// until it answers: the edge is not ready meanwhile, and, being unready,
// may get no request to find out by itself that the primary is back.
func (s *Server) watchPrimaries() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-s.stop; cancel() }()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for i := range s.ready.down {
			down := s.ready.down[i].Load()
			if !down && !s.core.Suspected(i) {
				continue
			}
			c, cancel := context.WithTimeout(ctx, time.Second)
			err := s.o.Store.LoadScripts(c, i)
			cancel()
			switch {
			case err != nil && !down:
				s.ready.down[i].Store(true)
				s.log.Warn("the shard's primary cannot be reached: keys the edge does not know are refused (on_redis_error: deny); not ready until it answers",
					"shard", s.o.Store.ShardName(i), "err", err)
			case err == nil && down:
				s.ready.down[i].Store(false)
				s.log.Info("the shard's primary answers again; ready", "shard", s.o.Store.ShardName(i))
			}
		}
	}
}

// warm reaches every shard's primary (loading the scripts) and creates the
// streams, retrying until all is done or the server stops.
func (s *Server) warm() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-s.stop; cancel() }()
	var js jetstream.JetStream
	if s.o.NATS != nil {
		js, _ = jetstream.New(s.o.NATS)
	}
	names := make([]string, s.o.Store.Shards())
	for i := range names {
		names[i] = s.o.Store.ShardName(i)
	}
	r := s.ready
	for delay := 50 * time.Millisecond; ; delay = min(2*delay, time.Second) {
		done := true
		for i := range r.reached {
			if r.reached[i].Load() {
				continue
			}
			c, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := s.o.Store.LoadScripts(c, i)
			cancel()
			if err != nil {
				s.log.Warn("the shard's primary cannot be reached yet; not ready", "shard", names[i], "err", err)
				done = false
				continue
			}
			r.reached[i].Store(true)
		}
		if js != nil && !r.streams.Load() {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := events.EnsureStreams(c, js, s.o.Streams, names)
			cancel()
			if err != nil {
				s.log.Warn("the streams cannot be found or created yet; not ready", "err", err)
				done = false
			} else {
				r.streams.Store(true)
			}
		}
		if done {
			return
		}
		select {
		case <-s.stop:
			return
		case <-time.After(delay):
		}
	}
}
