package edge

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/limiter"
)

// Envoy's rate-limit service (envoy.service.ratelimit.v3.RateLimitService):
// the front door Envoy's ratelimit filter calls over gRPC, answering from
// rules written in envoyproxy/ratelimit's YAML (internal/descriptors). Each
// rule is a policy, each distinct list of a descriptor's values an identity
// of it; a request is decided by the decision core like any other, every
// descriptor of it together (credit.Core.DecideRequest), so that a denied
// request consumes nothing. docs/envoy.md says what each answer means.

// A concurrency rule's units are held from the request path's call until
// the call Envoy makes when the stream is done: the first call's answer
// carries the request's tickets as dynamic metadata, RLSTicketsField of
// the ratelimit filter's namespace (envoy.filters.http.ratelimit), and a
// route's rate limit applied on stream done sends them back as a
// descriptor of one entry, RLSFinishKey, whose value is the tickets
// separated by spaces (a metadata action; docs/envoy.md). Each ticket is
// finished once, as /v1/finish finishes it.
const (
	RLSTicketsField = "tally_tickets"
	RLSFinishKey    = "tally_finish"
)

// Bounds of one request (anything beyond is refused as malformed).
const (
	maxRLSDescriptors = 64
	maxRLSEntries     = 32
	maxRLSText        = 1024 // bytes of one entry's key or value
)

// RLSConfig is how the rate-limit service decides.
type RLSConfig struct {
	// Mode is the mode of every rule's policy; "" means ModeAuto.
	Mode limiter.Mode
	// ResponseHeaders adds RateLimit-Limit, RateLimit-Remaining and
	// RateLimit-Reset (of the descriptor closest to its limit) to the
	// answers, for Envoy to add to the client's response, as
	// envoyproxy/ratelimit does with LIMIT_RESPONSE_HEADERS_ENABLED.
	ResponseHeaders bool
	// ChargeAtEnd names the domains whose descriptors carrying their own
	// hits_addend (above 0) are charges of a cost known only once the
	// request is done (Envoy's apply_on_stream_done: the tokens a model
	// answered with): applied in full, even past the limit, and answered
	// OK.
	ChargeAtEnd map[string]bool
	// ClockWindows names the domains whose rules' windows are aligned to
	// the clock (limiter.Policy.Align), as envoyproxy/ratelimit's are; "*"
	// names every domain. The others open at the second of their first
	// request.
	ClockWindows map[string]bool
}

// aligned reports whether domain's windows are aligned to the clock.
func (c RLSConfig) aligned(domain string) bool { return c.ClockWindows["*"] || c.ClockWindows[domain] }

// rlsRules are the loaded rules and their policies (a rule of 0 requests
// has a policy of limit 0: it names the rule's windows in records, and is
// never decided).
type rlsRules struct {
	c        *descriptors.Config
	policies map[*descriptors.Rule]limiter.Policy
	// held are the concurrency rules' policies by name: what a ticket of
	// theirs names (readTicket).
	held map[string]limiter.Policy
}

// newRLSRules turns every rule of c into a policy of o's mode, aligned to
// the clock for the domains o names, refusing what Tally cannot count (a
// limit beyond limiter.MaxLimit).
func newRLSRules(c *descriptors.Config, o RLSConfig) (*rlsRules, error) {
	r := &rlsRules{c: c, policies: make(map[*descriptors.Rule]limiter.Policy, len(c.Rules())), held: map[string]limiter.Policy{}}
	for _, rule := range c.Rules() {
		if rule.Unlimited {
			continue
		}
		p, err := rulePolicy(rule, o.Mode, o.aligned(rule.Domain))
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: %w", descriptors.ErrInvalid, rule.File, rule.Line, err)
		}
		r.policies[rule] = p
		if rule.Concurrency {
			r.held[p.Name] = p
		}
	}
	return r, nil
}

