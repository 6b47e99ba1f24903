// Package setting is the one shape every part of Tally's configuration
// takes. Each section is a Go struct owned by the package it configures
// (credit.Config, outbox.Config, accountant.Config, events.Streams, …) with
// two methods:
//
//   - WithDefaults returns the section with its zero values replaced by the
//     defaults, and changes nothing else. A default is written in that one
//     method and nowhere else.
//   - Validate, on the section after WithDefaults, refuses every value the
//     component cannot work with as an *Error that names the field as the
//     file spells it. It never replaces a value.
//
// The configuration file (internal/config) is those sections put together:
// it applies the defaults once, validates once, and places each error under
// the section's path (In) so that it can report the line.
package setting

import (
	"errors"
	"fmt"
)

// Error is a setting that cannot be used, with the path of its field.
type Error struct {
	// Field is the setting's path as the configuration file spells it,
	// relative to the section that reported it: "share",
	// "shards[1].primary", "policies[0].limit". Empty for the section as a
	// whole.
	Field string
	// Msg says what is wrong and what would do, e.g. "-1: want 1 to 64".
	Msg string
	// Kind is the reporting package's sentinel (errors.Is(err, Kind)).
	Kind error
}

func (e *Error) Error() string {
	prefix := ""
	if e.Kind != nil {
		prefix = e.Kind.Error() + ": "
	}
	if e.Field == "" {
		return prefix + e.Msg
	}
	return prefix + e.Field + ": " + e.Msg
}

// Unwrap makes errors.Is(err, Kind) hold.
func (e *Error) Unwrap() error { return e.Kind }

// Errorf is an *Error of kind for field.
func Errorf(kind error, field, format string, args ...any) *Error {
	return &Error{Field: field, Msg: fmt.Sprintf(format, args...), Kind: kind}
}

// In returns err with its field placed under prefix ("edge.credit" and
// "share" make "edge.credit.share"). Errors that are not an *Error are
// returned as they are.
func In(prefix string, err error) error {
	var e *Error
	if !errors.As(err, &e) {
		return err
	}
	out := *e
	switch {
	case prefix == "":
	case e.Field == "":
		out.Field = prefix
	default:
		out.Field = prefix + "." + e.Field
	}
	return &out
}
