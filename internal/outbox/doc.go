// Package outbox delivers what an edge's decision core leaves to account
// for: the charges of admissions made without a reservation, the refunds
// of 304s, credit given back unused (limiter.Entry). It numbers them per
// shard (the producer's sequence, which the primaries apply once), batches
// them, and delivers each batch by its route:
//
//	stream (default)  published to JetStream for the accountants (several
//	                  batches in flight per shard); a batch JetStream does
//	                  not acknowledge within PublishTimeout is applied on
//	                  the shard's primary by the edge itself.
//	direct            applied on the primary by the edge; a batch the
//	                  primary does not take in time goes to JetStream.
//
// Only when neither takes a batch do its events wait, up to Capacity per
// shard; beyond that new entries are refused (Record returns 0) and the
// core decides without them. Both routes apply the same idempotent script,
// so a batch that reaches both is applied once.
//
// The wire form of an entry is package events' (events.AccountingOf); the
// operation applied on a primary is limiter.Entry.Event. The outbox imports
// neither the core nor the edge: it is handed entries through Record and
// reports what a direct application left in a window through Learn.
package outbox
