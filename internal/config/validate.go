// Package config reads Tally's configuration file: one YAML file for a
// deployment, from which the edge-checker and the accountant each take the
// sections they need. Errors name the line and the field. Environment
// variables override addresses and secrets (Env), so that secrets need not
// be written in the file.
//
// docs/configuration.md describes every field and its default.
package config

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	pathpkg "path"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/deploy"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/edge"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
	"github.com/tallyhq/tally/internal/servertls"
	"github.com/tallyhq/tally/internal/setting"
	"github.com/tallyhq/tally/internal/shard"
)

func fieldErr(path, format string, args ...any) error {
	return setting.Errorf(ErrInvalid, path, format, args...)
}

// withDefaults sets the defaults of the file's own fields (those no
// component owns: the key prefix, the NATS address, the edge's listeners).
// A component's section keeps its zero values: the component applies its
// own defaults (its WithDefaults), and Validate judges them.
func (f *File) withDefaults() {
	if f.KeyPrefix == "" {
		f.KeyPrefix = "tally"
	}
	if f.NATS.URL == "" {
		f.NATS.URL = "nats://127.0.0.1:4222"
	}
	f.Edge = f.Edge.withDefaults()
	if c := &f.Serve.NATS.Cluster; c.On() {
		if c.Name == "" {
			c.Name = "tally"
		}
		// R3 from three servers: every accounting event kept through the
		// loss of any one.
		if f.NATS.Streams.Replicas == 0 && len(c.Routes) >= 2 {
			f.NATS.Streams.Replicas = 3
		}
	}
}

