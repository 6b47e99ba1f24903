package events

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrInvalidConfig is wrapped by stream and consumer configuration errors.
var ErrInvalidConfig = errors.New("events: invalid config")

// StreamConfig sets up the events stream and its dead-letter stream.
// Zero values take the defaults stated; docs/events.md explains them.
type StreamConfig struct {
	// Name of the events stream. Default "TALLY_EVENTS".
	Name string `yaml:"name"`
	// SubjectPrefix: events go to <prefix>.<shard>.<kind>. Default "tally.events".
	SubjectPrefix string `yaml:"subject_prefix"`
	// Storage is "file" (default) or "memory".
	Storage string `yaml:"storage"`
	// Duplicates is the window in which a repeated Nats-Msg-Id is dropped.
	// Default 2m.
	Duplicates time.Duration `yaml:"duplicates"`
	// MaxAge bounds how long an event waits to be applied. Default 24h:
	// an accountant outage longer than that loses charges.
	MaxAge time.Duration `yaml:"max_age"`
	// MaxBytes bounds the stream's size. Default 1 GiB; -1 unlimited.
	MaxBytes int64 `yaml:"max_bytes"`
	// Discard is "new" (default: a full stream refuses publishes, which
	// edges count as dropped, and never deletes an accepted event) or "old".
	Discard string `yaml:"discard"`
	// Replicas is the JetStream replication factor: 1 (default) on one
	// server, 3 on a cluster.
	Replicas int `yaml:"replicas"`
	// DeadLetterName and DeadLetterPrefix name the dead-letter stream and its
	// subjects (<prefix>.<shard>). Defaults "TALLY_DLQ" and "tally.dlq". It
	// keeps dead letters for 14 days.
	DeadLetterName   string `yaml:"dead_letter_name"`
	DeadLetterPrefix string `yaml:"dead_letter_prefix"`
}

// WithDefaults returns c with zero values replaced by defaults.
func (c StreamConfig) WithDefaults() StreamConfig {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Name, "TALLY_EVENTS")
	def(&c.SubjectPrefix, "tally.events")
	def(&c.Storage, "file")
	def(&c.Discard, "new")
	def(&c.DeadLetterName, "TALLY_DLQ")
	def(&c.DeadLetterPrefix, "tally.dlq")
	if c.Duplicates == 0 {
		c.Duplicates = 2 * time.Minute
	}
	if c.MaxAge == 0 {
		c.MaxAge = 24 * time.Hour
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 1 << 30
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	return c
}

