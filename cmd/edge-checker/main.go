// Command edge-checker decides API requests at once, with rate-limit
// headers, from units it reserves on the Redis shard primaries, and sends
// what is left to account for to NATS JetStream for the accountant. It runs
// as a reverse proxy in front of an API (edge.listen + edge.upstream), as a
// decision API for gateways and services (edge.api_listen), or both.
//
// Usage:
//
//	edge-checker -config tally.yaml
//
// SIGTERM or SIGINT shuts it down in this order: /readyz fails, the
// listeners stop accepting and in-flight requests finish, unused
// reservations are given back, queued accounting events are delivered (to
// JetStream, or the primaries) and decisions published, the NATS connection
// drains, Redis connections close. A listener that fails stops the process
// with a non-zero status.
package main

import "github.com/tallyhq/tally/internal/service"

func main() { service.Main("edge-checker", service.RunEdge) }
