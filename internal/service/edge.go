package service

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/tallyhq/tally/internal/redisstore"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/servertls"
	"github.com/tallyhq/tally/internal/xds"
)

// RunEdge runs an edge-checker until ctx ends or a listener fails (its
// error is returned), then shuts it down in this order: /readyz fails, the
// listeners stop accepting and in-flight requests finish, unused
// reservations are given back, queued accounting events are delivered (to
// JetStream, or the primaries) and decisions published, the NATS
// connections drain, Redis connections close.
func RunEdge(ctx context.Context, cfg *config.File, log *slog.Logger) error {
	return RunEdgeIn(ctx, cfg, log, nil)
}

// RunEdgeIn is RunEdge as a part of the process h describes (nil: a
// process of its own).
func RunEdgeIn(ctx context.Context, cfg *config.File, log *slog.Logger, h *Host) error {
	p, err := open(ctx, cfg, "tally-edge-checker", log, h)
	if err != nil {
		return err
	}
	defer p.close(5*time.Second, log)
	store := p.store
	probeCtx, stopProbes := context.WithCancel(context.Background())
	defer stopProbes()
	go store.RunProbes(probeCtx, time.Second)

	nc, err := connectNATS(cfg, h, "tally-edge-checker", "accounting events are applied on the primaries until it is back", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// Decisions (bulk telemetry) travel on a connection of their own, so that
	// accounting events never queue behind them.
	dnc, err := connectNATS(cfg, h, "tally-edge-checker-decisions", "decision records are dropped until it is back", log)
	if err != nil {
		return err
	}
	defer dnc.Close()

	opts := edgeOptions(cfg, store, p.keys, log, nc, dnc)
	opts.Metrics, opts.Tracer = p.metrics, p.tracing.Tracer("tally/edge")
	srv, err := edge.New(opts)
	if err != nil {
		return err
	}
	log.Info("edge-checker starting", "producer", srv.Producer(), "shards", store.Shards())

	l := newListeners(log)
	e := &cfg.Edge
	lim := Limits{MaxHeaderBytes: e.MaxHeaderBytes, ReadHeaderTimeout: e.ReadHeaderTimeout, ReadTimeout: e.ReadTimeout,
		WriteTimeout: e.WriteTimeout, IdleTimeout: e.IdleTimeout}
	var serving []*http.Server
	if cfg.Edge.Listen != "" {
		hs, err := l.serve(cfg.Edge.Listen, cfg.Edge.TLS, srv.ProxyHandler(), lim)
		if err != nil {
			return err
		}
		serving = append(serving, hs)
	}
	if cfg.Edge.APIListen != "" {
		hs, err := l.serve(cfg.Edge.APIListen, cfg.Edge.APITLS, RequireToken(cfg.APIToken, srv.APIHandler()), lim)
		if err != nil {
			return err
		}
		serving = append(serving, hs)
	}
	var rls *rlsServer
	if d := cfg.Descriptors(); d != nil {
		for _, w := range d.Warnings {
			log.Warn("rate-limit rules", "warning", w)
		}
	}
	if r := cfg.Edge.RLS; r.Listen != "" {
		if rls, err = serveRLS(r.Listen, r.TLS, srv, cfg.APIToken, l.failed, log); err != nil {
			return err
		}
		if r.HTTPListen != "" {
			hs, err := l.serve(r.HTTPListen, servertls.Config{}, rlsHTTPHandler(srv, cfg.APIToken, r.HealthNeedsRules), lim)
			if err != nil {
				return err
			}
			serving = append(serving, hs)
		}
		if r.XDS.On() {
			stopXDS, err := subscribe(ctx, cfg, srv, log.With("component", "xds"))
			if err != nil {
				return err
			}
			defer stopXDS()
		}
		if r.Unauthenticated && cfg.APIToken == "" {
			log.Warn("the rate-limit service takes calls from anyone who reaches it (edge.rls.unauthenticated), as envoyproxy/ratelimit does: "+
				"let only the gateways reach it (a NetworkPolicy), or set TALLY_API_TOKEN or a client CA", "listen", r.Listen, "http_listen", r.HTTPListen)
		}
	}
	if fa := cfg.Edge.ForwardAuth; fa.Listen != "" {
		hs, err := l.serve(fa.Listen, fa.TLS, srv.ForwardAuthHandler(), lim)
		if err != nil {
			return err
		}
		serving = append(serving, hs)
		if fa.LogListen != "" {
			pc, err := net.ListenPacket("udp", fa.LogListen)
			if err != nil {
				return err
			}
			log.Info("listening", "addr", pc.LocalAddr().String(), "serves", "gateways' access logs (UDP)")
			logCtx, stopLogs := context.WithCancel(ctx)
			defer stopLogs()
			go func() {
				if err := srv.ServeAccessLog(logCtx, pc); err != nil {
					l.failed <- err
				}
			}()
		}
	}
	reloadCtx, stopReload := context.WithCancel(ctx)
	defer stopReload()
	go reload(reloadCtx, cfg, srv, reloadInterval, log)
	admin, err := l.serve(cfg.Edge.AdminListen, cfg.Edge.AdminTLS, GuardAdmin(cfg.AdminToken, srv.AdminHandler()), lim)
	if err != nil {
		return err
	}
	if m := cfg.Edge.Metrics; m.Listen != "" {
		mux := http.NewServeMux()
		mux.Handle(m.Path, RequireToken(cfg.AdminToken, p.metrics.Handler()))
		hs, err := l.serve(m.Listen, servertls.Config{}, mux, adminLimits)
		if err != nil {
			return err
		}
		defer func() { _ = hs.Close() }()
	}
	failed := l.wait(ctx)

	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), cfg.Edge.ShutdownTimeout)
	defer cancel()
	srv.SetDraining()
	for _, hs := range serving {
		_ = hs.Shutdown(shutdown)
	}
	if rls != nil {
		rls.stop(shutdown)
	}
	if err := srv.Close(shutdown); err != nil {
		log.Warn("not everything was delivered", "err", err)
	}
	_ = nc.Drain()
	_ = dnc.Drain()
	_ = admin.Shutdown(shutdown)
	log.Info("stopped")
	return failed
}

