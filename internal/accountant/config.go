package accountant

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/telemetry"
)

// DecisionsConfig says which of the accountant's records go to the
// decisions stream.
type DecisionsConfig struct {
	events.BatcherConfig `yaml:",inline"`
	// SampleApplied is the share of ordinary outcomes recorded (charged,
	// refunded, released, netted), 0 to 1: default 1 (all); negative, none.
	// Anomalies (charged_over_limit, duplicate, late, pending) are always
	// recorded.
	SampleApplied float64 `yaml:"sample_applied"`
	// Disabled publishes no records at all.
	Disabled bool `yaml:"disabled"`
}

// Config tunes the accountant. Zero values take the defaults stated.
type Config struct {
	Streams events.Streams
	// Metrics is where the accountant's instruments are registered and
	// /metrics is served from; default a registry of its own.
	Metrics *telemetry.Metrics
	// Decisions configures the records of what applying each event did,
	// published on the decisions stream (an accountant's subject) for
	// analytics.
	Decisions DecisionsConfig
	// Tracer, when set, makes a consumer span per message applied: the
	// child of the span that published it (the message's traceparent
	// header), linked to the requests its events come from.
	Tracer trace.Tracer
	// Policies, when set, are the deployment's policies: an event whose
	// policy is unknown, or whose limit or window differ, is dead-lettered
	// instead of opening a window on terms nobody configured.
	Policies map[string]limiter.Policy
	// BatchSize is the most events read and applied as one run (the store
	// splits it into script calls of redisstore.Options.ScriptEvents). Default
	// 512.
	BatchSize int
	// BatchWait is how long a run waits for more messages after taking
	// those already received. Default 0: a run takes what has arrived, so
	// runs grow with load on their own (messages arrive while the previous
	// run is applied) and a lone event never waits. A wait below a
	// millisecond costs about a millisecond on an idle process (Go's timers
	// sleep in whole milliseconds there).
	BatchWait time.Duration
	// LeaseTTL is how long a shard's lease outlives its holder's last
	// renewal: the hand-over time after a crash. Default 3s.
	LeaseTTL time.Duration
	// PurgeEvery is how often applied messages are deleted from the stream.
	// Default 200ms.
	PurgeEvery time.Duration
	// RetryMin and RetryMax bound the delay before a failed run is tried
	// again; it doubles with each consecutive failure. Defaults 50ms and 2s.
	RetryMin, RetryMax time.Duration
	// MaxAttempts is how often a message whose events Redis refuses with a
	// permanent error (WRONGTYPE, a script error) is tried before it is
	// dead-lettered. Default 5.
	MaxAttempts int
	// Owner names this process in leases; default a random id.
	Owner string
}

func (c Config) withDefaults() Config {
	c.Streams = c.Streams.WithDefaults()
	if c.BatchSize <= 0 || c.BatchSize > limiter.MaxApply {
		c.BatchSize = 512
	}
	c.BatchWait = max(c.BatchWait, 0)
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 3 * time.Second
	}
	if c.PurgeEvery <= 0 {
		c.PurgeEvery = 200 * time.Millisecond
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = max(c.RetryMin, 2*time.Second)
	}
	if c.MaxAttempts <= 0 {
		c.MaxAttempts = 5
	}
	if c.Owner == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		c.Owner = "accountant-" + hex.EncodeToString(b[:])
	}
	return c
}
