// Package serve runs tally serve: an edge-checker, an accountant and an
// embedded NATS JetStream server in one process, from one configuration
// file, with only Redis outside — the smallest deployment of Tally, and
// the one that takes envoyproxy/ratelimit's place (internal/ratelimitenv
// reads its settings into a configuration).
//
// # The parts
//
// The edge and the accountant are the ones the separate binaries run
// (service.RunEdgeIn, service.RunAccountantIn), sharing the process's
// telemetry: one /metrics shows both. They reach the embedded server in
// process (no socket), each as the user of its role in Tally's shipped
// permissions (deploy/nats/tally.conf), with a password only the process
// knows unless TALLY_NATS_<USER>_PASSWORD gives one. The server listens
// for clients only when serve.nats.listen says so (services publishing
// their own events, analytics consumers), and joins the servers of other
// tally serve processes through serve.nats.cluster: several processes
// over the same Redis are one JetStream cluster (R3 from three), exact
// together as separate edges are. With nats.url set, the process uses that
// external NATS instead and embeds none.
//
// # Stopping
//
// When ctx ends: the edge stops admitting (its listeners close, in-flight
// requests finish), gives back unused reservations and delivers what it
// holds to account for; then the accountant stops reading, applies the
// run in hand and gives up its leases; then the NATS server shuts down
// (its store is on disk); then telemetry is flushed. A part that fails
// stops the others in the same order.
package serve
