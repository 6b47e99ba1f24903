// Package cli is tally, the operator's command-line tool: it checks a
// configuration file, inspects and resets a client's window, follows the
// decisions stream, lists and replays dead letters, and sets, lists and
// clears temporary limits, against a deployment's Redis and NATS as its
// configuration file names them.
//
// Every command is a value in commands (one file per command or family),
// run by Main with an Env (standard streams, environment, clock), so that
// tests run each against real Redis and NATS in-process. A reset and a
// change of temporary limits are recorded on the decisions stream as an
// operator's records (events.Decision with path "operator"); a replayed
// dead letter shows there as what the accountant did with its events.
// Reset and replay ask for confirmation unless --yes is given.
package cli
