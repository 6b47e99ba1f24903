// Package tallytest runs a whole Tally deployment in the test's process,
// for tests of what talks to Tally from outside (the public client
// package, the examples): a Redis primary (redistest), an embedded NATS
// JetStream server with the shipped users and permissions (natstest), an
// edge-checker serving the decision API and an accountant, all stopped when
// the test ends.
package tallytest
