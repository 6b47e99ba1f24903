package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	tallyclient "github.com/tallyhq/tally/client"
	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// decisionPaths are the values of a decision record's path
// (docs/decision.schema.json).
var decisionPaths = []string{"credit", "reserve", "cache", "borrow", "fail-open", "finish", "accountant", "rule",
	"backoff", "blocked", "operator"}

func init() {
	register(&command{name: "decisions", args: "[FLAGS]", summary: "print the decisions stream's records, oldest first; --follow for new ones",
		help: `Reads the decisions stream (nats.streams.decisions, default TALLY_DECISIONS) from --since ago
(or from its start with --all) and prints one line per record, oldest first:

  TIME (UTC)               RESULT  PATH       KEY (window digest)              POLICY used U/L ...

then, when the record has them: cost (when not 1), reset (the window's end; a time of day on
the record's day), until and strikes (backoff, blocks, temporary limits), outcome (accountants'
and operators' records, decision-API finishes), lag (accountants'), shadow, domain and rule
(Envoy's), request (the request id that joins an edge's record to an accountant's), edge (the
writer), and note (an operator's: who and why). With --json each record is printed as stored:
one JSON object a line (docs/decision.schema.json).

Without --follow it stops once it has printed what the stream held when it started; with
--follow it keeps printing new records until interrupted. Filters combine: --policy, the client
(--identity with --policy, or --digest), --result and --path. The NATS user needs only to read
the stream (the analytics user of deploy/nats/tally.conf will do).`,
		setup: func(c *call) func(context.Context) error {
			since := c.flags.Duration("since", 5*time.Minute, "print records published at most this `long` ago")
			all := c.flags.Bool("all", false, "print from the stream's first record (instead of --since)")
			follow := c.flags.Bool("follow", false, "keep printing new records until interrupted")
			cl := c.clientFlags()
			result := c.flags.String("result", "", "only records of this `result`: allowed or denied")
			path := c.flags.String("path", "", "only records of this `path`: "+strings.Join(decisionPaths, ", "))
			asJSON := c.flags.Bool("json", false, "print each record as stored: one JSON object a line")
			return func(ctx context.Context) error {
				if len(c.args) > 0 {
					return usagef("unexpected argument %q: filters are flags (--policy, --identity, --digest, --result, --path)", c.args[0])
				}
				sinceSet := false
				c.flags.Visit(func(f *flag.Flag) {
					if f.Name == "since" {
						sinceSet = true
					}
				})
				switch {
				case *all && sinceSet:
					return usagef("--all reads from the stream's start: give --all or --since, not both")
				case !*all && *since <= 0:
					return usagef("--since %v: want a positive duration such as 30s, 5m or 2h (or --all)", *since)
				case *result != "" && *result != "allowed" && *result != "denied":
					return usagef("--result %q: want allowed or denied", *result)
				case *path != "" && !slices.Contains(decisionPaths, *path):
					return usagef("--path %q: want one of %s", *path, strings.Join(decisionPaths, ", "))
				case *cl.identity != "" && *cl.policy == "":
					return usagef("--identity needs --policy: a window is a policy's and a client's")
				}
				f := decisionFilter{policy: *cl.policy, result: *result, path: *path}
				switch {
				case *cl.identity != "" || (*cl.digest != "" && *cl.policy != ""):
					_, k, err := c.key(cl)
					if err != nil {
						return err
					}
					f.key = k.Digest().String()
				case *cl.digest != "":
					dg, err := limiter.ParseDigest(*cl.digest)
					if err != nil {
						return usagef("--digest: want the 32 lower-case hex digits of a window key, as records and alerts name it")
					}
					f.key = dg.String()
				}
				cfg, err := c.deployment()
				if err != nil {
					return err
				}
				js, err := c.jetstream()
				if err != nil {
					return err
				}
				oc := jetstream.OrderedConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy}
				if !*all {
					from := c.env.Now().Add(-*since)
					oc.DeliverPolicy, oc.OptStartTime = jetstream.DeliverByStartTimePolicy, &from
				}
				stream := cfg.NATS.Streams.WithDefaults().Decisions.Name
				return c.readDecisions(ctx, js, stream, oc, *follow, func(r *record) {
					if !f.match(r) {
						return
					}
					if *asJSON {
						var b bytes.Buffer
						if json.Compact(&b, r.raw) != nil {
							b.Write(r.raw)
						}
						b.WriteByte('\n')
						_, _ = c.env.Stdout.Write(b.Bytes())
						return
					}
					c.out("%s\n", decisionLine(r))
				})
			}
		}})
}

