package accountant

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tallyhq/tally/internal/telemetry"
)

// AdminHandler serves /healthz, /readyz and /metrics (Prometheus text).
// Ready means what Ready says.
func (a *Accountant) AdminHandler(ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := a.Ready(ctx, ready); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	if a.cfg.Metrics != nil {
		mux.Handle("GET /metrics", a.cfg.Metrics.Handler())
	}
	return mux
}

// Ready reports whether the accountant does its work: ready(ctx) (NATS)
// returns nil, its streams exist, every shard's lease has been asked for
// (held here or by another accountant: its primary answered), and no
// shard has been failing for longer than twice the lease lifetime.
func (a *Accountant) Ready(ctx context.Context, ready func(context.Context) error) error {
	if ready != nil {
		if err := ready(ctx); err != nil {
			return err
		}
	}
	if !a.streamsReady.Load() {
		return errors.New("the streams are not created yet")
	}
	var waiting []string
	for _, st := range a.Shards() {
		if !st.Leasing {
			waiting = append(waiting, st.Name)
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("no lease asked for yet on shard(s) %s", strings.Join(waiting, ", "))
	}
	for _, st := range a.Shards() {
		if st.Err != nil && a.now().Sub(st.Since) > 2*a.cfg.LeaseTTL {
			return fmt.Errorf("shard %s failing for %v: %w", st.Name, a.now().Sub(st.Since).Round(time.Second), st.Err)
		}
	}
	return nil
}

// setupMetrics registers the accountant's instruments on cfg.Metrics (a
// registry of its own when nil): observable ones read the accountant's
// counters when /metrics is scraped.
func (a *Accountant) setupMetrics() error {
	if a.cfg.Metrics == nil {
		m, err := telemetry.NewMetrics()
		if err != nil {
			return err
		}
		a.cfg.Metrics = m
	}
	m := a.cfg.Metrics.Meter("tally/accountant")
	var errs []error
	counter := func(name, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	lag, err := m.Float64Histogram("tally_accountant_lag", metric.WithUnit("s"),
		metric.WithDescription("Time from an event's creation to its effect in Redis."),
		metric.WithExplicitBucketBoundaries(telemetry.LatencyBounds...))
	errs = append(errs, err)
	sizes, err := m.Int64Histogram("tally_accountant_message_events",
		metric.WithDescription("Accounting events per stream message read."),
		metric.WithExplicitBucketBoundaries(telemetry.BatchBounds...))
	errs = append(errs, err)
	evs := counter("tally_accountant_events", "Accounting events, by outcome.")
	msgs := counter("tally_accountant_messages", "Stream messages processed.")
	dead := counter("tally_accountant_dead_letters", "Messages copied to the dead-letter stream.")
	retries := counter("tally_accountant_retries", "Runs tried again after a failure.")
	over := counter("tally_accountant_over_limit_units", "Units charged beyond a window's limit (admitted without a reservation).")
	unconfirmed := counter("tally_accountant_unconfirmed", "Runs no replica confirmed in time.")
	repeated := counter("tally_accountant_repeated_messages", "Messages whose every event had been applied before: redelivered after a hand-over, or published again (applied once: outcome=\"duplicate\").")
	records := counter("tally_accountant_decision_records", "Decision records: published to the decisions stream, dropped.")
	reloads := counter("tally_accountant_script_reloads", "Lua scripts sent again to a Redis node that did not have them (NOSCRIPT).")
	backlog, err := m.Int64ObservableGauge("tally_accountant_pending_messages",
		metric.WithDescription("Messages of the shard's accounting subject not read yet, as of the last one read."))
	errs = append(errs, err)
	active, err := m.Int64ObservableGauge("tally_accountant_shard_active", metric.WithDescription("Whether this process serves the shard."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	a.lagHist, a.msgEvents = lag, sizes
	u := func(v uint64) int64 { return int64(min(v, math.MaxInt64)) }
	outcome := func(name string) metric.ObserveOption {
		return metric.WithAttributes(attribute.String("outcome", name))
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := a.Stats()
		for _, e := range []struct {
			name string
			n    uint64
		}{{"charged", s.Charged}, {"refunded", s.Refunded}, {"released", s.Released}, {"duplicate", s.Duplicates},
			{"late", s.Late}, {"netted", s.Netted}, {"pending", s.Pending}, {"ignored", s.Ignored}, {"not_held", s.NotHeld}} {
			o.ObserveInt64(evs, u(e.n), outcome(e.name))
		}
		o.ObserveInt64(msgs, u(s.Messages))
		o.ObserveInt64(dead, u(s.DeadLettered))
		o.ObserveInt64(retries, u(s.Retries))
		o.ObserveInt64(over, u(s.OverLimit))
		o.ObserveInt64(unconfirmed, u(s.Unconfirmed))
		o.ObserveInt64(repeated, u(s.Repeated))
		o.ObserveInt64(reloads, u(a.store.ScriptReloads()))
		if b := a.decisions.Load(); b != nil {
			bs := b.Stats()
			o.ObserveInt64(records, u(bs.Published), outcome("published"))
			o.ObserveInt64(records, u(bs.Dropped), outcome("dropped"))
		}
		for i, st := range a.Shards() {
			shard := metric.WithAttributes(attribute.String("shard", st.Name))
			v := int64(0)
			if st.Active {
				v = 1
				o.ObserveInt64(backlog, u(a.backlog[i].Load()), shard)
			}
			o.ObserveInt64(active, v, shard)
		}
		return nil
	}, evs, msgs, dead, retries, over, unconfirmed, repeated, records, reloads, backlog, active)
	return err
}
