package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Take reserves units of k's window on its shard's primary at time now (the
// caller's clock, read once for the decision), opening a window at the whole
// second of now when none is live (reset limiter.Window after that). The
// reservation is all or nothing above Need and never takes the window past
// Limit. It is one atomic script call (lua/take.lua).
//
// Take is not retried on a connection error: a retried reservation could
// be granted twice. After an error the reservation may or may not have
// been made (a primary that froze runs it when it wakes); the holder's next
// Take (or a read: Need and Want 0) tells by limiter.Grant.Mine.
func (s *Store) Take(ctx context.Context, k limiter.Key, now time.Time, a limiter.TakeArgs) (limiter.Grant, error) {
	if err := a.Validate(k); err != nil {
		return limiter.Grant{}, err
	}
	holder := a.Holder
	if holder == "" {
		holder = a.Producer
	}
	i, moving := s.ShardOf(k), ""
	if j, ok := s.previousOwner(k); ok {
		// The key moves: its previous owner serves a live window it holds,
		// or marks the key moved (lua/take.lua).
		i, moving = j, s.shards[i].name
	}
	var owed []byte
	for i, o := range a.Owed {
		if i > 0 {
			owed = append(owed, ',')
		}
		owed = strconv.AppendUint(owed, o.Seq, 10)
		owed = append(owed, ':')
		owed = strconv.AppendInt(owed, o.Units, 10)
	}
	keys := []string{k.String(), s.producerKey(a.Producer), s.keys.ReseedKey()}
	var v []int64
	var err error
	for attempt := 0; ; attempt++ {
		args := []any{ms(now), a.Window.Milliseconds(), a.Limit, a.Need, a.Want, s.opts.Grace.Milliseconds(), holder,
			a.Producer, string(owed), moving, "", "", "", ""}
		if a.Freeze {
			args[10], args[11], args[12] = a.Keep, a.Share, ms(a.ShareExpiry)
		}
		if s.shards[i].compact.Load() {
			args[13] = "1"
		}
		var open *opening
		if args[13] == "1" && a.Fresh && a.Need > 0 && moving == "" && len(owed) == 0 && !a.Freeze &&
			a.Window%time.Second == 0 && limiter.CompactHolder(holder, a.Producer) {
			start := now.Truncate(time.Second)
			reset := start.Add(a.Window)
			open = &opening{value: limiter.AppendCompact(make([]byte, 0, 48), a.Want, start, reset, holder), start: start,
				reset: reset, expires: reset.Add(s.opts.Grace), want: a.Want}
		}
		if err = s.gate(ctx, i); err == nil {
			v, err = s.shards[i].takes.do(ctx, keys, args, open)
		}
		to, moved := movedTo(err)
		if !moved || attempt > 0 {
			break
		}
		j, ok := s.byName[to]
		if !ok {
			return limiter.Grant{}, fmt.Errorf("limiter: take on shard %s: the key moved to shard %q, which is not configured",
				s.shards[i].name, to)
		}
		i, moving = j, ""
	}
	n := s.shards[i]
	if err != nil {
		return limiter.Grant{}, fmt.Errorf("limiter: take on shard %s: %w", n.name, scriptErr(err))
	}
	if len(v) != 8 {
		return limiter.Grant{}, fmt.Errorf("limiter: take on shard %s: unexpected reply %v", n.name, v)
	}
	g := limiter.Grant{Granted: v[0], Used: v[1], Opened: v[4] == 1, Applied: uint64(v[5]), Mine: v[6], Frozen: v[7], Shard: i}
	if v[2] != 0 {
		g.Live, g.ResetAt, g.Start = true, fromMS(v[2]), fromMS(v[3])
	}
	return g, nil
}
