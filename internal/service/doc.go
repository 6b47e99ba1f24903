// Package service runs Tally's binaries: the wiring of an edge-checker
// (RunEdge) and of an accountant (RunAccountant) from the configuration,
// and what both need beside their own logic — connections to NATS with TLS
// and credentials (disconnects and reconnects logged), the start-up check
// of the Redis primaries' eviction policy, the bearer-token guards of the
// HTTP listeners, and Main, the whole main of a binary (flags, logging,
// signals, exit status).
//
// It depends on config, edge, accountant, events and limiter; only the
// commands depend on it.
package service
