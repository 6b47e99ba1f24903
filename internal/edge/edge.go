package edge

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/backoff"
	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/outbox"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/setting"
	"github.com/tallyhq/tally/internal/telemetry"
)

// Store is what the edge needs of redisstore.Store: what its decision
// core reserves with, what its outbox applies with, and loading the
// scripts before it is ready.
type Store interface {
	credit.Reserver
	outbox.Applier
	LoadScripts(ctx context.Context, shard int) error
	// SetReseeder names what re-seeding a shard whose primary changed
	// re-asserts: the core's claims; then the outbox delivers again what
	// it applied there itself.
	SetReseeder(h redisstore.Reseeder)
}

// reseeder is what this edge holds in the shards' windows, for re-seeding.
type reseeder struct {
	core   *credit.Core
	outbox *outbox.Outbox
}

func (h reseeder) Claims(shard int, now time.Time) []limiter.Claim { return h.core.Claims(shard, now) }
func (h reseeder) Reseeded(shard int)                              { h.outbox.Redeliver(shard) }

var _ Store = (*redisstore.Store)(nil)

// DecisionsConfig says which decisions go to the decisions stream.
type DecisionsConfig struct {
	events.BatcherConfig `yaml:",inline"`
	// SampleAllowed is the share of allowed decisions published, 0 to 1;
	// denials and fail-open admissions are always published. Default 1;
	// negative publishes none.
	SampleAllowed float64 `yaml:"sample_allowed"`
	// LogSample is the share of decisions also logged (one "decision"
	// line each: digest, policy, result, path, counts, request and trace
	// ids; never the identity), 0 (default: none) to 1, at LogLevel
	// (debug, info, warn or error; default debug).
	LogSample float64 `yaml:"log_sample"`
	LogLevel  string  `yaml:"log_level"`
}

// ErrInvalidConfig is wrapped by the edge's configuration errors.
var ErrInvalidConfig = errors.New("edge: invalid config")

// WithDefaults is c with its zero values replaced by the defaults.
func (c DecisionsConfig) WithDefaults() DecisionsConfig {
	c.BatcherConfig = c.BatcherConfig.WithDefaults()
	if c.LogLevel == "" {
		c.LogLevel = "debug"
	}
	return c
}

// Validate refuses shares outside their range and unknown log levels, as a
// *setting.Error naming the field.
func (c DecisionsConfig) Validate() error {
	if err := c.BatcherConfig.Validate(); err != nil {
		return err
	}
	var level slog.Level
	switch {
	case c.SampleAllowed > 1:
		return setting.Errorf(ErrInvalidConfig, "sample_allowed", "%v: want 0 to 1 (negative: none)", c.SampleAllowed)
	case c.LogSample < 0 || c.LogSample > 1:
		return setting.Errorf(ErrInvalidConfig, "log_sample", "%v: want 0 (none) to 1 (every decision)", c.LogSample)
	case c.LogLevel != "" && level.UnmarshalText([]byte(c.LogLevel)) != nil:
		return setting.Errorf(ErrInvalidConfig, "log_level", "%q: want debug, info, warn or error", c.LogLevel)
	}
	return nil
}