// reloadInterval is how often the edge looks for a changed configuration.
const reloadInterval = 2 * time.Second

func edgeOptions(cfg *config.File, store *redisstore.Store, keys *limiter.KeySpace, log *slog.Logger, nc, dnc *nats.Conn) edge.Options {
	var upstream *url.URL
	if cfg.Edge.Listen != "" {
		upstream, _ = url.Parse(cfg.Edge.Upstream) // validated by config
	}
	source := cfg.Edge.Source
	if source == "" {
		host, _ := os.Hostname()
		source = "edge-checker/" + host
	}
	id := cfg.Edge.Identity
	chargeAtEnd := map[string]bool{}
	for _, d := range cfg.Edge.RLS.ChargeAtEnd {
		chargeAtEnd[d] = true
	}
	clock := map[string]bool{}
	for _, d := range cfg.Edge.RLS.ClockWindows {
		clock[d] = true
	}
	return edge.Options{
		Store: store, Keys: keys, NATS: nc, DecisionsNATS: dnc, Streams: cfg.NATS.Streams,
		Outbox: cfg.Edge.Outbox, Decisions: cfg.Edge.Decisions, Credit: cfg.Edge.Credit,
		Limits:           cfg.Limits(),
		Identity:         edge.Identifier{Header: id.Header, Trusted: id.Trusted(), IPv4Prefix: id.IPv4Prefix, IPv6Prefix: id.IPv6Prefix},
		DenyOnRedisError: cfg.Edge.OnRedisError == "deny",
		Upstream:         upstream, Source: source, Pprof: cfg.Edge.Pprof, Log: log,
		Gateways: cfg.Gateways(), Descriptors: cfg.Descriptors(), DescriptorsLater: cfg.Edge.RLS.XDS.On(), RLS: edge.RLSConfig{Mode: cfg.Edge.RLS.Mode, ResponseHeaders: cfg.Edge.RLS.ResponseHeaders,
			ChargeAtEnd: chargeAtEnd, ClockWindows: clock},
	}
}

// subscribe takes the rate-limit rules from the xDS management server of
// edge.rls.xds until ctx ends or stop is called (which waits for the
// subscription to end). Each update is read as the rules' files are and
// put in effect at once; one that cannot be is refused, the rules in
// effect kept.
func subscribe(ctx context.Context, cfg *config.File, srv *edge.Server, log *slog.Logger) (stop func(), err error) {
	x, r := cfg.Edge.RLS.XDS, cfg.Edge.RLS
	c, err := xds.New(xds.Config{Server: x.Server, TLS: cfg.XDSTLS(), NodeID: x.NodeID, NodeMetadata: x.NodeMetadata,
		Headers: x.Headers, BackoffInitial: x.BackoffInitial, BackoffMax: x.BackoffMax, MaxMessageBytes: x.MaxMessageBytes, Log: log,
		Apply: func(files []descriptors.File) error {
			rules, err := descriptors.Load(files, r.RuleOptions())
			if err != nil {
				return err
			}
			for _, w := range rules.Warnings {
				log.Warn("rate-limit rules", "warning", w)
			}
			return srv.SetDescriptors(rules)
		}})
	if err != nil {
		return nil, err
	}
	xctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(xctx)
	}()
	return func() { cancel(); <-done }, nil
}
