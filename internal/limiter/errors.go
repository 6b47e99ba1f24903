package limiter

import "errors"

// ErrInvalidArgument is wrapped by errors about an operation's arguments,
// whether Go or a script refused them. Retrying cannot help.
var ErrInvalidArgument = errors.New("limiter: invalid argument")