// Options configure a Server. Store, Keys and Policies are required.
type Options struct {
	Store Store
	// Keys builds window keys; request ids and notices are signed with keys
	// derived from its secret.
	Keys *limiter.KeySpace
	// NATS carries accounting events and notices. Without it the edge
	// applies its accounting events on the primaries itself and publishes
	// no decisions.
	NATS *nats.Conn
	// DecisionsNATS carries decision records; default NATS. A connection of
	// their own keeps accounting events from queueing behind large batches
	// of telemetry (one connection's messages are handled in order).
	DecisionsNATS *nats.Conn
	Streams       events.Streams
	Outbox        outbox.Config
	Decisions     DecisionsConfig
	Credit        credit.Config
	// Limits are the terms the edge starts with (SetLimits changes them).
	Limits
	Identity Identifier
	// DenyOnRedisError answers 503 when Redis cannot be reached in time and
	// the edge knows nothing of the window; otherwise such requests are
	// allowed (fail open) and charged once Redis is back.
	DenyOnRedisError bool
	// Upstream is the API behind the proxy; nil disables the proxy handler.
	Upstream *url.URL
	// Source is the CloudEvents source of what the edge publishes.
	Source string
	// Producer names this edge process in accounting events; default
	// "edge." and a random id, new at every start (the NATS permissions in
	// deploy/nats let edges publish as edge.*).
	Producer string
	// Pprof serves net/http/pprof's profiles under /debug/pprof/ on the
	// admin handler.
	Pprof bool
	Clock limiter.Clock
	Log   *slog.Logger
	// Metrics is where the edge's instruments are registered and /metrics
	// is served from; default a registry of its own.
	Metrics *telemetry.Metrics
	// Tracer, when set, makes spans: one per proxied request (server), one
	// per batch of accounting events published (producer, linked to the
	// requests). Without it the edge forwards the traceparent it received.
	Tracer trace.Tracer
	// Gateways are the addresses of the gateways whose forward-auth
	// requests (ForwardAuthHandler) and access logs (ServeAccessLog) are
	// believed; nobody else's are.
	Gateways []netip.Prefix
	// Descriptors are the rules of Envoy's rate-limit service
	// (RateLimitService), in envoyproxy/ratelimit's format; SetDescriptors
	// replaces them. RLS says how the service decides.
	Descriptors *descriptors.Config
	// DescriptorsLater says that the rate-limit service's rules come
	// after the start (SetDescriptors, from xDS): until then its calls are
	// refused, as envoyproxy/ratelimit's are before its first
	// configuration.
	DescriptorsLater bool
	RLS              RLSConfig
}

// Server holds the edge's handlers and its background work: the table of
// windows, the outbox of accounting events, notices and decisions.
type Server struct {
	o      Options
	limits atomic.Pointer[routing] // the terms in effect (SetLimits)
	// gatewayIdentity is o.Identity with the gateways trusted as proxies.
	gatewayIdentity Identifier
	proxy           *httputil.ReverseProxy
	core            *credit.Core
	outbox          *outbox.Outbox
	batcher         *events.Batcher
	notices         *events.Notices
	ticketKey       []byte
	ready           *readiness
	sub             *nats.Subscription
	log             *telemetry.RateLog
	draining        atomic.Bool
	reqs            atomic.Uint64 // request ids
	macs            sync.Pool     // of *macState: HMAC-SHA256 keyed for tickets
	dseq            atomic.Uint64 // decision record ids
	stop            chan struct{}
	done            sync.WaitGroup
	closed          atomic.Bool
	telemetry       *telemetry.Metrics
	rls             atomic.Pointer[rlsRules] // the rate-limit service's rules
	// decisionTime records decision latency, per path.
	decisionTime [credit.PathFailOpen + 1]decisionTimer
	// decisionLevel is the level of per-decision log lines.
	decisionLevel slog.Level

	badRequests, finished atomic.Uint64
	// logEntries counts gateways' access-log entries by what was done with
	// them (logNames).
	logEntries [logKinds]atomic.Uint64
	// finishes counts /v1/finish answers by kind (finishNames).
	finishes [finishKinds]atomic.Uint64

	// Temporary limits (heal.go): those known, how many, their reader, and
	// entries refused; the clients progressive backoff remembers; denials
	// by a block [0] and by backoff [1].
	temporary   temporary
	tempLimits  atomic.Int64
	limitReader *events.Limits
	badLimits   atomic.Uint64
	backoff     *backoff.Table
	// denied counts the most denied clients (denials.go).
	denied *topDenied
	// strangers limits the log lines about callers that are not gateways.
	strangers strangers
}

