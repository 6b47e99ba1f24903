// Command decisions is an analytics consumer of Tally's decisions stream:
// it reads the stream from its first record and prints, for each window,
// what was admitted, what was given back and by how much the window went
// over its limit, one JSON line per window. It needs nothing of Tally's but
// the stream (docs/events.md#decisions).
//
//	NATS_PASSWORD=… go run ./examples/decisions -nats nats://127.0.0.1:4222 -user analytics
//
// With the NATS permissions Tally ships (deploy/nats/tally.conf), the
// analytics user reads the decisions stream, with replies on its own inbox
// prefix (_INBOX_analytics), and can publish nothing.
//
// Counts are exact when every allowed decision and every refund is
// recorded (edge.decisions.sample_allowed and
// accountant.decisions.sample_applied at 1, the default).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// record is the part of a decision record this consumer reads.
type record struct {
	Data struct {
		Key       string    `json:"key"`
		Policy    string    `json:"policy"`
		Limit     int64     `json:"limit"`
		Cost      int64     `json:"cost"`
		Allowed   bool      `json:"allowed"`
		Path      string    `json:"path"`
		ResetAt   time.Time `json:"reset_at"`
		Outcome   string    `json:"outcome"`
		RequestID string    `json:"request_id"`
	} `json:"data"`
}

// Window is one rate-limit window as the stream tells it.
type Window struct {
	Key       string    `json:"key"`
	Policy    string    `json:"policy"`
	ResetAt   time.Time `json:"reset_at"`
	Limit     int64     `json:"limit"`
	Admitted  int64     `json:"admitted"`  // units of the requests allowed
	Refunded  int64     `json:"refunded"`  // units given back (304 responses)
	Net       int64     `json:"net"`       // what the window holds: admitted - refunded
	Overshoot int64     `json:"overshoot"` // units beyond the limit
}

func main() {
	url := flag.String("nats", nats.DefaultURL, "NATS server URL")
	user := flag.String("user", os.Getenv("NATS_USER"), "NATS user (its password in $NATS_PASSWORD)")
	inbox := flag.String("inbox", "", "inbox prefix (default _INBOX_<user> with a user, as deploy/nats/tally.conf grants)")
	stream := flag.String("stream", "TALLY_DECISIONS", "the decisions stream")
	idle := flag.Duration("idle", 2*time.Second, "stop once no record has come for this long")
	flag.Parse()
	var opts []nats.Option
	if *user != "" {
		opts = append(opts, nats.UserInfo(*user, os.Getenv("NATS_PASSWORD")))
		if *inbox == "" {
			*inbox = "_INBOX_" + *user
		}
	}
	if *inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(*inbox))
	}
	if err := run(*url, *stream, *idle, opts...); err != nil {
		fmt.Fprintln(os.Stderr, "decisions:", err)
		os.Exit(1)
	}
}

func run(url, stream string, idle time.Duration, opts ...nats.Option) error {
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	a, err := analyse(context.Background(), js, stream, idle)
	if err != nil {
		return err
	}
	out := json.NewEncoder(os.Stdout)
	for _, w := range a.Windows() {
		if err := out.Encode(w); err != nil {
			return err
		}
	}
	return nil
}

// analyse reads the stream from its first record until none has come for
// idle.
func analyse(ctx context.Context, js jetstream.JetStream, stream string, idle time.Duration) (*Analysis, error) {
	// An ordered consumer: no state on the server, every record from the
	// start of the stream, in order.
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	var a Analysis
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(idle))
		if err != nil {
			return nil, err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var recs []record // a message is a JSON array of CloudEvents
			if err := json.Unmarshal(m.Data(), &recs); err != nil {
				return nil, fmt.Errorf("message %s: %w", m.Subject(), err)
			}
			a.Add(recs...)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, err
		}
		if n == 0 {
			break
		}
	}
	return &a, nil
}

// Analysis joins admissions with what was given back, by request id and
// key. An admission is an edge's allowed record, or an accountant's charge
// that no edge recorded admitting: a service's own charge (an event it
// published itself, docs/events.md#accounting-events).
type Analysis struct {
	admitted map[string]*admission // request id + key: edges' admissions
	refunds  []given               // refunded and netted records, once each
	charges  []charge              // accountants' charged records
}

type admission struct {
	key, policy string
	limit, cost int64
	resetAt     time.Time // zero for a fail-open admission: its charge tells
}

// charge is an accountant's record of a charge applied: the window of an
// edge's admission made without one (fail-open), or a service's charge.
type charge struct {
	id string
	admission
}

// given is a record of units given back: refunded, or netted (a charge
// whose refund came first: it never counted).
type given struct {
	id     string
	netted bool
	admission
}

// Add takes records in any order.
func (a *Analysis) Add(recs ...record) {
	if a.admitted == nil {
		a.admitted = map[string]*admission{}
	}
	for _, r := range recs {
		d := r.Data
		id := d.RequestID + " " + d.Key
		ad := admission{key: d.Key, policy: d.Policy, limit: d.Limit, cost: d.Cost, resetAt: d.ResetAt}
		switch {
		case d.Outcome == "" && d.Allowed: // an edge admitted a request
			a.admitted[id] = &ad
		case d.Outcome == "refunded" || d.Outcome == "netted": // given back (netted: before its charge landed)
			a.refunds = append(a.refunds, given{id, d.Outcome == "netted", ad})
		case d.Outcome == "charged" || d.Outcome == "charged_over_limit":
			a.charges = append(a.charges, charge{id, ad})
		}
	}
}

// Windows returns every window with an admission, by key then reset.
func (a *Analysis) Windows() []Window {
	byWindow := map[string]*Window{}
	window := func(ad *admission) *Window {
		k := ad.key + " " + ad.policy + " " + ad.resetAt.String()
		w := byWindow[k]
		if w == nil {
			w = &Window{Key: ad.key, Policy: ad.policy, ResetAt: ad.resetAt, Limit: ad.limit}
			byWindow[k] = w
		}
		return w
	}
	admitted := make(map[string]*admission, len(a.admitted)+len(a.charges))
	for id, ad := range a.admitted {
		admitted[id] = ad
	}
	for _, c := range a.charges {
		switch ad := admitted[c.id]; {
		case ad != nil && ad.resetAt.IsZero(): // a fail-open admission: its charge places it
			ad.resetAt = c.resetAt
		case ad == nil && c.id != " "+c.key: // a service's charge, named
			admitted[c.id] = &c.admission
		case ad == nil: // a service's charge without a request id: nothing names it
			window(&c.admission).Admitted += c.cost
		}
	}
	for _, ad := range admitted {
		window(ad).Admitted += ad.cost
	}
	for _, g := range a.refunds {
		switch ad := admitted[g.id]; {
		case ad != nil: // a refund of a request that was recorded as admitted
			window(ad).Refunded += ad.cost
		case g.id == " "+g.key && !g.netted: // a service's refund of a charge without a request id
			window(&g.admission).Refunded += g.cost
		}
	}
	out := make([]Window, 0, len(byWindow))
	for _, w := range byWindow {
		w.Net = w.Admitted - w.Refunded
		w.Overshoot = max(0, w.Net-w.Limit)
		out = append(out, *w)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key < out[j].Key
		}
		return out[i].ResetAt.Before(out[j].ResetAt)
	})
	return out
}
