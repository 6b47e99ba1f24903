package client

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// ErrInvalidEvent is wrapped by the errors of events that break the
// contract (docs/events.md): nothing was published.
var ErrInvalidEvent = events.ErrInvalidEvent

// DefaultSubjectPrefix is where accounting events are published unless a
// deployment configures another (nats.streams.accounting.subject_prefix).
const DefaultSubjectPrefix = "tally.accounting"

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	// Namespace is the service's producer namespace, granted by its NATS
	// user's permissions (tally.accounting.*.<namespace>.>, as
	// deploy/nats/tally.conf grants "billing"): 1 to 40 of [A-Za-z0-9_.-].
	Namespace string
	// Source is the events' CloudEvents source: who published (1 to 256
	// bytes), say "billing-api".
	Source string
	// Keys is the deployment's key space.
	Keys *Keys
	// SubjectPrefix is DefaultSubjectPrefix when empty.
	SubjectPrefix string
}

// Publisher publishes a service's accounting events: charges of requests
// it served and refunds of their 304s. Each Publisher is a producer of its
// own ("<namespace>.<16 random hex digits>") that numbers its events per
// shard 1, 2, 3, …, so that the accountant applies each event once however
// often it is published. It is safe for concurrent use.
//
// Events are published one per message in the CloudEvents NATS binding's
// binary mode, and acknowledged by JetStream before a call returns: an
// acknowledged event is applied, across restarts of anything, exactly once.
type Publisher struct {
	js       jetstream.JetStream
	keys     *Keys
	prefix   string
	source   string
	producer string
	now      func() time.Time

	mu  sync.Mutex
	seq map[string]uint64 // shard → last number given
}

// NewPublisher returns a producer publishing through js.
func NewPublisher(js jetstream.JetStream, c PublisherConfig) (*Publisher, error) {
	if c.Keys == nil {
		return nil, errors.New("client: a publisher needs the deployment's Keys")
	}
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Source == "" || len(c.Source) > events.MaxSourceLen {
		return nil, fmt.Errorf("client: source: want 1 to %d bytes", events.MaxSourceLen)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	producer := c.Namespace + "." + hex.EncodeToString(b[:])
	if len(c.Namespace) > limiter.MaxProducerLen-17 || !limiter.ValidProducer(producer) {
		return nil, fmt.Errorf("client: namespace %q: want 1 to %d of [A-Za-z0-9_.-] in dot-separated tokens",
			c.Namespace, limiter.MaxProducerLen-17)
	}
	return &Publisher{js: js, keys: c.Keys, prefix: c.SubjectPrefix, source: c.Source, producer: producer,
		now: time.Now, seq: map[string]uint64{}}, nil
}

// Producer is the publisher's producer id, as the events and the decisions
// stream's accountant records name it.
func (p *Publisher) Producer() string { return p.producer }

// Charge is one request a service served and counts against a window.
type Charge struct {
	// Policy, Limit and Window are the policy's terms, as the deployment
	// configures them (an accountant that knows the policies refuses
	// others).
	Policy string
	Limit  int64
	Window time.Duration
	// Identity is whose window: HeaderIdentity, AddressIdentity or
	// APIIdentity of the client. It is hashed here; only its digest leaves
	// the process.
	Identity string
	// Units is what the request costs: 1 when zero.
	Units int64
	// StartedAt is when the request started: now when zero.
	StartedAt time.Time
	// ResetAt, when set, is the window the request's response showed (a
	// whole second): the charge then applies to that window only.
	ResetAt time.Time
	// RequestID names the request in the decisions stream (optional).
	RequestID string
	// TraceParent is the request's W3C trace context (optional).
	TraceParent string
}

// Receipt is a published event: its window and its number. A Receipt of
// a charge is what Finish refunds.
type Receipt struct {
	Window Window
	Seq    uint64
	ev     events.Accounting
}

// Charge publishes a charge of c's window. On an error other than
// ErrInvalidEvent the event may or may not have reached the stream: Retry
// the Receipt (the same event under the same number, applied once) rather
// than charging again, or leave it (a number never published is a hole the
// accountant tolerates, up to 64 at a time).
func (p *Publisher) Charge(ctx context.Context, c Charge) (Receipt, error) {
	if c.Units == 0 {
		c.Units = 1
	}
	if c.StartedAt.IsZero() {
		c.StartedAt = p.now()
	}
	if c.Identity == "" {
		return Receipt{}, fmt.Errorf("%w: no identity", ErrInvalidEvent)
	}
	w := p.keys.Window(c.Policy, c.Identity)
	e := events.Accounting{Kind: events.Started, Producer: p.producer, KeyID: p.keys.KeyID(), Source: p.source,
		TraceParent: c.TraceParent, Key: w.Digest, Policy: c.Policy, Limit: c.Limit,
		WindowSeconds: int64(c.Window / time.Second), Units: c.Units, StartedAt: c.StartedAt, ResetAt: c.ResetAt,
		RequestID: c.RequestID}
	return p.publish(ctx, w, e)
}

// Finish publishes how a charged request finished: a 304 Not Modified
// gives its charge back; any other status changes nothing (and need not
// be published).
func (p *Publisher) Finish(ctx context.Context, charge Receipt, status int) (Receipt, error) {
	if charge.ev.Kind != events.Started || charge.ev.Producer != p.producer {
		return Receipt{}, fmt.Errorf("%w: Finish takes a Receipt of this publisher's Charge", ErrInvalidEvent)
	}
	e := charge.ev
	e.Kind, e.Status, e.ChargeProducer, e.ChargeSeq = events.Finished, status, p.producer, charge.Seq
	return p.publish(ctx, charge.Window, e)
}

// Refund is Finish with 304 Not Modified.
func (p *Publisher) Refund(ctx context.Context, charge Receipt) (Receipt, error) {
	return p.Finish(ctx, charge, http.StatusNotModified)
}

// Retry publishes r's event again, under its number: JetStream drops it
// as a duplicate within its window, the shard's primary after that.
func (p *Publisher) Retry(ctx context.Context, r Receipt) error {
	if r.ev.Producer != p.producer || r.Seq == 0 {
		return fmt.Errorf("%w: Retry takes a Receipt of this publisher", ErrInvalidEvent)
	}
	return p.send(ctx, r)
}

func (p *Publisher) publish(ctx context.Context, w Window, e events.Accounting) (Receipt, error) {
	e.Time = p.now()
	probe := e
	probe.Seq = 1
	if probe.Kind == events.Finished {
		probe.Seq = max(2, e.ChargeSeq+1)
	}
	if err := probe.Validate(); err != nil {
		return Receipt{}, err // refused before it takes a number
	}
	p.mu.Lock()
	p.seq[w.Shard]++
	e.Seq = p.seq[w.Shard]
	p.mu.Unlock()
	r := Receipt{Window: w, Seq: e.Seq, ev: e}
	return r, p.send(ctx, r)
}

func (p *Publisher) send(ctx context.Context, r Receipt) error {
	m, err := events.AccountingEventMsg(p.prefix, r.Window.Shard, &r.ev)
	if err != nil {
		return err
	}
	if _, err := p.js.PublishMsg(ctx, m); err != nil {
		if errors.Is(err, jetstream.ErrNoStreamResponse) {
			return fmt.Errorf("client: no stream takes %s (is shard %q one of the deployment's, and the accounting stream up?): %w",
				m.Subject, r.Window.Shard, err)
		}
		return fmt.Errorf("client: publishing %s: %w", m.Header.Get(events.HeaderMsgID), err)
	}
	return nil
}
