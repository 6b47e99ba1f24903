// Package edge is the edge-checker: it decides each request at once, with
// rate-limit headers, from what it knows of the request's window, and keeps
// the window's accounting exact (docs/accuracy.md).
//
// Four front doors: the proxy (in front of an upstream API), the decision
// API (POST /v1/check and /v1/finish, for gateways and services that
// forward themselves), Envoy's rate-limit service (gRPC ShouldRateLimit,
// from envoyproxy/ratelimit's YAML rules: rls.go) and the admin endpoints
// (/healthz, /readyz, /metrics). Each door turns its protocol into one call
// of the core, credit.Core.DecideRequest, with every limit the request is
// held to, and the Outcome into its answer: the core decides the whole
// request (an operator's temporary limits and blocks, read here from the
// limits stream, and progressive backoff reach it through its Healer
// port, heal.go), so that a denied request consumes nothing.
//
// # Trust
//
// The proxy matches a request path exactly as the upstream receives it,
// and refuses paths whose meaning depends on who decodes them (path.go).
// Identities are normalised before they are hashed (identity.go). A
// request held to several limits is checked against what the edge knows of
// each before any reserves. A decision-API request is finished once: its
// signed ticket (ticket.go) names where its finish is marked on the
// primary (lua/finish.lua). Notices from other processes are believed only
// when signed with the deployment's secret. docs/security.md is the threat
// model.
//
// An edge is ready (/readyz) once it has reached every shard's primary and
// found its streams (ready.go).
//
// # Deciding
//
// The decisions are the core's (internal/credit): the front doors
// translate a request into one call of credit.Core.DecideRequest, and its
// Outcome into an answer; what is
// left to account for goes to the outbox (internal/outbox). In short: an edge admits requests against credit: units of the window it reserved
// on the shard's primary (redisstore.Store.Take, one atomic script that also
// opens the window at its first request). Far from the limit a reservation
// covers a while of the key's traffic, so most requests need no Redis call;
// it is renewed in the background before it runs out. A reservation takes at
// most a share of what is left, so near the limit they shrink to one request:
// the edge then decides each request atomically on the primary. A
// reservation never takes a window past its limit, so whatever all edges
// admit from credit stays within it. When a reservation finds no room, the
// window is full: the edge answers 429 from memory until the reset and tells
// the other edges (a notice on core NATS); a refund that makes room again is
// announced the same way, and a full window whose denials go on is read
// again (on a replica) in case a notice was lost.
//
// Policies choose a mode: auto (the above), exact (one reservation of
// exactly the request's cost per request) or async (like auto, but a
// request never waits for a reservation once its window is open: over its
// credit, the edge admits from what it last saw and charges the overdraft
// with an accounting event).
//
// # Accounting events
//
// What cannot be settled at once goes out as accounting events, numbered per
// shard, through the outbox: 304 refunds the edge cannot take back into its
// own credit, unused credit it gives back, overdrafts. They go to JetStream,
// where the accountant applies them; when JetStream does not acknowledge a
// batch in time, the edge applies it on the primary itself with the same
// idempotent script.
//
// # When a dependency is down
//
//   - NATS: events are applied on the primaries directly; notices stop (edges
//     converge by reading); decisions are dropped and counted.
//   - A primary: requests with credit are unaffected; others wait at most
//     the Redis budget, then are decided from what the edge knows of the
//     window (charged by an event once the primary is back), or, knowing
//     nothing, by on_redis_error: allow (fail open, charged later) or deny
//     (503). The request path marks the primary down so that the next
//     requests do not wait.
//   - A replica: only the rechecks of full windows read replicas; they move
//     to another replica or the primary.
package edge
