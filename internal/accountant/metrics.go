package accountant

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/tallyhq/tally/internal/metrics"
)

// AdminHandler serves /healthz, /readyz and /metrics (Prometheus text).
// Ready means ready(ctx) returns nil (NATS connected) and no shard has been
// failing for longer than twice the lease lifetime.
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
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		s := a.Stats()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# HELP tally_accountant_events_total Accounting events, by outcome.\n# TYPE tally_accountant_events_total counter\n")
		for _, o := range []struct {
			name string
			n    uint64
		}{{"charged", s.Charged}, {"refunded", s.Refunded}, {"released", s.Released}, {"duplicate", s.Duplicates},
			{"late", s.Late}, {"netted", s.Netted}, {"pending", s.Pending}, {"ignored", s.Ignored}} {
			fmt.Fprintf(w, "tally_accountant_events_total{outcome=%q} %d\n", o.name, o.n)
		}
		fmt.Fprintf(w, "# HELP tally_accountant_messages_total Stream messages processed.\n# TYPE tally_accountant_messages_total counter\ntally_accountant_messages_total %d\n", s.Messages)
		fmt.Fprintf(w, "# HELP tally_accountant_dead_letters_total Messages copied to the dead-letter stream.\n# TYPE tally_accountant_dead_letters_total counter\ntally_accountant_dead_letters_total %d\n", s.DeadLettered)
		fmt.Fprintf(w, "# HELP tally_accountant_retries_total Runs tried again after a failure.\n# TYPE tally_accountant_retries_total counter\ntally_accountant_retries_total %d\n", s.Retries)
		fmt.Fprintf(w, "# HELP tally_accountant_over_limit_units_total Units charged beyond a window's limit (admitted without a reservation).\n# TYPE tally_accountant_over_limit_units_total counter\ntally_accountant_over_limit_units_total %d\n", s.OverLimit)
		fmt.Fprintf(w, "# HELP tally_accountant_unconfirmed_total Runs no replica confirmed in time.\n# TYPE tally_accountant_unconfirmed_total counter\ntally_accountant_unconfirmed_total %d\n", s.Unconfirmed)
		s.Lag.WritePrometheus(w, "tally_accountant_lag_seconds", "Time from an event's creation to its effect in Redis.")
		metrics.WriteSchedLatency(w)
		fmt.Fprintf(w, "# HELP tally_accountant_shard_active Whether this process serves the shard.\n# TYPE tally_accountant_shard_active gauge\n")
		for _, st := range a.Shards() {
			v := 0
			if st.Active {
				v = 1
			}
			fmt.Fprintf(w, "tally_accountant_shard_active{shard=%q} %d\n", st.Name, v)
		}
	})
	return mux
}

// Ready reports whether the accountant can do its work: ready(ctx) (NATS)
// returns nil and no shard has been failing for longer than twice the lease
// lifetime.
func (a *Accountant) Ready(ctx context.Context, ready func(context.Context) error) error {
	if ready != nil {
		if err := ready(ctx); err != nil {
			return err
		}
	}
	for _, st := range a.Shards() {
		if st.Err != nil && a.now().Sub(st.Since) > 2*a.cfg.LeaseTTL {
			return fmt.Errorf("shard %s failing for %v: %w", st.Name, a.now().Sub(st.Since).Round(time.Second), st.Err)
		}
	}
	return nil
}