// New validates o and starts the server's background work. Call Close to
// stop it.
func New(o Options) (*Server, error) {
	if o.Store == nil || o.Keys == nil || (len(o.Policies) == 0 && o.Descriptors == nil && !o.DescriptorsLater) {
		return nil, errors.New("edge: Store, Keys, and Policies or Descriptors are required")
	}
	if o.Clock == nil {
		o.Clock = limiter.SystemClock{}
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	o.Streams, o.Decisions = o.Streams.WithDefaults(), o.Decisions.WithDefaults()
	if err := errors.Join(setting.In("streams", o.Streams.Validate()), setting.In("decisions", o.Decisions.Validate())); err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	if o.Source == "" {
		o.Source = "edge-checker"
	}
	if o.Producer == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Producer = "edge." + hex.EncodeToString(b[:])
	}
	if !limiter.ValidProducer(o.Producer) {
		return nil, fmt.Errorf("edge: producer %q: want 1 to %d of [A-Za-z0-9_.-]", o.Producer, limiter.MaxProducerLen)
	}
	for _, p := range o.Policies {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	}
	s := &Server{o: o, log: telemetry.NewRateLog(o.Log, 5*time.Second), stop: make(chan struct{}), decisionLevel: slog.LevelDebug,
		notices: events.NewNotices(o.Keys.Derive(events.NoticeKeyLabel)), ticketKey: o.Keys.Derive(ticketKeyLabel),
		ready: newReadiness(o.Store.Shards()), limitReader: events.NewLimits(o.Keys.Derive(events.LimitKeyLabel)),
		backoff: backoff.NewTable(backoffCapacity), denied: newTopDenied()}
	_ = s.decisionLevel.UnmarshalText([]byte(o.Decisions.LogLevel)) // validated above
	s.gatewayIdentity = gatewayIdentifier(o)
	if err := s.SetLimits(o.Limits); err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	if o.Descriptors != nil {
		if err := s.SetDescriptors(o.Descriptors); err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	}
	s.telemetry = o.Metrics
	if s.telemetry == nil {
		var err error
		if s.telemetry, err = telemetry.NewMetrics(); err != nil {
			return nil, fmt.Errorf("edge: metrics: %w", err)
		}
	}
	meter := s.telemetry.Meter("tally/edge")
	lag, err := meter.Float64Histogram("tally_edge_accounting_lag", metric.WithUnit("s"),
		metric.WithDescription("Time from an accounting event's creation to its effect in Redis, for the events the edge applied itself."),
		metric.WithExplicitBucketBoundaries(telemetry.LatencyBounds...))
	if err != nil {
		return nil, fmt.Errorf("edge: metrics: %w", err)
	}
	sizes, err := meter.Int64Histogram("tally_edge_accounting_message_events",
		metric.WithDescription("Accounting events per message published."),
		metric.WithExplicitBucketBoundaries(telemetry.BatchBounds...))
	if err != nil {
		return nil, fmt.Errorf("edge: metrics: %w", err)
	}
	s.outbox, err = outbox.New(outbox.Options{Config: o.Outbox, Applier: o.Store, NATS: o.NATS, Producer: o.Producer,
		Source: o.Source, KeyID: o.Keys.KeyID(), Prefix: o.Streams.Accounting.SubjectPrefix, Log: s.log, Lag: lag,
		Sizes: sizes, Tracer: o.Tracer,
		Learn: func(shard int, dg limiter.Digest, reset time.Time, used int64) { s.core.Learn(shard, dg, reset, used) }})
	if err != nil {
		return nil, fmt.Errorf("edge: %w", err)
	}
	decisionTime, err := meter.Float64Histogram("tally_edge_decision_duration", metric.WithUnit("s"),
		metric.WithDescription("Time to decide a request against one policy, by how it was decided (path)."),
		metric.WithExplicitBucketBoundaries(telemetry.DecisionBounds...))
	if err != nil {
		return nil, fmt.Errorf("edge: metrics: %w", err)
	}
	for p := credit.PathCredit; p <= credit.PathFailOpen; p++ {
		s.decisionTime[p] = decisionTimer{decisionTime, []metric.RecordOption{
			metric.WithAttributeSet(attribute.NewSet(attribute.String("path", p.String())))}}
	}
	deps := credit.Deps{Reserver: o.Store, Ledger: s.outbox, Keys: o.Keys, Clock: o.Clock, Log: s.log, Producer: o.Producer,
		FailOpen: !o.DenyOnRedisError, Policies: o.Policies, Permanent: redisstore.Permanent, Healer: healer{s},
		Timed: func(ctx context.Context, p credit.Path, d time.Duration) {
			t := s.decisionTime[p]
			t.h.Record(ctx, d.Seconds(), t.opts...)
		}}
	if o.NATS != nil {
		deps.Notifier = notifier{s}
	}
	if s.core, err = credit.New(o.Credit, deps); err != nil {
		_ = s.outbox.Close(context.Background())
		return nil, fmt.Errorf("edge: %w", err)
	}
	o.Store.SetReseeder(reseeder{core: s.core, outbox: s.outbox})
	if o.NATS != nil {
		dnc := o.DecisionsNATS
		if dnc == nil {
			dnc = o.NATS
		}
		if s.batcher, err = events.NewBatcher(dnc, o.Streams.DecisionsSubject(), o.Decisions.BatcherConfig); err != nil {
			return nil, err
		}
		s.sub, err = o.NATS.Subscribe(o.Streams.NoticePrefix+".>", func(m *nats.Msg) {
			ns, err := s.notices.Decode(m.Data, s.o.Clock.Now())
			if err != nil {
				s.core.Refused()
				s.log.Warn("a notice was refused", "subject", m.Subject, "err", err)
			}
			for _, n := range ns {
				if dg, err := limiter.ParseDigest(n.Key); err == nil {
					s.core.Heard(credit.Notice{Full: n.Full, Key: dg, ResetAt: n.ResetAt, Used: n.Used})
				}
			}
		})
		if err != nil {
			return nil, fmt.Errorf("edge: notices: %w", err)
		}
		if js, err := jetstream.New(o.NATS); err == nil {
			s.done.Go(func() {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				go func() { <-s.stop; cancel() }()
				s.followLimits(ctx, js)
			})
		} else {
			return nil, fmt.Errorf("edge: limits: %w", err)
		}
	} else {
		s.ready.limits.Store(true) // no stream to read them from
	}
	if o.Upstream != nil {
		s.proxy = s.newProxy(o.Upstream)
	}
	if err := s.registerMetrics(meter); err != nil {
		return nil, fmt.Errorf("edge: metrics: %w", err)
	}
	s.done.Go(s.sweep)
	s.done.Go(s.warm)
	if o.DenyOnRedisError {
		s.done.Go(s.watchPrimaries)
	}
	return s, nil
}

