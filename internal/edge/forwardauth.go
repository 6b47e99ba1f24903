package edge

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/limiter"
)

// Forward-auth: the front door of gateways that ask an outside service
// whether to let each request through — nginx's auth_request, Traefik's
// ForwardAuth, Caddy's forward_auth. The gateway sends the original
// request's headers, and its method, URI and host in headers of its own;
// the edge decides the original request as its proxy would, and answers
// 2xx with the rate-limit headers for the gateway to copy, or a denial the
// gateway passes on. Only a configured gateway is believed: anyone else is
// refused before anything is decided (its forwarded headers could name any
// method, path, host or client).
//
// Three paths, one per gateway's way of passing a denial on:
//
//	/auth/nginx    nginx understands only 2xx, 401 and 403 from the auth
//	               service (anything else becomes a 500): a denial is 403
//	               with the headers, which error_page turns into a 429
//	/auth/traefik  any other answer goes to the client as it is: a denial
//	/auth/caddy    is 429 with Retry-After and a problem body
//
// An allowed answer carries Tally-Request-Id: the request's signed ticket
// (several, comma-separated, when it is held to several limits). A gateway
// that sends Tally its access log (nginx over syslog, Caddy as JSON over
// UDP: LogListener) with that id and the response's status gets its 304s'
// charges back, once.

// The paths of the forward-auth handler.
const (
	forwardAuthNginx   = "/auth/nginx"
	forwardAuthTraefik = "/auth/traefik"
	forwardAuthCaddy   = "/auth/caddy"
)

// RequestIDHeader carries an allowed forward-auth request's tickets.
const RequestIDHeader = "Tally-Request-Id"

// ForwardAuthHandler serves gateways' forward-auth requests. Options.Gateways
// are the addresses believed; a caller from anywhere else is refused (421,
// and a warning in the log).
func (s *Server) ForwardAuthHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(forwardAuthNginx, func(w http.ResponseWriter, r *http.Request) { s.forwardAuth(w, r, true) })
	for _, p := range []string{forwardAuthTraefik, forwardAuthCaddy} {
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) { s.forwardAuth(w, r, false) })
	}
	return mux
}

