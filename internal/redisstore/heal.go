package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/lua"
)

// A shard's primary can change under Tally: Sentinel promotes a replica
// that never got the last writes of the primary it replaces, or a primary
// without persistence restarts empty (and its replicas resync to nothing).
// Either way the windows lose the end of what was done to them, while the
// edges still remember what they were given and still admit against it. A
// heal puts that back before anyone reserves again:
//
//  1. Every connection to a primary, and a probe every HealCheck, asks it
//     (lua/heal.lua) whether it is the primary the shard's epoch record
//     names. A primary that is not (another run id: a restart or a
//     promotion; no record: an emptied dataset) begins a heal: a new epoch,
//     and a marker that lasts HealFor.
//  2. While the marker lasts, no process that reached the primary writes to
//     the shard: reservations, accounting events, reports, finishes and
//     leases fail at once with ErrHealing, and the request path decides
//     from what it knows (credit, full windows) or by its on_redis_error
//     rule. A connection made to the primary meanwhile fails the command it
//     was made for, so that nothing slips in before its process learns of
//     the heal.
//  3. Each process re-asserts what it holds in the shard's windows
//     (Healer.Claims, lua/reseed.lua) and keeps the marker alive while it
//     does; then what it applied on the primary itself is delivered again
//     (Healer.Healed), and the accountants read the shard's subject again
//     from its oldest message (Epoch).
//
// The heal ends when the marker expires: HealFor after it began, or a
// little after the last process finished re-asserting. A process that
// learns of a heal only after it ended re-asserts late (HealStats.Late):
// others may have reserved in between.

// ErrHealing is returned for a write to a shard whose primary changed while
// the processes that reached it re-assert what they hold in its windows.
// It is transient: the heal lasts about Options.HealFor.
var ErrHealing = errors.New("redisstore: the shard's primary changed; its windows are being re-asserted")

// Healer is what a process holds in the shards' windows, for a heal: the
// edge's decision core and its outbox.
type Healer interface {
	// Claims lists what this process was given in shard i's windows live
	// at now, and the accounting events it sent for them.
	Claims(shard int, now time.Time) []limiter.Claim
	// Healed says that this process has re-asserted its claims on shard
	// i: what it applied on the primary itself may have been lost with the
	// old one, and is to be delivered again.
	Healed(shard int)
}

// HealStats counts a store's heals.
type HealStats struct {
	// Heals this process took part in: begun, joined, or learnt of late.
	Heals uint64
	// Late: heals this process learnt of after they ended.
	Late uint64
	// Claims re-asserted; Opened of them opened their window; Conflicts
	// found another window of their key live (nothing changed); Added
	// units added to windows.
	Claims, Opened, Conflicts, Added uint64
	// CheckErrors: asking a primary whether it changed failed (an ACL
	// without the commands heal.lua runs, or a script error).
	CheckErrors uint64
}

var (
	healScript   = redis.NewScript(lua.Heal)
	reseedScript = redis.NewScript(lua.Reseed)
)

// healing is one shard's heal state in this process.
type healing struct {
	mu sync.Mutex
	// epoch is the shard's epoch as this process last knew it ("": none).
	epoch string
	// until: no writes before then (the heal marker's end as last read).
	until time.Time
	// reseeding: this process re-asserts what it holds.
	reseeding bool
	// active: a heal is, or may be, in progress: gate takes its slow path.
	active atomic.Bool
	// heals counts the heals this process learnt of (Epoch).
	heals atomic.Uint64
}

// healReply is heal.lua's answer.
type healReply struct {
	state int64 // 0 same, 1 began, 2 joined, 3 late, 4 adopted
	epoch string
	pttl  time.Duration
}

const (
	healSame = iota
	healBegan
	healJoined
	healLate
	healAdopted
)

// claimBatch is the most claims sent in one pipeline.
const claimBatch = 128

// SetHealer names what this process holds in the shards' windows: what a
// heal re-asserts. Set it before the first request; nil: nothing.
func (s *Store) SetHealer(h Healer) {
	if h == nil {
		s.healer.Store(nil)
		return
	}
	s.healer.Store(&h)
}

