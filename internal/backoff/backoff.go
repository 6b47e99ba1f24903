package backoff

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/setting"
)

// Config is one policy's backoff. The zero Config is off.
type Config struct {
	// Factor multiplies the wait at each early return: 0 (off), or 1.1 to
	// 10.
	Factor float64 `yaml:"factor"`
	// Max caps the wait one answer gives (whole seconds, as Retry-After
	// says them); default 1h when Factor is set. Only the window's own
	// reset may be later: a client is never told to come back before it.
	Max time.Duration `yaml:"max"`
}

// On reports whether c backs clients off.
func (c Config) On() bool { return c.Factor > 0 }

// WithDefaults returns c with its cap set when backoff is on.
func (c Config) WithDefaults() Config {
	if c.On() && c.Max == 0 {
		c.Max = time.Hour
	}
	return c
}

// ErrInvalid is the kind of Validate's errors.
var ErrInvalid = errors.New("backoff: invalid")

// Validate refuses a factor or a cap that cannot work, as a
// *setting.Error naming the field.
func (c Config) Validate() error {
	switch {
	case c.Factor == 0 && c.Max == 0:
		return nil
	case math.IsNaN(c.Factor) || c.Factor < 1.1 || c.Factor > 10:
		return setting.Errorf(ErrInvalid, "factor", "%v: want 1.1 to 10 (or no backoff at all)", c.Factor)
	case c.WithDefaults().Max < time.Second || c.Max > 24*time.Hour || c.Max%time.Second != 0:
		return setting.Errorf(ErrInvalid, "max", "%v: want whole seconds, 1s to 24h", c.Max)
	}
	return nil
}

// Answer is what backoff says about one request.
type Answer struct {
	// Until is when the client may come back; Strikes its early returns in
	// a row; Reset the reset of the window that denied it (what its
	// responses keep showing as the window's: Until is for Retry-After).
	Until   time.Time
	Strikes int
	Reset   time.Time
}

type client struct {
	until   time.Time     // what the client was last told
	base    time.Duration // the first wait it was told
	reset   time.Time     // the window's reset it was denied by
	strikes int
}

const shards = 32

type shard struct {
	mu sync.Mutex
	m  map[limiter.Digest]*client
}

// Table remembers the clients an edge denied. It is safe for concurrent
// use.
type Table struct {
	capacity int
	n        atomic.Int64
	shards   [shards]shard
}

// NewTable returns a table that remembers at most capacity clients; past
// it, new clients are denied as usual, without backoff.
func NewTable(capacity int) *Table {
	t := &Table{capacity: capacity}
	for i := range t.shards {
		t.shards[i].m = map[limiter.Digest]*client{}
	}
	return t
}

func (t *Table) shard(dg limiter.Digest) *shard { return &t.shards[dg.Hash()%shards] }

// Early reports whether a request of dg at now comes before the time its
// client was told: it is then a strike, to be denied until the Answer's
// time (no window is read or charged).
func (t *Table) Early(dg limiter.Digest, now time.Time, c Config) (Answer, bool) {
	if t.n.Load() == 0 || !c.On() {
		return Answer{}, false
	}
	s := t.shard(dg)
	s.mu.Lock()
	defer s.mu.Unlock()
	cl := s.m[dg]
	if cl == nil || !now.Before(cl.until) {
		return Answer{}, false
	}
	c = c.WithDefaults()
	cl.strikes++
	wait := float64(cl.base) * math.Pow(c.Factor, float64(cl.strikes))
	cl.until = now.Add(time.Duration(min(wait, float64(c.Max))))
	if cl.until.Before(cl.reset) {
		cl.until = cl.reset // a cap below the window's own wait: never before its reset
	}
	return Answer{Until: cl.until, Strikes: cl.strikes, Reset: cl.reset}, true
}

// Denied records that the window denied a request of dg at now, its client
// told to retry at reset: a client that waited as told starts again with
// no strikes.
func (t *Table) Denied(dg limiter.Digest, now, reset time.Time, c Config) {
	if !c.On() {
		return
	}
	s := t.shard(dg)
	s.mu.Lock()
	defer s.mu.Unlock()
	cl := s.m[dg]
	if cl == nil {
		if int(t.n.Load()) >= t.capacity && !t.prune(s, now) {
			return
		}
		cl = &client{}
		s.m[dg] = cl
		t.n.Add(1)
	}
	*cl = client{until: reset, base: max(time.Second, reset.Sub(now)), reset: reset}
}

// Allowed forgets dg's client: it was admitted.
func (t *Table) Allowed(dg limiter.Digest) {
	if t.n.Load() == 0 {
		return
	}
	s := t.shard(dg)
	s.mu.Lock()
	if _, ok := s.m[dg]; ok {
		delete(s.m, dg)
		t.n.Add(-1)
	}
	s.mu.Unlock()
}

// prune forgets the clients of s whose wait is over; it reports whether it
// made room. Callers hold s.mu.
func (t *Table) prune(s *shard, now time.Time) bool {
	freed := false
	for dg, cl := range s.m {
		if !now.Before(cl.until) {
			delete(s.m, dg)
			t.n.Add(-1)
			freed = true
		}
	}
	return freed
}

// Len is the number of clients remembered.
func (t *Table) Len() int { return int(t.n.Load()) }
