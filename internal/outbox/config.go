package outbox

import (
	"errors"
	"time"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/setting"
)

// Config bounds the accounting events an edge holds. Zero values take the
// defaults stated; values no outbox can work with are refused (Validate).
type Config struct {
	// Capacity is how many events may wait per shard while both NATS and
	// the shard's primary are unreachable; beyond it new events are dropped,
	// counted and logged. Default 100000.
	Capacity int `yaml:"capacity"`
	// PublishTimeout is how long a batch may take on its route (JetStream's
	// acknowledgement, or the primary's answer) before the other route is
	// tried. Default 500ms.
	PublishTimeout time.Duration `yaml:"publish_timeout"`
	// MaxBatch is the most events in one message, at most events.MaxBatch.
	// Default 512.
	MaxBatch int `yaml:"max_batch"`
	// InFlight is how many batches per shard may await JetStream's
	// acknowledgement at once. Default 4.
	InFlight int `yaml:"in_flight"`
	// Route is RouteStream (default) or RouteDirect; docs/architecture.md
	// says what each costs.
	Route string `yaml:"route"`
}

// Routes of accounting events.
const (
	RouteStream = "stream"
	RouteDirect = "direct"
)

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("outbox: invalid config")

// Validate refuses an unknown route, negative values and batches larger
// than a message may hold, as a *setting.Error naming the field; zero
// values stand for the defaults.
func (c Config) Validate() error {
	switch {
	case c.Route != "" && c.Route != RouteStream && c.Route != RouteDirect:
		return setting.Errorf(ErrInvalidConfig, "route", "%q: want stream or direct", c.Route)
	case c.Capacity < 0 || c.Capacity > 100_000_000:
		return setting.Errorf(ErrInvalidConfig, "capacity", "%d: want 1 to 100000000 (0: the default)", c.Capacity)
	case c.PublishTimeout < 0 || c.PublishTimeout > time.Minute:
		return setting.Errorf(ErrInvalidConfig, "publish_timeout", "%v: want a duration up to 1m (0: the default)", c.PublishTimeout)
	case c.MaxBatch < 0 || c.MaxBatch > events.MaxBatch:
		return setting.Errorf(ErrInvalidConfig, "max_batch", "%d: want 1 to %d (0: the default)", c.MaxBatch, events.MaxBatch)
	case c.InFlight < 0 || c.InFlight > 1024:
		return setting.Errorf(ErrInvalidConfig, "in_flight", "%d: want 1 to 1024 (0: the default)", c.InFlight)
	}
	return nil
}

// WithDefaults is c with its zero values replaced by the defaults.
func (c Config) WithDefaults() Config {
	if c.Capacity <= 0 {
		c.Capacity = 100_000
	}
	if c.PublishTimeout <= 0 {
		c.PublishTimeout = 500 * time.Millisecond
	}
	if c.MaxBatch <= 0 {
		c.MaxBatch = 512
	}
	if c.InFlight <= 0 {
		c.InFlight = 4
	}
	if c.Route == "" {
		c.Route = RouteStream
	}
	return c
}