// rulePolicy is the policy of a rule: its window opens at the second of its
// first request, or, aligned (the domain's windows aligned to the clock),
// at the multiple of its unit since the Unix epoch, as the reference's. A
// calendar rule's windows are its unit's periods of its zone's calendar,
// whatever aligned says: the rule says where its windows lie.
func rulePolicy(rule *descriptors.Rule, mode limiter.Mode, aligned bool) (limiter.Policy, error) {
	if rule.Limit > limiter.MaxLimit {
		return limiter.Policy{}, fmt.Errorf("requests_per_unit %d: Tally counts up to %d per window (unlimited: true takes no limit)",
			rule.Limit, limiter.MaxLimit)
	}
	p := limiter.Policy{Name: rlsPolicyName(rule.Key), Limit: rule.Limit, Window: rule.Window(), Mode: mode, Shadow: rule.Shadow,
		Align: aligned}
	if rule.Calendar {
		p.Calendar, p.Location, p.Align = rule.Unit.Period(), rule.Location, false
		p.Window = p.Calendar.Longest()
	}
	if rule.Slices > 0 {
		// Sub-windows of the unit, aligned to the clock.
		p.Algorithm, p.Slices, p.Align = limiter.SlidingWindow, rule.Slices, true
		p.Window = rule.Window() / time.Duration(rule.Slices)
	}
	if rule.Concurrency {
		// Two sub-windows of a lease of one unit, aligned to the clock.
		p.Algorithm, p.Slices, p.Align = limiter.Concurrency, 2, true
	}
	if rule.Burst > 0 {
		// A bucket of Burst refilled requests_per_unit every unit, in
		// periods of a second; one too small to hold credit is decided in
		// mode exact, whatever the domain's mode.
		p = p.Bucket(rule.Burst, rule.Limit, rule.Window())
		if !p.HoldsCredit() {
			p.Mode = limiter.ModeExact
		}
	}
	if p.Limit == 0 {
		return p, nil
	}
	return p, p.Validate()
}

// ruleWindow is what a status of rule says before any window is known —
// the time to the reset of the window a request at now would open: the
// unit, or a calendar rule's next period's first midnight — and the most
// its duration_until_reset can be (the unit, or the longest period).
func ruleWindow(rule *descriptors.Rule, now time.Time) (*durationpb.Duration, time.Duration) {
	if rule.Burst > 0 {
		// A bucket: before anything is known, a full bucket's (the least
		// a duration says, a second); at most the time the burst takes to
		// refill.
		full := limiter.Policy{}.Bucket(rule.Burst, rule.Limit, rule.Window()).Refill(rule.Burst)
		return untilReset(now, now, full), full
	}
	if rule.Slices > 0 || rule.Concurrency {
		// The end of the sub-window (the lease) a request at now falls in.
		p := limiter.Policy{Window: rule.Window() / time.Duration(max(1, rule.Slices)), Align: true}
		return untilReset(p.WindowAt(now).ResetAt, now, rule.Window()), rule.Window()
	}
	if !rule.Calendar {
		return durationpb.New(rule.Window()), rule.Window()
	}
	p := limiter.Policy{Calendar: rule.Unit.Period(), Location: rule.Location}
	longest := p.Calendar.Longest()
	return untilReset(p.WindowAt(now).ResetAt, now, longest), longest
}

// rlsPolicyName names the policy of a rule's full key: readable, and
// distinct for distinct keys (a digest of the key ends it).
func rlsPolicyName(key string) string {
	sum := sha256.Sum256([]byte(key))
	b := make([]byte, 0, 64)
	b = append(b, descriptors.PolicyPrefix...)
	for i := 0; i < len(key) && len(b) < 47; i++ {
		c := key[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-':
		default:
			c = '-'
		}
		b = append(b, c)
	}
	b = append(b, '.')
	return string(hex.AppendEncode(b, sum[:4]))
}

// ValidDescriptors refuses rules the rate-limit service cannot count, with
// the rule's file and line (what SetDescriptors would refuse).
func ValidDescriptors(c *descriptors.Config, mode limiter.Mode) error {
	_, err := newRLSRules(c, RLSConfig{Mode: mode})
	return err
}

// SetDescriptors makes c the rules the rate-limit service answers from:
// at once for the next request, without dropping one in flight. It refuses
// rules Tally cannot count and keeps the rules in effect then.
func (s *Server) SetDescriptors(c *descriptors.Config) error {
	r, err := newRLSRules(c, s.o.RLS)
	if err != nil {
		return err
	}
	s.rls.Store(r)
	return nil
}

// RLSRulesLoaded reports whether the rate-limit service has rules to
// answer from (until then every call is refused).
func (s *Server) RLSRulesLoaded() bool { return s.rls.Load() != nil }

// RateLimitService returns Envoy's rate-limit service, to register on a
// gRPC server (rlsv3.RegisterRateLimitServiceServer).
func (s *Server) RateLimitService() rlsv3.RateLimitServiceServer { return rlsService{s: s} }

type rlsService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Server
}

// rlsItem is one descriptor of a request, resolved.
type rlsItem struct {
	rule      *descriptors.Rule // nil: no rule limits it
	unlimited bool
	check     int // its index among the limits checked, -1: none
	// refused: its cost is beyond the rule's limit (denied by its terms,
	// nothing read).
	refused bool
	// charged, for a charge of a cost known only at the end, is its
	// verdict (never a denial).
	charged *credit.Verdict
	// finish: the descriptor names requests to finish (RLSFinishKey).
	finish bool
}

