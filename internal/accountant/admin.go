package accountant

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// AdminHandler serves /healthz, /readyz (ready must return nil) and
// /metrics in the Prometheus text format.
func (a *Accountant) AdminHandler(ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		s := a.Stats()
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# HELP tally_accountant_events_total Events applied, by outcome.\n# TYPE tally_accountant_events_total counter\n")
		for _, o := range []struct {
			name string
			n    uint64
		}{{"charged", s.Charged}, {"refunded", s.Refunded}, {"duplicate", s.Duplicates}, {"late", s.Late},
			{"netted", s.Netted}, {"pending", s.Pending}, {"ignored", s.Ignored}, {"dead_lettered", s.DeadLettered}} {
			fmt.Fprintf(w, "tally_accountant_events_total{outcome=%q} %d\n", o.name, o.n)
		}
		fmt.Fprintf(w, "# HELP tally_accountant_retries_total Batches nak'ed after a transient failure.\n# TYPE tally_accountant_retries_total counter\ntally_accountant_retries_total %d\n", s.Retries)
		fmt.Fprintf(w, "# HELP tally_accountant_lag_seconds Time from an event's publication to its effect in Redis.\n# TYPE tally_accountant_lag_seconds summary\n")
		fmt.Fprintf(w, "tally_accountant_lag_seconds_sum %g\ntally_accountant_lag_seconds_count %d\n", s.LagSum.Seconds(), s.LagCount)
		fmt.Fprintf(w, "# HELP tally_accountant_lag_max_seconds Largest accounting lag seen.\n# TYPE tally_accountant_lag_max_seconds gauge\ntally_accountant_lag_max_seconds %g\n", s.LagMax.Seconds())
	})
	return mux
}
