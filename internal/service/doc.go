// Package service holds what the edge-checker and the accountant need to run
// as services beside their own logic: connections to NATS from the
// configuration (TLS, credentials, disconnects and reconnects logged), the
// start-up check of the Redis primaries, and the bearer-token guards of
// their HTTP listeners.
//
// It depends on config and limiter; nothing in internal depends on it.
package service