var (
	errNoDomain      = status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	errNoDescriptors = status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	errNoRules       = status.Error(codes.Unavailable, "no rate limit configuration loaded")
)

// ShouldRateLimit decides one request: every descriptor must pass.
func (r rlsService) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s := r.s
	if err := validRLSRequest(req); err != nil {
		s.badRequests.Add(1)
		return nil, err
	}
	rules := s.rls.Load()
	if rules == nil {
		return nil, errNoRules
	}
	now := s.o.Clock.Now()
	reqNum := s.reqs.Add(1)
	items := make([]rlsItem, len(req.Descriptors))
	type resolved struct {
		policy  limiter.Policy
		counter string
		cost    int64
		atEnd   bool // a charge of a cost known only at the end
	}
	found := make([]resolved, len(req.Descriptors))
	replaced := map[string]bool{}
	known := rules.c.Known(req.Domain)
	for i, d := range req.Descriptors {
		it, f := &items[i], &found[i]
		it.check = -1
		if len(d.Entries) == 1 && d.Entries[0].Key == RLSFinishKey {
			it.finish = true
			s.finishTickets(ctx, d.Entries[0].Value)
			continue
		}
		if !known {
			continue
		}
		entries := make([]descriptors.Entry, len(d.Entries))
		for j, e := range d.Entries {
			entries[j] = descriptors.Entry{Key: e.Key, Value: e.Value}
		}
		if o := d.Limit; o != nil {
			rule, err := overrideRule(req.Domain, entries, o)
			if err == nil {
				f.policy, err = rulePolicy(rule, s.o.RLS.Mode, s.o.RLS.aligned(req.Domain))
			}
			if err != nil {
				s.badRequests.Add(1)
				return nil, status.Error(codes.InvalidArgument, "descriptor "+strconv.Itoa(i)+": limit override: "+err.Error())
			}
			it.rule, f.counter = rule, descriptors.Counter(req.Domain, entries)
		} else {
			m := rules.c.Match(req.Domain, entries)
			if m.Rule == nil {
				continue
			}
			it.rule, it.unlimited, f.counter, f.policy = m.Rule, m.Rule.Unlimited, m.Counter, rules.policies[m.Rule]
			for _, name := range m.Rule.Replaces {
				replaced[name] = true
			}
		}
		f.cost = int64(max(1, req.HitsAddend))
		if d.HitsAddend != nil {
			f.cost = int64(min(d.HitsAddend.Value, uint64(limiter.MaxLimit)))
			f.atEnd = f.cost > 0 && s.o.RLS.ChargeAtEnd[req.Domain]
		}
	}
	checks := make([]credit.Limit, 0, len(req.Descriptors))
	for i := range items {
		it, f := &items[i], &found[i]
		switch {
		case it.rule == nil || it.unlimited:
			continue
		case it.rule.Name != "" && replaced[it.rule.Name]:
			items[i] = rlsItem{check: -1} // another rule of the request takes its place
			continue
		}
		if it.rule.Limit == 0 && f.cost == 0 {
			continue // a check against a rule of 0 requests: nothing to read, and it passes
		}
		if f.atEnd {
			v := s.core.Charge(ctx, f.policy, f.cost, s.o.Keys.Sum(f.policy.Name, limiter.DescriptorIdentity(f.counter)), now, reqNum)
			it.charged = &v
			continue
		}
		it.check = len(checks)
		it.refused = f.cost > f.policy.Limit
		checks = append(checks, credit.Limit{Policy: f.policy, Digest: s.o.Keys.Sum(f.policy.Name, limiter.DescriptorIdentity(f.counter)),
			Cost: f.cost, Quota: it.rule.Quota})
	}
	res, err := s.core.DecideRequest(ctx, checks, now, reqNum, nil)
	if err != nil {
		if errors.Is(err, credit.ErrUnavailable) {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return nil, status.Error(codes.Internal, err.Error())
	}
	if !res.Allowed() {
		// Nothing was charged: the other limits are looked at (charging
		// nothing) for their statuses.
		for i := range items {
			it := &items[i]
			if c := it.check; c >= 0 && c != res.Denied && res.Verdicts[c].Path == 0 && !it.refused {
				if v, err := s.core.Look(ctx, checks[c].Policy, checks[c].Digest, now, reqNum); err == nil {
					res.Verdicts[c] = v
				}
			}
		}
	}
	resp := s.rlsAnswer(req.Domain, items, checks, res, now)
	if res.Allowed() {
		s.heldTickets(resp, res.Verdicts)
	}
	return resp, nil
}