// Epoch counts the heals of shard i this process learnt of: what was
// applied on the shard before a change of it may have been lost, and is to
// be applied again.
func (s *Store) Epoch(i int) uint64 { return s.shards[i].heal.heals.Load() }

// Healing reports whether shard i takes no writes from this process now:
// a heal is in progress.
func (s *Store) Healing(i int) bool {
	h := &s.shards[i].heal
	if !h.active.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reseeding || time.Now().Before(h.until)
}

// HealStats reads the heal counters.
func (s *Store) HealStats() HealStats {
	return HealStats{Heals: s.heals.Load(), Late: s.late.Load(), Claims: s.claims.Load(), Opened: s.opened.Load(),
		Conflicts: s.conflicts.Load(), Added: s.added.Load(), CheckErrors: s.checkErrors.Load()}
}

// gate refuses a write to shard i while it heals. A store that has seen no
// heal pays one atomic load.
func (s *Store) gate(ctx context.Context, i int) error {
	if !s.shards[i].heal.active.Load() {
		return nil
	}
	return s.gateSlow(ctx, i)
}

func (s *Store) gateSlow(ctx context.Context, i int) error {
	n := s.shards[i]
	h := &n.heal
	h.mu.Lock()
	healing := h.reseeding || time.Now().Before(h.until)
	h.mu.Unlock()
	if healing {
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrHealing)
	}
	// The marker's end as last read has passed; others may have kept it
	// alive since. (Not under h.mu: a new connection asks heal.lua, which
	// takes it.)
	c, cancel := context.WithTimeout(ctx, s.opts.ReadTimeout)
	defer cancel()
	left, err := n.healc.PTTL(c, s.keys.HealKey()).Result()
	if err != nil {
		return fmt.Errorf("limiter: shard %s: %w (reading the heal marker: %v)", n.name, ErrHealing, err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if left > 0 {
		if end := time.Now().Add(left); end.After(h.until) {
			h.until = end
		}
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrHealing)
	}
	if h.reseeding || time.Now().Before(h.until) {
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrHealing)
	}
	if h.active.CompareAndSwap(true, false) {
		s.log().Info("the shard's heal is over; reservations resume", "shard", n.name, "epoch", h.epoch)
	}
	return nil
}

// check asks shard i's primary, through c, whether it changed (heal.lua),
// and takes the answer in; it reports ErrHealing while the shard heals.
func (s *Store) check(ctx context.Context, i int, c redis.Scripter) error {
	n := s.shards[i]
	n.heal.mu.Lock()
	known := n.heal.epoch
	n.heal.mu.Unlock()
	v, err := healScript.Run(ctx, c, []string{s.keys.EpochKey(), s.keys.HealKey()}, "check", newEpoch(), known,
		s.opts.HealFor.Milliseconds()).Slice()
	if err != nil {
		return err
	}
	r, err := parseHeal(v)
	if err != nil {
		return err
	}
	if s.observe(i, r) {
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrHealing)
	}
	return nil
}

func parseHeal(v []any) (healReply, error) {
	if len(v) != 3 {
		return healReply{}, fmt.Errorf("unexpected heal reply %v", v)
	}
	state, ok1 := v[0].(int64)
	epoch, ok2 := v[1].(string)
	pttl, ok3 := v[2].(int64)
	if !ok1 || !ok2 || !ok3 {
		return healReply{}, fmt.Errorf("unexpected heal reply %v", v)
	}
	return healReply{state: state, epoch: epoch, pttl: time.Duration(pttl) * time.Millisecond}, nil
}

