package cli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/accountant"
	"github.com/tallyhq/tally/internal/events"
)

func init() {
	register(&command{name: "dead-letters list", args: "[--json]", summary: "list the accounting messages set aside as dead letters, with why",
		help: `Prints every message of the dead-letter stream (nats.streams.dead_letters, default TALLY_DLQ),
one a line: its sequence there (what "tally dead-letters replay --seq" takes), when it was
stored, its shard, the accounting subject and sequence it came from, how many events its body
holds ("-" when it does not decode: the reason says why) and the reason it was set aside.
--json prints them as a JSON array instead. An empty stream prints "no dead letters".`,
		setup: func(c *call) func(context.Context) error {
			asJSON := c.flags.Bool("json", false, "print the dead letters as a JSON array")
			return func(ctx context.Context) error {
				if len(c.args) > 0 {
					return usagef("unexpected argument %q", c.args[0])
				}
				dls, err := c.deadLetters(ctx)
				if err != nil {
					return err
				}
				switch {
				case *asJSON:
					if dls == nil {
						dls = []deadLetterEntry{}
					}
					return c.printJSON(dls)
				case len(dls) == 0:
					c.out("no dead letters\n")
					return nil
				}
				c.printDeadLetters(dls)
				return nil
			}
		}})
	register(&command{name: "dead-letters replay", args: "--seq N[,M…] | --all [--yes]",
		summary: "publish dead letters again on their original subjects, then delete them from the dead-letter stream",
		help: `Publishes each dead letter named (--seq, as "tally dead-letters list" shows them, or --all) again
on the accounting subject it came from, with its original headers and body (less the
dead-letter headers), and once JetStream has stored it, deletes it from the dead-letter
stream. Fix what the reason names first (a window key of the wrong type in Redis, a policy the
accountants do not know): a replayed message that fails again comes back as a new dead letter.

Replaying is safe: events keep their producers' numbers, so an event already applied is a
duplicate that changes nothing; and each replay carries the message id replay.<sequence>, so
one repeated within the accounting stream's duplicate window is stored once. Messages are
replayed in order, one at a time; the first failure stops the replay and says what was done.
Asks for confirmation, showing what will be replayed, unless --yes is given.`,
		setup: func(c *call) func(context.Context) error {
			seqs := c.flags.String("seq", "", "the dead letters' `sequences` in the dead-letter stream, comma-separated")
			all := c.flags.Bool("all", false, "replay every dead letter")
			yes := c.flags.Bool("yes", false, "do not ask for confirmation")
			return func(ctx context.Context) error {
				if len(c.args) > 0 {
					return usagef("unexpected argument %q: name dead letters by --seq N[,M…]", c.args[0])
				}
				if (*seqs == "") == !*all {
					return usagef("name the dead letters to replay: --seq N[,M…] (as tally dead-letters list shows them) or --all, one of them")
				}
				var want []uint64
				if *seqs != "" {
					var err error
					if want, err = parseSeqs(*seqs); err != nil {
						return err
					}
				}
				return c.replay(ctx, want, *yes)
			}
		}})
}

// deadLetterEntry is one dead letter as list shows it.
type deadLetterEntry struct {
	Seq         uint64    `json:"seq"`
	Stored      time.Time `json:"stored"`
	Shard       string    `json:"shard"`
	Subject     string    `json:"original_subject"`
	OriginalSeq uint64    `json:"original_seq,omitempty"`
	Producer    string    `json:"producer,omitempty"`
	// Events is how many events the body holds; nil when it does not
	// decode (DecodeError says why).
	Events      *int   `json:"events"`
	DecodeError string `json:"decode_error,omitempty"`
	Reason      string `json:"reason"`

	msg *jetstream.RawStreamMsg
	evs []events.Accounting // the body's events, when it decodes
}