// withDefaults is e with the defaults of its own fields.
func (e Edge) withDefaults() Edge {
	if e.AdminListen == "" {
		e.AdminListen = "127.0.0.1:9090"
	}
	if e.OnRedisError == "" {
		e.OnRedisError = "allow"
	}
	if e.MaxHeaderBytes == 0 {
		e.MaxHeaderBytes = 16 << 10
	}
	for _, d := range e.timeouts() {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if e.ShutdownTimeout == 0 {
		e.ShutdownTimeout = 15 * time.Second
	}
	if e.Identity.IPv4Prefix == 0 {
		e.Identity.IPv4Prefix = 32
	}
	if e.Identity.IPv6Prefix == 0 {
		e.Identity.IPv6Prefix = 64
	}
	if e.Metrics.Listen != "" && e.Metrics.Path == "" {
		e.Metrics.Path = "/metrics"
	}
	if x := &e.RLS.XDS; x.On() {
		if x.NodeID == "" {
			x.NodeID = "default"
		}
		if x.BackoffInitial == 0 {
			x.BackoffInitial = 500 * time.Millisecond
		}
		if x.BackoffMax == 0 {
			x.BackoffMax = 30 * time.Second
		}
		if x.MaxMessageBytes == 0 {
			x.MaxMessageBytes = 4 << 20
		}
	}
	return e
}

type timeout struct {
	field string
	v     *time.Duration
	def   time.Duration
}

func (e *Edge) timeouts() []timeout {
	return []timeout{{"read_header_timeout", &e.ReadHeaderTimeout, 5 * time.Second}, {"read_timeout", &e.ReadTimeout, 30 * time.Second},
		{"write_timeout", &e.WriteTimeout, 60 * time.Second}, {"idle_timeout", &e.IdleTimeout, 120 * time.Second},
		{"shutdown_timeout", &e.ShutdownTimeout, 15 * time.Second}}
}

// problems collects what is wrong with a file, in the order it is checked:
// each a *setting.Error naming its field, or an error of the file as a
// whole (the environment's).
type problems []error

// add records err, if any.
func (ps *problems) add(err error) {
	if err != nil {
		*ps = append(*ps, err)
	}
}

// in records a section's error with its field placed under the section's
// path (setting.In).
func (ps *problems) in(prefix string, err error) {
	if err != nil {
		ps.add(setting.In(prefix, err))
	}
}

// field records that the setting at path cannot be used.
func (ps *problems) field(path, format string, args ...any) {
	ps.add(fieldErr(path, format, args...))
}

// validate checks every field once, after withDefaults: the file's own
// fields here, each component's section by its Validate (which reports its
// first error). A bad item does not stop the check: every problem is
// recorded in ps, and a check that depends on an item already found bad is
// skipped rather than reported twice.
func (f *File) validate(ps *problems) {
	secret := f.KeySecret
	if secret == nil { // the secret's own problem is the environment's (applyEnv): judge the prefix alone
		secret = make([]byte, limiter.MinSecretLen)
	}
	if _, err := limiter.NewKeySpace(f.KeyPrefix, secret); err != nil {
		ps.field("key_prefix", "%v", err)
	}
	for _, err := range shard.Problems(f.Redis.Shards) {
		ps.in("redis", err)
	}
	f.Redis.validate(ps, f.StoreOptions())
	for _, one := range strings.Split(f.NATS.URL, ",") { // a cluster's servers
		if u, err := url.Parse(strings.TrimSpace(one)); err != nil || u.Host == "" {
			ps.field("nats.url", "%q: want nats://host:port, or several separated by commas", f.NATS.URL)
			break
		}
	}
	ps.in("nats.streams", f.NATS.Streams.Validate())
	f.validatePolicies(ps)
	f.validateSecurity(ps)
	ps.in("accountant", f.Accountant.Validate())
	f.validateEdge(ps)
}

// validate places the store's verdict on the file's fields: the three
// timeouts the store has are one setting here.
func (r Redis) validate(ps *problems, o redisstore.Options) {
	names := map[string]bool{}
	for _, s := range r.Shards {
		names[s.Name] = true
	}
	for _, l := range []struct {
		field string
		names []string
	}{{"redis.placement", r.Placement}, {"redis.previous_placement", r.PreviousPlacement}} {
		seen := map[string]bool{}
		for _, n := range l.names {
			if !names[n] || seen[n] {
				ps.field(l.field, "%q: want names of shards in redis.shards, each once", n)
			}
			seen[n] = true
		}
	}
	err := o.Validate()
	var e *setting.Error
	switch {
	case !errors.As(err, &e):
		ps.add(err)
	case e.Field == "dial_timeout" || e.Field == "read_timeout" || e.Field == "write_timeout":
		ps.field("redis.timeout", "%s", e.Msg)
	default:
		ps.in("redis", err)
	}
}

// validatePolicies checks the policies, then the routes and the edge's
// default and global policies that name them.
func (f *File) validatePolicies(ps *problems) {
	named := map[string]bool{} // every policy's name, valid or not
	// usable are the policies a route's cost can be judged against: valid,
	// and named once.
	usable := map[string]bool{}
	for i, p := range f.Policies {
		path := fmt.Sprintf("policies[%d]", i)
		lp := p.Limiter()
		calendarOK := p.validateWindows(ps, path) && p.validateAlgorithm(ps, path)
		if !calendarOK {
			// Its other terms are judged as those of a valid calendar.
			lp.Calendar, lp.Window, lp.Location = limiter.Day, limiter.Day.Longest(), nil
			lp.Algorithm, lp.Slices, lp.Align, lp.Rate, lp.Every = "", 0, false, 0, 0
		}
		err := lp.Validate()
		ps.in(path, err)
		usable[p.Name] = err == nil && calendarOK && !named[p.Name]
		if named[p.Name] {
			ps.field(path+".name", "duplicate policy %q", p.Name)
		}
		if p.Key != "" && p.Key != KeyIdentity && p.Key != KeyAddress {
			ps.field(path+".key", "%q: want identity or address", p.Key)
		}
		p.validateTerms(ps, path)
		named[p.Name] = true
	}
	f.validateRoutes(ps, usable)
	if d := f.Edge.DefaultPolicy; d != "" && !named[d] {
		ps.field("edge.default_policy", "unknown policy %q", d)
	}
	for i, name := range f.Edge.GlobalPolicies {
		if !named[name] {
			ps.field(fmt.Sprintf("edge.global_policies[%d]", i), "unknown policy %q", name)
		}
	}
	if len(f.Policies) == 0 && (f.Edge.Listen != "" || f.Edge.APIListen != "" || f.Edge.ForwardAuth.Listen != "") {
		ps.field("policies", "the edge needs at least one policy (the rate-limit service, edge.rls, needs none)")
	}
}

// validateRoutes checks each route: its path, methods and host, that no
// other route is the same, and its policies (their cost against those in
// usable).
func (f *File) validateRoutes(ps *problems, usable map[string]bool) {
	byName := f.PolicyMap()
	paths := map[string]bool{}
	for i, r := range f.Routes {
		path := fmt.Sprintf("routes[%d]", i)
		before := len(*ps)
		if !strings.HasPrefix(r.Path, "/") {
			ps.field(path+".path", "%q: want a path starting with /", r.Path)
		}
		methods := make([]string, len(r.Methods))
		for j, m := range r.Methods {
			if !validToken(m) {
				ps.field(fmt.Sprintf("%s.methods[%d]", path, j), "%q: want a method (GET, POST, …)", m)
			}
			methods[j] = strings.ToUpper(m)
		}
		sort.Strings(methods)
		if h := r.Host; h != "" && !validHost(h) {
			ps.field(path+".host", "%q: want a host name, or *. and a domain", h)
		}
		if len(*ps) == before { // only a well-formed route is compared with the others
			key := pathpkg.Clean(r.Path) + " " + strings.Join(methods, ",") + " " + strings.ToLower(r.Host)
			if paths[key] {
				ps.field(path+".path", "duplicate route %q (same methods and host)", r.Path)
			}
			paths[key] = true
		}
		field := path + ".policy"
		switch {
		case r.Policy != "" && len(r.Policies) > 0:
			ps.field(path, "set policy or policies, not both")
			continue
		case len(r.Policies) > 0:
			field = path + ".policies"
		case r.Policy == "":
			ps.field(field, "missing: the route's policy")
			continue
		}
		costBad := false
		for _, name := range r.Names() {
			p, ok := byName[name]
			switch {
			case !ok:
				ps.field(field, "unknown policy %q (known: %s)", name, strings.Join(sortedKeys(byName), ", "))
			case usable[name] && !costBad && (r.Cost < 0 || r.Cost > p.Limit):
				ps.field(path+".cost", "%d: want 1 to the limit of policy %q (%d)", r.Cost, name, p.Limit)
				costBad = true
			}
		}
	}
}

func (f *File) validateEdge(ps *problems) {
	e := &f.Edge
	if e.Listen != "" {
		u, err := url.Parse(e.Upstream)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			ps.field("edge.upstream", "%q: proxy mode (edge.listen) needs an http(s) upstream URL", e.Upstream)
		}
	}
	if e.OnRedisError != "allow" && e.OnRedisError != "deny" {
		ps.field("edge.on_redis_error", "%q: want allow or deny", e.OnRedisError)
	}
	if e.MaxHeaderBytes < 1024 || e.MaxHeaderBytes > 1<<20 {
		ps.field("edge.max_header_bytes", "%d: want 1024 to 1048576", e.MaxHeaderBytes)
	}
	badTimeout := map[string]bool{}
	for _, d := range e.timeouts() {
		if *d.v < 100*time.Millisecond || *d.v > time.Hour {
			ps.field("edge."+d.field, "%v: want 100ms to 1h", *d.v)
			badTimeout[d.field] = true
		}
	}
	if !badTimeout["read_header_timeout"] && !badTimeout["read_timeout"] && e.ReadHeaderTimeout > e.ReadTimeout {
		ps.field("edge.read_header_timeout", "%v: want at most read_timeout (%v)", e.ReadHeaderTimeout, e.ReadTimeout)
	}
	id := &e.Identity
	if id.IPv4Prefix < 8 || id.IPv4Prefix > 32 {
		ps.field("edge.identity.ipv4_prefix", "%d: want 8 to 32", id.IPv4Prefix)
	}
	if id.IPv6Prefix < 16 || id.IPv6Prefix > 128 {
		ps.field("edge.identity.ipv6_prefix", "%d: want 16 to 128", id.IPv6Prefix)
	}
	for i, c := range id.TrustedProxies {
		if _, err := parsePrefix(c); err != nil {
			ps.field(fmt.Sprintf("edge.identity.trusted_proxies[%d]", i), "%q: want an address or CIDR", c)
		}
	}
	f.validateRLS(ps)
	f.validateXDSNumbers(ps)
	f.validateServe(ps)
	f.validateForwardAuth(ps)
	ps.in("edge.outbox", e.Outbox.Validate())
	ps.in("edge.credit", e.Credit.Validate())
	ps.in("edge.decisions", e.Decisions.Validate())
}