// maxRLSTickets bounds the tickets one finish descriptor names.
const maxRLSTickets = 16

// heldTickets puts the tickets of the units an allowed request holds under
// concurrency rules into resp's dynamic metadata (RLSTicketsField), for
// Envoy to send back when the stream is done.
func (s *Server) heldTickets(resp *rlsv3.RateLimitResponse, vs []credit.Verdict) {
	var b []byte
	for _, v := range vs {
		if v.Policy.Algorithm != limiter.Concurrency || v.Path == 0 || !v.Allowed() || (!v.Decided && v.ChargeSeq == 0) {
			continue // holds nothing (admitted without a window and never charged)
		}
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = s.appendTicket(b, v)
	}
	if len(b) > 0 {
		resp.DynamicMetadata = &structpb.Struct{Fields: map[string]*structpb.Value{RLSTicketsField: structpb.NewStringValue(string(b))}}
	}
}

// finishTickets finishes the requests whose tickets a stream-done call
// names (space-separated): their concurrency rules' units are given back,
// once. Envoy ignores the answer to that call, so a ticket that is not one
// is counted and logged, and the call's other descriptors are decided.
func (s *Server) finishTickets(ctx context.Context, tickets string) {
	for i, id := range strings.Fields(tickets) {
		if i == maxRLSTickets {
			s.badRequests.Add(1)
			s.log.Warn("a stream-done call named more tickets than are finished at once", "most", maxRLSTickets)
			return
		}
		switch _, err := s.finishTicket(ctx, id, 200); {
		case errors.Is(err, errBadTicket):
			s.badRequests.Add(1)
			s.log.Warn("a stream-done call named a ticket this deployment did not issue", "err", err)
		case err != nil: // its units come back with the lease
			s.log.Warn("a request of a stream-done call was not finished on its primary", "err", err)
		}
	}
}

// rlsAnswer builds the answer: a status per descriptor in the request's
// order, the overall code, and the headers of the descriptor closest to its
// limit. It records the request's decisions: the denial, or every limit's
// verdict.
func (s *Server) rlsAnswer(domain string, items []rlsItem, checks []credit.Limit, res credit.Outcome, now time.Time) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items))}
	if res.Denied >= 0 {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	var shown *rlsv3.RateLimitResponse_DescriptorStatus
	for i := range items {
		it := &items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		if it.unlimited {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		if it.rule == nil {
			continue
		}
		st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: it.rule.Name, RequestsPerUnit: uint32(it.rule.Limit),
			Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rlsv3.RateLimitResponse_RateLimit_Unit_value[string(it.rule.Unit)])}
		var longest time.Duration
		st.DurationUntilReset, longest = ruleWindow(it.rule, now)
		if v := it.charged; v != nil {
			if v.Decided {
				st.LimitRemaining = uint32(v.Decision.Remaining)
				if !v.Decision.ResetAt.IsZero() {
					st.DurationUntilReset = untilReset(v.Decision.ResetAt, now, longest)
				}
			}
			s.recordRule(*v, "", domain, it.rule.Key)
			continue
		}
		if it.check < 0 {
			continue // a check against a rule of 0 requests
		}
		c := checks[it.check]
		v := res.Verdicts[it.check]
		over := it.refused
		switch {
		case it.refused:
			s.recordRefused(v, c, domain, it.rule.Key, now)
		case v.Path == 0: // left undecided
		case !v.Decided: // admitted without knowing the window (fail open)
			st.LimitRemaining = uint32(it.rule.Limit)
		default:
			d := v.Decision
			remaining := d.Remaining
			if res.Denied >= 0 && it.check != res.Denied && v.Allowed() && v.Cost > 0 {
				remaining = min(d.Limit, remaining+v.Cost) // its charge was given back
			}
			st.LimitRemaining = uint32(remaining)
			if !d.ResetAt.IsZero() {
				st.DurationUntilReset = untilReset(d.ResetAt, now, longest)
			}
			over = !d.Allowed
		}
		if over {
			// As envoyproxy/ratelimit answers (shadow rules included): a
			// descriptor over its limit has nothing left, whatever a request
			// of a smaller cost could still have.
			st.LimitRemaining = 0
		}
		if v.Path != 0 && (res.Denied < 0 || it.check == res.Denied) {
			s.recordRule(v, "", domain, it.rule.Key)
		}
		if over && !it.rule.Shadow {
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if !it.rule.Shadow && (shown == nil || tighter(st, shown)) {
			shown = st
		}
	}
	if s.o.RLS.ResponseHeaders && shown != nil {
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: "RateLimit-Limit", Value: strconv.FormatUint(uint64(shown.CurrentLimit.RequestsPerUnit), 10)},
			{Key: "RateLimit-Remaining", Value: strconv.FormatUint(uint64(shown.LimitRemaining), 10)},
			{Key: "RateLimit-Reset", Value: strconv.FormatInt(int64(shown.DurationUntilReset.AsDuration()/time.Second), 10)},
		}
	}
	return resp
}

