package cli

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

func init() {
	register(&command{name: "dead-letters discard", args: "--seq N[,M…] | --all --reason TEXT [--by NAME] [--yes]",
		summary: "delete dead letters that can never apply, recording who and why",
		help: `Deletes each dead letter named (--seq, as "tally dead-letters list" shows them, or --all) from
the dead-letter stream, for good: what its events would have charged or given back never
happens. For a message that can never apply (a body that does not decode, another deployment's
key id, a policy nobody configured); fix and replay what can. Each is first recorded on the
decisions stream (path "operator", outcome "discarded", the note naming who and why, and the
event's kind and units): one record per event, with its window key and policy, or one for a
body that does not decode, whose key is 32 zeros and policy "-". Asks for confirmation, showing what will be
discarded, unless --yes is given.`,
		setup: func(c *call) func(context.Context) error {
			seqs := c.flags.String("seq", "", "the dead letters' `sequences` in the dead-letter stream, comma-separated")
			all := c.flags.Bool("all", false, "discard every dead letter")
			yes := c.flags.Bool("yes", false, "do not ask for confirmation")
			by, reason := c.actorFlags()
			return func(ctx context.Context) error {
				switch {
				case len(c.args) > 0:
					return usagef("unexpected argument %q: name dead letters by --seq N[,M…]", c.args[0])
				case (*seqs == "") == !*all:
					return usagef("name the dead letters to discard: --seq N[,M…] (as tally dead-letters list shows them) or --all, one of them")
				case *reason == "":
					return usagef("say why: --reason TEXT (recorded with who discards them)")
				}
				actor, err := operator(c, *by)
				if err != nil {
					return err
				}
				var want []uint64
				if *seqs != "" {
					if want, err = parseSeqs(*seqs); err != nil {
						return err
					}
				}
				return c.discard(ctx, want, events.OperatorNote(actor, *reason), *yes)
			}
		}})
}

// discard records, then deletes, the dead letters seqs (every one when
// nil). The first failure stops it and says what was done.
func (c *call) discard(ctx context.Context, seqs []uint64, note string, yes bool) error {
	dls, st, s, err := c.chosen(ctx, seqs, "discarded")
	if err != nil {
		return err
	}
	if len(dls) == 0 {
		c.out("no dead letters\n")
		return nil
	}
	if len(note) > 256 {
		return usagef("--by and --reason: at most 256 bytes together")
	}
	c.printDeadLetters(dls)
	if err := c.confirm(yes, fmt.Sprintf("Discard %s for good, deleting each from %s (recorded on the decisions stream)?",
		plural(len(dls), "dead letter", "dead letters"), s.DeadLetters.Name)); err != nil {
		return err
	}
	for i, d := range dls {
		if err := c.discardOne(ctx, st, s, d, note); err != nil {
			if i > 0 {
				err = fmt.Errorf("%w (the %s before it were discarded)", err, plural(i, "dead letter", "dead letters"))
			}
			return err
		}
	}
	return nil
}

// discardOne records one dead letter's discard, then deletes it.
func (c *call) discardOne(ctx context.Context, st jetstream.Stream, s events.Streams, d deadLetterEntry, note string) error {
	now := c.env.Now()
	rec := events.Decision{Time: now, Shard: d.Shard, Allowed: true, Path: "operator", Outcome: "discarded",
		Note: note + " (dead letter " + strconv.FormatUint(d.Seq, 10) + ")"}
	var ds []events.Decision
	for _, e := range d.evs {
		r := rec
		r.Key, _ = limiter.ParseDigest(e.Key) // decoded: a valid digest
		r.Policy, r.Limit, r.WindowSeconds, r.RequestID = e.Policy, e.Limit, e.WindowSeconds, e.RequestID
		r.Note = fmt.Sprintf("%s (dead letter %d: %s of %d units, %s #%d)", note, d.Seq, eventWord(e), e.Units, e.Producer, e.Seq)
		ds = append(ds, r)
	}
	if len(ds) == 0 { // a body that does not decode names no window
		r := rec
		r.Policy, r.WindowSeconds = "-", 1
		ds = append(ds, r)
	}
	if err := c.record(ctx, ds...); err != nil {
		return fmt.Errorf("dead letter %d: not discarded: %w", d.Seq, err)
	}
	call, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := st.DeleteMsg(call, d.Seq)
	cancel()
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("dead letter %d: its discard was recorded, but it was not deleted from %s: %w (run the discard again, or: nats stream rmm %s %d)",
			d.Seq, s.DeadLetters.Name, err, s.DeadLetters.Name, d.Seq)
	}
	n := "its body does not decode"
	if d.Events != nil {
		n = plural(*d.Events, "event", "events")
	}
	c.out("dead letter %d: discarded (%s, from %s); recorded on the decisions stream\n", d.Seq, n, d.Subject)
	return nil
}

// eventWord names what an accounting event was: a charge, a refund (a 304's
// finish), a finish, or a release.
func eventWord(e events.Accounting) string {
	switch {
	case e.Kind == events.Started:
		return "a charge"
	case e.Kind == events.Released:
		return "a release"
	case e.Status == 304:
		return "a refund"
	}
	return "a finish"
}
