package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
)

type stateKey struct{}

type proxyState struct {
	v      verdict
	status int
}

func (s *Server) newProxy(upstream *url.URL) *httputil.ReverseProxy {
	// One upstream: keep as many idle connections to it as there are
	// requests in flight, or every burst opens (and leaves in TIME_WAIT) new
	// ones. net/http's default keeps 2.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns, tr.MaxIdleConnsPerHost = 1024, 1024
	return &httputil.ReverseProxy{
		Transport: tr,
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		ModifyResponse: func(resp *http.Response) error {
			if st, ok := resp.Request.Context().Value(stateKey{}).(*proxyState); ok {
				st.status = resp.StatusCode
				if st.v.decided {
					st.v.decision.SetHeaders(resp.Header)
				}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if st, ok := r.Context().Value(stateKey{}).(*proxyState); ok {
				st.status = http.StatusBadGateway
			}
			if r.Context().Err() != nil { // the client went away: nothing to answer
				return
			}
			s.log.Warn("upstream failed", "err", err)
			problem(w, http.StatusBadGateway, "upstream-unavailable", "Bad Gateway", "the upstream API did not answer")
		},
	}
}

// ProxyHandler decides each request and forwards the allowed ones to the
// upstream. It panics if Options.Upstream was nil.
func (s *Server) ProxyHandler() http.Handler {
	if s.proxy == nil {
		panic("edge: ProxyHandler without an upstream")
	}
	return http.HandlerFunc(s.serveProxy)
}

func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request) {
	p, limited := s.policyFor(r.URL.Path)
	if !limited {
		s.proxy.ServeHTTP(w, r)
		return
	}
	identity, err := s.o.Identity.Identity(r)
	if err != nil {
		s.badRequests.Add(1)
		problem(w, http.StatusBadRequest, "bad-identity", "Bad Request", err.Error())
		return
	}
	now := s.o.Clock.Now()
	v, err := s.check(r.Context(), p, identity, now)
	if err != nil {
		s.unavailable(w)
		return
	}
	v.reqNum = s.reqs.Add(1)
	s.record(v, r.Header.Get("Traceparent"))
	if v.decided && !v.decision.Allowed {
		s.deny(w, v)
		return
	}
	st := &proxyState{v: v}
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
	status := st.status
	if status == 0 {
		status = http.StatusBadGateway
	}
	s.finish(v, status)
}

// unavailable answers a request the edge cannot decide (fail closed).
func (s *Server) unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusServiceUnavailable, "limiter-unavailable", "Service Unavailable",
		"the rate limiter cannot decide right now; retry shortly")
}

func (s *Server) deny(w http.ResponseWriter, v verdict) {
	d := v.decision
	d.SetHeaders(w.Header())
	problem(w, http.StatusTooManyRequests, "rate-limited", "Too Many Requests",
		fmt.Sprintf("rate limit %q of %d per %s exceeded; the window resets in %s",
			d.Resource, d.Limit, d.Window, d.RetryAfter()))
}

// problem writes an RFC 9457 problem details response.
func problem(w http.ResponseWriter, status int, kind, title, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "urn:tally:problem:" + kind, "title": title, "status": status, "detail": detail,
	})
}
