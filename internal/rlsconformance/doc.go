// Package rlsconformance is envoyproxy/ratelimit's behaviour, as a suite
// that runs against any server of Envoy's rate-limit service over gRPC:
// the answers verified on the reference's code (docs/envoy.md, "What each
// case answers") for nested and several descriptors, descriptors no rule
// matches, unlimited and zero rules, malformed requests, hits_addend,
// shadow_mode, replaces, wildcards and limit overrides — each case its own
// domain, so that one server loaded with every case's rules runs them all.
//
// One behaviour is left out on purpose: what a denied request charges (the
// reference charges it; Tally deliberately does not, and the cases that
// look at it say so). The windows are the clock's, as the reference's
// (duration_until_reset is unit − now mod unit): a server runs the suite
// with its domains' windows aligned to the clock (edge.rls.clock_windows,
// on with the reference's settings).
//
// Tests of tally serve (internal/serve) run the suite with the rules from
// a directory and pushed over xDS (XDS turns a case's files into
// RateLimitConfig resources). It is a package, not a _test file, so that
// every door's tests can share it.
package rlsconformance
