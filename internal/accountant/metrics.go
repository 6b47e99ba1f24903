package accountant

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"
)

// lagBounds are the upper bounds of the lag histogram's buckets, in seconds.
var lagBounds = []float64{0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// Histogram is a snapshot of durations counted in fixed buckets: Counts[i]
// counts those up to LagBounds[i] seconds, the last one those above.
type Histogram struct {
	Counts [20]uint64
	Sum    time.Duration
	Count  uint64
}

// LagBounds are the upper bounds of the lag histogram's buckets, in seconds.
var LagBounds = lagBounds

// histogram counts durations live; the zero value is ready and it is safe
// for concurrent use.
type histogram struct {
	live [20]atomic.Uint64 // len(lagBounds)+1
	sum  atomic.Int64
	n    atomic.Uint64
}

// Observe records d.
func (h *histogram) Observe(d time.Duration) {
	d = max(0, d)
	s := d.Seconds()
	i := 0
	for i < len(lagBounds) && s > lagBounds[i] {
		i++
	}
	h.live[i].Add(1)
	h.sum.Add(int64(d))
	h.n.Add(1)
}

// Snapshot copies the counts.
func (h *histogram) Snapshot() Histogram {
	var s Histogram
	for i := range h.live {
		s.Counts[i] = h.live[i].Load()
	}
	s.Sum, s.Count = time.Duration(h.sum.Load()), h.n.Load()
	return s
}

// Quantile estimates the q-quantile (0 to 1) of a snapshot by linear
// interpolation within its bucket; 0 when empty.
func (h Histogram) Quantile(q float64) time.Duration {
	var total uint64
	for _, c := range h.Counts {
		total += c
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	var seen float64
	for i, c := range h.Counts {
		if seen+float64(c) >= rank && c > 0 {
			lo := 0.0
			if i > 0 {
				lo = lagBounds[i-1]
			}
			hi := lo * 2
			if i < len(lagBounds) {
				hi = lagBounds[i]
			}
			s := lo + (hi-lo)*(rank-seen)/float64(c)
			return time.Duration(s * float64(time.Second))
		}
		seen += float64(c)
	}
	return time.Duration(lagBounds[len(lagBounds)-1] * float64(time.Second))
}

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
		fmt.Fprintf(w, "# HELP tally_accountant_lag_seconds Time from an event's creation to its effect in Redis.\n# TYPE tally_accountant_lag_seconds histogram\n")
		var cum uint64
		for i, c := range s.Lag.Counts {
			cum += c
			le := "+Inf"
			if i < len(lagBounds) {
				le = fmt.Sprint(lagBounds[i])
			}
			fmt.Fprintf(w, "tally_accountant_lag_seconds_bucket{le=%q} %d\n", le, cum)
		}
		fmt.Fprintf(w, "tally_accountant_lag_seconds_sum %g\ntally_accountant_lag_seconds_count %d\n", s.Lag.Sum.Seconds(), s.Lag.Count)
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