// deadLetterOf reads what a dead letter says about itself.
func deadLetterOf(s events.Streams, m *jetstream.RawStreamMsg) deadLetterEntry {
	e := deadLetterEntry{Seq: m.Sequence, Stored: m.Time.UTC(), msg: m,
		Shard:   strings.TrimPrefix(m.Subject, s.DeadLetters.SubjectPrefix+"."),
		Subject: m.Header.Get(accountant.HeaderDeadSubject), Reason: m.Header.Get(accountant.HeaderDeadReason)}
	e.OriginalSeq, _ = strconv.ParseUint(m.Header.Get(accountant.HeaderDeadSeq), 10, 64)
	e.Producer = events.ProducerOfSubject(s.Accounting.SubjectPrefix, e.Shard, e.Subject)
	evs, err := events.DecodeAccounting(e.Shard, e.Producer, m.Header, m.Data)
	if err != nil {
		e.DecodeError = err.Error()
	} else {
		n := len(evs)
		e.Events, e.evs = &n, evs
	}
	return e
}

// deadLetterStream is the deployment's dead-letter stream and its
// streams' configuration.
func (c *call) deadLetterStream(ctx context.Context) (jetstream.Stream, events.Streams, error) {
	cfg, err := c.deployment()
	if err != nil {
		return nil, events.Streams{}, err
	}
	js, err := c.jetstream()
	if err != nil {
		return nil, events.Streams{}, err
	}
	s := cfg.NATS.Streams.WithDefaults()
	st, err := js.Stream(ctx, s.DeadLetters.Name)
	if err != nil {
		return nil, s, fmt.Errorf("dead-letter stream %s: %w", s.DeadLetters.Name, err)
	}
	return st, s, nil
}

// deadLetters reads every message of the dead-letter stream, in order.
func (c *call) deadLetters(ctx context.Context) ([]deadLetterEntry, error) {
	st, s, err := c.deadLetterStream(ctx)
	if err != nil {
		return nil, err
	}
	state := st.CachedInfo().State
	if state.Msgs == 0 {
		return nil, nil
	}
	var out []deadLetterEntry
	// Each read returns the first message at or after seq: replayed
	// (deleted) ones leave gaps that cost nothing.
	for seq := state.FirstSeq; seq <= state.LastSeq; {
		m, err := st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(">"))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s message %d: %w", s.DeadLetters.Name, seq, err)
		}
		if m.Sequence > state.LastSeq {
			break // stored since this began
		}
		out = append(out, deadLetterOf(s, m))
		seq = m.Sequence + 1
	}
	return out, nil
}

