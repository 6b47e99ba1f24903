// Package edge is the edge-checker: it decides each request from one read
// of the key's window on a Redis replica, answers at once with rate-limit
// headers, and publishes the request's events for the accountant.
//
// Three handlers: the proxy (in front of an upstream API), the decision API
// (POST /v1/check and /v1/finish, for gateways and services that forward
// themselves) and the admin endpoints (/healthz, /readyz, /metrics).
//
// # One read decides
//
// A check reads the replica. When it finds no live window, the edge opens
// the window on the primary (limiter.Store.Open) and decides from that
// answer instead, so the first responses of a window already carry its
// final reset time on every edge. The response's headers come from the same
// read that decided, allowed or denied.
//
// # When a dependency is down
//
//   - Redis: a check that fails is answered by the on_redis_error rule:
//     allow (default; no rate-limit headers, the request is still published
//     and charged) or deny (503 with Retry-After). A down replica is handled
//     by the store's read policy first.
//   - NATS: publishing never blocks a request. Events wait in a bounded
//     buffer and are retried; when the buffer is full they are dropped and
//     counted (tally_edge_events_dropped_total).
package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// Store is what the edge needs of limiter.Store.
type Store interface {
	Check(ctx context.Context, k limiter.Key) (limiter.Window, error)
	Open(ctx context.Context, k limiter.Key, window time.Duration) (limiter.Window, bool, error)
	ShardOf(k limiter.Key) int
	ShardName(i int) string
	Ping(ctx context.Context) error
}

// Publisher is what the edge needs of events.Publisher.
type Publisher interface {
	Publish(m *nats.Msg) bool
	Stats() events.PublisherStats
}

var (
	_ Store     = (*limiter.Store)(nil)
	_ Publisher = (*events.Publisher)(nil)
)

// Route maps a path prefix to a policy, with an optional cost override.
type Route struct {
	Path   string
	Policy string
	Cost   int64
}

// route is a Route with its subtree prefix ("/search" → "/search/").
type route struct {
	Route
	under string
}

// Options configure a Server. Store, Keys, Publisher and Policies are
// required.
type Options struct {
	Store     Store
	Keys      *limiter.KeySpace
	Publisher Publisher
	// SubjectPrefix of the events (events.StreamConfig.SubjectPrefix).
	SubjectPrefix string
	Policies      map[string]limiter.Policy
	Routes        []Route
	// DefaultPolicy applies to paths no route matches; empty passes them
	// through unlimited.
	DefaultPolicy string
	Identity      Identifier
	// DenyOnRedisError answers 503 when a check fails; otherwise requests
	// are allowed (fail open).
	DenyOnRedisError bool
	// Upstream is the API behind the proxy; nil disables the proxy handler.
	Upstream *url.URL
	// Source is the CloudEvents source of published events.
	Source string
	// TicketSecret signs decision-API request ids (the key secret).
	TicketSecret []byte
	// Ready reports whether NATS is usable, for /readyz.
	Ready func() error
	Clock limiter.Clock
	Log   *slog.Logger
}

// Server holds the edge's handlers.
type Server struct {
	o        Options
	routes   []route // longest path first
	proxy    *httputil.ReverseProxy
	draining atomic.Bool

	allowed, denied, redisErrors, opened, failOpen, badRequests atomic.Uint64
}

// New validates o and returns a server.
func New(o Options) (*Server, error) {
	if o.Store == nil || o.Keys == nil || o.Publisher == nil || len(o.Policies) == 0 {
		return nil, errors.New("edge: Store, Keys, Publisher and Policies are required")
	}
	if o.Clock == nil {
		o.Clock = limiter.SystemClock{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.SubjectPrefix == "" {
		o.SubjectPrefix = events.StreamConfig{}.WithDefaults().SubjectPrefix
	}
	if o.Source == "" {
		o.Source = "edge-checker"
	}
	if o.Ready == nil {
		o.Ready = func() error { return nil }
	}
	for _, p := range o.Policies {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	}
	s := &Server{o: o}
	for _, r := range o.Routes {
		s.routes = append(s.routes, route{Route: r, under: strings.TrimSuffix(r.Path, "/") + "/"})
	}
	sort.SliceStable(s.routes, func(i, j int) bool { return len(s.routes[i].Path) > len(s.routes[j].Path) })
	for _, r := range s.routes {
		if _, ok := o.Policies[r.Policy]; !ok {
			return nil, fmt.Errorf("edge: route %s: unknown policy %q", r.Path, r.Policy)
		}
	}
	if o.DefaultPolicy != "" {
		if _, ok := o.Policies[o.DefaultPolicy]; !ok {
			return nil, fmt.Errorf("edge: unknown default policy %q", o.DefaultPolicy)
		}
	}
	if o.Upstream != nil {
		s.proxy = &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(o.Upstream)
				pr.Out.Host = pr.In.Host
				pr.SetXForwarded()
			},
			ModifyResponse: func(resp *http.Response) error {
				if st, ok := resp.Request.Context().Value(stateKey{}).(*proxyState); ok {
					st.status = resp.StatusCode
					if st.decided {
						st.decision.SetHeaders(resp.Header)
					}
				}
				return nil
			},
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				if st, ok := r.Context().Value(stateKey{}).(*proxyState); ok {
					st.status = http.StatusBadGateway
				}
				o.Log.Warn("upstream failed", "err", err)
				problem(w, http.StatusBadGateway, "upstream-unavailable", "Bad Gateway", "the upstream API did not answer")
			},
		}
	}
	return s, nil
}

