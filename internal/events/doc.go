// Package events is Tally's wire: request events as CloudEvents 1.0 in
// binary mode on NATS JetStream, the streams and consumers that carry them,
// and the edge's bounded asynchronous publisher.
//
// # The contract
//
// Three versioned types, all with the same JSON data (Request):
// dev.tally.request.started.v1 (charge), dev.tally.request.finished.v1
// (with the response status: 304 refunds) and dev.tally.request.rejected.v1
// (telemetry only). Attributes travel as exact lower-case ce-* NATS headers,
// the data as the body. The event id is "<request id>.<kind>" and is also the
// Nats-Msg-Id, so JetStream drops repeated publishes within its duplicate
// window and a request's start and finish never collide. docs/events.md is
// the public description, for services that publish events themselves.
//
// # Subjects and streams
//
// Events go to <prefix>.<shard>.<kind> (default prefix tally.events): the
// publisher knows the key's shard, and each shard has one durable consumer
// that filters on its own subjects. EnsureStreams and EnsureConsumer create
// or update the streams and consumers idempotently at start-up. Events that
// can never be applied go to the dead-letter stream (<dead-letter prefix>.<shard>).
//
// This package knows nothing of Redis: applying events is the accountant's.
package events
