// Package ratelimitenv reads envoyproxy/ratelimit's settings — the
// environment variables of its src/settings/settings.go, as Envoy Gateway
// and Istio's sample set them — into Tally's configuration, so that
// tally serve takes the reference's place by an image swap alone.
//
// Read turns the variables into a configuration file (YAML, what
// config.Parse reads: the equivalent a user can keep and edit) and the
// Tally variables that carry secrets. Every variable of the reference is
// in Variables with what Tally does with it: honoured (Tally does what the
// reference does), ignored (accepted; Tally has no such knob or does the
// thing its own way — the reason is given once, in Result.Notes, when the
// variable is set) or refused (a value Tally cannot honour is an error
// naming the variable). docs/envoy.md shows the same table (Table).
//
// The package only reads: a getenv function in, a Result out.
package ratelimitenv
