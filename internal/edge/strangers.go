package edge

import (
	"net/netip"
	"sync"
	"time"
)

// strangers limits the log lines about callers that are not a configured
// gateway (a forward-auth request, an access-log datagram): the first from
// each address is logged, then at most one a minute per address, in
// bounded memory. A gateway left out of edge.forward_auth.gateways shows in
// the log at once; a scanner cannot flood it.
type strangers struct {
	mu   sync.Mutex
	last map[netip.Addr]time.Time
}

const (
	strangerEvery = time.Minute
	strangersMax  = 1024 // addresses remembered
)

// due reports whether a stranger at a should be logged at now, and notes
// that it is.
func (s *strangers) due(a netip.Addr, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.last == nil {
		s.last = map[netip.Addr]time.Time{}
	}
	if at, ok := s.last[a]; ok && now.Sub(at) < strangerEvery {
		return false
	}
	if _, ok := s.last[a]; !ok && len(s.last) >= strangersMax {
		for b, at := range s.last {
			if now.Sub(at) >= strangerEvery {
				delete(s.last, b)
			}
		}
		if len(s.last) >= strangersMax {
			return false // a flood of addresses: counted, not each logged
		}
	}
	s.last[a] = now
	return true
}
