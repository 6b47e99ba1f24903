package serve

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/config"
	"github.com/tallyhq/tally/internal/service"
	"github.com/tallyhq/tally/internal/telemetry"
)

// Options are what the caller knows of the process beside its
// configuration.
type Options struct {
	// Hostname names the embedded server when serve.nats.name does not.
	Hostname string
	// NATSReady bounds the wait for the embedded server to take
	// connections. Default 30s.
	NATSReady time.Duration
}

// Run runs tally serve until ctx ends or a part fails (its error is
// returned), then stops in the order the package documentation gives.
func Run(ctx context.Context, cfg *config.File, log *slog.Logger, o Options) (err error) {
	if o.NATSReady == 0 {
		o.NATSReady = 30 * time.Second
	}
	var edgeHost, accHost service.Host
	var ns *embedded
	if cfg.EmbeddedNATS() {
		if ns, err = startNATS(cfg, o.Hostname, log, o.NATSReady); err != nil {
			return err
		}
		defer func() {
			ns.shutdown()
			log.Info("embedded NATS stopped")
		}()
		edgeHost.NATS, accHost.NATS = ns.options("edge"), ns.options("accountant")
	} else {
		// With the passwords of the shipped roles, each part connects as
		// its role (deploy/nats/tally.conf); otherwise both as the file's
		// user, who then needs both roles' permissions.
		pw := cfg.Serve.NATS.Passwords
		roles := pw["edge"] != "" && pw["accountant"] != ""
		if roles {
			edgeHost.NATS = append(cfg.NATSOptions(), nats.UserInfo("edge", pw["edge"]), nats.CustomInboxPrefix(deploy.InboxPrefix("edge")))
			accHost.NATS = append(cfg.NATSOptions(), nats.UserInfo("accountant", pw["accountant"]),
				nats.CustomInboxPrefix(deploy.InboxPrefix("accountant")))
		}
		log.Info("using an external NATS", "url", cfg.NATS.URL, "as_roles", roles)
	}
	metrics, err := telemetry.Setup(ctx, "tally-serve")
	if err != nil {
		return err
	}
	tracing, err := telemetry.SetupTracing(ctx, "tally-serve")
	if err != nil {
		return err
	}
	defer func() {
		flush, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if ferr := errors.Join(metrics.Shutdown(flush), tracing.Shutdown(flush)); ferr != nil {
			log.Warn("telemetry not flushed", "err", ferr)
		}
	}()
	edgeHost.Metrics, edgeHost.Tracing = metrics, tracing
	accHost.Metrics, accHost.Tracing = metrics, tracing

	edgeCtx, stopEdge := context.WithCancel(ctx)
	defer stopEdge()
	accCtx, stopAcc := context.WithCancel(context.Background())
	defer stopAcc()
	edgeDone, accDone := make(chan error, 1), make(chan error, 1)
	go func() { accDone <- service.RunAccountantIn(accCtx, cfg, log.With("part", "accountant"), &accHost) }()
	go func() { edgeDone <- service.RunEdgeIn(edgeCtx, cfg, log.With("part", "edge"), &edgeHost) }()

	var edgeErr, accErr error
	select {
	case edgeErr = <-edgeDone: // ctx ended, or the edge failed
		stopAcc()
		accErr = <-accDone
	case accErr = <-accDone: // the accountant failed: the edge stops first all the same
		stopEdge()
		edgeErr = <-edgeDone
	}
	log.Info("edge and accountant stopped")
	return errors.Join(edgeErr, accErr)
}
