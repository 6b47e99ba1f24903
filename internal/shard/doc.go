// Package shard maps rate-limit keys to Redis shards and chooses which node
// of a shard serves a read. It does no I/O: callers report what they saw
// (a failed read, a replica whose replication link is down) and ask which
// replicas to try.
//
// # Shards
//
// A shard is one Redis primary (every write: reservations, accounting
// events, leases) and zero or more replicas (reads: edges read windows they
// believe full, in case a notice that they have room was lost; replicas are
// also what a failover promotes), or a master that Redis Sentinel watches
// (its primary and replicas are then whatever the sentinels say, and follow
// a failover: Config.Sentinel). The map comes from configuration and is static:
// a shard that is down stays the owner of its keys, and operations on it fail
// until it is back. Rehashing its keys onto another shard would hand every
// affected client a fresh window, which is the silent counter reset that
// go-redis's Ring does and that Tally refuses.
//
// # Key to shard
//
// Keys are placed by rendezvous (highest random weight) hashing over shard
// names. A key goes to the shard whose name scores highest for it. Adding a
// shard moves only the keys the new shard now wins, about 1/(n+1) of them,
// and removing one moves only that shard's keys; the order of shards in the
// configuration does not matter. While keys move (a placement and the
// previous one, redisstore.Options), a moving key keeps the live window
// its previous owner holds until it resets. The key's 64-bit hash is taken from Tally's
// keyed key digest, so a client cannot steer which shard it lands on.
//
// # Replica selection
//
// Reads rotate over the shard's replicas that are up. A replica is marked
// down for a cooldown when a read on it fails with a connection error or when
// a probe finds its replication link down (it would serve stale counts), and
// is tried again after the cooldown. When every replica is down the shard's
// [ReadPolicy] decides: read the primary (the default: correct, at the cost of
// primary load), or fail the read and let the caller apply its own
// fail-open or fail-closed rule.
//
// The I/O side of all this (connections, probes, recovering from NOSCRIPT
// after a restart, a SCRIPT FLUSH or a promotion) lives in redisstore.Store,
// which drives this package.
package shard
