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
// reseed puts that back before anyone reserves again:
//
//  1. Every connection to a primary, and a probe every EpochCheck, asks it
//     (lua/epoch.lua) whether it is the primary the shard's epoch record
//     names. A primary that is not (another run id: a restart or a
//     promotion; no record: an emptied dataset) begins a reseed: a new epoch,
//     and a marker that lasts ReseedFor.
//  2. While the marker lasts, nothing writes to the shard's windows: every
//     script that would (take, apply, hold, finish) reads the marker first
//     and refuses (TALLYRESEEDING), whatever connection its call came on,
//     and a process that knows of the reseed does not send them (gate); they
//     fail with ErrReseeding, and the request path decides from what it
//     knows (credit, full windows) or by its on_redis_error rule. A
//     connection made to the primary meanwhile fails the command it was made
//     for (but the reseed's own), so that its process learns of the reseed
//     first.
//  3. Each process re-asserts what it holds in the shard's windows
//     (Reseeder.Claims, lua/reseed.lua) and keeps the marker alive while it
//     does; then what it applied on the primary itself is delivered again
//     (Reseeder.Reseeded), and the accountants read the shard's subject again
//     from its oldest message (Epoch).
//
// The reseed ends when the marker expires: ReseedFor after it began, or a
// little after the last process finished re-asserting. A process that
// learns of a reseed only after it ended re-asserts late (ReseedStats.Late):
// others may have reserved in between.

// ErrReseeding is returned for a write to a shard whose primary changed while
// the processes that reached it re-assert what they hold in its windows.
// It is transient: the reseed lasts about Options.ReseedFor.
var ErrReseeding = errors.New("redisstore: the shard's primary changed; its windows are being re-asserted")

// Reseeder is what a process holds in the shards' windows, for a reseed: the
// edge's decision core and its outbox.
type Reseeder interface {
	// Claims lists what this process was given in shard i's windows live
	// at now, and the accounting events it sent for them.
	Claims(shard int, now time.Time) []limiter.Claim
	// Reseeded says that this process has re-asserted its claims on shard
	// i: what it applied on the primary itself may have been lost with the
	// old one, and is to be delivered again.
	Reseeded(shard int)
}

// ReseedStats counts a store's reseeds.
type ReseedStats struct {
	// Reseeds this process took part in: begun, joined, or learnt of late.
	Reseeds uint64
	// Late: reseeds this process learnt of after they ended.
	Late uint64
	// Claims re-asserted; Opened of them opened their window; Conflicts
	// found another window of their key live (nothing changed); Added
	// units added to windows.
	Claims, Opened, Conflicts, Added uint64
	// CheckErrors: asking a primary whether it changed failed (an ACL
	// without the commands epoch.lua runs, or a script error).
	CheckErrors uint64
}

var (
	epochScript  = redis.NewScript(lua.Epoch)
	reseedScript = redis.NewScript(lua.Reseed)
)

// reseeding is one shard's reseed state in this process.
type reseeding struct {
	mu sync.Mutex
	// epoch is the shard's epoch as this process last knew it ("": none).
	epoch string
	// until: no writes before then (the reseed marker's end as last read).
	until time.Time
	// reseeding: this process re-asserts what it holds.
	reseeding bool
	// active: a reseed is, or may be, in progress: gate takes its slow path.
	active atomic.Bool
	// reseeds counts the reseeds this process learnt of (Epoch).
	reseeds atomic.Uint64
}

// epochReply is epoch.lua's answer.
type epochReply struct {
	state   int64 // 0 same, 1 began, 2 joined, 3 late, 4 adopted
	epoch   string
	pttl    time.Duration
	compact bool   // the shard's windows may be compact
	level   string // the shard's format level when span records are kept
}

const (
	epochSame = iota
	epochBegan
	epochJoined
	epochLate
	epochAdopted
)

// maxReseedFor is the longest Options.ReseedFor: a reseed marker that
// lasts longer was not set by a process (epoch.lua ignores it too).
const maxReseedFor = 10 * time.Minute

// claimBatch is the most claims sent in one pipeline.
const claimBatch = 128

// SetReseeder names what this process holds in the shards' windows: what a
// reseed re-asserts. Set it before the first request; nil: nothing.
func (s *Store) SetReseeder(h Reseeder) {
	if h == nil {
		s.reseeder.Store(nil)
		return
	}
	s.reseeder.Store(&h)
}

// Epoch counts the reseeds of shard i this process learnt of: what was
// applied on the shard before a change of it may have been lost, and is to
// be applied again.
func (s *Store) Epoch(i int) uint64 { return s.shards[i].reseed.reseeds.Load() }

