package config

import (
	"fmt"
	"reflect"
	"sort"
)

// Changes say how next differs from f: what a running edge takes at once
// (its limits: policies, routes, tiers, overrides, backoff), a line each, and the
// sections that take effect only at the next start.
func (f *File) Changes(next *File) (limits []string, restart []string) {
	a, b := f.PolicyMap(), next.PolicyMap()
	for _, name := range sortedKeys(b) {
		old, ok := a[name]
		switch {
		case !ok:
			limits = append(limits, fmt.Sprintf("added policy %s: %d per %s", name, b[name].Limit, b[name].Per()))
		case old != b[name]:
			limits = append(limits, fmt.Sprintf("changed policy %s: %d per %s → %d per %s", name, old.Limit, old.Per(), b[name].Limit, b[name].Per()))
		}
	}
	for _, name := range sortedKeys(a) {
		if _, ok := b[name]; !ok {
			limits = append(limits, "removed policy "+name)
		}
	}
	la, lb := f.Limits(), next.Limits()
	if !reflect.DeepEqual(la.Routes, lb.Routes) || la.DefaultPolicy != lb.DefaultPolicy || !reflect.DeepEqual(la.GlobalPolicies, lb.GlobalPolicies) {
		limits = append(limits, fmt.Sprintf("routes: %d → %d (default policy %q, global %v)", len(la.Routes), len(lb.Routes), lb.DefaultPolicy, lb.GlobalPolicies))
	}
	for _, name := range sortedKeys(b) {
		if !reflect.DeepEqual(la.Tiers[name], lb.Tiers[name]) {
			limits = append(limits, "changed tiers of "+name)
		}
		if !reflect.DeepEqual(la.Overrides[name], lb.Overrides[name]) {
			limits = append(limits, fmt.Sprintf("overrides of %s: %d → %d", name, len(la.Overrides[name]), len(lb.Overrides[name])))
		}
		if la.Backoff[name] != lb.Backoff[name] {
			limits = append(limits, fmt.Sprintf("backoff of %s: %+v → %+v", name, la.Backoff[name], lb.Backoff[name]))
		}
	}
	if !reflect.DeepEqual(la.AddressKeyed, lb.AddressKeyed) {
		limits = append(limits, "changed which policies are keyed by address")
	}
	for _, s := range []struct {
		name string
		a, b any
	}{
		{"key_prefix", f.KeyPrefix, next.KeyPrefix}, {"redis", f.Redis, next.Redis}, {"nats", f.NATS, next.NATS},
		{"accountant", f.Accountant, next.Accountant}, {"the key secret", f.KeySecret, next.KeySecret},
		{"the tokens", [2]string{f.APIToken, f.AdminToken}, [2]string{next.APIToken, next.AdminToken}},
		{"edge listeners and upstream", edgeListeners(f.Edge), edgeListeners(next.Edge)},
		{"edge.identity", f.Edge.Identity, next.Edge.Identity}, {"edge.credit", f.Edge.Credit, next.Edge.Credit},
		{"edge.outbox", f.Edge.Outbox, next.Edge.Outbox}, {"edge.decisions", f.Edge.Decisions, next.Edge.Decisions},
		{"edge.rls settings", rlsSettings(f.Edge.RLS), rlsSettings(next.Edge.RLS)},
	} {
		if !reflect.DeepEqual(s.a, s.b) {
			restart = append(restart, s.name)
		}
	}
	sort.Strings(restart)
	return limits, restart
}

func edgeListeners(e Edge) []any {
	return []any{e.Listen, e.Upstream, e.APIListen, e.AdminListen, e.OnRedisError, e.MaxHeaderBytes, e.ReadHeaderTimeout,
		e.ReadTimeout, e.WriteTimeout, e.IdleTimeout, e.ShutdownTimeout, e.Source, e.Pprof, e.RLS.Listen,
		e.TLS, e.APITLS, e.AdminTLS, e.ForwardAuth.TLS}
}

// rlsSettings are the rate-limit service's settings but its rules (which
// reload).
func rlsSettings(r RLS) RLS {
	r.Config = ""
	return r
}