// SetDraining makes /readyz fail, first step of a graceful shutdown: load
// balancers stop sending new requests while in-flight ones finish.
func (s *Server) SetDraining() { s.draining.Store(true) }

// policyFor returns the policy and cost for a path, ok=false for paths that
// are not limited.
func (s *Server) policyFor(path string) (limiter.Policy, bool) {
	for _, r := range s.routes {
		if path == r.Path || strings.HasPrefix(path, r.under) {
			p := s.o.Policies[r.Policy]
			if r.Cost > 0 {
				p.Cost = r.Cost
			}
			return p, true
		}
	}
	if s.o.DefaultPolicy != "" {
		return s.o.Policies[s.o.DefaultPolicy], true
	}
	return limiter.Policy{}, false
}

// outcome is one decision and what was learned making it.
type outcome struct {
	decision limiter.Decision
	decided  bool // false: Redis failed and the request is let through
	key      limiter.Key
	shard    string
	policy   limiter.Policy
	now      time.Time
}

// decide reads the window (one read decides) and applies the policy.
func (s *Server) decide(ctx context.Context, p limiter.Policy, identity string) (outcome, error) {
	k := s.o.Keys.Key(p.Name, identity)
	o := outcome{key: k, shard: s.o.Store.ShardName(s.o.Store.ShardOf(k)), policy: p, now: s.o.Clock.Now()}
	w, err := s.o.Store.Check(ctx, k)
	if err != nil {
		s.redisErrors.Add(1)
		return o, err
	}
	if !w.Live {
		// The first request of a window: open it on the primary so that the
		// reset we show is the one every later response will show.
		ow, _, err := s.o.Store.Open(ctx, k, p.Window)
		if err == nil {
			w = ow
			s.opened.Add(1)
		} else {
			s.o.Log.Warn("opening a window failed; deciding from the check", "shard", o.shard, "err", err)
		}
	}
	o.decision, o.decided = limiter.Decide(p, w, o.now), true
	return o, nil
}

// publish sends one event of a request; it never blocks.
func (s *Server) publish(kind events.Kind, reqID string, o outcome, status int, traceparent string) {
	p := o.policy
	data := events.Request{
		RequestID: reqID, Key: o.key.Digest(), Policy: p.Name, Limit: p.Limit,
		WindowSeconds: int64(p.Window / time.Second), Cost: p.CostOrDefault(),
		StartedAt: o.now, Status: status,
	}
	if o.decided {
		data.Used, data.ResetAt = o.decision.Used, o.decision.ResetAt
	}
	m, err := events.Encode(s.o.SubjectPrefix, events.Event{
		ID: events.EventID(reqID, kind), Kind: kind, Source: s.o.Source, Time: s.o.Clock.Now(),
		Shard: o.shard, Data: data, TraceParent: traceparent,
	})
	if err != nil {
		s.o.Log.Error("encoding an event failed", "kind", kind, "err", err)
		return
	}
	s.o.Publisher.Publish(m)
}

func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ProxyHandler decides each request and forwards the allowed ones to the
// upstream. It panics if Options.Upstream was nil.
func (s *Server) ProxyHandler() http.Handler {
	if s.proxy == nil {
		panic("edge: ProxyHandler without an upstream")
	}
	return http.HandlerFunc(s.serveProxy)
}

type stateKey struct{}

type proxyState struct {
	decision limiter.Decision
	decided  bool
	status   int
}

