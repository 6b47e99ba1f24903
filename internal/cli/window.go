package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/redisstore"
)

func init() {
	register(&command{name: "inspect", args: "--policy P (--identity I | --digest D)",
		summary: "show a client's window: used, reserved per edge, reset, and its temporary limit",
		help: `Derives the window key as the edge does (the key secret from TALLY_KEY_SECRET) and reads the
window on its shard's primary. "used" counts every unit in the window: what was charged and
what edges reserved and may still spend. Holders are the producers (edges, services) and the
units each holds; frozen shares are credit an edge reported it will not spend.`,
		setup: func(c *call) func(context.Context) error {
			who := c.clientFlags()
			asJSON := c.flags.Bool("json", false, "print the window as JSON")
			return func(ctx context.Context) error {
				p, k, w, err := c.window(ctx, who)
				if err != nil {
					return err
				}
				now := c.env.Now()
				tl, tlErr := c.temporaryOf(ctx, k.Digest())
				if *asJSON {
					return c.printJSON(inspectionOf(p, k, w, tl))
				}
				c.printWindow(p, k, w, tl, now)
				switch {
				case tlErr != nil:
					c.out("temporary limit: unknown (%v)\n", tlErr)
				case tl == nil:
					c.out("temporary limit: none\n")
				default:
					c.out("temporary limit: %s\n", describeLimit(*tl, now))
				}
				return nil
			}
		}})
	register(&command{name: "reset", args: "--policy P (--identity I | --digest D) [--yes] [--reason TEXT]",
		summary: "empty a client's window now (asks first), tell every edge, record it",
		help: `Deletes the window on its primary, so that the client's next request opens a new one, and
tells every edge (a signed notice) that the window has room: an edge that knew it full stops
answering 429 from memory at once. Credit an edge had reserved in the deleted window is spent
before that edge reserves again: the client may be admitted up to that much more than its limit
in the new window (docs/operations.md). The reset is recorded on the decisions stream.`,
		setup: func(c *call) func(context.Context) error {
			who := c.clientFlags()
			yes := c.flags.Bool("yes", false, "do not ask for confirmation")
			reason := c.flags.String("reason", "", "why, recorded with the reset (`text`)")
			by := c.flags.String("by", "", "who resets it, recorded (`name`; default $USER, else $LOGNAME: one is needed)")
			return func(ctx context.Context) error {
				actor, err := operator(c, *by)
				if err != nil {
					return err
				}
				p, k, w, err := c.window(ctx, who)
				if err != nil {
					return err
				}
				now := c.env.Now()
				if !w.Live {
					c.out("no live window of policy %s for digest %s: nothing to reset\n", p.Name, k.Digest())
					return nil
				}
				q := fmt.Sprintf("Reset the window of policy %s for digest %s (used %d of %d, resets %s)?",
					p.Name, k.Digest(), w.Used, p.Limit, w.ResetAt.UTC().Format(time.RFC3339))
				if err := c.confirm(*yes, q); err != nil {
					return err
				}
				if _, err := c.jetstream(); err != nil { // before anything changes: the reset is told and recorded
					return err
				}
				if _, err := c.store.Reset(ctx, k, p, now); err != nil {
					return err
				}
				notice := events.NewNotices(c.keys.Derive(events.NoticeKeyLabel)).Append(nil,
					events.Notice{Key: k.Digest().String(), ResetAt: w.ResetAt, Used: 0}, c.env.Now())
				streams := c.cfg.NATS.Streams.WithDefaults()
				if err := c.nc.Publish(events.NoticeSubject(streams.NoticePrefix, w.Shard), notice); err != nil {
					return fmt.Errorf("the window was reset, but the edges were not told (they learn it at their next read): %w", err)
				}
				d := events.Decision{Time: now, Shard: w.Shard, Key: k.Digest(), Policy: p.Name, Limit: p.Limit,
					WindowSeconds: int64(p.Window / time.Second), Allowed: true, Path: "operator", Outcome: "reset",
					Note: events.OperatorNote(actor, *reason)}
				if err := c.record(ctx, d); err != nil {
					return fmt.Errorf("the window was reset and the edges told, but %w", err)
				}
				c.out("reset: policy %s, digest %s (it held %d of %d); edges told, recorded on the decisions stream\n",
					p.Name, k.Digest(), w.Used, p.Limit)
				return nil
			}
		}})
}

