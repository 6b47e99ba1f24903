package service

import (
	"context"
	"io"
	"net/http"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tallyhq/tally/internal/edge"
)

// envoyproxy/ratelimit's HTTP port (edge.rls.http_listen), for clients
// that cannot speak gRPC and for probes: POST /json takes a
// RateLimitRequest in protobuf JSON and answers the RateLimitResponse in
// the same form — 200 when OK, 429 when over the limit, 400 for a request
// that cannot be read or decided — and GET /healthcheck answers 200 "OK"
// while the rate-limit service can decide, 500 otherwise, as the
// reference's do.

// maxJSONRequest bounds a /json request's body.
const maxJSONRequest = 1 << 20

// rlsHTTPHandler serves /json (behind the token, when there is one) and
// /healthcheck. needRules makes /healthcheck fail until rules are loaded
// (the reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
func rlsHTTPHandler(srv *edge.Server, token string, needRules bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/json", RequireToken(token, jsonHandler(srv.RateLimitService())))
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if !srv.Ready() || (needRules && !srv.RLSRulesLoaded()) {
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("OK"))
	})
	return mux
}

func jsonHandler(svc rlsv3.RateLimitServiceServer) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONRequest))
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		resp, err := svc.ShouldRateLimit(ctx, &req)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch resp.OverallCode {
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		case rlsv3.RateLimitResponse_UNKNOWN:
			w.WriteHeader(http.StatusInternalServerError)
		}
		_, _ = w.Write(out)
	})
}
