package edge

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"

	"github.com/tallyhq/tally/internal/backoff"
	"github.com/tallyhq/tally/internal/limiter"
)

// The terms an edge holds requests to — its policies, the routes that
// name them, the tiers and overrides that change their limits — in one
// value the edge swaps at once (SetLimits): a reload takes effect for the
// next request, without dropping one in flight, and a policy's windows
// outlive a change of its terms (credit.Core adopts the new terms).

// Limits are the terms an edge holds requests to, which it can take anew
// while it runs.
type Limits struct {
	Policies map[string]limiter.Policy
	Routes   []Route
	// DefaultPolicy applies to paths no route matches; empty passes them
	// through unlimited (global policies still apply).
	DefaultPolicy string
	// GlobalPolicies hold every proxied request beside its route's
	// policies: e.g. a limit per client address that a client rotating
	// its tokens cannot escape.
	GlobalPolicies []string
	// AddressKeyed names the policies whose windows are keyed by the
	// client's address (Identifier.Address) even when the request carries
	// an identity header.
	AddressKeyed map[string]bool
	// Tiers give a policy other limits by the client's plan, named by a
	// header (in proxy mode believed only from trusted proxies) or the
	// decision API's "tier".
	Tiers map[string]Tiers
	// Overrides give one identity of a policy another limit.
	Overrides map[string][]Override
	// Backoff, by policy, makes the Retry-After of a client that keeps
	// sending while denied grow (internal/backoff); policies not named
	// have none.
	Backoff map[string]backoff.Config
}

// Route holds the requests it matches to policies: by path prefix, and,
// when set, by method and host. The route with the longest path wins; among
// equal paths one naming a host, then one naming methods.
type Route struct {
	// Path is a prefix: "/search" matches /search and /search/code. It is
	// cleaned like request paths (path.Clean) before matching.
	Path string
	// Methods, when set, are the methods the route matches (GET, POST, …).
	Methods []string
	// Host, when set, is the host the route matches (the request's Host,
	// without its port, compared without case); "*.example.com" matches
	// every name below example.com.
	Host string
	// Policies are the limits a request to the path is held to; it is
	// allowed only if every one allows it.
	Policies []string
	// Cost, when positive, overrides the cost of the route's policies.
	Cost int64
}

// Tiers are a policy's limits by plan.
type Tiers struct {
	// Header names the client's plan on a proxied request.
	Header string
	// Limits are the limit of each plan; a plan not listed keeps the
	// policy's.
	Limits map[string]int64
}

// Override is one identity's limit under a policy: the identity as the
// edge reads it (the identity header's value, or "ip:" and the address
// prefix without one), or as the decision API is given it.
type Override struct {
	Identity string
	Limit    int64
}

// limit is one policy a request is held to, resolved: its cost overridden
// by the route, and whether it is keyed by the client's address whatever
// identity the request carries.
type limit struct {
	policy    limiter.Policy
	byAddress bool
}

// route is a Route resolved: its subtree prefix ("/search" → "/search/"),
// its methods and host, and its limits, the global ones included.
type route struct {
	Route
	under   string
	methods map[string]bool // nil: any
	host    string          // "": any; "*.x" a suffix ".x"
	limits  []limit
}

// routing is Limits resolved, read by every request.
type routing struct {
	policies  map[string]limiter.Policy
	routes    []route // longest path first; host, then methods, first among equals
	fallback  []limit // for requests no route matches
	tiers     map[string]Tiers
	overrides map[limiter.Digest]int64 // a window's limit, by its key's digest
	keyed     map[string]bool          // policies some override names (a lookup needed)
	backoff   map[string]backoff.Config
	// concurrent: some policy is a concurrency limit, so a gateway's
	// access-log entry of any status may finish a request (accesslog.go).
	concurrent bool
}

var errNoPolicies = errors.New("no policy")

