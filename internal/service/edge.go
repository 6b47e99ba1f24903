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
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
)

// RunEdge runs an edge-checker until ctx ends or a listener fails (its
// error is returned), then shuts it down in this order: /readyz fails, the
// listeners stop accepting and in-flight requests finish, unused
// reservations are given back, queued accounting events are delivered (to
// JetStream, or the primaries) and decisions published, the NATS
// connections drain, Redis connections close.
func RunEdge(ctx context.Context, cfg *config.File, log *slog.Logger) error {
	p, err := open(ctx, cfg, "tally-edge-checker", log)
	if err != nil {
		return err
	}
	defer p.close(5*time.Second, log)
	store := p.store
	probeCtx, stopProbes := context.WithCancel(context.Background())
	defer stopProbes()
	go store.RunProbes(probeCtx, time.Second)

	nc, err := ConnectNATS(cfg, "tally-edge-checker", "accounting events are applied on the primaries until it is back", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	// Decisions (bulk telemetry) travel on a connection of their own, so that
	// accounting events never queue behind them.
	dnc, err := ConnectNATS(cfg, "tally-edge-checker-decisions", "decision records are dropped until it is back", log)
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
	if cfg.Edge.RLS.Listen != "" {
		if rls, err = serveRLS(cfg.Edge.RLS.Listen, cfg.Edge.RLS.TLS, srv, cfg.APIToken, l.failed, log); err != nil {
			return err
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
	return edge.Options{
		Store: store, Keys: keys, NATS: nc, DecisionsNATS: dnc, Streams: cfg.NATS.Streams,
		Outbox: cfg.Edge.Outbox, Decisions: cfg.Edge.Decisions, Credit: cfg.Edge.Credit,
		Limits:           cfg.Limits(),
		Identity:         edge.Identifier{Header: id.Header, Trusted: id.Trusted(), IPv4Prefix: id.IPv4Prefix, IPv6Prefix: id.IPv6Prefix},
		DenyOnRedisError: cfg.Edge.OnRedisError == "deny",
		Upstream:         upstream, Source: source, Pprof: cfg.Edge.Pprof, Log: log,
		Gateways: cfg.Gateways(), Descriptors: cfg.Descriptors(), RLS: edge.RLSConfig{Mode: cfg.Edge.RLS.Mode, ResponseHeaders: cfg.Edge.RLS.ResponseHeaders,
			ChargeAtEnd: chargeAtEnd},
	}
}