// Reseeding reports whether shard i takes no writes from this process now:
// a reseed is in progress.
func (s *Store) Reseeding(i int) bool {
	h := &s.shards[i].reseed
	if !h.active.Load() {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.reseeding || time.Now().Before(h.until)
}

// ReseedStats reads the reseed counters.
func (s *Store) ReseedStats() ReseedStats {
	return ReseedStats{Reseeds: s.reseeds.Load(), Late: s.late.Load(), Claims: s.claims.Load(), Opened: s.opened.Load(),
		Conflicts: s.conflicts.Load(), Added: s.added.Load(), CheckErrors: s.checkErrors.Load()}
}

// gate refuses a write to shard i while it reseeds. A store that has seen no
// reseed pays one atomic load.
func (s *Store) gate(ctx context.Context, i int) error {
	if !s.shards[i].reseed.active.Load() {
		return nil
	}
	return s.gateSlow(ctx, i)
}

func (s *Store) gateSlow(ctx context.Context, i int) error {
	n := s.shards[i]
	h := &n.reseed
	h.mu.Lock()
	reseeding := h.reseeding || time.Now().Before(h.until)
	h.mu.Unlock()
	if reseeding {
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrReseeding)
	}
	// The marker's end as last read has passed; others may have kept it
	// alive since. (Not under h.mu: a new connection asks epoch.lua, which
	// takes it.)
	c, cancel := context.WithTimeout(reseedCtx(ctx), s.opts.ReadTimeout)
	defer cancel()
	left, err := n.primary.PTTL(c, s.keys.ReseedKey()).Result()
	if err != nil {
		return fmt.Errorf("limiter: shard %s: %w (reading the reseed marker: %v)", n.name, ErrReseeding, err)
	}
	if left > maxReseedFor {
		left = 0 // no process sets it so long: not a reseed's (docs/security.md)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if left > 0 {
		if end := time.Now().Add(left); end.After(h.until) {
			h.until = end
		}
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrReseeding)
	}
	if h.reseeding || time.Now().Before(h.until) {
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrReseeding)
	}
	if h.active.CompareAndSwap(true, false) {
		s.log().Info("the shard's reseed is over; reservations resume", "shard", n.name, "epoch", h.epoch)
	}
	return nil
}

// check asks shard i's primary, through c, whether it changed (epoch.lua),
// and takes the answer in; it reports ErrReseeding while the shard reseeds.
func (s *Store) check(ctx context.Context, i int, c redis.Scripter) error {
	n := s.shards[i]
	n.reseed.mu.Lock()
	known := n.reseed.epoch
	n.reseed.mu.Unlock()
	v, err := epochScript.Run(ctx, c, s.epochKeys(), "check", newEpoch(), known,
		s.opts.ReseedFor.Milliseconds(), s.knewCompact(i), ms(s.opts.Clock.Now())).Slice()
	if err != nil {
		return err
	}
	r, err := parseEpoch(v)
	if err != nil {
		return err
	}
	if s.observe(i, r) {
		return fmt.Errorf("limiter: shard %s: %w", n.name, ErrReseeding)
	}
	return nil
}

func parseEpoch(v []any) (epochReply, error) {
	if len(v) != 5 {
		return epochReply{}, fmt.Errorf("unexpected reseed reply %v", v)
	}
	state, ok1 := v[0].(int64)
	epoch, ok2 := v[1].(string)
	pttl, ok3 := v[2].(int64)
	compact, ok4 := v[3].(int64)
	level, ok5 := v[4].(string)
	if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 {
		return epochReply{}, fmt.Errorf("unexpected reseed reply %v", v)
	}
	return epochReply{state: state, epoch: epoch, pttl: time.Duration(pttl) * time.Millisecond, compact: compact == 1,
		level: level}, nil
}

// epochKeys are the keys epoch.lua takes.
func (s *Store) epochKeys() []string {
	return []string{s.keys.EpochKey(), s.keys.ReseedKey(), s.keys.FormatKey(), s.keys.RefillKey()}
}

// knewCompact is epoch.lua's ARGV[5] for shard i: "2" while this process
// knows the shard's span records kept, "1" once it has seen the shard's
// windows compact, so that a primary that lost its format record gets it
// back.
func (s *Store) knewCompact(i int) string {
	switch {
	case s.shards[i].level() != "":
		return "2"
	case s.shards[i].compact.Load():
		return "1"
	}
	return ""
}

// learnFormat takes shard i's format record, as epoch.lua or a probe read
// it, into the shard's state: compact windows once and for all, the level
// of its span records as the record says now (an operator may lower it).
func (s *Store) learnFormat(n *shardNodes, compact bool, level string) {
	if compact && n.compact.CompareAndSwap(false, true) {
		s.log().Info("the shard's windows are compact from now on", "shard", n.name)
	}
	if level == n.level() {
		return
	}
	if level == "" {
		n.spans.Store(nil)
		s.log().Info("the shard's sliding windows' span records are no longer trusted", "shard", n.name)
		return
	}
	n.spans.Store(&level)
	s.log().Info("the shard's sliding windows keep span records from now on", "shard", n.name, "level", level)
}

