package cli

import (
	"context"
	"runtime/debug"
)

// Version is tally's version: set at link time (-ldflags "-X
// github.com/tallyhq/tally/internal/cli.Version=v1.2.3"), else the module's
// version and the commit it was built from.
var Version = ""

func init() {
	register(&command{name: "version", summary: "print tally's version, and the commit and Go it was built with",
		setup: func(c *call) func(context.Context) error {
			return func(context.Context) error {
				v, commit, modified, goVersion := Version, "", false, ""
				if bi, ok := debug.ReadBuildInfo(); ok {
					goVersion = bi.GoVersion
					if v == "" {
						v = bi.Main.Version
					}
					for _, s := range bi.Settings {
						switch s.Key {
						case "vcs.revision":
							commit = s.Value
						case "vcs.modified":
							modified = s.Value == "true"
						}
					}
				}
				if v == "" {
					v = "(devel)"
				}
				c.out("tally %s", v)
				if commit != "" {
					c.out(" commit %s", commit)
					if modified {
						c.out(" (modified)")
					}
				}
				if goVersion != "" {
					c.out(" %s", goVersion)
				}
				c.out("\n")
				return nil
			}
		}})
}
