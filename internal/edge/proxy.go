package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/events"
)

type stateKey struct{}

// proxyState is what a proxied request's decisions and response leave for
// its finish.
type proxyState struct {
	vs     []credit.Verdict // the allowed verdicts, one per limit
	shown  int              // the one whose headers the response carries (-1: none, every limit in shadow mode)
	status int
	buf    [2]credit.Verdict
	checks [2]credit.Limit
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
			// The path as matched (requestPath), in its canonical encoding.
			pr.Out.URL.RawPath = ""
			pr.SetURL(upstream)
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
		},
		ModifyResponse: func(resp *http.Response) error {
			if st, ok := resp.Request.Context().Value(stateKey{}).(*proxyState); ok {
				st.status = resp.StatusCode
				if st.shown >= 0 && st.vs[st.shown].Decided {
					v := &st.vs[st.shown]
					setHeaders(resp.Header, v.Decision)
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
	path, err := requestPath(r)
	if err != nil {
		s.badRequests.Add(1)
		problem(w, http.StatusBadRequest, "ambiguous-path", "Bad Request", err.Error())
		return
	}
	rt := s.limits.Load()
	limits := rt.limitsFor(path, r.Method, requestHost(r))
	if len(limits) == 0 {
		s.proxy.ServeHTTP(w, r)
		return
	}
	st := &proxyState{}
	d := s.decideHTTP(r, s.o.Identity, rt, limits, st.checks[:0], st.buf[:0])
	defer d.span.End()
	r, span, traceparent, out := d.r, d.span, d.traceparent, d.out
	switch {
	case d.badIdentity != nil:
		s.badRequests.Add(1)
		problem(w, http.StatusBadRequest, "bad-identity", "Bad Request", d.badIdentity.Error())
		setStatus(span, http.StatusBadRequest)
		return
	case d.err != nil:
		s.unavailable(w)
		setStatus(span, http.StatusServiceUnavailable)
		return
	}
	if out.Refused() {
		// A limit the request's cost is beyond (SetLimits keeps routes'
		// costs within every tier's and override's limit: not reached).
		problem(w, http.StatusTooManyRequests, "cost-beyond-limit", "Too Many Requests", "the request costs more than its limit allows")
		setStatus(span, http.StatusTooManyRequests)
		return
	}
	if !out.Allowed() {
		// The denial is the request's only decision record.
		v := out.Denial()
		v.TraceParent = traceparent
		s.record(v, traceparent)
		s.deny(w, v)
		setStatus(span, http.StatusTooManyRequests)
		return
	}
	st.vs = out.Verdicts
	for i := range st.vs {
		st.vs[i].TraceParent = traceparent
	}
	for _, v := range st.vs {
		s.record(v, traceparent)
	}
	st.shown = tightest(st.vs)
	// The request is finished however the proxy ends: it aborts a response
	// whose body it could not copy (the client went away, the upstream
	// broke off) by panicking with http.ErrAbortHandler, and a request held
	// to a concurrency limit must give its units back then too.
	defer func() {
		status := st.status
		if status == 0 {
			status = http.StatusBadGateway
		}
		s.finish(st.vs, status)
		setStatus(span, status)
	}()
	s.proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
}

// httpDecision is what deciding an HTTP request made of it (the proxy's,
// or the one a gateway asks about): the request with its server span, if
// the edge makes spans (the caller ends it), its validated traceparent,
// and the core's outcome; or the identity it could not use, or why the
// core could not decide (Redis unreachable, failing closed).
type httpDecision struct {
	r           *http.Request
	span        trace.Span
	traceparent string
	out         credit.Outcome
	badIdentity error
	err         error
}

// decideHTTP decides r, held to limits, for the client id finds in it:
// whose windows the request counts in first (a request refused for its
// identity touches none), then one call of the core. checks and vs are
// reused.
func (s *Server) decideHTTP(r *http.Request, id Identifier, rt *routing, limits []limit, checks []credit.Limit, vs []credit.Verdict) httpDecision {
	now := s.o.Clock.Now()
	reqNum := s.reqs.Add(1)
	d := httpDecision{r: r, span: noop.Span{}}
	if s.o.Tracer != nil {
		d.r, d.span = s.startServerSpan(r, "")
	}
	d.traceparent = s.traceParent(d.r)
	checks, d.badIdentity = s.requestChecks(d.r, id, rt, limits, checks)
	if d.badIdentity == nil {
		d.out, d.err = s.core.DecideRequest(d.r.Context(), checks, now, reqNum, vs)
	}
	return d
}

// requestChecks are the limits an HTTP request is held to, each in its
// terms for the client (its tier, its override), with its window's digest
// and the request's cost, appended to checks. id says whose window the
// request counts in (its identity header, or its address through the
// proxies id trusts); an identity it cannot use is the error.
func (s *Server) requestChecks(r *http.Request, id Identifier, rt *routing, limits []limit, checks []credit.Limit) ([]credit.Limit, error) {
	var identity, address string
	for _, l := range limits {
		who := &identity
		if l.byAddress {
			who = &address
		}
		if *who == "" {
			var err error
			if l.byAddress {
				*who = id.Address(r)
			} else if *who, err = id.Identity(r); err != nil {
				return nil, err
			}
		}
		dg := s.o.Keys.Sum(l.policy.Name, *who)
		p := rt.terms(l.policy, s.plan(rt, l.policy, r, id), dg)
		checks = append(checks, credit.Limit{Policy: p, Digest: dg, Cost: p.CostOrDefault()})
	}
	return checks, nil
}

// validTraceParent is a client's traceparent header when it is a valid W3C
// one (55 characters), else "": it is copied into events and records.
func validTraceParent(h string) string {
	if !events.ValidTraceParent(h) {
		return ""
	}
	return h
}

// tightest picks the credit.Verdict whose headers a response shows when several
// limits allowed it: the one with the least room left, the soonest reset
// among equals (what a client must respect first). Limits in shadow mode are
// not shown: they are not enforced. -1 when there is none to show.
func tightest(vs []credit.Verdict) int {
	best := -1
	for i := range vs {
		if vs[i].Policy.Shadow {
			continue
		}
		if best < 0 || !vs[best].Decided {
			best = i
			continue
		}
		a, b := &vs[i].Decision, &vs[best].Decision
		if vs[i].Decided && (a.Remaining < b.Remaining || (a.Remaining == b.Remaining && a.ResetAt.Before(b.ResetAt))) {
			best = i
		}
	}
	return best
}

// unavailable answers a request the edge cannot decide (fail closed).
func (s *Server) unavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	problem(w, http.StatusServiceUnavailable, "limiter-unavailable", "Service Unavailable",
		"the rate limiter cannot decide right now; retry shortly")
}

func (s *Server) deny(w http.ResponseWriter, v credit.Verdict) {
	s.denyWith(w, v, http.StatusTooManyRequests)
}

// denial is what a denied request's problem body says.
func denial(v credit.Verdict) string {
	d := v.Decision
	switch v.Path {
	case credit.PathBlocked:
		return fmt.Sprintf("blocked under rate limit %q by an operator; retry in %s", d.Resource, d.RetryAfter())
	case credit.PathBackoff:
		return fmt.Sprintf("rate limit %q: request sent before the Retry-After given (%d in a row); retry in %s",
			d.Resource, d.Strikes, d.RetryAfter())
	}
	per := d.Window.String()
	if v.Policy.Calendar != "" {
		per = v.Policy.Per()
	}
	return fmt.Sprintf("rate limit %q of %d per %s exceeded; the window resets in %s", d.Resource, d.Limit, per, d.RetryAfter())
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
