// Package buildinfo says what a Tally binary is: its version (the
// repository's VERSION), the commit and the time it was built from, the Go
// that built it and its licence. make release stamps the commit and the
// time at link time:
//
//	go build -ldflags "-X github.com/tallyhq/tally/internal/buildinfo.Commit=<sha>
//	  -X github.com/tallyhq/tally/internal/buildinfo.Date=<RFC 3339>"
//
// A binary built otherwise takes the commit Go recorded, if any, and says
// "unknown" for what it does not know.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/tallyhq/tally"
)

// Licence is the SPDX identifier of the licence every binary is under.
const Licence = "Apache-2.0"

// Commit and Date are set at link time: the commit the binary was built
// from and the time of that commit (RFC 3339, UTC), which keeps two builds
// of one commit identical.
var (
	Commit = ""
	Date   = ""
)

// Info is what a binary knows about its build.
type Info struct {
	Name, Version, Commit, Date, GoVersion, Platform, Licence string
	// Modified: the commit had changes not committed (Go's vcs.modified).
	Modified bool
}

// Read returns the build information of the running binary, named name.
func Read(name string) Info {
	i := Info{Name: name, Version: tally.Version(), Commit: Commit, Date: Date, GoVersion: runtime.Version(),
		Platform: runtime.GOOS + "/" + runtime.GOARCH, Licence: Licence}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.Commit == "" {
					i.Commit = s.Value
				}
			case "vcs.time":
				if i.Date == "" {
					i.Date = s.Value
				}
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	return i
}

// String is what `version` prints: the name and version, then one line
// each for the commit, the build date, Go and the licence.
func (i Info) String() string {
	unknown := func(s string) string {
		if s == "" {
			return "unknown"
		}
		return s
	}
	commit := unknown(i.Commit)
	if i.Modified {
		commit += " (modified)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\n", i.Name, i.Version)
	fmt.Fprintf(&b, "commit:  %s\n", commit)
	fmt.Fprintf(&b, "built:   %s\n", unknown(i.Date))
	fmt.Fprintf(&b, "go:      %s %s\n", i.GoVersion, i.Platform)
	fmt.Fprintf(&b, "licence: %s\n", i.Licence)
	return b.String()
}