func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request) {
	p, limited := s.policyFor(r.URL.Path)
	if !limited {
		s.proxy.ServeHTTP(w, r)
		return
	}
	identity, err := s.o.Identity.Identity(r)
	if err != nil {
		s.badRequests.Add(1)
		problem(w, http.StatusBadRequest, "bad-identity", "Bad Request", err.Error())
		return
	}
	o, err := s.decide(r.Context(), p, identity)
	if err != nil && s.refuseOnError(w, err) {
		return
	}
	reqID := newRequestID()
	tp := r.Header.Get("Traceparent")
	if o.decided && !o.decision.Allowed {
		s.deny(w, r, o, reqID, tp)
		return
	}
	s.allowed.Add(1)
	s.publish(events.KindStarted, reqID, o, 0, tp)
	st := &proxyState{decision: o.decision, decided: o.decided}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
	status := st.status
	if status == 0 {
		status = http.StatusBadGateway
	}
	s.publish(events.KindFinished, reqID, o, status, tp)
}

// refuseOnError applies the on_redis_error rule; true when it answered.
func (s *Server) refuseOnError(w http.ResponseWriter, err error) bool {
	s.o.Log.Warn("rate-limit check failed", "err", err, "deny", s.o.DenyOnRedisError)
	if s.o.DenyOnRedisError {
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "limiter-unavailable", "Service Unavailable",
			"the rate limiter cannot decide right now; retry shortly")
		return true
	}
	s.failOpen.Add(1)
	return false
}

func (s *Server) deny(w http.ResponseWriter, r *http.Request, o outcome, reqID, tp string) {
	s.denied.Add(1)
	s.publish(events.KindRejected, reqID, o, 0, tp)
	d := o.decision
	d.SetHeaders(w.Header())
	problem(w, http.StatusTooManyRequests, "rate-limited", "Too Many Requests",
		fmt.Sprintf("rate limit %q of %d per %s exceeded; the window resets in %s",
			d.Resource, d.Limit, d.Window, d.RetryAfter()))
}

// problem writes an RFC 9457 problem details response.
func problem(w http.ResponseWriter, status int, kind, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "urn:tally:problem:" + kind, "title": title, "status": status, "detail": detail,
	})
}

// AdminHandler serves /healthz (the process is up), /readyz (Redis
// primaries and NATS reachable, not draining) and /metrics (Prometheus
// text format).
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var errs []error
		if s.draining.Load() {
			errs = append(errs, errors.New("draining"))
		}
		if err := s.o.Store.Ping(ctx); err != nil {
			errs = append(errs, err)
		}
		if err := s.o.Ready(); err != nil {
			errs = append(errs, err)
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		ps := s.o.Publisher.Stats()
		writeMetrics(w, []metric{
			{"tally_edge_decisions_total", "Requests decided.", "counter", `result="allowed"`, float64(s.allowed.Load())},
			{"tally_edge_decisions_total", "", "", `result="denied"`, float64(s.denied.Load())},
			{"tally_edge_redis_errors_total", "Checks that failed in Redis.", "counter", "", float64(s.redisErrors.Load())},
			{"tally_edge_fail_open_total", "Requests allowed because the check failed.", "counter", "", float64(s.failOpen.Load())},
			{"tally_edge_windows_opened_total", "Windows opened by this edge.", "counter", "", float64(s.opened.Load())},
			{"tally_edge_bad_requests_total", "Requests refused as malformed.", "counter", "", float64(s.badRequests.Load())},
			{"tally_edge_events_published_total", "Events acknowledged by JetStream.", "counter", "", float64(ps.Published)},
			{"tally_edge_events_retried_total", "Event publishes retried.", "counter", "", float64(ps.Retried)},
			{"tally_edge_events_dropped_total", "Events dropped: buffer full, attempts exhausted or unsent at shutdown.", "counter", "", float64(ps.Dropped)},
			{"tally_edge_events_queued", "Events waiting to be published.", "gauge", "", float64(ps.Queued)},
		})
	})
	return mux
}

type metric struct {
	name, help, kind, labels string
	value                    float64
}

func writeMetrics(w http.ResponseWriter, ms []metric) {
	var b strings.Builder
	for _, m := range ms {
		if m.help != "" {
			fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", m.name, m.help, m.name, m.kind)
		}
		if m.labels != "" {
			fmt.Fprintf(&b, "%s{%s} %s\n", m.name, m.labels, strconv.FormatFloat(m.value, 'f', -1, 64))
		} else {
			fmt.Fprintf(&b, "%s %s\n", m.name, strconv.FormatFloat(m.value, 'f', -1, 64))
		}
	}
	_, _ = w.Write([]byte(b.String()))
}
