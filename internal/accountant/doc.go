// Package accountant applies accounting events to the windows in Redis.
// For each shard, one accountant process at a time (the holder of the
// shard's lease) reads the shard's subject of the accounting stream in order
// from its oldest message, applies the events on the shard's primary, and
// deletes from the stream what it applied once a replica confirmed it.
//
// # Guarantees
//
// Every event the stream accepted is applied eventually, at most once:
//   - the primary remembers, per producer, which event numbers it applied
//     (lua/apply.lua), so a message read again after a crash, a hand-over,
//     a republish, a retry, or a copy of a batch an edge applied itself,
//     changes nothing;
//   - messages are deleted only once applied and confirmed (Redis WAIT), so
//     a crash or a failover loses nothing the stream held;
//   - an event is applied only when its producer is the one its subject
//     names and its key id is the deployment's, and a refund or release
//     gives back at most what its producer holds in the window: nobody
//     undoes another producer's charges (docs/security.md);
//   - transient failures (connection loss, READONLY after a failover, a
//     restarting primary, OOM) are retried with a growing delay, holding the
//     shard's place; a message that can never be applied (undecodable, terms
//     that differ from the configured policy, a key of another shard, a
//     Redis error that persists) is copied to the dead-letter stream with
//     its reason, and the shard moves on.
//
// It is ready (AdminHandler's /readyz) once its streams exist and every
// shard's lease has been asked for.
//
// Several accountants can run at once for availability: each shard's lease
// picks one; when it stops (or dies), another takes the shard within the
// lease's lifetime, at once after a graceful stop. Correctness does not
// depend on the lease.
//
// # Files by job
//
//	accountant.go  the process: its shards, its counters (Stats, exported
//	               once, as metrics, by metrics.go)
//	lease.go       who serves a shard: the lease, held and renewed
//	reader.go      reading a shard's subject in order, in runs
//	apply.go       applying a run's events on the primary, retrying what
//	               failed and narrowing down what Redis refuses
//	records.go     what each event did: counters, decision records, notices
//	purge.go       deleting from the stream what is applied and confirmed
//	deadletter.go  setting aside what can never be applied
//	carry.go       what a worker that lets its shard go leaves to the next
//	               one of the process: what it applied, a run whose answer
//	               was lost
//	config.go      the tunables, their defaults and checks
//
// # Shutdown
//
// When the context ends, each shard stops reading, finishes the run in
// hand, deletes what a replica confirmed from the stream, and gives up its
// lease. Close the Redis store and the NATS connection after Run returns.
package accountant