// observe takes a heal.lua answer into shard i's state, starting this
// process's re-assertion when the shard entered an epoch this process did
// not know. It reports whether the shard takes no writes now.
func (s *Store) observe(i int, r healReply) bool {
	n := s.shards[i]
	h := &n.heal
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	if r.pttl > 0 {
		if end := now.Add(r.pttl); end.After(h.until) {
			h.until = end
		}
		h.active.Store(true)
	}
	switch r.state {
	case healBegan, healJoined, healLate:
		if r.epoch == h.epoch {
			break
		}
		first := h.epoch == ""
		h.epoch = r.epoch
		h.heals.Add(1)
		s.heals.Add(1)
		if r.state == healLate {
			s.late.Add(1)
			s.log().Error("the shard's primary changed and its heal ended before this process learnt of it: "+
				"re-asserting late; windows may have let more through meanwhile", "shard", n.name, "epoch", r.epoch)
		} else if !first {
			s.log().Warn("the shard's primary changed: re-asserting what this process holds in its windows; "+
				"no reservation there until the heal ends", "shard", n.name, "epoch", r.epoch, "heal_for", r.pttl)
		}
		h.reseeding = true
		h.active.Store(true)
		s.wg.Add(1)
		go s.reseed(i, r.epoch)
	default:
		if h.epoch == "" {
			h.epoch = r.epoch
		}
	}
	return h.reseeding || now.Before(h.until)
}

// reseed re-asserts this process's claims on shard i for epoch, keeping
// the heal alive meanwhile, then says so to the healer.
func (s *Store) reseed(i int, epoch string) {
	defer s.wg.Done()
	n := s.shards[i]
	var hl Healer
	if p := s.healer.Load(); p != nil {
		hl = *p
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	var claims []limiter.Claim
	if hl != nil {
		claims = hl.Claims(i, s.opts.Clock.Now())
	}
	var keep sync.WaitGroup
	keep.Go(func() { s.keepHealing(ctx, i) })
	delay := 20 * time.Millisecond
	for sent := 0; sent < len(claims) && ctx.Err() == nil; {
		batch := claims[sent:min(sent+claimBatch, len(claims))]
		if err := s.sendClaims(ctx, i, epoch, batch); err != nil {
			s.log().Warn("re-asserting windows on the shard's new primary failed; retrying", "shard", n.name, "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(delay):
			}
			delay = min(2*delay, time.Second)
			continue
		}
		sent += len(batch)
	}
	cancel()
	keep.Wait()
	if hl != nil && len(claims) > 0 {
		s.log().Info("re-asserted what this process holds in the shard's windows", "shard", n.name, "windows", len(claims))
	}
	if hl != nil {
		hl.Healed(i)
	}
	n.heal.mu.Lock()
	n.heal.reseeding = false
	n.heal.mu.Unlock()
}

// keepHealing keeps shard i's heal marker alive while this process
// re-asserts (until ctx ends), so that nobody reserves before it is done.
func (s *Store) keepHealing(ctx context.Context, i int) {
	n := s.shards[i]
	every := max(20*time.Millisecond, s.opts.HealFor/5)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, cancel := context.WithTimeout(ctx, s.opts.ReadTimeout)
		_ = healScript.Run(c, n.healc, []string{s.keys.EpochKey(), s.keys.HealKey()}, "extend", newEpoch(), "",
			max(100, (3*every).Milliseconds())).Err()
		cancel()
	}
}

