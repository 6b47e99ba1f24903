// Command accountant applies Tally's accounting events to the rate-limit
// windows: for each shard it consumes the shard's events from NATS
// JetStream in order and applies them on the shard's Redis primary, exactly
// once, deleting from the stream only what a replica confirmed. Several
// accountants can run at once; each shard is served by one of them at a
// time (a lease in Redis), and another takes over when it stops.
//
// Usage:
//
//	accountant -config tally.yaml
//
// SIGTERM or SIGINT stops it: each shard stops reading, the run in hand is
// applied and deleted from the stream, the shard's lease is given up (so
// that another accountant takes over at once), then NATS and Redis
// connections close.
package main

import "github.com/tallyhq/tally/internal/service"

func main() { service.Main("accountant", service.RunAccountant) }