// window reads the window of the client the flags name, on its primary:
// what inspect and reset start with.
func (c *call) window(ctx context.Context, who client) (limiter.Policy, limiter.Key, redisstore.WindowDetail, error) {
	if len(c.args) > 0 {
		return limiter.Policy{}, limiter.Key{}, redisstore.WindowDetail{}, usagef("unexpected %q", c.args[0])
	}
	p, k, err := c.key(who)
	if err != nil {
		return p, k, redisstore.WindowDetail{}, err
	}
	st, err := c.redis()
	if err != nil {
		return p, k, redisstore.WindowDetail{}, err
	}
	w, err := st.Inspect(ctx, k, p, c.env.Now())
	return p, k, w, err
}

// inspection is inspect's JSON: one key style, and no time that is not
// one (a window that is not live has no start or reset; a holding no
// expiry).
type inspection struct {
	Policy string `json:"policy"`
	// Limit is the limit in force: a temporary limit's when one is (0: a
	// block), else the policy's (PolicyLimit); Left what it leaves.
	Limit       int64                  `json:"limit"`
	PolicyLimit int64                  `json:"policy_limit"`
	Window      string                 `json:"window"`
	Digest      string                 `json:"digest"`
	Shard       string                 `json:"shard"`
	MovedTo     string                 `json:"moved_to,omitempty"`
	Live        bool                   `json:"live"`
	Used        int64                  `json:"used"`
	Left        int64                  `json:"left"`
	Start       *time.Time             `json:"start,omitempty"`
	ResetAt     *time.Time             `json:"reset_at,omitempty"`
	Holders     []holding              `json:"holders"`
	Frozen      []holding              `json:"frozen"`
	Temporary   *events.TemporaryLimit `json:"temporary_limit,omitempty"`
}

// holding is units a producer holds in the window (a frozen share: until
// when).
type holding struct {
	Who   string     `json:"who"`
	Units int64      `json:"units"`
	Until *time.Time `json:"until,omitempty"`
}

func inspectionOf(p limiter.Policy, k limiter.Key, w redisstore.WindowDetail, tl *events.TemporaryLimit) inspection {
	limit, _ := inForce(p, tl)
	in := inspection{Policy: p.Name, Limit: limit, PolicyLimit: p.Limit, Window: p.Per(), Digest: k.Digest().String(),
		Shard: w.Shard, MovedTo: w.MovedTo, Live: w.Live, Used: w.Used, Left: max(0, limit-w.Used), Temporary: tl,
		Holders: []holding{}, Frozen: []holding{}}
	if !w.Live {
		in.Left = limit
	} else {
		start, reset := w.Start.UTC(), w.ResetAt.UTC()
		in.Start, in.ResetAt = &start, &reset
	}
	for _, h := range w.Holders {
		in.Holders = append(in.Holders, holding{Who: h.Who, Units: h.Units})
	}
	for _, f := range w.Frozen {
		until := f.Until.UTC()
		in.Frozen = append(in.Frozen, holding{Who: f.Who, Units: f.Units, Until: &until})
	}
	return in
}

// inForce is the limit a client is held to: its temporary limit's while
// one is in force (a block: 0), else its policy's; and how to say so.
func inForce(p limiter.Policy, tl *events.TemporaryLimit) (int64, string) {
	switch {
	case tl == nil:
		return p.Limit, ""
	case tl.Block:
		return 0, fmt.Sprintf("; blocked by an operator, the policy's limit %d", p.Limit)
	}
	return tl.Limit, fmt.Sprintf("; temporary limit %d, the policy's %d", tl.Limit, p.Limit)
}