// readDecisions reads stream with an ordered consumer (nothing kept on the
// server) and calls fn with each record, in order: until ctx ends when
// follow is set, else until it has read every message that was pending
// when it started.
func (c *call) readDecisions(ctx context.Context, js jetstream.JetStream, stream string, oc jetstream.OrderedConsumerConfig,
	follow bool, fn func(*record)) error {
	cons, err := js.OrderedConsumer(ctx, stream, oc)
	if err != nil {
		return fmt.Errorf("reading %s (does the NATS user have the permission to?): %w", stream, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("reading %s: %w", stream, err)
	}
	defer it.Stop()
	if !follow {
		// The consumer's first information says how many messages it has
		// to deliver: none, and there is nothing to wait for.
		if info := cons.CachedInfo(); info != nil && info.NumPending == 0 {
			return nil
		}
	}
	for {
		wait, cancel := ctx, context.CancelFunc(func() {})
		if !follow {
			wait, cancel = context.WithTimeout(ctx, 5*time.Second)
		}
		m, err := it.Next(jetstream.NextContext(wait))
		cancel()
		switch {
		case err != nil && ctx.Err() != nil:
			if follow {
				return nil // interrupted: what following is for
			}
			return ctx.Err()
		case err != nil && !follow && errors.Is(err, context.DeadlineExceeded):
			// Nothing came for a while: caught up unless the consumer
			// still has messages to deliver.
			info, ierr := cons.Info(ctx)
			if ierr != nil {
				return fmt.Errorf("reading %s: %w", stream, ierr)
			}
			if info.NumPending == 0 {
				return nil
			}
			continue
		case err != nil:
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		md, err := m.Metadata()
		if err != nil {
			return fmt.Errorf("reading %s: %w", stream, err)
		}
		recs, err := parseRecords(m.Data())
		if err != nil {
			fmt.Fprintf(c.env.Stderr, "tally %s: %s message %d (subject %s) skipped: %v\n", c.cmd.name, stream,
				md.Sequence.Stream, m.Subject(), err)
		}
		for i := range recs {
			fn(&recs[i])
		}
		if !follow && md.NumPending == 0 {
			return nil // caught up
		}
	}
}

// record is one decision record as read: the public client package's
// shape of it, and its JSON as the message holds it.
type record struct {
	tallyclient.DecisionRecord
	raw json.RawMessage
}

// parseRecords reads one message of the decisions stream: a JSON array of
// decision records (docs/decision.schema.json).
func parseRecords(body []byte) ([]record, error) {
	var raws []json.RawMessage
	if err := json.Unmarshal(body, &raws); err != nil {
		return nil, fmt.Errorf("want a JSON array of decision records: %w", err)
	}
	out := make([]record, len(raws))
	for i, raw := range raws {
		if err := json.Unmarshal(raw, &out[i].DecisionRecord); err != nil {
			return nil, fmt.Errorf("record %d: %w", i+1, err)
		}
		if t := out[i].Type; t != events.TypeDecision {
			return nil, fmt.Errorf("record %d: type %q: want %s", i+1, t, events.TypeDecision)
		}
		out[i].raw = raw
	}
	return out, nil
}

// decisionFilter selects records; its zero value selects every one.
type decisionFilter struct {
	policy, result, path string
	key                  string // a window key's digest, "" for any
}

func (f *decisionFilter) match(r *record) bool {
	d := &r.Data
	switch {
	case f.policy != "" && d.Policy != f.policy,
		f.key != "" && d.Key != f.key,
		f.result == "allowed" && !d.Allowed,
		f.result == "denied" && d.Allowed,
		f.path != "" && d.Path != f.path:
		return false
	}
	return true
}

// decisionLine is a record as one readable line: fixed-width columns
// (time, result, path, key) first, then the policy, the window's count
// and what else the record says.
func decisionLine(r *record) string {
	d := &r.Data
	result := "allowed"
	if !d.Allowed {
		result = "denied"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-7s %-10s %s %s used %d/%d", r.Time.UTC().Format("2006-01-02T15:04:05.000Z"), result, d.Path,
		d.Key, d.Policy, d.Used, d.Limit)
	if d.Cost != 1 {
		fmt.Fprintf(&b, " cost %d", d.Cost)
	}
	at := func(t time.Time) string { // a time of day on the record's day, else the whole time
		t, day := t.UTC(), r.Time.UTC()
		if t.Year() == day.Year() && t.YearDay() == day.YearDay() {
			return t.Format("15:04:05")
		}
		return t.Format(time.RFC3339)
	}
	if !d.ResetAt.IsZero() {
		b.WriteString(" reset " + at(d.ResetAt))
	}
	if d.Strikes > 0 {
		b.WriteString(" strikes " + strconv.Itoa(d.Strikes))
	}
	if !d.Until.IsZero() {
		b.WriteString(" until " + at(d.Until))
	}
	if d.Outcome != "" {
		b.WriteString(" outcome " + d.Outcome)
	}
	if d.LagMS > 0 {
		fmt.Fprintf(&b, " lag %.3fms", d.LagMS)
	}
	if d.Shadow {
		b.WriteString(" shadow")
	}
	if d.Rule != "" {
		b.WriteString(" domain " + d.Domain + " rule " + d.Rule)
	}
	if d.RequestID != "" {
		b.WriteString(" request " + d.RequestID)
	}
	b.WriteString(" edge " + d.Edge)
	if d.Note != "" {
		b.WriteString(" note " + strconv.Quote(d.Note))
	}
	return b.String()
}
