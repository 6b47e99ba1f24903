package cli

import (
	"context"

	"github.com/tallyhq/tally/internal/buildinfo"
)

func init() {
	register(&command{name: "version", summary: "print tally's version, commit, build date, Go version and licence",
		setup: func(c *call) func(context.Context) error {
			return func(context.Context) error {
				c.out("%s", buildinfo.Read("tally"))
				return nil
			}
		}})
}
