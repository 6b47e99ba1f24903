package accountant

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/setting"
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
	// Streams are the deployment's streams (the file's nats.streams).
	Streams events.Streams `yaml:"-"`
	// Metrics is where the accountant's instruments are registered and
	// /metrics is served from; default a registry of its own.
	Metrics *telemetry.Metrics `yaml:"-"`
	// Decisions configures the records of what applying each event did,
	// published on the decisions stream (an accountant's subject) for
	// analytics.
	Decisions DecisionsConfig `yaml:"decisions"`
	// Tracer, when set, makes a consumer span per message applied: the
	// child of the span that published it (the message's traceparent
	// header), linked to the requests its events come from.
	Tracer trace.Tracer `yaml:"-"`
	// Policies, when set, are the deployment's policies: an event whose
	// policy is unknown, or whose window differs, is dead-lettered instead
	// of opening a window on terms nobody configured. Its limit is not
	// compared: tiers, overrides and temporary limits give clients limits
	// of their own.
	Policies map[string]limiter.Policy `yaml:"-"`
	// BatchSize is the most events read and applied as one run (the store
	// splits it into script calls of redisstore.Options.ScriptEvents). Default
	// 512.
	BatchSize int `yaml:"batch_size"`
	// BatchWait is how long a run waits for more messages after taking
	// those already received. Default 0: a run takes what has arrived, so
	// runs grow with load on their own (messages arrive while the previous
	// run is applied) and a lone event never waits. A wait below a
	// millisecond costs about a millisecond on an idle process (Go's timers
	// sleep in whole milliseconds there).
	BatchWait time.Duration `yaml:"batch_wait"`
	// LeaseTTL is how long a shard's lease outlives its holder's last
	// renewal: the hand-over time after a crash. Default 3s.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// PurgeEvery is how often applied messages are deleted from the stream.
	// Default 200ms.
	PurgeEvery time.Duration `yaml:"purge_every"`
	// RetryMin and RetryMax bound the delay before a failed run is tried
	// again; it doubles with each consecutive failure. Defaults 50ms and 2s.
	RetryMin time.Duration `yaml:"retry_min"`
	RetryMax time.Duration `yaml:"retry_max"`
	// MaxAttempts is how often a message whose events Redis refuses with a
	// permanent error (WRONGTYPE, a script error) is tried before it is
	// dead-lettered. Default 5.
	MaxAttempts int `yaml:"max_attempts"`
	// Owner names this process in leases; default a random id.
	Owner string `yaml:"-"`
}

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("accountant: invalid config")

// WithDefaults is c with its zero values replaced by the defaults; it
// changes nothing else.
func (c Config) WithDefaults() Config {
	c.Streams = c.Streams.WithDefaults()
	c.Decisions.BatcherConfig = c.Decisions.BatcherConfig.WithDefaults()
	if c.BatchSize == 0 {
		c.BatchSize = 512
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 3 * time.Second
	}
	if c.PurgeEvery == 0 {
		c.PurgeEvery = 200 * time.Millisecond
	}
	if c.RetryMin == 0 {
		c.RetryMin = 50 * time.Millisecond
	}
	if c.RetryMax == 0 {
		c.RetryMax = max(c.RetryMin, 2*time.Second)
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 5
	}
	if c.Owner == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		c.Owner = "accountant-" + hex.EncodeToString(b[:])
	}
	return c
}

// Validate refuses, as a *setting.Error naming the field, every value an
// accountant cannot work with; zero values stand for the defaults.
func (c Config) Validate() error {
	bad := func(field, format string, args ...any) error {
		return setting.Errorf(ErrInvalidConfig, field, format, args...)
	}
	d := c.WithDefaults()
	switch {
	case c.BatchSize < 0 || c.BatchSize > limiter.MaxApply:
		return bad("batch_size", "%d: want 1 to %d (0: the default)", c.BatchSize, limiter.MaxApply)
	case c.BatchWait < 0 || c.BatchWait > time.Second:
		return bad("batch_wait", "%v: want 0 to 1s", c.BatchWait)
	case c.LeaseTTL < 0 || (c.LeaseTTL > 0 && c.LeaseTTL < 100*time.Millisecond) || c.LeaseTTL > time.Minute:
		return bad("lease_ttl", "%v: want 100ms to 1m (0: the default)", c.LeaseTTL)
	case c.PurgeEvery < 0 || c.PurgeEvery > time.Minute:
		return bad("purge_every", "%v: want a duration up to 1m (0: the default)", c.PurgeEvery)
	case c.RetryMin < 0 || c.RetryMin > time.Minute:
		return bad("retry_min", "%v: want a duration up to 1m (0: the default)", c.RetryMin)
	case c.RetryMax < 0 || c.RetryMax > 10*time.Minute:
		return bad("retry_max", "%v: want a duration up to 10m (0: the default)", c.RetryMax)
	case d.RetryMax < d.RetryMin:
		return bad("retry_max", "%v: want at least retry_min (%v)", d.RetryMax, d.RetryMin)
	case c.MaxAttempts < 0 || c.MaxAttempts > 1000:
		return bad("max_attempts", "%d: want 1 to 1000 (0: the default)", c.MaxAttempts)
	case c.Decisions.SampleApplied > 1:
		return bad("decisions.sample_applied", "%v: want 0 to 1 (negative: none)", c.Decisions.SampleApplied)
	}
	if err := c.Decisions.BatcherConfig.Validate(); err != nil {
		return setting.In("decisions", err)
	}
	return setting.In("streams", c.Streams.Validate())
}
