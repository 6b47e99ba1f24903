package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

const limitsHelp = `A temporary limit changes one client's terms under one policy for a while — a tighter or
looser limit, or a block (every request denied, told to come back when it lifts) — and lifts
itself at its expiry with no one acting. It is published, signed with a key derived from the
deployment's secret, on the limits stream; every edge follows the stream and applies it within
the time a JetStream message takes to reach it (milliseconds; an edge that cannot reach NATS
applies it once it can). Every change is recorded on the decisions stream.`

func init() {
	register(&command{name: "limits set", args: "--policy P (--identity I | --digest D) (--limit N | --block) --for DURATION",
		summary: "put a temporary limit (or a block) on a client, lifting itself after DURATION", help: limitsHelp,
		setup: func(c *call) func(context.Context) error {
			who := c.clientFlags()
			limit := c.flags.Int64("limit", 0, "the client's limit under the policy while it lasts (`units` per window)")
			block := c.flags.Bool("block", false, "deny every request of the client while it lasts")
			d := c.flags.Duration("for", 0, "how long it lasts (`duration`: 15m, 2h; at most 168h)")
			by, reason := c.actorFlags()
			return func(ctx context.Context) error {
				switch {
				case len(c.args) > 0:
					return usagef("unexpected %q", c.args[0])
				case *block == (*limit != 0):
					return usagef("give --limit N or --block (one of them)")
				case *d <= 0 || *d > events.MaxTemporary:
					return usagef("--for %v: want a duration from 1s to %v", *d, events.MaxTemporary)
				}
				p, k, err := c.key(who)
				if err != nil {
					return err
				}
				if !*block && (*limit < p.CostOrDefault() || *limit > limiter.MaxLimit) {
					return usagef("--limit %d: want %d (what a request of %s costs) to %d", *limit, p.CostOrDefault(), p.Name, limiter.MaxLimit)
				}
				actor, err := operator(c, *by)
				if err != nil {
					return err
				}
				latest, err := c.latestLimit(ctx, k.Digest())
				if err != nil {
					return err
				}
				now := c.env.Now()
				set := events.After(latest, now)
				l := events.TemporaryLimit{Policy: p.Name, Key: k.Digest(), Limit: *limit, Block: *block, Set: set,
					Expires: set.Add(*d), By: actor, Reason: *reason}
				if err := c.publishLimit(ctx, p, k, l); err != nil {
					return err
				}
				c.out("set: policy %s, digest %s: %s\n", p.Name, k.Digest(), describeLimit(l, now))
				return nil
			}
		}})
	register(&command{name: "limits clear", args: "--policy P (--identity I | --digest D)",
		summary: "lift a client's temporary limit before its expiry", help: limitsHelp,
		setup: func(c *call) func(context.Context) error {
			who := c.clientFlags()
			by, reason := c.actorFlags()
			return func(ctx context.Context) error {
				if len(c.args) > 0 {
					return usagef("unexpected %q", c.args[0])
				}
				actor, err := operator(c, *by)
				if err != nil {
					return err
				}
				p, k, err := c.key(who)
				if err != nil {
					return err
				}
				cur, err := c.latestLimit(ctx, k.Digest())
				if err != nil {
					return err
				}
				now := c.env.Now()
				if cur == nil || !cur.Live(now) {
					return fmt.Errorf("no temporary limit in force for policy %s, digest %s: nothing to clear", p.Name, k.Digest())
				}
				set := events.After(cur, now)
				l := events.TemporaryLimit{Policy: p.Name, Key: k.Digest(), Cleared: true, Set: set, Expires: set.Add(events.MaxTemporary),
					By: actor, Reason: *reason}
				if err := c.publishLimit(ctx, p, k, l); err != nil {
					return err
				}
				c.out("cleared: policy %s, digest %s (was %s)\n", p.Name, k.Digest(), describeLimit(*cur, now))
				return nil
			}
		}})
	register(&command{name: "limits list", args: "[--policy P] [--json]",
		summary: "list the temporary limits in force", help: limitsHelp,
		setup: func(c *call) func(context.Context) error {
			policy := c.flags.String("policy", "", "only this `policy`'s")
			asJSON := c.flags.Bool("json", false, "print them as JSON")
			return func(ctx context.Context) error {
				if len(c.args) > 0 {
					return usagef("unexpected %q", c.args[0])
				}
				ls, err := c.liveLimits(ctx, *policy)
				if err != nil {
					return err
				}
				if *asJSON {
					return c.printJSON(ls)
				}
				if len(ls) == 0 {
					c.out("no temporary limits in force\n")
					return nil
				}
				now := c.env.Now()
				for _, l := range ls {
					c.out("%-16s %s  %s\n", l.Policy, l.Key, describeLimit(l, now))
				}
				return nil
			}
		}})
}

// actorFlags are who acts and why, recorded with a change.
func (c *call) actorFlags() (by, reason *string) {
	return c.flags.String("by", "", "who makes the change, recorded (`name`; default $USER, else $LOGNAME: one is needed)"),
		c.flags.String("reason", "", "why, recorded with the change (`text`, at most 256 bytes)")
}

// publishLimit publishes l on the limits stream, waits for JetStream to
// store it, and records it on the decisions stream.
func (c *call) publishLimit(ctx context.Context, p limiter.Policy, k limiter.Key, l events.TemporaryLimit) error {
	js, err := c.jetstream()
	if err != nil {
		return err
	}
	streams := c.cfg.NATS.Streams.WithDefaults()
	m, err := events.NewLimits(c.keys.Derive(events.LimitKeyLabel)).Msg(streams.Limits.SubjectPrefix, l)
	if err != nil {
		return usagef("%v", err)
	}
	pub, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.PublishMsg(pub, m); err != nil {
		return fmt.Errorf("the limits stream did not take it (nothing changed; the edges create the stream when they start): %w", err)
	}
	st, err := c.redis()
	if err != nil {
		return err
	}
	d := events.LimitRecord(l, p.Window, p.Limit, st.ShardName(st.ShardOf(k)))
	if err := c.record(ctx, d); err != nil {
		return fmt.Errorf("the change is in force, but %w", err)
	}
	return nil
}

// liveLimits reads the latest entry of every window key from the limits
// stream and returns those in force (of policy, when given).
func (c *call) liveLimits(ctx context.Context, policy string) ([]events.TemporaryLimit, error) {
	js, err := c.jetstream()
	if err != nil {
		return nil, err
	}
	streams := c.cfg.NATS.Streams.WithDefaults()
	cons, err := js.OrderedConsumer(ctx, streams.Limits.Name, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy, FilterSubjects: []string{streams.Limits.SubjectPrefix + ".>"}})
	if err != nil {
		return nil, fmt.Errorf("the limits stream: %w", err)
	}
	reader := events.NewLimits(c.keys.Derive(events.LimitKeyLabel))
	now := c.env.Now()
	var out []events.TemporaryLimit
	pending := cons.CachedInfo().NumPending // what the stream held when the consumer was made
	for pending > 0 {
		batch, err := cons.Fetch(int(min(pending, 256)), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if meta, err := m.Metadata(); err == nil {
				pending = meta.NumPending
			}
			l, err := reader.Read(streams.Limits.SubjectPrefix, m.Subject(), m.Headers(), m.Data())
			if err != nil {
				fmt.Fprintf(c.env.Stderr, "tally: an entry of the limits stream was refused (%s): %v\n", m.Subject(), err)
				continue
			}
			if l.Live(now) && (policy == "" || l.Policy == policy) {
				out = append(out, l)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("the limits stream did not deliver what it holds in 5s")
		}
	}
	return out, nil
}