func (c *call) printWindow(p limiter.Policy, k limiter.Key, w redisstore.WindowDetail, tl *events.TemporaryLimit, now time.Time) {
	c.out("policy %s: %d per %s (mode %s), digest %s, shard %s\n", p.Name, p.Limit, p.Per(), p.Mode.OrDefault(), k.Digest(), w.Shard)
	if w.MovedTo != "" {
		c.out("moved to shard %s (resharding)\n", w.MovedTo)
	}
	if !w.Live {
		c.out("window: none live (the next request opens one)\n")
		return
	}
	limit, terms := inForce(p, tl)
	c.out("window: used %d of %d (%d left%s), opened %s, resets %s (in %s)\n", w.Used, limit, max(0, limit-w.Used), terms,
		w.Start.UTC().Format(time.RFC3339), w.ResetAt.UTC().Format(time.RFC3339), w.ResetAt.Sub(now).Round(time.Second))
	for _, h := range w.Holders {
		c.out("  held by %-28s %d\n", h.Who, h.Units)
	}
	for _, f := range w.Frozen {
		c.out("  frozen for %-25s %d until %s\n", f.Who, f.Units, f.Until.UTC().Format(time.RFC3339))
	}
}

// temporaryOf is dg's temporary limit in force, if any (nil when none was
// ever set, or the latest entry lifted it or has expired).
func (c *call) temporaryOf(ctx context.Context, dg limiter.Digest) (*events.TemporaryLimit, error) {
	l, err := c.latestLimit(ctx, dg)
	if err != nil || l == nil || !l.Live(c.env.Now()) {
		return nil, err
	}
	return l, nil
}

// latestLimit is the latest entry of the limits stream for dg (nil: none).
func (c *call) latestLimit(ctx context.Context, dg limiter.Digest) (*events.TemporaryLimit, error) {
	js, err := c.jetstream()
	if err != nil {
		return nil, err
	}
	streams := c.cfg.NATS.Streams.WithDefaults()
	s, err := js.Stream(ctx, streams.Limits.Name)
	if err != nil {
		return nil, err
	}
	subject := events.LimitSubject(streams.Limits.SubjectPrefix, events.TemporaryLimit{Key: dg})
	m, err := s.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	l, err := events.NewLimits(c.keys.Derive(events.LimitKeyLabel)).Read(streams.Limits.SubjectPrefix, m.Subject, m.Header, m.Data)
	if err != nil {
		return nil, err
	}
	return &l, nil
}

func describeLimit(l events.TemporaryLimit, now time.Time) string {
	terms := fmt.Sprintf("limit %d", l.Limit)
	if l.Block {
		terms = "blocked"
	}
	s := fmt.Sprintf("%s until %s (in %s)", terms, l.Expires.UTC().Format(time.RFC3339), l.Expires.Sub(now).Round(time.Second))
	if note := events.OperatorNote(l.By, l.Reason); note != "" {
		s += ", " + note
	}
	return s
}

// operator is who acts, as operators' records name them: --by, else
// $USER, else $LOGNAME. A record must name someone: without any of them it
// is a usage error, before anything changes.
func operator(c *call, by string) (string, error) {
	for _, who := range []string{by, c.env.Getenv("USER"), c.env.Getenv("LOGNAME")} {
		if who = strings.TrimSpace(who); who != "" {
			return who, nil
		}
	}
	return "", usagef("say who acts: --by NAME (neither $USER nor $LOGNAME is set); the record names who")
}

func init() {
	register(&command{name: "windows compact", args: "[--yes]",
		summary: "let every process open windows compact and trust span records (after upgrading every edge and accountant)",
		help: `Records on every shard's primary the deployment's window format: windows may be stored compact,
one string per window that one edge alone reserved in, opened by one SET; and a sliding window's
reservations may trust its span record, what the other sub-windows of its spans hold, kept true by
every script that changes a sub-window (docs/windows.md). A deployment that began on this version has
it from the start; one upgraded from 0.1 runs this once every edge-checker and accountant runs this
version — 0.1 fails on compact windows and keeps no span record true. Processes learn it within
redis.epoch_check. Each run begins a new level, which no earlier span record is of. It cannot be undone
while compact windows live.`,
		setup: func(c *call) func(context.Context) error {
			yes := c.flags.Bool("yes", false, "do not ask for confirmation")
			return func(ctx context.Context) error {
				st, err := c.redis()
				if err != nil {
					return err
				}
				if err := c.confirm(*yes, "Every edge-checker and accountant runs this version?"); err != nil {
					return err
				}
				was, err := st.MakeCompact(ctx)
				for i, w := range was {
					if w {
						c.out("shard %s: compact, span records kept already (a new level)\n", st.ShardName(i))
					} else {
						c.out("shard %s: compact, span records kept from now on\n", st.ShardName(i))
					}
				}
				return err
			}
		}})
}