// isGateway reports whether a is a configured gateway's address.
func (s *Server) isGateway(a netip.Addr) bool {
	for _, p := range s.o.Gateways {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// notGatewayStatus answers a forward-auth request from an address that is
// not a gateway's: 421 Misdirected Request, which no gateway takes for a
// rate limit — nginx turns it into a 500 (it understands only 2xx, 401 and
// 403; its 403 is Tally's denial, made a 429 by error_page), Traefik and
// Caddy pass it on with its problem body.
const notGatewayStatus = http.StatusMisdirectedRequest

// stranger logs, at most once a minute per address, a caller that is not a
// configured gateway: what it sent (what) was refused or dropped.
func (s *Server) stranger(a netip.Addr, what string) {
	if s.strangers.due(a, time.Now()) {
		s.o.Log.Warn(what+" from an address that is not a gateway's was refused; "+
			"if it is a gateway, add it to edge.forward_auth.gateways", "addr", a.String())
	}
}

// forwardAuth decides the original request of a gateway's auth request.
// nginx: a denial is 403 (which nginx's error_page turns into a 429).
func (s *Server) forwardAuth(w http.ResponseWriter, r *http.Request, nginx bool) {
	if a := parseAddr(r.RemoteAddr); !s.isGateway(a) {
		s.badRequests.Add(1)
		s.stranger(a, "a forward-auth request")
		problem(w, notGatewayStatus, "not-a-gateway", "Misdirected Request",
			"forward-auth answers configured gateways only (edge.forward_auth.gateways), and this address is not one")
		return
	}
	method, uri, host := original(r)
	if method == "" || uri == "" {
		// A gateway that does not send them is misconfigured: nginx turns
		// this 400 into a 500, which shows.
		s.badRequest(w, "X-Forwarded-Method and X-Forwarded-Uri (or X-Original-URI) are required: the gateway's configuration sends them")
		return
	}
	u, err := url.ParseRequestURI(uri)
	var path string
	if err == nil {
		path, err = urlPath(u)
	}
	if err != nil {
		s.badRequests.Add(1)
		status := http.StatusBadRequest
		if nginx {
			status = http.StatusForbidden
		}
		problem(w, status, "ambiguous-path", "Bad Request", errAmbiguousPath.Error())
		return
	}
	rt := s.limits.Load()
	limits := rt.limitsFor(path, method, hostOnly(host))
	if len(limits) == 0 {
		w.WriteHeader(http.StatusOK)
		return
	}
	var buf [4]credit.Limit
	d := s.decideHTTP(r, s.gatewayIdentity, rt, limits, buf[:0], nil)
	defer d.span.End()
	span, traceparent, res := d.span, d.traceparent, d.out
	switch {
	case d.badIdentity != nil:
		s.badRequest(w, d.badIdentity.Error())
		return
	case d.err != nil:
		s.unavailable(w)
		setStatus(span, http.StatusServiceUnavailable)
		return
	}
	if !res.Allowed() {
		status := http.StatusTooManyRequests
		if nginx {
			status = http.StatusForbidden
		}
		if res.Refused() { // its cost is beyond its limit
			problem(w, status, "cost-beyond-limit", "Too Many Requests", "the request costs more than its limit allows")
			return
		}
		v := res.Denial()
		v.TraceParent = traceparent
		s.record(v, traceparent)
		s.denyWith(w, v, status)
		setStatus(span, status)
		return
	}
	ids := make([]byte, 0, 96*len(res.Verdicts))
	for i, v := range res.Verdicts {
		v.TraceParent = traceparent
		s.record(v, traceparent)
		if v.Allowed() && v.Cost > 0 {
			if len(ids) > 0 {
				ids = append(ids, ',')
			}
			ids = s.appendTicket(ids, res.Verdicts[i])
		}
	}
	h := w.Header()
	if shown := tightest(res.Verdicts); shown >= 0 && res.Verdicts[shown].Decided {
		setHeaders(h, res.Verdicts[shown].Decision)
	}
	if len(ids) > 0 {
		h.Set(RequestIDHeader, string(ids))
	}
	w.WriteHeader(http.StatusOK)
	setStatus(span, http.StatusOK)
}

// original is what a gateway says of the request it asks about: its
// method, URI (path and query) and host, from the headers each gateway
// sends (X-Forwarded-Method, -Uri, -Host: Traefik, Caddy, and nginx as
// deploy/nginx sets them; X-Original-Method, -URI as older nginx
// configurations name them).
func original(r *http.Request) (method, uri, host string) {
	method = first(r.Header.Get("X-Forwarded-Method"), r.Header.Get("X-Original-Method"))
	uri = first(r.Header.Get("X-Forwarded-Uri"), r.Header.Get("X-Original-URI"))
	host = first(r.Header.Get("X-Forwarded-Host"), r.Host)
	return strings.ToUpper(method), uri, host
}

func first(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// denyWith answers a denial with status: the decision's headers,
// Retry-After, and a problem body.
func (s *Server) denyWith(w http.ResponseWriter, v credit.Verdict, status int) {
	setHeaders(w.Header(), v.Decision)
	problem(w, status, "rate-limited", "Too Many Requests", denial(v))
}

// gatewayIdentifier is o.Identity with the gateways trusted as proxies: a
// forward-auth request's client is the right-most address of its
// X-Forwarded-For that is not a gateway's or a trusted proxy's.
func gatewayIdentifier(o Options) Identifier {
	id := o.Identity
	id.Trusted = append(append([]netip.Prefix(nil), o.Identity.Trusted...), o.Gateways...)
	return id
}

// finishNothing is finishTicket's outcome for a status that gives the
// ticket's request nothing back: nothing was done.
const finishNothing limiter.FinishOutcome = 0

// finishTicket finishes a request of one ticket with its response's status
// (a gateway's access log): a 304 gives its charge back, and any status a
// concurrency limit's units, once. It says what finishing did.
func (s *Server) finishTicket(ctx context.Context, id string, status int) (limiter.FinishOutcome, error) {
	v, err := s.readTicket(id)
	if err != nil {
		return 0, err
	}
	if v.Policy.Algorithm.GivesBack(status, v.Cost) == 0 {
		return finishNothing, nil
	}
	now := s.o.Clock.Now()
	if !now.Before(v.Expires()) || (!v.Decided && v.ChargeSeq == 0) {
		return limiter.FinishLate, nil // nothing left to give back
	}
	ctx, cancel := context.WithTimeout(ctx, finishTimeout)
	defer cancel()
	res, err := s.core.Finish(ctx, v, status, now)
	if err == nil && res.Outcome != limiter.AlreadyFinished && res.Outcome != limiter.FinishLate {
		s.recordFinish(v, res, now)
	}
	return res.Outcome, err
}