func (s *Server) sweep() {
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-s.stop; cancel() }()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.core.Sweep(ctx, s.o.Clock.Now())
		}
	}
}

// notifier tells the other edges what the core asks them to be told: a
// signed, dated notice on core NATS (no acknowledgement, no wait).
type notifier struct{ s *Server }

func (n notifier) Notify(shard int, c credit.Notice) {
	s := n.s
	subject := events.NoticeSubject(s.o.Streams.NoticePrefix, s.o.Store.ShardName(shard))
	msg := events.Notice{Full: c.Full, Key: c.Key.String(), ResetAt: c.ResetAt, Used: c.Used}
	_ = s.o.NATS.Publish(subject, s.notices.Append(nil, msg, s.o.Clock.Now()))
}

// Producer is the id of this edge in accounting events.
func (s *Server) Producer() string { return s.o.Producer }

// SetDraining makes /readyz fail, first step of a graceful shutdown: load
// balancers stop sending new requests while in-flight ones finish.
func (s *Server) SetDraining() { s.draining.Store(true) }

// Close stops the background work, in order: the sweeper stops; every
// unused reservation is given back; queued accounting events are delivered
// (to JetStream or the primaries) and decisions published, until ctx ends.
// Call it after the listeners have stopped and in-flight requests finished.
func (s *Server) Close(ctx context.Context) error {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	close(s.stop)
	s.done.Wait()
	s.core.Wait()
	s.core.ReleaseAll(ctx, s.o.Clock.Now())
	var errs []error
	if s.sub != nil {
		_ = s.sub.Unsubscribe()
	}
	errs = append(errs, s.outbox.Close(ctx))
	if s.batcher != nil {
		errs = append(errs, s.batcher.Close(ctx))
	}
	return errors.Join(errs...)
}

// cleanPath is path.Clean of a request path, rooted.
func cleanPath(p string) string {
	if p == "/" {
		return p
	}
	if !strings.HasPrefix(p, "/") {
		p = "/" + p
	}
	return path.Clean(p)
}

// decisionTimer is the decision latency histogram with a path's
// attributes, made once.
type decisionTimer struct {
	h    metric.Float64Histogram
	opts []metric.RecordOption
}

// record publishes a decision to the decisions stream (allowed ones
// sampled).
func (s *Server) record(v credit.Verdict, traceparent string) { s.recordRule(v, traceparent, "", "") }

// recordRule is record for a decision of Envoy's rate-limit service, which
// names the request's domain and the descriptor rule that limited it.
func (s *Server) recordRule(v credit.Verdict, traceparent, domain, rule string) {
	allowed := !v.Decided || v.Decision.Allowed
	if !allowed && !v.Policy.Shadow {
		s.denied.add(v.Policy.Name, v.Key.Digest(), v.Now)
	}
	if rate := s.o.Decisions.LogSample; rate > 0 && (rate >= 1 || mrand.Float64() < rate) {
		s.logDecision(v, allowed, traceparent)
	}
	if s.batcher == nil {
		return
	}
	if allowed && v.Path != credit.PathFailOpen && !events.Sampled(s.o.Decisions.SampleAllowed) {
		return
	}
	d := s.decision(v, traceparent)
	d.Allowed, d.Path, d.Domain, d.Rule = allowed, v.Path.String(), domain, rule
	s.batcher.Add(d)
}

