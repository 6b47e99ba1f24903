package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tallyhq/tally/internal/limiter"
)

// WindowDetail is one key's window as an operator inspects it on its
// primary: lua/window.lua's fields, read as they are.
type WindowDetail struct {
	// Shard is where it was read: the key's owner, or its previous owner
	// while keys move and a window there is still live.
	Shard string
	// Live is false when no window of the key is live at the read's now.
	Live bool
	// Used counts every unit the window holds: charged and reserved.
	Used           int64
	Start, ResetAt time.Time
	// Holders are the units each producer holds in the window (its
	// reservations and charges, less what it gave back): "reserved per
	// edge", for edges.
	Holders []Holding
	// Frozen are the frozen shares of edges' credit (lua/hold.lua).
	Frozen []Holding
	// MovedTo names the shard the key moved to (resharding), when marked.
	MovedTo string
}

// Holding is the units one producer or holder has in a window.
type Holding struct {
	Who   string
	Units int64
	// Until is when a frozen share expires (zero for holdings).
	Until time.Time
}

// Inspect reads k's window under policy p on its primary (not a replica:
// an operator wants what decides), at now. For a sliding window it is the
// span that ends with the sub-window of now: Used sums the sub-windows of
// the span, Holders what each producer holds in them, Start is the span's
// and ResetAt the sub-window's end.
func (s *Store) Inspect(ctx context.Context, k limiter.Key, p limiter.Policy, now time.Time) (WindowDetail, error) {
	if j, moving := s.previousOwner(k); moving {
		if w, err := s.inspectOn(ctx, j, k, p, now); err != nil || w.Live {
			return w, err
		}
	}
	return s.inspectOn(ctx, s.ShardOf(k), k, p, now)
}

// spanKeys are the Redis keys of every sub-window of p's sliding window of
// k that a span holding the sub-window of now may count, oldest first, and
// how many of them end with that sub-window; for other policies, k's key.
func spanKeys(k limiter.Key, p limiter.Policy, now time.Time) (keys []string, upToNow int) {
	if p.Slices == 0 {
		return []string{k.String()}, 1
	}
	reset := p.WindowAt(now).ResetAt
	for i := -(p.Slices - 1); i < p.Slices; i++ {
		keys = append(keys, k.SliceKey(reset.Add(time.Duration(i)*p.Window)))
	}
	return keys, p.Slices
}

func (s *Store) inspectOn(ctx context.Context, i int, k limiter.Key, p limiter.Policy, now time.Time) (WindowDetail, error) {
	if p.Slices == 0 {
		return s.inspectKey(ctx, i, k.String(), now)
	}
	keys, upToNow := spanKeys(k, p, now)
	var out WindowDetail
	held := map[string]int64{}
	for j, key := range keys[:upToNow] {
		// A sub-window of the span: live at its own time.
		w, err := s.inspectKey(ctx, i, key, now.Add(-time.Duration(upToNow-1-j)*p.Window))
		if err != nil {
			return w, err
		}
		out.Shard, out.MovedTo = w.Shard, w.MovedTo
		if !w.Live {
			continue
		}
		if !out.Live {
			out.Start = w.Start
		}
		out.Live, out.Used = true, out.Used+w.Used
		for _, h := range w.Holders {
			held[h.Who] += h.Units
		}
	}
	out.ResetAt = p.WindowAt(now).ResetAt
	for who, u := range held {
		out.Holders = append(out.Holders, Holding{Who: who, Units: u})
	}
	sort.Slice(out.Holders, func(a, b int) bool { return out.Holders[a].Who < out.Holders[b].Who })
	return out, nil
}

// inspectKey reads the window stored at key on shard i, live at now.
func (s *Store) inspectKey(ctx context.Context, i int, key string, now time.Time) (WindowDetail, error) {
	n := s.shards[i]
	if v, err := n.primary.Get(ctx, key).Result(); err == nil {
		// A compact window: one holder's (lua/window.lua).
		c, ok := limiter.ParseCompact(v)
		if !ok {
			return WindowDetail{}, fmt.Errorf("limiter: inspect on shard %s primary: %q is no window", n.name, v)
		}
		w := WindowDetail{Shard: n.name}
		if c.ResetAt.After(now) {
			w.Live, w.Used, w.Start, w.ResetAt = true, c.Used, c.Start, c.ResetAt
			w.Holders = []Holding{{Who: c.Producer, Units: c.Used}}
		}
		return w, nil
	} else if !errors.Is(err, redis.Nil) && !redis.HasErrorPrefix(err, "WRONGTYPE") {
		return WindowDetail{}, fmt.Errorf("limiter: inspect on shard %s primary: %w", n.name, err)
	}
	fields, err := n.primary.HGetAll(ctx, key).Result()
	if err != nil {
		return WindowDetail{}, fmt.Errorf("limiter: inspect on shard %s primary: %w", n.name, err)
	}
	w := WindowDetail{Shard: n.name, MovedTo: fields["m"]}
	num := func(f string) int64 { v, _ := strconv.ParseInt(fields[f], 10, 64); return v }
	if r := num("r"); r > now.UnixMilli() {
		w.Live, w.Used = true, num("u")
		w.Start, w.ResetAt = time.UnixMilli(num("s")), time.UnixMilli(r)
	}
	if !w.Live {
		return w, nil
	}
	for f, v := range fields {
		switch {
		case strings.HasPrefix(f, "c:"):
			if u, err := strconv.ParseInt(v, 10, 64); err == nil && u != 0 {
				w.Holders = append(w.Holders, Holding{Who: f[2:], Units: u})
			}
		case strings.HasPrefix(f, "z:"):
			// "frozen:expiry ms:producer" (lua/hold.lua)
			parts := strings.SplitN(v, ":", 3)
			if len(parts) == 3 {
				u, _ := strconv.ParseInt(parts[0], 10, 64)
				until, _ := strconv.ParseInt(parts[1], 10, 64)
				w.Frozen = append(w.Frozen, Holding{Who: f[2:], Units: u, Until: time.UnixMilli(until)})
			}
		}
	}
	sort.Slice(w.Holders, func(a, b int) bool { return w.Holders[a].Who < w.Holders[b].Who })
	sort.Slice(w.Frozen, func(a, b int) bool { return w.Frozen[a].Who < w.Frozen[b].Who })
	return w, nil
}

// Reset deletes k's window under policy p on every shard that may hold it
// (its owner, and its previous owner while keys move): the client starts a
// new window at its next request. For a sliding window it deletes every
// sub-window a span holding the sub-window of now may count. It reports
// whether there was one. Edges that hold credit of the deleted window keep
// it until they hear the window has room (the caller's notice) — see
// docs/operations.md for the bound.
func (s *Store) Reset(ctx context.Context, k limiter.Key, p limiter.Policy, now time.Time) (bool, error) {
	keys, _ := spanKeys(k, p, now)
	if p.Slices > 0 {
		keys = append(keys, k.SpanRecordKey()) // what the span held, which a reservation would trust
	}
	shards := []int{s.ShardOf(k)}
	if j, moving := s.previousOwner(k); moving {
		shards = append(shards, j)
	}
	existed := false
	for _, i := range shards {
		n := s.shards[i]
		if err := s.gate(ctx, i); err != nil {
			return existed, err
		}
		deleted, err := n.primary.Del(ctx, keys...).Result()
		if err != nil {
			return existed, fmt.Errorf("limiter: reset on shard %s primary: %w", n.name, err)
		}
		existed = existed || deleted > 0
	}
	return existed, nil
}
