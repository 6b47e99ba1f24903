// Package events is Tally's wire on NATS: accounting events, decision
// records and notices, the streams that carry them, and the batcher that
// publishes decisions.
//
// # Accounting events
//
// What is left to account for after an edge answered (a 304 refund it could
// not take back into its own credit, units it reserved and did not use, an
// overdraft) and what services publish themselves: CloudEvents 1.0 of types
// dev.tally.request.started.v2, dev.tally.request.finished.v2 and
// dev.tally.credit.released.v1, several per message in CloudEvents' JSON
// batch format, on <prefix>.<shard>.<producer>: a producer publishes on its
// own subject (ProducerOfSubject), which NATS permissions grant it, so that
// nobody publishes as another. Each producer numbers its events per shard
// (extension attributes tallyproducer and tallyseq): that is what makes
// applying them exactly once possible; tallykeyid names the key secret
// their digests were made with. They are encoded by hand, with
// no reflection, and validated without regular expressions. docs/events.md
// is the public contract.
//
// # Decisions and notices
//
// Every decision can be recorded as a dev.tally.decision.v1 CloudEvent on
// the decisions stream, for analytics (Batcher: bounded, never blocks a
// request). Notices ("full" and "room") tell edges on core NATS which
// windows are full, so that they answer 429 without Redis; each is signed
// and dated (Notices), so that a forged or replayed one changes nothing.
//
// # Streams
//
// Streams are by purpose, so that none takes another's capacity: accounting
// (what is not yet applied; accountants delete what they applied),
// decisions (oldest dropped first) and dead letters. EnsureStreams creates
// or updates them idempotently at start-up; the accounting stream takes the
// subjects of the configured shards only.
//
// This package uses package limiter's names and limits (policy names,
// producer ids, key digests, Op), never its store: it does no Redis I/O.
package events