// validateTerms checks a policy's tiers, overrides and backoff.
// validateWindows checks where p's windows open (windows, period,
// time_zone), and reports false when p's windows are on the calendar but
// its period or its zone cannot be used.
func (p Policy) validateWindows(ps *problems, path string) bool {
	switch p.Windows {
	case "", WindowsFirstRequest, WindowsClock:
		if p.Period != "" {
			ps.field(path+".period", "%q: a period is for windows: calendar (windows: %s)", p.Period, p.windowsOrDefault())
		}
		if p.TimeZone != "" {
			ps.field(path+".time_zone", "%q: a time zone is for windows: calendar (windows: %s)", p.TimeZone, p.windowsOrDefault())
		}
		return true
	case WindowsCalendar:
	default:
		ps.field(path+".windows", "%q: want first_request, clock or calendar", p.Windows)
		return true
	}
	ok := true
	switch {
	case p.Period == "":
		ps.field(path+".period", "missing: windows: calendar needs period: day, week, month or year")
		ok = false
	case limiter.Period(p.Period).Validate() != nil:
		ps.field(path+".period", "%q: want day, week, month or year", p.Period)
		ok = false
	}
	if p.Window != 0 {
		ps.field(path+".window", "%v: a calendar window lasts its period (%s), leave window out", p.Window, p.Period)
	}
	if _, err := limiter.LoadZone(p.TimeZone); err != nil {
		ps.field(path+".time_zone", "%v", err)
		ok = false
	}
	return ok
}