// SetLimits makes l the terms the edge holds requests to, at once for the
// next request. It refuses terms that do not hold together and keeps the
// terms in effect then.
func (s *Server) SetLimits(l Limits) error {
	rt := &routing{policies: l.Policies, tiers: l.Tiers, overrides: map[limiter.Digest]int64{}, keyed: map[string]bool{},
		backoff: map[string]backoff.Config{}}
	for name, b := range l.Backoff {
		if _, ok := l.Policies[name]; !ok {
			return fmt.Errorf("backoff of unknown policy %q", name)
		}
		if err := b.Validate(); err != nil {
			return fmt.Errorf("policy %q: backoff: %w", name, err)
		}
		rt.backoff[name] = b.WithDefaults()
	}
	for _, p := range l.Policies {
		if err := p.Validate(); err != nil {
			return err
		}
		rt.concurrent = rt.concurrent || p.Algorithm == limiter.Concurrency
	}
	resolve := func(names []string, cost int64) ([]limit, error) {
		out := make([]limit, 0, len(names)+len(l.GlobalPolicies))
		seen := map[string]bool{}
		for i, name := range append(slices.Clip(names), l.GlobalPolicies...) {
			p, ok := l.Policies[name]
			if !ok {
				return nil, fmt.Errorf("unknown policy %q", name)
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			if cost > 0 && i < len(names) {
				if cost > p.Limit {
					return nil, fmt.Errorf("cost %d above policy %q's limit %d", cost, name, p.Limit)
				}
				p.Cost = cost
			}
			out = append(out, limit{policy: p, byAddress: l.AddressKeyed[name]})
		}
		return out, nil
	}
	for _, r := range l.Routes {
		r.Path = cleanPath(r.Path)
		if len(r.Policies) == 0 {
			return fmt.Errorf("route %s: %w", r.Path, errNoPolicies)
		}
		limits, err := resolve(r.Policies, r.Cost)
		if err != nil {
			return fmt.Errorf("route %s: %w", r.Path, err)
		}
		rr := route{Route: r, under: strings.TrimSuffix(r.Path, "/") + "/", host: strings.ToLower(r.Host), limits: limits}
		if len(r.Methods) > 0 {
			rr.methods = map[string]bool{}
			for _, m := range r.Methods {
				rr.methods[strings.ToUpper(m)] = true
			}
		}
		rt.routes = append(rt.routes, rr)
	}
	sort.SliceStable(rt.routes, func(i, j int) bool {
		a, b := &rt.routes[i], &rt.routes[j]
		if len(a.Path) != len(b.Path) {
			return len(a.Path) > len(b.Path)
		}
		if (a.host != "") != (b.host != "") {
			return a.host != ""
		}
		return a.methods != nil && b.methods == nil
	})
	var def []string
	if l.DefaultPolicy != "" {
		def = []string{l.DefaultPolicy}
	}
	var err error
	if rt.fallback, err = resolve(def, 0); err != nil {
		return fmt.Errorf("default and global policies: %w", err)
	}
	// The most any request costs under each policy: a tier's or an
	// override's limit below it would refuse such requests whatever their
	// window says.
	cost := map[string]int64{}
	for name, p := range l.Policies {
		cost[name] = p.CostOrDefault()
	}
	for _, r := range rt.routes {
		for _, lm := range r.limits {
			cost[lm.policy.Name] = max(cost[lm.policy.Name], lm.policy.CostOrDefault())
		}
	}
	for name, ts := range l.Tiers {
		if _, ok := l.Policies[name]; !ok {
			return fmt.Errorf("tiers of unknown policy %q", name)
		}
		for plan, lim := range ts.Limits {
			if lim < cost[name] || lim > limiter.MaxLimit {
				return fmt.Errorf("policy %q, tier %q: limit %d: want %d (what a request costs) to %d", name, plan, lim, cost[name], limiter.MaxLimit)
			}
		}
	}
	for name, os := range l.Overrides {
		if _, ok := l.Policies[name]; !ok {
			return fmt.Errorf("overrides of unknown policy %q", name)
		}
		for _, o := range os {
			if o.Limit < cost[name] || o.Limit > limiter.MaxLimit || o.Identity == "" {
				return fmt.Errorf("policy %q: an override needs an identity and a limit from %d (what a request costs) to %d", name, cost[name], limiter.MaxLimit)
			}
			id := o.Identity
			if !strings.HasPrefix(id, "ip:") {
				id = "h:" + limiter.NormaliseCredential(s.o.Identity.Header, id)
			}
			rt.overrides[s.o.Keys.Sum(name, id)] = o.Limit
			rt.keyed[name] = true
		}
	}
	s.limits.Store(rt)
	return nil
}

// limitsFor returns the limits a request is held to (none: not limited):
// its path (requestPath's: no dot segments, no empty segments), method and
// host.
func (rt *routing) limitsFor(p, method, host string) []limit {
	for i := range rt.routes {
		r := &rt.routes[i]
		if (p == r.Path || strings.HasPrefix(p, r.under)) && (r.methods == nil || r.methods[method]) && r.matchesHost(host) {
			return r.limits
		}
	}
	return rt.fallback
}

func (r *route) matchesHost(host string) bool {
	switch {
	case r.host == "":
		return true
	case strings.HasPrefix(r.host, "*."):
		return strings.HasSuffix(host, r.host[1:])
	}
	return host == r.host
}

// requestHost is r's host as routes match it.
func requestHost(r *http.Request) string { return hostOnly(r.Host) }

// hostOnly is a Host value as routes match it: without its port, lower
// case.
func hostOnly(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.HasSuffix(h, "]") {
		h = h[:i]
	}
	return strings.ToLower(strings.Trim(h, "[]"))
}

// terms are p's terms for one client: its tier's limit (plan: "" for none),
// then its identity's override (the window's digest), whichever applies.
func (rt *routing) terms(p limiter.Policy, plan string, dg limiter.Digest) limiter.Policy {
	if plan != "" {
		if lim, ok := rt.tiers[p.Name].Limits[plan]; ok {
			p = p.WithLimit(lim)
		}
	}
	if rt.keyed[p.Name] {
		if lim, ok := rt.overrides[dg]; ok {
			p = p.WithLimit(lim)
		}
	}
	return p
}

// plan is the client's plan for p on a proxied request: the tier header's
// value, believed only from a trusted proxy (anyone else could name any
// plan).
func (s *Server) plan(rt *routing, p limiter.Policy, r *http.Request, id Identifier) string {
	ts, ok := rt.tiers[p.Name]
	if !ok || ts.Header == "" || !id.trusted(parseAddr(r.RemoteAddr)) {
		return ""
	}
	return r.Header.Get(ts.Header)
}