// parseFormat reads a format record (lua/epoch.lua's KEYS[3]): whether the
// shard's windows may be compact, and the level of its span records when
// they are kept.
func parseFormat(v string) (compact bool, level string) {
	if v == "compact" {
		return true, ""
	}
	if l, ok := strings.CutPrefix(v, "spans:"); ok && len(l) == 16 && limiter.IsLowerHex(l) {
		return true, l
	}
	return false, ""
}

// observe takes a epoch.lua answer into shard i's state, starting this
// process's re-assertion when the shard entered an epoch this process did
// not know. It reports whether the shard takes no writes now.
func (s *Store) observe(i int, r epochReply) bool {
	n := s.shards[i]
	s.learnFormat(n, r.compact, r.level)
	h := &n.reseed
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
	case epochBegan, epochJoined, epochLate:
		if r.epoch == h.epoch {
			break
		}
		first := h.epoch == ""
		h.epoch = r.epoch
		h.reseeds.Add(1)
		s.reseeds.Add(1)
		if r.state == epochLate {
			s.late.Add(1)
			s.log().Error("the shard's primary changed and its reseed ended before this process learnt of it: "+
				"re-asserting late; windows may have let more through meanwhile", "shard", n.name, "epoch", r.epoch)
		} else if !first {
			s.log().Warn("the shard's primary changed: re-asserting what this process holds in its windows; "+
				"no reservation there until the reseed ends", "shard", n.name, "epoch", r.epoch, "reseed_for", r.pttl)
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
// the reseed alive meanwhile, then says so to the reseeder.
func (s *Store) reseed(i int, epoch string) {
	defer s.wg.Done()
	n := s.shards[i]
	var hl Reseeder
	if p := s.reseeder.Load(); p != nil {
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
	var expired atomic.Bool
	var keep sync.WaitGroup
	keep.Go(func() { s.keepReseeding(ctx, i, &expired) })
	var claims []limiter.Claim
	if hl != nil {
		claims = hl.Claims(i, s.opts.Clock.Now())
	}
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
	switch {
	case len(claims) > 0 && expired.Load():
		s.late.Add(1)
		s.log().Error("re-asserted what this process holds in the shard's windows after the reseed ended: "+
			"those windows may have let more through meanwhile (raise redis.reseed_for)", "shard", n.name, "windows", len(claims))
	case len(claims) > 0:
		s.log().Info("re-asserted what this process holds in the shard's windows", "shard", n.name, "windows", len(claims))
	}
	if hl != nil {
		hl.Reseeded(i)
	}
	n.reseed.mu.Lock()
	n.reseed.reseeding = false
	n.reseed.mu.Unlock()
}

// keepReseeding keeps shard i's reseed marker alive while this process
// re-asserts (until ctx ends), so that nobody reserves before it is done:
// at once, then every ReseedFor/5. It sets expired when it finds the reseed
// over before this process is done.
func (s *Store) keepReseeding(ctx context.Context, i int, expired *atomic.Bool) {
	n := s.shards[i]
	every := max(20*time.Millisecond, s.opts.ReseedFor/5)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		c, cancel := context.WithTimeout(reseedCtx(ctx), s.opts.ReadTimeout)
		v, err := epochScript.Run(c, n.primary, s.epochKeys(), "extend", newEpoch(), "",
			max(100, (3*every).Milliseconds()), s.knewCompact(i), ms(s.opts.Clock.Now())).Slice()
		cancel()
		if r, perr := parseEpoch(v); err == nil && perr == nil && r.epoch == "" && ctx.Err() == nil {
			expired.Store(true)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sendClaims sends claims to shard i's primary in one pipeline.
func (s *Store) sendClaims(ctx context.Context, i int, epoch string, claims []limiter.Claim) error {
	n := s.shards[i]
	now := ms(s.opts.Clock.Now())
	ctx = reseedCtx(ctx)
	for attempt := 0; ; attempt++ {
		c, cancel := context.WithTimeout(ctx, 2*time.Second)
		pipe := n.primary.Pipeline()
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
			cmds[j] = pipe.EvalSha(c, reseedScript.Hash(), []string{cl.Key.WindowKey(cl.ResetAt, cl.Slices)}, now, epoch,
				ms(cl.ResetAt), ms(cl.Start), cl.Window.Milliseconds(), s.opts.Grace.Milliseconds(), cl.Holder, cl.Producer,
				cl.Reserved, cl.Charged, cl.GivenBack, cl.From, cl.To, cl.Frozen, expiry,
				limiter.Linger(cl.Window, cl.Slices).Milliseconds())
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
			if err := s.reload(ctx, n.primary, reseedScript); err != nil {
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

// watch checks every shard's primary every EpochCheck until the store
// closes: a probe, in case no connection of this process breaks (an idle
// process, credit in hand) while the primary changes.
func (s *Store) watch() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.EpochCheck)
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

// probe reads shard i's epoch record and reseed marker, and asks the primary
// the whole question (check) only when either says something changed. A
// connection the probe makes asks it in any case (its OnConnect).
func (s *Store) probe(i int) {
	n := s.shards[i]
	ctx, cancel := context.WithTimeout(reseedCtx(context.Background()), s.opts.ReadTimeout)
	defer cancel()
	var rec, format *redis.StringCmd
	var left *redis.DurationCmd
	for attempt := 0; ; attempt++ {
		pipe := n.primary.Pipeline()
		rec = pipe.Get(ctx, s.keys.EpochKey())
		left = pipe.PTTL(ctx, s.keys.ReseedKey())
		format = pipe.Get(ctx, s.keys.FormatKey())
		_, err := pipe.Exec(ctx)
		if err == nil || errors.Is(err, redis.Nil) {
			break
		}
		if attempt > 0 || ctx.Err() != nil {
			return // unreachable: the next probe, or connection, asks
		}
		// A connection the primary's restart or death broke: a new one asks
		// at once (its OnConnect), not a probe later.
	}
	n.reseed.mu.Lock()
	known := n.reseed.epoch
	n.reseed.mu.Unlock()
	marked := left.Val() > 0 && left.Val() <= maxReseedFor
	compact, level := parseFormat(format.Val())
	if compact {
		s.learnFormat(n, compact, level)
	}
	// A format record gone while this process knew it (compact, or a
	// level, which it knows only with compact): the check puts it back.
	if !marked && known != "" && epochOf(rec.Val()) == known && (compact || !n.compact.Load()) {
		return
	}
	if err := s.check(ctx, i, n.primary); err != nil && !errors.Is(err, ErrReseeding) {
		s.checkErrors.Add(1)
		s.log().Error("asking the shard's primary whether it changed failed", "shard", n.name, "err", err)
	}
}

// onConnect is the OnConnect of a primary's connections: a connection to a
// primary that changed fails, and its command with it, until the reseed ends
// — but for a reseed's own calls (reseedCtx). A check that fails for another
// reason (an ACL without the commands epoch.lua runs) is counted and logged,
// and the connection is used. (A Sentinel shard's client runs it on its
// connections to the sentinels too, which know no scripts.)
func (s *Store) onConnect(i int) func(ctx context.Context, cn *redis.Conn) error {
	return func(ctx context.Context, cn *redis.Conn) error {
		err := s.check(ctx, i, cn)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, ErrReseeding):
			if ctx.Value(reseedCtxKey{}) != nil {
				return nil
			}
			return err
		case redis.HasErrorPrefix(err, "ERR unknown command"):
			return nil // a sentinel
		}
		s.checkErrors.Add(1)
		s.log().Error("asking the shard's primary whether it changed failed", "shard", s.shards[i].name, "err", err)
		return nil
	}
}

// reseedCtx marks ctx as a reseed's own: its calls go through while the shard
// reseeds.
func reseedCtx(ctx context.Context) context.Context {
	return context.WithValue(ctx, reseedCtxKey{}, true)
}

type reseedCtxKey struct{}

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

// Compact reports whether shard i's windows may be compact, as this process
// last read the shard's format record.
func (s *Store) Compact(i int) bool { return s.shards[i].compact.Load() }

// MakeCompact records on every shard's primary that the deployment's windows
// may be compact (lua/window.lua) and that every process keeps sliding
// windows' span records true (lua/window.lua's touch_span), at a new level
// no earlier record is of: what an operator does once every process runs
// this version (`tally windows compact`). Processes learn
// it within EpochCheck. It reports, for each shard it recorded it on, in
// order, whether span records were kept there already; an error stops it at the
// shard that failed.
func (s *Store) MakeCompact(ctx context.Context) ([]bool, error) {
	var was []bool
	for _, n := range s.shards {
		level := newEpoch()
		prev, err := n.primary.SetArgs(ctx, s.keys.FormatKey(), "spans:"+level, redis.SetArgs{Get: true}).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return was, fmt.Errorf("limiter: shard %s: recording the window format: %w", n.name, err)
		}
		_, old := parseFormat(prev)
		was = append(was, old != "")
		s.learnFormat(n, true, level)
	}
	return was, nil
}
