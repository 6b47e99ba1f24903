// Package faults is Tally's fault suite: it runs the whole pipeline as real
// processes — two Redis shards (a primary with an append-only file and a
// replica each), a NATS server with JetStream, an accountant and an
// edge-checker in proxy mode in front of an API that answers 304 to
// revalidations — and fails one dependency at a time under steady load:
//
//   - a shard primary killed (SIGKILL) and restarted from its append-only
//     file, or frozen (SIGSTOP) for seconds;
//   - a replica frozen, or killed and restarted;
//   - NATS killed and restarted on the same store, or frozen;
//   - the accountant killed and replaced;
//   - the accounting stream full, with no accountant reading it;
//   - a message that is not an event, and an event Redis refuses
//     (a window key of the wrong type), on the accounting stream;
//   - with two edges over hundreds of keys (failover_test.go): a Sentinel
//     shard's primary killed, its replicas short of its last writes, and a
//     primary without persistence restarted empty — the shard is re-seeded
//     from what the edges hold.
//
// After each fault the load stops, the edge stops as a deploy would (it
// gives its unused credit back) and the accountant empties the stream. The
// suite then proves, for every key the clients used, that the window's count
// on the primary is exactly what the clients were allowed (200 and 304
// answers, times the cost) less what was refunded (the 304s): nothing lost,
// nothing counted twice. It also proves that no request failed (no 5xx, no
// broken connection: on_redis_error is allow), that no request waited longer
// than a generous bound (a stall would break it), that windows with a small
// limit never let more through than their limit, and that what can never be
// applied ends in the dead-letter stream with its reason while the shard
// goes on. It logs each fault's latencies (p50, p99, max) before, during and
// after the fault; docs/operations.md ("The fault suite") quotes them.
//
// The suite builds edge-checker, accountant and nats-server from this module
// in its TestMain and expects redis-server on PATH. It takes about two
// minutes; -short skips it.
package faults
