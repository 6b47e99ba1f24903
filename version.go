// Package tally holds the version of the whole repository: the VERSION file
// beside this one, shared by every binary, the image, the Helm chart and the
// changelog. docs/install.md says how a release is made from it.
package tally

import (
	_ "embed"
	"strings"
)

//go:embed VERSION
var version string

// Version is the repository's version (the VERSION file), without a
// leading "v": 0.1.0. Releases are tagged v and this.
func Version() string { return strings.TrimSpace(version) }
