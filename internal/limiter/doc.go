// Package limiter is Tally's window model, with no I/O: policies and their
// modes, decisions, the operations a window takes (reservations,
// accounting events, finishes) with their arguments, validation and
// results, the Redis key layout, and the clock. The edge's decision core,
// the Redis store (package redisstore), the accountant and the wire
// (package events) share it.
//
// # Windows
//
// A window belongs to one key, a (policy name, identity) pair. It opens at
// the whole second its first request falls in and resets Window later (a
// whole second too), so that it lasts exactly Window.
// The reset time is computed once, stored next to the count, and returned by
// every call: it never comes from a TTL, so every response of one window
// shows the same reset. Redis expiry (reset + grace) is garbage collection
// only; every script compares the stored reset with the caller's now, so a
// closed window that a replica (or a lagging primary) still holds reads as
// absent.
//
// # Operations
//
//   - TakeArgs and Grant: reserving units of a window on its primary,
//     opening it at its first request; a reservation never takes a window
//     past its limit.
//   - Event, Result: accounting events (charges, 304 refunds, releases of
//     unused reservations), each numbered by its producer so that it takes
//     effect once; a producer gives back at most what it holds in a window.
//   - FinishArgs, FinishResult: finishing a decision-API request, once.
//
// Each has a Validate that checks what the scripts (package lua) check,
// before any call reaches Redis (ErrInvalidArgument).
//
// # Keys
//
// keys.go is the only place that builds Redis keys: identities are hashed
// with a keyed hash, so no user string reaches Redis or picks a shard.
//
// # Time
//
// Operations take now from their caller (an edge reads its clock once per
// request). Tests use ManualClock to move through windows without sleeping.
package limiter