// sendClaims sends claims to shard i's primary in one pipeline.
func (s *Store) sendClaims(ctx context.Context, i int, epoch string, claims []limiter.Claim) error {
	n := s.shards[i]
	now := ms(s.opts.Clock.Now())
	for attempt := 0; ; attempt++ {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		pipe := n.healc.Pipeline()
		cmds := make([]*redis.Cmd, len(claims))
		for j, cl := range claims {
			if err := cl.Validate(); err != nil {
				cmds[j] = redis.NewCmd(c)
				cmds[j].SetErr(err)
				continue
			}
			var expiry int64
			if cl.Frozen > 0 {
				expiry = ms(cl.FrozenExpiry)
			}
			cmds[j] = pipe.EvalSha(c, reseedScript.Hash(), []string{cl.Key.String()}, now, epoch, ms(cl.ResetAt), ms(cl.Start),
				cl.Window.Milliseconds(), s.opts.Grace.Milliseconds(), cl.Holder, cl.Producer, cl.Reserved, cl.Charged,
				cl.GivenBack, cl.From, cl.To, cl.Frozen, expiry)
		}
		_, _ = pipe.Exec(c)
		cancel()
		var failed error
		noscript := false
		for j, cmd := range cmds {
			v, err := cmd.Int64Slice()
			switch {
			case noScript(err):
				noscript = true
			case errors.Is(err, limiter.ErrInvalidArgument) || refused(err):
				s.log().Error("a claim was refused; its window is not re-asserted", "shard", n.name, "err", err)
			case err != nil:
				failed = err
			case len(v) != 3:
				failed = fmt.Errorf("unexpected reseed reply %v", v)
			default:
				s.tally(claims[j], v)
			}
		}
		if noscript && attempt == 0 {
			if err := s.reload(ctx, n.healc, reseedScript); err != nil {
				return err
			}
			continue
		}
		return failed
	}
}

// tally counts one claim's answer.
func (s *Store) tally(c limiter.Claim, v []int64) {
	s.claims.Add(1)
	switch v[0] {
	case 1:
		s.opened.Add(1)
	case 3:
		s.conflicts.Add(1)
		s.log().Error("a window was re-asserted after another window of its key opened: it may let more through than "+
			"its limit until it resets", "shard", s.ShardName(s.ShardOf(c.Key)), "key", c.Key.Digest().String())
	}
	if v[2] > 0 {
		s.added.Add(uint64(v[2]))
	}
}

// watch checks every shard's primary every HealCheck until the store
// closes: a probe, in case no connection of this process breaks (an idle
// process, credit in hand) while the primary changes.
func (s *Store) watch() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.HealCheck)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
		}
		for i := range s.shards {
			s.probe(i)
		}
	}
}

// probe reads shard i's epoch record and heal marker, and asks the primary
// the whole question (check) only when either says something changed. A
// connection the probe makes asks it in any case (its OnConnect).
func (s *Store) probe(i int) {
	n := s.shards[i]
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ReadTimeout)
	defer cancel()
	pipe := n.healc.Pipeline()
	rec := pipe.Get(ctx, s.keys.EpochKey())
	left := pipe.PTTL(ctx, s.keys.HealKey())
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return // unreachable: the next connection asks
	}
	n.heal.mu.Lock()
	known := n.heal.epoch
	n.heal.mu.Unlock()
	if left.Val() <= 0 && known != "" && epochOf(rec.Val()) == known {
		return
	}
	if err := s.check(ctx, i, n.healc); err != nil && !errors.Is(err, ErrHealing) {
		s.checkErrors.Add(1)
		s.log().Error("asking the shard's primary whether it changed failed", "shard", n.name, "err", err)
	}
}

// onConnect is the OnConnect of a primary's connections: a connection to a
// primary that changed fails, and its command with it, until the heal ends.
// A check that fails for another reason (an ACL without the commands
// heal.lua runs) is counted and logged, and the connection is used.
func (s *Store) onConnect(i int) func(ctx context.Context, cn *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		err := s.check(ctx, i, cn)
		if err != nil && !errors.Is(err, ErrHealing) {
			s.checkErrors.Add(1)
			s.log().Error("asking the shard's primary whether it changed failed", "shard", s.shards[i].name, "err", err)
			return nil
		}
		return err
	}
}

// healConnect is the OnConnect of the heal client's connections: it
// learns of a change as any connection does, and is used during heals.
func (s *Store) healConnect(i int) func(ctx context.Context, cn *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		if err := s.check(ctx, i, cn); err != nil && !errors.Is(err, ErrHealing) {
			s.checkErrors.Add(1)
		}
		return nil
	}
}

// epochOf is the epoch id in an epoch record ("<run id>:<epoch>:<how>").
func epochOf(rec string) string {
	parts := strings.Split(rec, ":")
	if len(parts) != 3 {
		return ""
	}
	return parts[1]
}

// newEpoch is a fresh epoch id: 16 hex digits.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
