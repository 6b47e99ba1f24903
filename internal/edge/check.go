package edge

import (
	"context"
	"time"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/limiter"
)

// limitCheck is one limit a request is held to: the policy, the digest of
// the window's key, and what the request costs there (0: it charges
// nothing, and is denied only by a window past its limit). Quota limits
// deny a request only all together (envoyproxy/ratelimit's quota_mode). A
// refused limit denies by its terms alone, with no window to read (a limit
// of 0, or a cost beyond the limit): it is never decided.
type limitCheck struct {
	policy  limiter.Policy
	digest  limiter.Digest
	cost    int64
	quota   bool
	refused bool
	// blocked, when set, is the end of an operator's block of the client:
	// the request is denied until then, nothing read or charged.
	blocked time.Time
}

// checked is what decideAll found: a verdict per limit, in order (the zero
// Verdict for limits left undecided because the request was denied first),
// and which limit denied the request (-1: none did). The other limits'
// charges of a denied request were given back.
type checked struct {
	vs     []credit.Verdict
	denied int
}

// decideAll decides a request held to every limit of checks, so that a
// denied request consumes nothing: each limit is first checked against what
// the edge knows (a window known full denies before any other reserves),
// then each decides in order, and a denial gives back what the others
// charged. A limit in shadow mode never denies (its verdict says what it
// would have done); quota limits deny only when every one of them does. vs
// is reused for the verdicts. An error (Redis unreachable, fail closed)
// leaves nothing charged.
func (s *Server) decideAll(ctx context.Context, checks []limitCheck, now time.Time, reqNum uint64, vs []credit.Verdict) (checked, error) {
	vs = vs[:0]
	for range checks {
		vs = append(vs, credit.Verdict{})
	}
	for i, c := range checks {
		if !c.blocked.IsZero() && !c.policy.Shadow {
			vs[i] = s.blockedVerdict(c, now, reqNum)
			return checked{vs: vs, denied: i}, nil
		}
		if c.policy.Shadow || c.quota {
			continue
		}
		if c.refused {
			return checked{vs: vs, denied: i}, nil
		}
		if len(checks) > 1 && c.cost > 0 {
			if v, full := s.core.Peek(c.policy, c.cost, c.digest, now, reqNum); full {
				vs[i] = v
				return checked{vs: vs, denied: i}, nil
			}
		}
	}
	quotas, quotaDenied, firstQuota := 0, 0, -1
	for i, c := range checks {
		if c.quota {
			quotas++
		}
		denied := c.refused
		if !c.refused {
			v, err := s.check(ctx, c.policy, c.cost, c.digest, now, reqNum)
			if err != nil {
				s.core.GiveBack(vs[:i])
				return checked{vs: vs, denied: -1}, err
			}
			vs[i] = v
			denied = !v.Allowed()
		}
		switch {
		case !denied || c.policy.Shadow:
		case c.quota:
			quotaDenied++
			if firstQuota < 0 {
				firstQuota = i
			}
		default:
			// Denied by one limit: what the others charged goes back.
			s.core.GiveBack(vs[:i])
			return checked{vs: vs, denied: i}, nil
		}
	}
	if quotaDenied > 0 && quotaDenied == quotas {
		s.core.GiveBack(vs)
		return checked{vs: vs, denied: firstQuota}, nil
	}
	return checked{vs: vs, denied: -1}, nil
}
