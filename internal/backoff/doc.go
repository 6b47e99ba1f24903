// Package backoff is progressive backoff for clients that keep sending
// while they are denied: a client told to retry after some time that comes
// back before it gets a longer Retry-After each time (the policy's factor,
// up to its cap), and one that waits as told is never counted against.
//
// The model, per window key (a client under one policy), at one edge:
//
//   - A denial by the window (full) tells the client to retry at the
//     window's reset: the base. The key is remembered with no strikes.
//   - A request before the time the client was last told is an early
//     return, a strike: it is denied without deciding anything, and told to
//     wait base × factor^strikes from now, at most the cap (whole seconds),
//     but never to come back before the window's reset (the answer keeps
//     that reset as the window's: only its Retry-After grows).
//   - A request at or after the time it was told is decided as usual: the
//     strikes are forgotten (good behaviour) whatever the window says; if it
//     is admitted, the key is forgotten altogether.
//
// So a client is never denied by backoff longer than the last Retry-After
// it was given, and a client that waits as told never gets a longer one.
// The state is each edge's own, in memory, bounded (Table's capacity): a
// client spread over several edges is backed off at each separately.
//
// Table takes the time of each call from its caller (one clock: the
// edge's), and never reads a clock itself.
package backoff