func (c StreamConfig) jetstream() (events, dlq jetstream.StreamConfig, err error) {
	c = c.WithDefaults()
	storage := jetstream.FileStorage
	switch c.Storage {
	case "file":
	case "memory":
		storage = jetstream.MemoryStorage
	default:
		return events, dlq, fmt.Errorf("%w: storage %q: want file or memory", ErrInvalidConfig, c.Storage)
	}
	discard := jetstream.DiscardNew
	switch c.Discard {
	case "new":
	case "old":
		discard = jetstream.DiscardOld
	default:
		return events, dlq, fmt.Errorf("%w: discard %q: want new or old", ErrInvalidConfig, c.Discard)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		return events, dlq, fmt.Errorf("%w: replicas %d: want 1 to 5", ErrInvalidConfig, c.Replicas)
	}
	if c.Duplicates < 0 || c.MaxAge < 0 || (c.MaxAge > 0 && c.Duplicates > c.MaxAge) {
		return events, dlq, fmt.Errorf("%w: duplicates %v must be within max_age %v", ErrInvalidConfig, c.Duplicates, c.MaxAge)
	}
	events = jetstream.StreamConfig{
		Name:        c.Name,
		Description: "Tally request events (CloudEvents, binary mode), a subject per shard",
		Subjects:    []string{c.SubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     storage,
		Duplicates:  c.Duplicates,
		MaxAge:      c.MaxAge,
		MaxBytes:    c.MaxBytes,
		Discard:     discard,
		Replicas:    c.Replicas,
	}
	dlq = jetstream.StreamConfig{
		Name:        c.DeadLetterName,
		Description: "Tally events that could not be applied, with the reason; inspect and replay",
		Subjects:    []string{c.DeadLetterPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     storage,
		Duplicates:  2 * time.Minute,
		MaxAge:      14 * 24 * time.Hour,
		Discard:     jetstream.DiscardOld,
		Replicas:    c.Replicas,
	}
	return events, dlq, nil
}

// EnsureStreams creates the events and dead-letter streams, or updates them
// when their settings differ from c. It is idempotent and writes nothing
// when the streams already match, so every process can call it at start.
func EnsureStreams(ctx context.Context, js jetstream.StreamManager, c StreamConfig) error {
	ev, dlq, err := c.jetstream()
	if err != nil {
		return err
	}
	for _, sc := range []jetstream.StreamConfig{ev, dlq} {
		if err := ensureStream(ctx, js, sc); err != nil {
			return fmt.Errorf("events: stream %s: %w", sc.Name, err)
		}
	}
	return nil
}

// ensureStream skips the update when nothing changed: an update is a write
// on the server (and, in nats-server 2.15, races with consumers being
// created at the same moment by another process).
func ensureStream(ctx context.Context, js jetstream.StreamManager, want jetstream.StreamConfig) error {
	st, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Another process may create it first; an identical create succeeds.
		_, err = js.CreateOrUpdateStream(ctx, want)
		return err
	}
	if err != nil {
		return err
	}
	if have := st.CachedInfo().Config; sameStream(have, want) {
		return nil
	}
	_, err = js.UpdateStream(ctx, want)
	return err
}

// sameStream compares the settings Tally sets; the server fills in others.
func sameStream(have, want jetstream.StreamConfig) bool {
	return slices.Equal(have.Subjects, want.Subjects) && have.Description == want.Description &&
		have.Retention == want.Retention && have.Storage == want.Storage &&
		have.Duplicates == want.Duplicates && have.MaxAge == want.MaxAge &&
		have.MaxBytes == want.MaxBytes && have.Discard == want.Discard && have.Replicas == want.Replicas
}

// ConsumerConfig sets up the accountant's per-shard consumers.
type ConsumerConfig struct {
	// DurablePrefix: the consumer of shard s is "<prefix>-<s>". Default "accountant".
	DurablePrefix string `yaml:"durable_prefix"`
	// AckWait is how long a delivered, unacknowledged event waits before it
	// is redelivered (to this or another accountant). Default 30s.
	AckWait time.Duration `yaml:"ack_wait"`
	// MaxAckPending bounds events delivered and not yet acknowledged.
	// Default 10000.
	MaxAckPending int `yaml:"max_ack_pending"`
	// PinnedTTL: one accountant is pinned per shard; when it stops pulling
	// for this long, another takes over. Default 5s.
	PinnedTTL time.Duration `yaml:"pinned_ttl"`
}

// Group is the priority group the accountants pull with.
const Group = "accountant"

// WithDefaults returns c with zero values replaced by defaults.
func (c ConsumerConfig) WithDefaults() ConsumerConfig {
	if c.DurablePrefix == "" {
		c.DurablePrefix = "accountant"
	}
	if c.AckWait == 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxAckPending == 0 {
		c.MaxAckPending = 10000
	}
	if c.PinnedTTL == 0 {
		c.PinnedTTL = 5 * time.Second
	}
	return c
}

// EnsureConsumer creates or updates the durable consumer of one shard: the
// shard's started and finished events, explicit acks, redelivered without
// limit (a transient failure must never drop a charge; undecodable events
// are terminated and dead-lettered instead), one pinned client at a time.
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, sc StreamConfig, c ConsumerConfig, shard string) (jetstream.Consumer, error) {
	sc, c = sc.WithDefaults(), c.WithDefaults()
	if !shardRE.MatchString(shard) {
		return nil, fmt.Errorf("%w: shard %q", ErrInvalidConfig, shard)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, sc.Name, jetstream.ConsumerConfig{
		Durable:        c.DurablePrefix + "-" + shard,
		Description:    "Tally accountant for shard " + shard,
		FilterSubjects: []string{Subject(sc.SubjectPrefix, shard, KindStarted), Subject(sc.SubjectPrefix, shard, KindFinished)},
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  c.MaxAckPending,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{Group},
		PinnedTTL:      c.PinnedTTL,
	})
	if err != nil {
		return nil, fmt.Errorf("events: consumer for shard %s: %w", shard, err)
	}
	return cons, nil
}

// EnsureStreamsRetry calls EnsureStreams until it succeeds or ctx ends,
// waiting every between attempts and reporting each failure to onErr
// (which may be nil). A process can start before NATS does.
func EnsureStreamsRetry(ctx context.Context, js jetstream.StreamManager, c StreamConfig, every time.Duration, onErr func(error)) error {
	for {
		attempt, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := EnsureStreams(attempt, js, c)
		cancel()
		if err == nil || errors.Is(err, ErrInvalidConfig) {
			return err
		}
		if onErr != nil {
			onErr(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}
