// Package limiter is Tally's window layer: policies, decisions and their
// response headers, the Redis keys, and the store that runs the window
// scripts (package lua) on the shards.
//
// # Windows
//
// A window belongs to one key, a (policy name, identity) pair. It opens at
// its first request and resets Window later, rounded up to a whole second.
// The reset time is computed by Tally, stored next to the count, and read
// back by every check: it never comes from a TTL, so every response for one
// window shows the same X-RateLimit-Reset. Redis expiry (reset + Grace) is
// garbage collection only; every script compares the stored reset with the
// caller's now, so a closed window that a replica (or a lagging primary)
// still holds reads as absent.
//
// # The flow
//
//   - Check reads the live window on a replica; one read decides (Decide) and
//     fills the headers (Decision.SetHeaders).
//   - When the check finds no live window, Open opens it on the primary, so
//     that the first responses already carry the window's final reset.
//   - Charges and refunds (Apply, Charge, Refund) run on the primary, keyed by
//     event id: each takes effect at most once, in the window that was live
//     when the request started. A refund that comes before its charge leaves
//     a marker and the charge then nets to zero; a refund or charge whose
//     window has closed or been replaced is Late and changes nothing.
//
// # Keys
//
// keys.go is the only place that builds Redis keys: identities are hashed
// with a keyed hash, so no user string reaches Redis or picks a shard.
//
// # Time
//
// Every call takes now from the Store's Clock. Tests use ManualClock to move
// through windows without sleeping.
package limiter