func (c *call) printDeadLetters(dls []deadLetterEntry) {
	tw := tabwriter.NewWriter(c.env.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSTORED (UTC)\tSHARD\tFROM (SUBJECT #SEQUENCE)\tEVENTS\tREASON")
	for _, d := range dls {
		from := d.Subject
		if from == "" {
			from = "(no " + accountant.HeaderDeadSubject + ")"
		}
		if d.OriginalSeq > 0 {
			from += " #" + strconv.FormatUint(d.OriginalSeq, 10)
		}
		n := "-"
		if d.Events != nil {
			n = strconv.Itoa(*d.Events)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", d.Seq, d.Stored.Format("2006-01-02T15:04:05.000Z"), d.Shard, from, n,
			oneLine(d.Reason))
	}
	_ = tw.Flush()
}

// oneLine keeps a header's text on its line.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// parseSeqs reads --seq: stream sequences, comma-separated, each once.
func parseSeqs(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || n == 0 {
			return nil, usagef("--seq %q: want dead-letter stream sequences such as 12 or 12,15 (tally dead-letters list shows them)", s)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out, nil
}

// chosen reads the dead letters seqs (every one when nil): all of them, or
// an error naming those that are not there (what would then be done is
// not).
func (c *call) chosen(ctx context.Context, seqs []uint64, what string) ([]deadLetterEntry, jetstream.Stream, events.Streams, error) {
	var dls []deadLetterEntry
	if seqs == nil {
		var err error
		if dls, err = c.deadLetters(ctx); err != nil {
			return nil, nil, events.Streams{}, err
		}
	}
	st, s, err := c.deadLetterStream(ctx)
	if err != nil {
		return nil, nil, s, err
	}
	if seqs != nil {
		var missing []string
		for _, seq := range seqs {
			m, err := st.GetMsg(ctx, seq)
			switch {
			case errors.Is(err, jetstream.ErrMsgNotFound):
				missing = append(missing, strconv.FormatUint(seq, 10))
			case err != nil:
				return nil, nil, s, fmt.Errorf("reading %s message %d: %w", s.DeadLetters.Name, seq, err)
			default:
				dls = append(dls, deadLetterOf(s, m))
			}
		}
		if len(missing) > 0 {
			return nil, nil, s, fmt.Errorf("no dead letter %s in %s (tally dead-letters list shows what it holds): nothing was %s",
				strings.Join(missing, ", "), s.DeadLetters.Name, what)
		}
	}
	return dls, st, s, nil
}

// replay publishes the dead letters seqs (every one when nil) again on
// their original subjects and deletes each from the dead-letter stream
// once JetStream has stored its copy.
func (c *call) replay(ctx context.Context, seqs []uint64, yes bool) error {
	dls, st, s, err := c.chosen(ctx, seqs, "replayed")
	if err != nil {
		return err
	}
	if len(dls) == 0 {
		c.out("no dead letters\n")
		return nil
	}
	for _, d := range dls { // every one must say where it goes before any is replayed
		if !strings.HasPrefix(d.Subject, s.Accounting.SubjectPrefix+".") {
			return fmt.Errorf("dead letter %d: original subject %q is not an accounting subject (%s.>): nothing was replayed",
				d.Seq, d.Subject, s.Accounting.SubjectPrefix)
		}
	}
	c.printDeadLetters(dls)
	if err := c.confirm(yes, fmt.Sprintf("Replay %s on %s's subjects, deleting each from %s once stored?",
		plural(len(dls), "dead letter", "dead letters"), s.Accounting.Name, s.DeadLetters.Name)); err != nil {
		return err
	}
	js, err := c.jetstream()
	if err != nil {
		return err
	}
	for i, d := range dls {
		if err := c.replayOne(ctx, js, st, s, d); err != nil {
			if i > 0 {
				err = fmt.Errorf("%w (the %s before it were replayed)", err, plural(i, "dead letter", "dead letters"))
			}
			if rest := len(dls) - i - 1; rest > 0 {
				err = fmt.Errorf("%w; %s after it not tried", err, plural(rest, "dead letter", "dead letters"))
			}
			return err
		}
	}
	return nil
}

// replayOne publishes one dead letter on its original subject, waits for
// the ack, then deletes it from the dead-letter stream.
func (c *call) replayOne(ctx context.Context, js jetstream.JetStream, st jetstream.Stream, s events.Streams, d deadLetterEntry) error {
	m := nats.NewMsg(d.Subject)
	m.Header = nats.Header{}
	for k, v := range d.msg.Header {
		switch {
		case k == accountant.HeaderDeadReason, k == accountant.HeaderDeadSubject, k == accountant.HeaderDeadSeq,
			k == events.HeaderMsgID, strings.HasPrefix(k, "Nats-Expected-"):
			continue // the dead letter's own, or JetStream's instructions for the copy
		}
		m.Header[k] = append([]string(nil), v...)
	}
	m.Data = d.msg.Data
	id := "replay." + strconv.FormatUint(d.Seq, 10)
	call, cancel := context.WithTimeout(ctx, 5*time.Second)
	ack, err := js.PublishMsg(call, m, jetstream.WithMsgID(id))
	cancel()
	if err != nil {
		return fmt.Errorf("dead letter %d: publishing on %s: %w (it is still in %s)", d.Seq, d.Subject, err, s.DeadLetters.Name)
	}
	what := "replayed"
	if ack.Duplicate {
		what = "already replayed (" + ack.Stream + " kept the first copy)"
	}
	call, cancel = context.WithTimeout(ctx, 5*time.Second)
	err = st.DeleteMsg(call, d.Seq)
	cancel()
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("dead letter %d: %s on %s as %s message %d, but not deleted from %s: %w (replaying it again is safe: "+
			"its events are duplicates; or delete it: nats stream rmm %s %d)", d.Seq, what, d.Subject, ack.Stream, ack.Sequence,
			s.DeadLetters.Name, err, s.DeadLetters.Name, d.Seq)
	}
	n := "its body does not decode"
	if d.Events != nil {
		n = plural(*d.Events, "event", "events")
	}
	c.out("dead letter %d: %s on %s (%s) as %s message %d; deleted from %s\n", d.Seq, what, d.Subject, n, ack.Stream,
		ack.Sequence, s.DeadLetters.Name)
	return nil
}
