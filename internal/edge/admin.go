package edge

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/pprof"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/redisstore"
)

// AdminHandler serves /healthz (the process is up), /readyz, /metrics
// (Prometheus text format) and the temporary-limits API (/v1/limits,
// limitsapi.go).
//
// An edge is ready once it decides normally: it has reached every shard's
// primary (its scripts loaded there) and, with NATS, found or created its
// streams; until then /readyz answers 503 and names what is missing. Once
// ready it stays ready unless it is draining: with NATS down it applies
// accounting events on the primaries itself, and with a primary down it
// decides from what it knows, or admits what it does not know
// (on_redis_error allow). Such degradations show in /metrics and the logs,
// and in /readyz's body, not in its status: failing every edge at once when
// a shared dependency blips would take the API down with it. With
// on_redis_error deny a primary down is not a degradation: every request
// for a key the edge does not know fails, and /readyz answers 503 until the
// primary answers again.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if s.draining.Load() {
			http.Error(w, "not ready: draining", http.StatusServiceUnavailable)
			return
		}
		if m := s.missing(); m != "" {
			http.Error(w, "not ready: "+m, http.StatusServiceUnavailable)
			return
		}
		if u := s.undecidable(); u != "" {
			http.Error(w, "not ready: "+u, http.StatusServiceUnavailable)
			return
		}
		var degraded []string
		if nc := s.o.NATS; nc != nil && !nc.IsConnected() {
			degraded = append(degraded, "nats "+nc.Status().String())
		}
		for i := range s.o.Store.Shards() {
			if s.core.Suspected(i) {
				degraded = append(degraded, "shard "+s.o.Store.ShardName(i)+" primary unreachable")
			}
		}
		if len(degraded) > 0 {
			_, _ = fmt.Fprintf(w, "ready (degraded: %s)\n", strings.Join(degraded, "; "))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", s.telemetry.Handler())
	s.limitsAPI(mux)
	if s.o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// registerMetrics registers the edge's instruments on m: observable ones
// read the edge's counters when /metrics is scraped, so the request path
// only increments atomics.
func (s *Server) registerMetrics(m metric.Meter) error {
	var errs []error
	counter := func(name, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	decisions := counter("tally_edge_decisions", "Requests decided, by result and by how (path).")
	byPolicy := counter("tally_edge_policy_decisions", "Requests decided, by policy and result (never by key).")
	natsUp := gauge("tally_edge_nats_connected", "Whether the edge is connected to NATS (0: accounting events go to the primaries).")
	primaryUp := gauge("tally_edge_primary_reachable", "Whether the shard's primary answers reservations (0: requests are decided without waiting for it).")
	unavailable := counter("tally_edge_unavailable", "Requests answered 503: Redis unreachable in time and on_redis_error deny.")
	takes := counter("tally_edge_reservations", "Reservations made on the primaries.")
	takeErrors := counter("tally_edge_reservation_errors", "Reservations that failed (the edge decided without them).")
	recovered := counter("tally_edge_recovered_units", "Units of reservations whose answer was lost (the primary made them after the edge stopped waiting), taken back into credit.")
	holds := counter("tally_edge_frozen_reports", "Reports of the credit this edge will not spend (frozen shares), by outcome.")
	takenBack := counter("tally_edge_credit_taken_back_units", "Units of this edge's frozen credit another edge took back while its reports did not arrive.")
	released := counter("tally_edge_released_units", "Reserved units given back unused.")
	absorbed := counter("tally_edge_refunds_absorbed", "304 refunds taken back into the edge's own credit (no event).")
	notices := counter("tally_edge_notices", "Notices of full windows sent, notices received, and notices refused (not signed with the deployment's secret, or replayed).")
	finishes := counter("tally_edge_finishes", "Decision-API finishes, by result: finished, already_finished (409), expired (410), unavailable (503).")
	rechecks := counter("tally_edge_rechecks", "Reads of windows known to be full, in case a notice was lost, and of windows a lost reservation may have changed.")
	keys := gauge("tally_edge_keys", "Keys the edge remembers.")
	evicted := counter("tally_edge_keys_evicted", "Keys forgotten to bound memory.")
	bad := counter("tally_edge_bad_requests", "Requests refused as malformed.")
	accEvents := counter("tally_edge_accounting_events", "Accounting events: published to JetStream, applied on a primary by the edge, dropped.")
	accMessages := counter("tally_edge_accounting_messages", "Accounting messages JetStream acknowledged.")
	queued := gauge("tally_edge_accounting_queued", "Accounting events waiting to be delivered.")
	records := counter("tally_edge_decision_records", "Decision records: published to the decisions stream, dropped.")
	recordMessages := counter("tally_edge_decision_messages", "Decision messages JetStream acknowledged.")
	recordsQueued := gauge("tally_edge_decision_records_queued", "Decision records waiting to be published (beyond edge.decisions.buffer: dropped).")
	reloads := counter("tally_edge_script_reloads", "Lua scripts sent again to a Redis node that did not have them (NOSCRIPT).")
	reseeds := counter("tally_edge_reseeds", "Reseeds of shards whose primary changed (a promotion, a restart) this edge took part in, "+
		"by timing: in_time, or late (learnt of after the reseed ended: the shard's windows may have let more through meanwhile).")
	reseeded := counter("tally_edge_reseeded_windows", "Windows this edge re-asserted in reseeds, by outcome: seeded (the new "+
		"primary held them), opened (it had lost them), conflict (another window of the key was live: not re-asserted).")
	reseededUnits := counter("tally_edge_reseeded_units", "Units reseeds put back into windows from what this edge re-asserted.")
	epochChecks := counter("tally_edge_epoch_check_errors", "Failed checks of whether a shard's primary changed (an ACL "+
		"without the commands they run, a script error): while they fail, a change of primary goes unnoticed.")
	reseeding := gauge("tally_edge_shard_reseeding", "1 while a shard reseeds: it takes no reservation from this edge.")
	tempLimits := gauge("tally_edge_temporary_limits", "Operators' temporary limits the edge applies now.")
	badLimits := counter("tally_edge_temporary_limits_refused", "Entries of the limits stream refused: not signed with the deployment's secret, or not valid.")
	clientDenials := gauge("tally_edge_client_denials", "The clients denied most in the last whole minute, by policy and window key digest "+
		"(at most 10, each denied at least 60 times): tally inspect --policy P --digest D shows one.")
	backedOff := gauge("tally_edge_backoff_clients", "Clients progressive backoff remembers (denied, and not admitted since).")
	accessLog := counter("tally_edge_access_log_entries", "Gateways' access-log entries: refunded (a 304, or any status of a concurrency limit's request), repeated, late, ignored, unreadable, not from a gateway, failed.")
	if err := errors.Join(errs...); err != nil {
		return err
	}
	attr := func(kv ...string) metric.ObserveOption {
		a := make([]attribute.KeyValue, 0, len(kv)/2)
		for i := 0; i+1 < len(kv); i += 2 {
			a = append(a, attribute.String(kv[i], kv[i+1]))
		}
		return metric.WithAttributes(a...)
	}
	u := func(v uint64) int64 { return int64(min(v, math.MaxInt64)) }
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		d := s.core.Stats()
		for p := credit.PathCredit; p <= credit.PathFailOpen; p++ {
			for allowed, result := range []string{"denied", "allowed"} {
				if n := d.Decisions[p][allowed]; n > 0 || p == credit.PathCredit || p == credit.PathCache {
					o.ObserveInt64(decisions, u(n), attr("result", result, "path", p.String()))
				}
			}
		}
		for _, p := range []credit.Path{credit.PathBlocked, credit.PathBackoff} {
			o.ObserveInt64(decisions, u(d.Decisions[p][0]), attr("result", "denied", "path", p.String()))
		}
		o.ObserveInt64(tempLimits, int64(len(s.Temporary(s.o.Clock.Now()))))
		o.ObserveInt64(badLimits, u(s.badLimits.Load()))
		o.ObserveInt64(backedOff, int64(s.backoff.Len()))
		for _, c := range s.denied.top(s.o.Clock.Now()) {
			o.ObserveInt64(clientDenials, c.n, attr("policy", c.policy, "digest", c.digest.String()))
		}
		for name, c := range d.Policies {
			for allowed, result := range []string{"denied", "allowed"} {
				o.ObserveInt64(byPolicy, u(c[allowed]), attr("policy", name, "result", result))
			}
		}
		o.ObserveInt64(natsUp, u(boolValue(s.o.NATS != nil && s.o.NATS.IsConnected())))
		for i := range s.o.Store.Shards() {
			o.ObserveInt64(primaryUp, u(boolValue(!s.core.Suspected(i))), attr("shard", s.o.Store.ShardName(i)))
		}
		o.ObserveInt64(unavailable, u(d.Unavailable))
		o.ObserveInt64(takes, u(d.Takes))
		o.ObserveInt64(takeErrors, u(d.TakeErrors))
		o.ObserveInt64(recovered, u(d.Recovered))
		o.ObserveInt64(holds, u(d.Holds-d.HoldErrors), attr("outcome", "answered"))
		o.ObserveInt64(holds, u(d.HoldErrors), attr("outcome", "failed"))
		o.ObserveInt64(takenBack, u(d.TakenBack))
		o.ObserveInt64(released, u(d.Released))
		o.ObserveInt64(absorbed, u(d.Absorbed))
		o.ObserveInt64(notices, u(d.NoticesSent), attr("direction", "sent"))
		o.ObserveInt64(notices, u(d.NoticesIn), attr("direction", "received"))
		o.ObserveInt64(notices, u(d.NoticesRefused), attr("direction", "refused"))
		for i := range s.finishes {
			o.ObserveInt64(finishes, u(s.finishes[i].Load()), attr("result", finishNames[i]))
		}
		for i := range s.logEntries {
			o.ObserveInt64(accessLog, u(s.logEntries[i].Load()), attr("outcome", logNames[i]))
		}
		o.ObserveInt64(rechecks, u(d.Rechecks))
		o.ObserveInt64(keys, d.Keys)
		o.ObserveInt64(evicted, u(d.Evicted))
		o.ObserveInt64(bad, u(s.badRequests.Load()))
		st := s.outbox.Stats()
		o.ObserveInt64(accEvents, u(st.Published), attr("outcome", "published"))
		o.ObserveInt64(accEvents, u(st.Direct), attr("outcome", "applied_directly"))
		o.ObserveInt64(accEvents, u(st.Dropped), attr("outcome", "dropped"))
		o.ObserveInt64(accMessages, u(st.Messages))
		o.ObserveInt64(queued, int64(st.Queued))
		if s.batcher != nil {
			bs := s.batcher.Stats()
			o.ObserveInt64(records, u(bs.Published), attr("outcome", "published"))
			o.ObserveInt64(records, u(bs.Dropped), attr("outcome", "dropped"))
			o.ObserveInt64(recordMessages, u(bs.Messages))
			o.ObserveInt64(recordsQueued, int64(bs.Queued))
		}
		if st, ok := s.o.Store.(interface{ ScriptReloads() uint64 }); ok {
			o.ObserveInt64(reloads, u(st.ScriptReloads()))
		}
		o.ObserveInt64(accEvents, u(st.Redelivered), attr("outcome", "redelivered"))
		if st, ok := s.o.Store.(reseedReporter); ok {
			h := st.ReseedStats()
			o.ObserveInt64(reseeds, u(h.Reseeds-h.Late), attr("timing", "in_time"))
			o.ObserveInt64(reseeds, u(h.Late), attr("timing", "late"))
			o.ObserveInt64(reseeded, u(h.Claims-h.Opened-h.Conflicts), attr("outcome", "seeded"))
			o.ObserveInt64(reseeded, u(h.Opened), attr("outcome", "opened"))
			o.ObserveInt64(reseeded, u(h.Conflicts), attr("outcome", "conflict"))
			o.ObserveInt64(reseededUnits, u(h.Added))
			o.ObserveInt64(epochChecks, u(h.CheckErrors))
			for i := range s.o.Store.Shards() {
				o.ObserveInt64(reseeding, u(boolValue(st.Reseeding(i))), attr("shard", s.o.Store.ShardName(i)))
			}
		}
		return nil
	}, decisions, byPolicy, natsUp, primaryUp, unavailable, takes, takeErrors, recovered, released, absorbed, notices, finishes,
		rechecks, keys, evicted, bad, accEvents, accMessages, queued, records, recordMessages, recordsQueued, reloads, reseeds,
		reseeded, reseededUnits, epochChecks, reseeding, accessLog, holds, takenBack, tempLimits, badLimits, backedOff, clientDenials)
	return err
}

// reseedReporter is what the edge reports of its store's reseeds
// (redisstore.Store).
type reseedReporter interface {
	ReseedStats() redisstore.ReseedStats
	Reseeding(shard int) bool
}

func boolValue(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