// validateAlgorithm checks the terms of p's algorithm — a sliding window's
// window and slices, a concurrency limit's lease — and reports false when
// its sub-windows cannot be made (its other terms are then judged as a
// valid window's).
func (p Policy) validateAlgorithm(ps *problems, path string) bool {
	if p.Algorithm != limiter.Concurrency && p.Lease != 0 {
		ps.field(path+".lease", "%v: a lease is a concurrency limit's (algorithm: concurrency)", p.Lease)
	}
	if p.Algorithm != limiter.TokenBucket && p.Burst != 0 {
		ps.field(path+".burst", "%d: a burst is a token bucket's (algorithm: token_bucket)", p.Burst)
	}
	if p.Algorithm == limiter.Concurrency {
		return p.validateConcurrency(ps, path)
	}
	if p.Algorithm == limiter.TokenBucket {
		return p.validateBucket(ps, path)
	}
	if p.Algorithm != limiter.SlidingWindow {
		if p.Slices != 0 {
			ps.field(path+".slices", "%d: slices are a sliding window's (algorithm: sliding_window)", p.Slices)
		}
		return true
	}
	if p.Windows != "" {
		ps.field(path+".windows", "%q: a sliding window's sub-windows are aligned to the clock; leave windows out", p.Windows)
		return false
	}
	n := p.slices()
	if n < 2 || n > limiter.MaxSlices {
		ps.field(path+".slices", "%d: want 2 to %d", p.Slices, limiter.MaxSlices)
		return false
	}
	if p.Window <= 0 || p.Window%(time.Duration(n)*time.Second) != 0 {
		ps.field(path+".window", "%v: a sliding window of %d slices lasts a multiple of %ds (whole-second sub-windows)", p.Window, n, n)
		return false
	}
	return true
}

// validateConcurrency checks a concurrency limit's lease, and that it names
// none of a window's terms.
func (p Policy) validateConcurrency(ps *problems, path string) bool {
	ok := true
	for _, f := range []struct {
		name string
		set  bool
	}{{"window", p.Window != 0}, {"windows", p.Windows != ""}, {"slices", p.Slices != 0}} {
		if f.set {
			ps.field(path+"."+f.name, "a concurrency limit has no window: its requests' units are held for a lease; leave %s out", f.name)
			ok = false
		}
	}
	if p.Lease < limiter.MinWindow || 2*p.Lease > limiter.MaxWindow || p.Lease%time.Second != 0 {
		ps.field(path+".lease", "%v: want whole seconds from %v to %v", p.Lease, limiter.MinWindow, limiter.MaxWindow/2)
		ok = false
	}
	return ok
}

