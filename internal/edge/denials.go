package edge

import (
	"slices"
	"sync"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// The clients denied most, so that an alert on a client blocked
// consistently can name it (by its window key's digest, never its
// identity) and lead to `tally inspect`. Metrics are never labelled by key
// otherwise: here at most topShown series per edge, those of clients denied
// at least topMin times in the last whole minute.

const (
	topTracked = 64 // clients counted at once (Space-Saving: the most denied are kept)
	topShown   = 10
	topMin     = 60 // denials in a minute: one a second
)

// deniedClient is one client's denials in a minute.
type deniedClient struct {
	policy string
	digest limiter.Digest
	n      int64
	// over is how much n may overcount: the count it took over from the
	// client it replaced. Only n - over is certain.
	over int64
}

// topDenied counts denials per client over whole minutes, in bounded
// memory; Top is the last whole minute's most denied.
type topDenied struct {
	mu     sync.Mutex
	minute int64 // the minute counted (Unix minutes)
	counts map[limiter.Digest]*deniedClient
	last   []deniedClient // the last whole minute's, most denied first
}

func newTopDenied() *topDenied { return &topDenied{counts: map[limiter.Digest]*deniedClient{}} }

// add counts one denial of dg under policy at now.
func (t *topDenied) add(policy string, dg limiter.Digest, now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.roll(now)
	if c, ok := t.counts[dg]; ok {
		c.n++
		return
	}
	if len(t.counts) < topTracked {
		t.counts[dg] = &deniedClient{policy: policy, digest: dg, n: 1}
		return
	}
	// Space-Saving: the least counted gives its place, and its count, to
	// the newcomer (an overestimate that never hides a heavy client).
	var least *deniedClient
	for _, c := range t.counts {
		if least == nil || c.n < least.n {
			least = c
		}
	}
	delete(t.counts, least.digest)
	t.counts[dg] = &deniedClient{policy: policy, digest: dg, n: least.n + 1, over: least.n}
}

// roll closes the minute counted when now is in a later one. Callers hold
// t.mu.
func (t *topDenied) roll(now time.Time) {
	m := now.Unix() / 60
	if m == t.minute {
		return
	}
	t.last = t.last[:0]
	if m == t.minute+1 {
		for _, c := range t.counts {
			if c.n-c.over >= topMin { // certainly denied that often
				t.last = append(t.last, *c)
			}
		}
		slices.SortFunc(t.last, func(a, b deniedClient) int { return int(b.n - a.n) })
		t.last = t.last[:min(len(t.last), topShown)]
	}
	t.minute = m
	clear(t.counts)
}

// top is the last whole minute's most denied clients (at least topMin
// denials each), as of now.
func (t *topDenied) top(now time.Time) []deniedClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.roll(now)
	return slices.Clone(t.last)
}