// untilReset is a status's duration_until_reset: the time from now to the
// window's reset, rounded up to whole seconds, within (0, unit] — what
// envoyproxy/ratelimit answers too (for a calendar rule, unit is its
// longest period). A window lasts exactly its unit, so only an edge whose
// clock runs behind the one that opened the window would count more, and a
// window that reset as the request was decided less.
func untilReset(reset, now time.Time, unit time.Duration) *durationpb.Duration {
	left := (reset.Sub(now) + time.Second - 1).Truncate(time.Second)
	return durationpb.New(min(max(unit, time.Second), max(time.Second, left)))
}

// tighter reports whether a's status is what a client must respect before
// b's: over the limit, or less left.
func tighter(a, b *rlsv3.RateLimitResponse_DescriptorStatus) bool {
	aOver, bOver := a.Code == rlsv3.RateLimitResponse_OVER_LIMIT, b.Code == rlsv3.RateLimitResponse_OVER_LIMIT
	if aOver != bOver {
		return aOver
	}
	return a.LimitRemaining < b.LimitRemaining
}

// recordRefused records a request a rule denied by its terms alone (a limit
// of 0, or a cost beyond the limit): nothing was read or charged.
func (s *Server) recordRefused(v credit.Verdict, c credit.Limit, domain, rule string, now time.Time) {
	if s.batcher == nil {
		return
	}
	d := s.decision(credit.Verdict{Policy: c.Policy, Cost: c.Cost, Key: s.o.Keys.KeyOf(c.Digest), Now: now, Producer: s.o.Producer,
		ReqNum: v.ReqNum}, "")
	d.Allowed, d.Path, d.Domain, d.Rule = false, "rule", domain, rule
	s.batcher.Add(d)
}

// validRLSRequest refuses what envoyproxy/ratelimit refuses (no domain, no
// descriptors), and what would make Tally hold more than a request should:
// more than 64 descriptors, 32 entries in one, or a key or value over 1 KiB.
func validRLSRequest(req *rlsv3.RateLimitRequest) error {
	switch {
	case req.Domain == "":
		return errNoDomain
	case len(req.Descriptors) == 0:
		return errNoDescriptors
	case len(req.Descriptors) > maxRLSDescriptors:
		return status.Errorf(codes.InvalidArgument, "%d descriptors: at most %d", len(req.Descriptors), maxRLSDescriptors)
	case len(req.Domain) > maxRLSText:
		return status.Errorf(codes.InvalidArgument, "domain of %d bytes: at most %d", len(req.Domain), maxRLSText)
	}
	for i, d := range req.Descriptors {
		if len(d.Entries) > maxRLSEntries {
			return status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: at most %d", i, len(d.Entries), maxRLSEntries)
		}
		for _, e := range d.Entries {
			if len(e.Key) > maxRLSText || len(e.Value) > maxRLSText {
				return status.Errorf(codes.InvalidArgument, "descriptor %d: an entry's key or value is over %d bytes", i, maxRLSText)
			}
		}
	}
	return nil
}

// overrideRule is the rule of a descriptor that carries its own limit (the
// route's limit override in Envoy's configuration): counted by its domain,
// entries and terms.
func overrideRule(domain string, entries []descriptors.Entry, o *rlv3.RateLimitDescriptor_RateLimitOverride) (*descriptors.Rule, error) {
	u := descriptors.Unit(o.Unit.String())
	if u.Duration() == 0 {
		return nil, fmt.Errorf("unknown unit %s", o.Unit)
	}
	var key strings.Builder
	key.WriteString(domain)
	for _, e := range entries {
		key.WriteByte('.')
		key.WriteString(e.Key)
		if e.Value != "" {
			key.WriteByte('_')
			key.WriteString(e.Value)
		}
	}
	// The terms are part of the key: two overrides of one descriptor count
	// apart, as their limits differ.
	key.WriteString(".override." + string(u) + "." + strconv.FormatUint(uint64(o.RequestsPerUnit), 10))
	return &descriptors.Rule{Domain: domain, Key: key.String(), Limit: int64(o.RequestsPerUnit), Unit: u}, nil
}