// validateBucket checks a token bucket's burst, and that it names none of
// a window's other terms; its rate (limit per window) is the limiter's to
// judge.
func (p Policy) validateBucket(ps *problems, path string) bool {
	ok := true
	for _, f := range []struct {
		name string
		set  bool
	}{{"windows", p.Windows != ""}, {"slices", p.Slices != 0}} {
		if f.set {
			ps.field(path+"."+f.name, "a token bucket refills continuously: it has no windows to open or slice; leave %s out", f.name)
			ok = false
		}
	}
	if p.Burst < 0 || p.Burst > limiter.MaxLimit {
		ps.field(path+".burst", "%d: want 1 to %d", p.Burst, limiter.MaxLimit)
		ok = false
	}
	if p.Window < time.Second || p.Window > limiter.MaxBucketEvery || p.Window%time.Second != 0 {
		ps.field(path+".window", "%v: a token bucket refills its limit every whole number of seconds, 1s to %v", p.Window,
			limiter.MaxBucketEvery)
		ok = false
	}
	return ok
}

func (p Policy) windowsOrDefault() string {
	if p.Windows == "" {
		return WindowsFirstRequest
	}
	return p.Windows
}

func (p Policy) validateTerms(ps *problems, path string) {
	ps.in(path+".backoff", p.Backoff.Validate())
	limitOK := func(v int64) bool { return v >= max(1, p.Cost) && v <= limiter.MaxLimit }
	if t := p.Tiers; t != nil {
		if !validToken(t.Header) {
			ps.field(path+".tiers.header", "%q: want a header name (X-Plan)", t.Header)
		}
		if len(t.Limits) == 0 {
			ps.field(path+".tiers.limits", "empty: give each plan its limit")
		}
		for _, plan := range sortedKeys(t.Limits) {
			if plan == "" || len(plan) > 256 {
				ps.field(path+".tiers.limits", "a plan's name: want 1 to 256 bytes")
				continue
			}
			if v := t.Limits[plan]; !limitOK(v) {
				ps.field(path+".tiers.limits."+plan, "%d: want %d to %d", v, max(1, p.Cost), limiter.MaxLimit)
			}
		}
	}
	seen := map[string]bool{}
	for i, o := range p.Overrides {
		f := fmt.Sprintf("%s.overrides[%d]", path, i)
		switch {
		case o.Identity == "" || len(o.Identity) > 4096:
			ps.field(f+".identity", "want 1 to 4096 bytes")
		case seen[o.Identity]:
			ps.field(f+".identity", "given twice")
		}
		if !limitOK(o.Limit) {
			ps.field(f+".limit", "%d: want %d to %d", o.Limit, max(1, p.Cost), limiter.MaxLimit)
		}
		seen[o.Identity] = true
	}
}

// validToken reports whether s is an HTTP token (a method, a header name).
func validToken(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// validHost reports whether h names a host, or every name below a domain
// ("*.example.com").
func validHost(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == ':' || c == '[' || c == ']') {
			return false
		}
	}
	return true
}

// validateForwardAuth checks the forward-auth listener's settings.
func (f *File) validateForwardAuth(ps *problems) {
	fa := &f.Edge.ForwardAuth
	if fa.Listen == "" {
		if len(fa.Gateways) > 0 || fa.LogListen != "" {
			ps.field("edge.forward_auth.listen", "empty: set it to answer the gateways")
		}
		return
	}
	if len(fa.Gateways) == 0 {
		ps.field("edge.forward_auth.gateways", "empty: name the gateways' addresses (only their requests are believed)")
	}
	for i, g := range fa.Gateways {
		if _, err := parsePrefix(g); err != nil {
			ps.field(fmt.Sprintf("edge.forward_auth.gateways[%d]", i), "%q: want an address or CIDR", g)
		}
	}
}

