package credit

import (
	"errors"
	"time"

	"github.com/tallyhq/tally/internal/setting"
)

// Config tunes how an edge reserves and remembers windows
// (docs/accuracy.md). Zero values take the defaults stated; negative ones
// are refused (Validate).
type Config struct {
	// Horizon is how long a reservation aims to last at the key's rate of
	// requests at this edge. Longer means fewer reservations; the units an
	// edge holds show as used on the other edges until it uses or releases
	// them. Near the limit Share caps reservations anyway. Default 5s.
	Horizon time.Duration `yaml:"horizon"`
	// Share: a reservation takes at most 1/Share of what is left in the
	// window, so that near the limit reservations shrink to one request and
	// every edge keeps getting its part. Default 8.
	Share int `yaml:"share"`
	// IdleRelease is how long reserved units may sit unused before the edge
	// gives them back (or three of the key's intervals between requests, if
	// longer). Default 1s.
	IdleRelease time.Duration `yaml:"idle_release"`
	// Keys is the most keys an edge remembers; the least recently used go
	// first (their credit given back). Default 100000.
	Keys int `yaml:"keys"`
	// Recheck is how long after a window was found full it is read again
	// (on a replica) while its requests keep being denied, in case a notice
	// that it has room was lost; the wait doubles after every read that
	// finds it still full, up to 32 times Recheck. Default 1s.
	Recheck time.Duration `yaml:"recheck"`
	// RedisBudget is the longest a request waits for a reservation; past
	// it the edge decides without one (FailOpen). Default 100ms.
	RedisBudget time.Duration `yaml:"redis_budget"`
}

// ErrInvalidConfig is wrapped by Config.Validate's errors.
var ErrInvalidConfig = errors.New("credit: invalid config")

// Validate refuses values no edge can work with, as a *setting.Error
// naming the field; zero values stand for the defaults.
func (c Config) Validate() error {
	for _, d := range []struct {
		name string
		v    time.Duration
		max  time.Duration
	}{{"horizon", c.Horizon, time.Hour}, {"idle_release", c.IdleRelease, time.Hour},
		{"recheck", c.Recheck, time.Hour}, {"redis_budget", c.RedisBudget, 10 * time.Second}} {
		if d.v < 0 || d.v > d.max {
			return setting.Errorf(ErrInvalidConfig, d.name, "%v: want a duration up to %v (0: the default)", d.v, d.max)
		}
	}
	if c.Share < 0 || c.Share > 1000 {
		return setting.Errorf(ErrInvalidConfig, "share", "%d: want 1 to 1000 (0: the default)", c.Share)
	}
	if c.Keys < 0 || c.Keys > 100_000_000 {
		return setting.Errorf(ErrInvalidConfig, "keys", "%d: want 1 to 100000000 (0: the default)", c.Keys)
	}
	return nil
}

// WithDefaults is c with its zero values replaced by the defaults.
func (c Config) WithDefaults() Config {
	if c.Horizon <= 0 {
		c.Horizon = 5 * time.Second
	}
	if c.Share <= 0 {
		c.Share = 8
	}
	if c.IdleRelease <= 0 {
		c.IdleRelease = time.Second
	}
	if c.Keys <= 0 {
		c.Keys = 100_000
	}
	if c.Recheck <= 0 {
		c.Recheck = time.Second
	}
	if c.RedisBudget <= 0 {
		c.RedisBudget = 100 * time.Millisecond
	}
	return c
}
