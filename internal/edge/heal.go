package edge

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// What lets the edge heal without anyone editing its configuration:
// progressive backoff for clients that keep sending while denied
// (internal/backoff, per policy in Limits.Backoff), and temporary limits
// an operator puts on one client for a while (events.TemporaryLimit), read
// from the limits stream, that lift themselves at their expiry.

// backoffCapacity bounds the clients progressive backoff remembers (about
// 100 bytes each).
const backoffCapacity = 1 << 20

// temporary is the temporary limits the edge knows, by window key digest,
// copied on write (they change rarely and are read by every request).
type temporary struct {
	mu  sync.Mutex
	set atomic.Pointer[map[limiter.Digest]events.TemporaryLimit]
}

// SetTemporary takes one entry of the limits stream: a limit to apply
// while it is live, or (cleared) the end of one, kept until its own expiry
// so that an older entry sent again cannot bring back what it lifted. An
// entry set before the one held for its key is ignored (a replay).
// Entries past their expiry are forgotten.
func (s *Server) SetTemporary(l events.TemporaryLimit) {
	t := &s.temporary
	t.mu.Lock()
	defer t.mu.Unlock()
	next := map[limiter.Digest]events.TemporaryLimit{}
	live := 0
	if cur := t.set.Load(); cur != nil {
		if held, ok := (*cur)[l.Key]; ok && l.Set.Before(held.Set) {
			return
		}
		now := s.o.Clock.Now()
		for dg, e := range *cur {
			if now.Before(e.Expires) {
				next[dg] = e
			}
		}
	}
	next[l.Key] = l
	for _, e := range next {
		if !e.Cleared {
			live++
		}
	}
	s.tempLimits.Store(int64(live))
	t.set.Store(&next)
}

// Temporary returns the temporary limits live at now, by policy and key.
func (s *Server) Temporary(now time.Time) []events.TemporaryLimit {
	cur := s.temporary.set.Load()
	if cur == nil {
		return nil
	}
	var out []events.TemporaryLimit
	for _, l := range *cur {
		if l.Live(now) {
			out = append(out, l)
		}
	}
	slices.SortFunc(out, func(a, b events.TemporaryLimit) int {
		if a.Policy != b.Policy {
			if a.Policy < b.Policy {
				return -1
			}
			return 1
		}
		return bytes.Compare(a.Key[:], b.Key[:])
	})
	return out
}

// healer is the edge's side of credit.Healer: the temporary limits it
// read from the limits stream, and progressive backoff by the policies'
// terms (Limits.Backoff).
type healer struct{ s *Server }

// Terms is the live temporary limit of dg under policy, if any: a load
// and nothing more while no temporary limit is set.
func (h healer) Terms(policy string, dg limiter.Digest, now time.Time) (credit.Temporary, bool) {
	if h.s.tempLimits.Load() == 0 {
		return credit.Temporary{}, false
	}
	cur := h.s.temporary.set.Load()
	l, ok := (*cur)[dg]
	if !ok || !l.Live(now) || l.Policy != policy {
		return credit.Temporary{}, false
	}
	return credit.Temporary{Limit: l.Limit, Until: l.Expires, Block: l.Block}, true
}

func (h healer) Early(p limiter.Policy, dg limiter.Digest, now time.Time) (credit.Backoff, bool) {
	rt := h.s.limits.Load()
	if len(rt.backoff) == 0 {
		return credit.Backoff{}, false // no policy backs off: nothing to look up
	}
	a, early := h.s.backoff.Early(dg, now, rt.backoff[p.Name])
	return credit.Backoff{Until: a.Until, Reset: a.Reset, Strikes: a.Strikes}, early
}

func (h healer) Answered(p limiter.Policy, dg limiter.Digest, now time.Time, d limiter.Decision) {
	rt := h.s.limits.Load()
	if len(rt.backoff) == 0 {
		return
	}
	if d.Allowed {
		h.s.backoff.Allowed(dg)
	} else {
		h.s.backoff.Denied(dg, now, d.ResetAt, rt.backoff[p.Name])
	}
}

// followLimits reads the limits stream from its start and applies every
// signed entry (SetTemporary), until ctx ends; an entry that is not signed
// with the deployment's key is counted and ignored. It starts once the
// edge's streams exist (warm creates them: a fresh edge has nothing to warn
// about before), logs when it starts reading, and, when it cannot, says so
// and tries again every second. The ordered consumer starts again by itself
// after NATS comes back.
func (s *Server) followLimits(ctx context.Context, js jetstream.JetStream) {
	for !s.ready.streams.Load() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	failed := false
	for {
		err := s.consumeLimits(ctx, js, failed)
		if ctx.Err() != nil {
			return
		}
		failed = true
		s.log.Warn("the limits stream cannot be read; temporary limits wait", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// consumeLimits applies the limits stream's entries until ctx ends, or
// returns why it cannot read the stream. again says whether an earlier
// attempt failed (the log says it is read again).
func (s *Server) consumeLimits(ctx context.Context, js jetstream.JetStream, again bool) error {
	prefix := s.o.Streams.WithDefaults().Limits.SubjectPrefix
	c, err := js.OrderedConsumer(ctx, s.o.Streams.WithDefaults().Limits.Name, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return err
	}
	// Ready once what the stream held at start is applied.
	if info := c.CachedInfo(); info != nil && info.NumPending == 0 {
		s.ready.limits.Store(true)
	}
	cc, err := c.Consume(func(m jetstream.Msg) {
		if meta, err := m.Metadata(); err == nil && meta.NumPending == 0 {
			defer s.ready.limits.Store(true)
		}
		l, err := s.limitReader.Read(prefix, m.Subject(), m.Headers(), m.Data())
		if err != nil {
			s.badLimits.Add(1)
			s.log.Warn("a temporary limit was refused", "subject", m.Subject(), "err", err)
			return
		}
		s.SetTemporary(l)
	})
	if err != nil {
		return err
	}
	msg := "the limits stream is read; temporary limits apply"
	if again {
		msg = "the limits stream is read again; temporary limits apply"
	}
	s.o.Log.Info(msg, "stream", s.o.Streams.WithDefaults().Limits.Name)
	<-ctx.Done()
	cc.Stop()
	return nil
}

// held is the entry the edge holds for dg (live, expired or a clear).
func (s *Server) held(dg limiter.Digest) *events.TemporaryLimit {
	if cur := s.temporary.set.Load(); cur != nil {
		if l, ok := (*cur)[dg]; ok {
			return &l
		}
	}
	return nil
}
