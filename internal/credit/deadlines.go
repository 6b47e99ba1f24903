package credit

import (
	"sync"
	"time"
)

// deadlines hands out channels closed once a time has passed, one channel
// per tick of the clock: every request that waits for a reservation until
// a deadline in the same tick shares one channel and one timer, where a
// timer of its own would cost the runtime's timer heap an insertion and a
// removal per request. A deadline is kept to within one tick late, never
// early.
type deadlines struct {
	tick  int64 // ns
	mu    sync.Mutex
	slots map[int64]chan struct{} // by the tick number they close at
}

// newDeadlines keeps deadlines to within tick (at least a millisecond).
func newDeadlines(tick time.Duration) *deadlines {
	return &deadlines{tick: int64(max(tick, time.Millisecond)), slots: map[int64]chan struct{}{}}
}

// after returns a channel closed after t, and no later than a tick after
// it.
func (d *deadlines) after(t time.Time) <-chan struct{} {
	n := t.UnixNano()/d.tick + 1 // the first tick that ends after t
	d.mu.Lock()
	defer d.mu.Unlock()
	if ch, ok := d.slots[n]; ok {
		return ch
	}
	ch := make(chan struct{})
	d.slots[n] = ch
	time.AfterFunc(time.Until(time.Unix(0, n*d.tick)), func() {
		d.mu.Lock()
		delete(d.slots, n)
		d.mu.Unlock()
		close(ch)
	})
	return ch
}