// Gateways are edge.forward_auth.gateways as prefixes.
func (f *File) Gateways() []netip.Prefix {
	var out []netip.Prefix
	for _, g := range f.Edge.ForwardAuth.Gateways {
		if p, err := parsePrefix(g); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// validateRLS checks the rate-limit service's settings and reads its rules.
func (f *File) validateRLS(ps *problems) {
	r := &f.Edge.RLS
	if r.Listen == "" {
		switch {
		case r.Config != "":
			ps.field("edge.rls.listen", "empty: set it to serve the rules of edge.rls.config")
		case r.XDS.On():
			ps.field("edge.rls.listen", "empty: set it to serve the rules of edge.rls.xds")
		case r.HTTPListen != "":
			ps.field("edge.rls.listen", "empty: set it with edge.rls.http_listen")
		}
		return
	}
	modeOK := true
	switch r.Mode {
	case "", limiter.ModeAuto, limiter.ModeExact, limiter.ModeAsync:
	default:
		ps.field("edge.rls.mode", "%q: want auto, exact or async", r.Mode)
		modeOK = false
	}
	switch {
	case r.Config != "" && r.XDS.On():
		ps.field("edge.rls.xds", "set with edge.rls.config: take the rules from a directory or from xDS, not both")
	case r.Config == "" && !r.XDS.On():
		ps.field("edge.rls.config", "empty: name the directory of envoyproxy/ratelimit configuration files (or set edge.rls.xds.server)")
	}
	for i, d := range r.ChargeAtEnd {
		if d == "" {
			ps.field(fmt.Sprintf("edge.rls.charge_at_end[%d]", i), "empty: name a domain")
		}
	}
	for i, d := range r.ClockWindows {
		if d == "" {
			ps.field(fmt.Sprintf("edge.rls.clock_windows[%d]", i), "empty: name a domain, or * for every domain")
		}
	}
	if r.HTTPListen != "" {
		if _, _, err := net.SplitHostPort(r.HTTPListen); err != nil {
			ps.field("edge.rls.http_listen", "%q: want host:port", r.HTTPListen)
		}
	}
	if r.XDS.On() {
		f.validateXDS(ps)
	}
	if r.Config == "" || r.XDS.On() {
		return
	}
	c, err := descriptors.LoadDir(r.Config, r.RuleOptions())
	if err == nil && modeOK { // the rules are judged in the mode they run in
		err = edge.ValidDescriptors(c, r.Mode)
	}
	if err != nil {
		ps.field("edge.rls.config", "%v", err)
		return
	}
	f.descriptors = c
}

// validateXDSNumbers checks the xDS subscription's numbers, whenever
// they are written (defaults fill them only when xDS is on).
func (f *File) validateXDSNumbers(ps *problems) {
	x := &f.Edge.RLS.XDS
	if x.BackoffInitial != 0 && (x.BackoffInitial < 10*time.Millisecond || x.BackoffInitial > 10*time.Minute) {
		ps.field("edge.rls.xds.backoff_initial", "%v: want 10ms to 10m", x.BackoffInitial)
	} else if x.BackoffMax != 0 && (x.BackoffMax < x.BackoffInitial || x.BackoffMax > time.Hour) {
		ps.field("edge.rls.xds.backoff_max", "%v: want backoff_initial (%v) to 1h", x.BackoffMax, x.BackoffInitial)
	}
	if x.MaxMessageBytes != 0 && (x.MaxMessageBytes < 1<<10 || x.MaxMessageBytes > 256<<20) {
		ps.field("edge.rls.xds.max_message_bytes", "%d: want 1 KiB to 256 MiB", x.MaxMessageBytes)
	}
}

// validateXDS checks the xDS subscription's settings.
func (f *File) validateXDS(ps *problems) {
	x := &f.Edge.RLS.XDS
	if host, port, err := net.SplitHostPort(x.Server); err != nil || host == "" || port == "" {
		ps.field("edge.rls.xds.server", "%q: want host:port", x.Server)
	}
	var err error
	if f.xdsTLS, err = x.TLS.Config(); err != nil {
		ps.field("edge.rls.xds.tls", "%v", err)
	}
}

// XDSTLS is the TLS of the connection to the xDS management server; nil
// when it is plain.
func (f *File) XDSTLS() *tls.Config {
	if f.xdsTLS == nil {
		return nil
	}
	return f.xdsTLS.Clone()
}

// validateServe checks tally serve's section: the embedded NATS, which an
// external one (nats.url) excludes.
func (f *File) validateServe(ps *problems) {
	n := &f.Serve.NATS
	if f.natsURLGiven {
		switch {
		case f.Serve.DataDir != "":
			ps.field("serve.data_dir", "set, but nats.url names an external NATS: the data directory is the embedded server's")
		case n.Listen != "" || n.Cluster.On() || len(n.Cluster.Routes) > 0 || n.Name != "":
			ps.field("serve.nats", "set, but nats.url names an external NATS: configure the embedded server or name an external one, not both")
		}
		return
	}
	if n.Listen != "" {
		if _, _, err := net.SplitHostPort(n.Listen); err != nil {
			ps.field("serve.nats.listen", "%q: want host:port", n.Listen)
		}
	}
	if n.TLS.On() && n.Listen == "" {
		ps.field("serve.nats.tls", "set, but serve.nats.listen is empty: nothing listens with it")
	} else {
		ps.in("serve.nats.tls", n.TLS.Validate())
	}
	c := &n.Cluster
	if !c.On() {
		if len(c.Routes) > 0 {
			ps.field("serve.nats.cluster.listen", "empty: the routes need a route listener of this server's")
		}
		if f.NATS.Streams.Replicas > 1 {
			ps.field("nats.streams.replicas", "%d: the embedded server is alone (no serve.nats.cluster): want 1", f.NATS.Streams.Replicas)
		}
		return
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		ps.field("serve.nats.cluster.listen", "%q: want host:port", c.Listen)
	}
	if !validPrefixTokens(c.Name) {
		ps.field("serve.nats.cluster.name", "%q: want letters, digits, _ and -", c.Name)
	}
	for i, r := range c.Routes {
		if _, err := RouteURL(r); err != nil {
			ps.field(fmt.Sprintf("serve.nats.cluster.routes[%d]", i), "%v", err)
		}
	}
	if c.Password == "" {
		ps.field("serve.nats.cluster", "set %s: the routes' password (a server that joins the cluster sees every message)",
			deploy.NATSRoutePasswordEnv)
	}
	if servers := len(c.Routes) + 1; f.NATS.Streams.Replicas > servers {
		ps.field("nats.streams.replicas", "%d: the embedded cluster has %d servers (this one and its routes)", f.NATS.Streams.Replicas, servers)
	}
}

// RouteURL is a route of serve.nats.cluster.routes as a URL: host:port or
// nats-route://host:port (nats:// is taken too), without credentials (the
// password is TALLY_NATS_ROUTE_PASSWORD's).
func RouteURL(route string) (*url.URL, error) {
	s := route
	if !strings.Contains(s, "://") {
		s = "nats-route://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Port() == "" || (u.Scheme != "nats-route" && u.Scheme != "nats") || u.User != nil ||
		(u.Path != "" && u.Path != "/") {
		return nil, fmt.Errorf("%q: want host:port or nats-route://host:port, without credentials", route)
	}
	u.Scheme = "nats-route"
	return u, nil
}

// Descriptors are the rate-limit service's rules as read when the file was
// loaded (nil without edge.rls).
func (f *File) Descriptors() *descriptors.Config { return f.descriptors }

// SetDescriptors replaces the rules read from edge.rls.config (they were
// read again on their own).
func (f *File) SetDescriptors(c *descriptors.Config) { f.descriptors = c }

// validateSecurity refuses what would expose Tally or its data: a decision
// API whose request ids cannot be signed, APIs reachable beyond loopback
// without a token, TLS settings that cannot be loaded.
func (f *File) validateSecurity(ps *problems) {
	e := &f.Edge
	if e.APIListen != "" && f.APIToken == "" && !Loopback(e.APIListen) {
		ps.field("edge.api_listen", "%q is reachable beyond loopback: set %s, the bearer token the API then requires",
			e.APIListen, EnvAPIToken)
	}
	if e.RLS.HTTPListen != "" && f.APIToken == "" && !Loopback(e.RLS.HTTPListen) && !e.RLS.Unauthenticated {
		ps.field("edge.rls.http_listen", "%q is reachable beyond loopback: set %s, the bearer token it then requires "+
			"(or edge.rls.unauthenticated, docs/security.md)", e.RLS.HTTPListen, EnvAPIToken)
	}
	if e.Metrics.Listen != "" && !strings.HasPrefix(e.Metrics.Path, "/") {
		ps.field("edge.metrics.path", "%q: want a path starting with /", e.Metrics.Path)
	}
	if e.RLS.Listen != "" && f.APIToken == "" && !Loopback(e.RLS.Listen) && !e.RLS.Unauthenticated && e.RLS.TLS.ClientCAFile == "" {
		ps.field("edge.rls.listen", "%q is reachable beyond loopback: set %s, the bearer token the rate-limit service then requires "+
			"(Envoy sends it as initial_metadata: authorization: Bearer <token>), or require client certificates (edge.rls.tls.client_ca_file)",
			e.RLS.Listen, EnvAPIToken)
	}
	for _, l := range []struct{ field, addr string }{{"edge.admin_listen", e.AdminListen}, {"accountant.admin_listen", f.Accountant.AdminListen}} {
		if l.addr != "" && f.AdminToken == "" && !Loopback(l.addr) {
			ps.field(l.field, "%q is reachable beyond loopback: set %s, the bearer token /metrics then requires",
				l.addr, EnvAdminToken)
		}
	}
	for _, l := range f.serverTLS() {
		if l.TLS.On() && l.Addr == "" {
			ps.field(l.Field, "set, but %s is empty: nothing listens with it", l.Listen)
			continue
		}
		ps.in(l.Field, l.TLS.Validate())
	}
	var err error
	if f.redisTLS, err = f.Redis.TLS.Config(); err != nil {
		ps.field("redis.tls", "%v", err)
	}
	f.natsOpts = f.NATS.options(ps)
}

// listenerTLS is one listener's TLS settings: the field they are under,
// the listener's address and the field that sets it.
type listenerTLS struct {
	Field, Listen, Addr string
	TLS                 servertls.Config
}

// serverTLS are the TLS settings of every listener of both binaries.
func (f *File) serverTLS() []listenerTLS {
	e := &f.Edge
	return []listenerTLS{
		{"edge.tls", "edge.listen", e.Listen, e.TLS},
		{"edge.api_tls", "edge.api_listen", e.APIListen, e.APITLS},
		{"edge.admin_tls", "edge.admin_listen", e.AdminListen, e.AdminTLS},
		{"edge.rls.tls", "edge.rls.listen", e.RLS.Listen, e.RLS.TLS},
		{"edge.forward_auth.tls", "edge.forward_auth.listen", e.ForwardAuth.Listen, e.ForwardAuth.TLS},
		{"accountant.admin_tls", "accountant.admin_listen", f.Accountant.AdminListen, f.Accountant.AdminTLS},
	}
}

// Loopback reports whether a listen address (host:port) accepts
// connections from this machine only.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// validPrefixTokens reports whether s is subject tokens of [A-Za-z0-9_-]
// separated by dots.
func validPrefixTokens(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return false
		}
		for i := 0; i < len(tok); i++ {
			if c := tok[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '-' {
				return false
			}
		}
	}
	return true
}

// lineOf finds the line of a path like "policies[1].limit" in the document;
// 0 when it is not there (a default, or an override from the environment).
func lineOf(doc *yaml.Node, path string) int {
	line, _ := lookup(doc, path)
	return line
}

// written reports whether the document writes the setting at path (its
// key, or its item, is in the file).
func written(doc *yaml.Node, path string) bool {
	_, ok := lookup(doc, path)
	return ok
}

// lookup finds the setting at path: its line, and whether the document
// has it (else the line of its nearest ancestor the document has).
func lookup(doc *yaml.Node, path string) (int, bool) {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := 0
	if path == "" {
		return line, false
	}
	for _, part := range strings.Split(path, ".") {
		name, idx := part, -1
		if i := strings.IndexByte(part, '['); i >= 0 && strings.HasSuffix(part, "]") {
			name = part[:i]
			idx, _ = strconv.Atoi(part[i+1 : len(part)-1])
		}
		if n == nil || n.Kind != yaml.MappingNode {
			return line, false
		}
		var next *yaml.Node
		for k := 0; k+1 < len(n.Content); k += 2 {
			if n.Content[k].Value == name {
				line, next = n.Content[k].Line, n.Content[k+1]
				break
			}
		}
		if next == nil {
			return line, false
		}
		n = next
		if idx >= 0 {
			if n.Kind != yaml.SequenceNode || idx >= len(n.Content) {
				return line, false
			}
			n = n.Content[idx]
			line = n.Line
		}
	}
	return line, true
}

// parsePrefix reads a CIDR, or a single address as a full-length prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
