package credit

import (
	"context"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// The core's ports: what it needs of the world, named for what it needs.
// The Redis store, the outbox and NATS implement them in production; tests
// use fakes (core_test.go).

// Reserver reserves and reads windows on their shards' primaries
// (redisstore.Store).
type Reserver interface {
	// Take reserves units of k's window (lua/take.lua): never past its limit.
	Take(ctx context.Context, k limiter.Key, now time.Time, a limiter.TakeArgs) (limiter.Grant, error)
	// TakeAsync is Take without waiting: done gets its result once, on
	// another goroutine than the caller's (which may hold the lock done
	// takes), and must neither block nor take long. What bounds the call is
	// the Reserver's own timeouts.
	TakeAsync(k limiter.Key, now time.Time, a limiter.TakeArgs, done func(limiter.Grant, error))
	// Check reads k's window (a replica, or the primary).
	Check(ctx context.Context, k limiter.Key) (limiter.Window, error)
	// Finish finishes a decision-API request once (lua/finish.lua).
	Finish(ctx context.Context, k limiter.Key, now time.Time, a limiter.FinishArgs) (limiter.FinishResult, error)
	// Hold records on shard i the shares of credit this edge will not
	// spend (lua/hold.lua), each answered in order; an error: none is
	// known to be recorded.
	Hold(ctx context.Context, i int, hs []limiter.Hold) ([]limiter.HoldResult, error)
	// ShardOf is the shard of k; Shards how many there are; ShardName one's
	// name, for logs.
	ShardOf(k limiter.Key) int
	Shards() int
	ShardName(i int) string
}

// Ledger takes what is left to account for (the outbox): charges of
// admissions made without a reservation, 304 refunds the edge cannot take
// back into its credit, credit given back unused.
type Ledger interface {
	// Record queues e for shard's primary and returns its sequence number
	// (the edge numbers its entries per shard), or 0 when it was dropped.
	Record(shard int, e limiter.Entry) uint64
}

// Notifier tells the other edges that a window is full, or has room again
// (core NATS, signed).
type Notifier interface {
	Notify(shard int, n Notice)
}

// Notice is what a notice says of a window.
type Notice struct {
	Full    bool
	Key     limiter.Digest
	ResetAt time.Time
	Used    int64
}

// Log is where the core writes what an operator should know (rate-limited
// by the caller).
type Log interface {
	Info(msg string, args ...any)
	Warn(msg string, args ...any)
	Error(msg string, args ...any)
}
