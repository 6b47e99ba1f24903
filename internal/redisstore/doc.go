// Package redisstore runs the window operations of package limiter on the
// Redis shards: every call to go-redis lives here. A Store holds one
// primary and its replicas per shard, and runs the scripts of package lua.
//
//   - Take reserves units of a window on the shard's primary (take.lua).
//   - Apply and ApplyRun apply accounting events in atomic script calls
//     (apply.lua), each event once whatever is redelivered, republished or
//     retried; a run sent again after a lost answer learns what it did.
//   - Finish finishes a decision-API request once (finish.lua).
//   - Check reads a window on a replica (rotating, skipping replicas that
//     are down or cut off from their primary), or the primary by the read
//     policy.
//   - HoldLease and ConfirmApplied keep one accountant active per shard and
//     confirm, with Redis WAIT, that what it applied is on a replica.
//
// Scripts are run by their hash and sent again when a node does not have
// them (NOSCRIPT: a restart, a promotion, SCRIPT FLUSH); LoadScripts loads
// them ahead. Calls on primaries are never retried by go-redis: a
// reservation retried could be granted twice (Permanent tells a refusal
// from a node that could not answer). Tracing is a hook of its own
// (InstrumentTracing), off unless traces are exported.
package redisstore
