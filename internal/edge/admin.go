package edge

import (
	"fmt"
	"maps"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/tallyhq/tally/internal/metrics"
)

// AdminHandler serves /healthz (the process is up), /readyz and /metrics
// (Prometheus text format).
//
// An edge is ready while it can decide, that is unless it is draining: with
// NATS down it applies accounting events on the primaries itself, and with a
// primary down it decides from what it knows (or by on_redis_error). Such
// degradations show in /metrics and the logs, and in /readyz's body, not in
// its status: failing every edge at once when a shared dependency blips
// would take the API down with it.
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
		var degraded []string
		if nc := s.o.NATS; nc != nil && !nc.IsConnected() {
			degraded = append(degraded, "nats "+nc.Status().String())
		}
		now := s.o.Clock.Now().UnixNano()
		for i := range s.o.Store.Shards() {
			if s.dec.suspected(i, now) {
				degraded = append(degraded, "shard "+s.o.Store.ShardName(i)+" primary unreachable")
			}
		}
		if len(degraded) > 0 {
			_, _ = fmt.Fprintf(w, "ready (degraded: %s)\n", strings.Join(degraded, "; "))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /metrics", s.metrics)
	if s.o.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

func (s *Server) metrics(w http.ResponseWriter, _ *http.Request) {
	var b strings.Builder
	help := func(name, kind, text string) { fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, text, name, kind) }
	value := func(name, labels string, v uint64) {
		if labels != "" {
			name += "{" + labels + "}"
		}
		b.WriteString(name + " " + strconv.FormatUint(v, 10) + "\n")
	}
	d := s.dec
	help("tally_edge_decisions_total", "counter", "Requests decided, by result and by how (path).")
	for p := PathCredit; p <= PathFailOpen; p++ {
		for allowed, result := range []string{"denied", "allowed"} {
			if n := d.byPath[p][allowed].Load(); n > 0 || p == PathCredit || p == PathCache {
				value("tally_edge_decisions_total", `result="`+result+`",path="`+p.String()+`"`, n)
			}
		}
	}
	help("tally_edge_policy_decisions_total", "counter", "Requests decided, by policy and result (never by key).")
	for _, name := range slices.Sorted(maps.Keys(d.byPolicy)) {
		c := d.byPolicy[name]
		for allowed, result := range []string{"denied", "allowed"} {
			value("tally_edge_policy_decisions_total", `policy="`+name+`",result="`+result+`"`, c[allowed].Load())
		}
	}
	help("tally_edge_nats_connected", "gauge", "Whether the edge is connected to NATS (0: accounting events go to the primaries).")
	value("tally_edge_nats_connected", "", boolValue(s.o.NATS != nil && s.o.NATS.IsConnected()))
	help("tally_edge_primary_reachable", "gauge", "Whether the shard's primary answers reservations (0: requests are decided without waiting for it).")
	now := s.o.Clock.Now().UnixNano()
	for i := range s.o.Store.Shards() {
		value("tally_edge_primary_reachable", `shard="`+s.o.Store.ShardName(i)+`"`, boolValue(!d.suspected(i, now)))
	}
	help("tally_edge_unavailable_total", "counter", "Requests answered 503: Redis unreachable in time and on_redis_error deny.")
	value("tally_edge_unavailable_total", "", d.unavailable.Load())
	help("tally_edge_reservations_total", "counter", "Reservations made on the primaries.")
	value("tally_edge_reservations_total", "", d.takes.Load())
	help("tally_edge_reservation_errors_total", "counter", "Reservations that failed (the edge decided without them).")
	value("tally_edge_reservation_errors_total", "", d.takeErrors.Load())
	help("tally_edge_recovered_units_total", "counter", "Units of reservations whose answer was lost (the primary made them after the edge stopped waiting), taken back into credit.")
	value("tally_edge_recovered_units_total", "", d.recovered.Load())
	help("tally_edge_released_units_total", "counter", "Reserved units given back unused.")
	value("tally_edge_released_units_total", "", d.released.Load())
	help("tally_edge_refunds_absorbed_total", "counter", "304 refunds taken back into the edge's own credit (no event).")
	value("tally_edge_refunds_absorbed_total", "", d.absorbed.Load())
	help("tally_edge_notices_total", "counter", "Notices of full windows sent, and notices received.")
	value("tally_edge_notices_total", `direction="sent"`, d.noticesUp.Load())
	value("tally_edge_notices_total", `direction="received"`, d.noticesIn.Load())
	help("tally_edge_rechecks_total", "counter", "Reads of windows known to be full, in case a notice was lost.")
	value("tally_edge_rechecks_total", "", d.rechecks.Load())
	help("tally_edge_keys", "gauge", "Keys the edge remembers.")
	value("tally_edge_keys", "", uint64(max(0, d.table.size.Load())))
	help("tally_edge_keys_evicted_total", "counter", "Keys forgotten to bound memory.")
	value("tally_edge_keys_evicted_total", "", d.table.evicted.Load())
	help("tally_edge_bad_requests_total", "counter", "Requests refused as malformed.")
	value("tally_edge_bad_requests_total", "", s.badRequests.Load())
	o := s.outbox.stats()
	help("tally_edge_accounting_events_total", "counter", "Accounting events: published to JetStream, applied on a primary by the edge, dropped.")
	value("tally_edge_accounting_events_total", `outcome="published"`, o.Published)
	value("tally_edge_accounting_events_total", `outcome="applied_directly"`, o.Direct)
	value("tally_edge_accounting_events_total", `outcome="dropped"`, o.Dropped)
	help("tally_edge_accounting_messages_total", "counter", "Accounting messages JetStream acknowledged.")
	value("tally_edge_accounting_messages_total", "", o.Messages)
	help("tally_edge_accounting_queued", "gauge", "Accounting events waiting to be delivered.")
	value("tally_edge_accounting_queued", "", uint64(o.Queued))
	metrics.WriteSchedLatency(&b)
	s.outbox.lag.Snapshot().WritePrometheus(&b, "tally_edge_accounting_lag_seconds",
		"Time from an accounting event's creation to its effect in Redis, for the events the edge applied itself.")
	if s.batcher != nil {
		bs := s.batcher.Stats()
		help("tally_edge_decision_records_total", "counter", "Decision records: published to the decisions stream, dropped.")
		value("tally_edge_decision_records_total", `outcome="published"`, bs.Published)
		value("tally_edge_decision_records_total", `outcome="dropped"`, bs.Dropped)
		help("tally_edge_decision_messages_total", "counter", "Decision messages JetStream acknowledged.")
		value("tally_edge_decision_messages_total", "", bs.Messages)
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	_, _ = w.Write([]byte(b.String()))
}

func boolValue(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}
