package cli

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/tallyhq/tally/internal/config"
)

func init() {
	register(&command{name: "check-config", args: "[FILE]", summary: "check a configuration file: every problem, with its line",
		help: `Reads FILE (default --config, $TALLY_CONFIG, else tally.yaml) with the environment the
processes would have (TALLY_KEY_SECRET is required, as by the edge and the accountant), and
prints every problem, one a line, as "FILE:LINE: FIELD: what is wrong and what would do".
Exits 1 when there is any, 0 (printing "FILE: ok") when there is none. Nothing is reached:
addresses are checked for their form only.`,
		setup: func(c *call) func(context.Context) error {
			return func(context.Context) error {
				path := c.configPath()
				switch len(c.args) {
				case 0:
				case 1:
					path = c.args[0]
				default:
					return usagef("one file at a time")
				}
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				problems := config.Check(b, c.env.Getenv)
				for _, p := range problems {
					loc := path
					if p.Line > 0 {
						loc = fmt.Sprintf("%s:%d", path, p.Line)
					}
					q := p
					q.Line = 0
					fmt.Fprintf(c.env.Stderr, "%s: %s\n", loc, q)
				}
				if len(problems) > 0 {
					return errors.New(plural(len(problems), "problem", "problems") + " found")
				}
				c.out("%s: ok\n", path)
				return nil
			}
		}})
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprint(n) + " " + many
}
