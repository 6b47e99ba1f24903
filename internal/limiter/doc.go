// Package limiter is Tally's window layer: policies and their modes,
// decisions and their response headers, the Redis keys, and the store that
// runs the scripts (package lua) on the shards.
//
// # Windows
//
// A window belongs to one key, a (policy name, identity) pair. It opens at
// its first request and resets Window later, rounded up to a whole second.
// The reset time is computed once, stored next to the count, and returned by
// every call: it never comes from a TTL, so every response of one window
// shows the same reset. Redis expiry (reset + Grace) is garbage collection
// only; every script compares the stored reset with the caller's now, so a
// closed window that a replica (or a lagging primary) still holds reads as
// absent.
//
// # Reservations and events
//
//   - Take reserves units of a window on the shard's primary, opening the
//     window at its first request; it never takes a window past its limit.
//     Edges admit requests against what they reserved (docs/accuracy.md).
//   - Apply applies accounting events (charges, 304 refunds, releases of
//     unused reservations) in atomic script calls. Each producer numbers its
//     events per shard; the primary remembers the highest number applied
//     and the gaps below it, so every event takes effect once, whatever is
//     redelivered, republished or retried, with memory that does not grow
//     with traffic.
//   - Check reads a window on a replica (rotating, skipping replicas that
//     are down or cut off from their primary).
//   - HoldLease and ConfirmApplied keep one accountant active per shard and
//     confirm, with Redis WAIT, that what it applied is on a replica.
//
// # Keys
//
// keys.go is the only place that builds Redis keys: identities and producer
// ids are hashed with a keyed hash, so no user string reaches Redis or picks
// a shard.
//
// # Time
//
// Take and Apply take now from their caller (an edge reads its clock once
// per request); Check uses the Store's Clock. Tests use ManualClock to move
// through windows without sleeping.
package limiter