// recordRefund publishes that an allowed request's charge went back into
// this edge's credit (no accounting event, so no accountant's record),
// sampled as allowed decisions are.
func (s *Server) recordRefund(v credit.Verdict) {
	if s.batcher == nil || !events.Sampled(s.o.Decisions.SampleAllowed) {
		return
	}
	d := s.decision(v, v.TraceParent)
	d.Time, d.Allowed, d.Path, d.Outcome = s.o.Clock.Now(), true, credit.PathCredit.String(), "refunded"
	d.Used = max(0, d.Used-v.Cost)
	s.batcher.Add(d)
}

// recordFinish publishes what a decision-API finish of a 304 did on the
// primary (no accounting event, so no accountant's record): outcome
// "refunded" with the units given back, or "pending" when the request's
// charge event had not been applied yet (the accountant records it
// "netted" when it is). The request id is that of the edge that decided
// the request, so the record joins its decision.
func (s *Server) recordFinish(v credit.Verdict, res limiter.FinishResult, now time.Time) {
	if s.batcher == nil || !events.Sampled(s.o.Decisions.SampleAllowed) {
		return
	}
	d := s.decision(v, "")
	d.Time, d.Allowed, d.Path, d.Edge, d.RequestID = now, true, credit.PathFinish.String(), s.o.Producer, v.RequestID()
	if res.Outcome == limiter.FinishPending {
		d.Outcome, d.Used = "pending", 0
		d.ResetAt = time.Time{}
	} else {
		d.Outcome, d.Cost, d.Used, d.ResetAt = "refunded", res.Amount, res.Used, res.ResetAt
		if res.Amount == 0 {
			return // nothing given back: the producer held nothing more in the window
		}
	}
	s.batcher.Add(d)
}

// decision is v's decision record, but for Allowed, Path and Outcome.
func (s *Server) decision(v credit.Verdict, traceparent string) events.Decision {
	d := events.Decision{Time: v.Now, Source: s.o.Source, Edge: s.o.Producer, Seq: s.dseq.Add(1),
		Shard: s.o.Store.ShardName(v.Shard), RequestNum: v.ReqNum, TraceParent: traceparent, Key: v.Key.Digest(),
		Policy: v.Policy.Name, Limit: v.Policy.Limit, WindowSeconds: int64(v.Policy.LengthAt(v.Now) / time.Second), Cost: v.Cost,
		Shadow: v.Policy.Shadow}
	if v.Decided {
		d.Used, d.ResetAt = v.Decision.Used, v.Decision.ResetAt
		if v.Path == credit.PathBackoff || v.Path == credit.PathBlocked {
			d.Until, d.Strikes = v.Decision.RetryAt, v.Decision.Strikes
		}
	}
	return d
}

// logDecision writes one decision to the log at the configured level.
func (s *Server) logDecision(v credit.Verdict, allowed bool, traceparent string) {
	attrs := []slog.Attr{slog.String("key", v.Key.Digest().String()), slog.String("policy", v.Policy.Name),
		slog.Bool("allowed", allowed), slog.String("path", v.Path.String()), slog.Int64("cost", v.Cost),
		slog.String("request_id", s.o.Producer+"-"+strconv.FormatUint(v.ReqNum, 10))}
	if v.Decided {
		attrs = append(attrs, slog.Int64("used", v.Decision.Used), slog.Int64("limit", v.Policy.Limit),
			slog.Int64("reset", v.Decision.ResetAt.Unix()))
	}
	if traceparent != "" {
		attrs = append(attrs, slog.String("trace_id", traceparent[3:35]))
	}
	s.o.Log.LogAttrs(context.Background(), s.decisionLevel, "decision", attrs...)
}

// finish handles a request's end: a 304 gives its charges back, and a
// concurrency limit's units are given back whatever the status.
func (s *Server) finish(vs []credit.Verdict, status int) {
	s.finished.Add(1)
	for _, v := range vs {
		if v.Allowed() && v.Policy.Algorithm.GivesBack(status, v.Cost) > 0 && s.core.Refund(v) {
			s.recordRefund(v) // an event's refund is recorded by the accountant
		}
	}
}
