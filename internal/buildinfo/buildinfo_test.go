package buildinfo

import (
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A binary's version names the repository's VERSION, what Commit and Date
// were stamped with, the Go that built it and the licence, one a line.
func TestString(t *testing.T) {
	raw, err := os.ReadFile("../../VERSION")
	require.NoError(t, err)
	want := strings.TrimSpace(string(raw))
	require.Regexp(t, `^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`, want, "VERSION is a semantic version without a leading v")

	Commit, Date = "0123456789abcdef0123456789abcdef01234567", "2026-01-02T03:04:05Z"
	t.Cleanup(func() { Commit, Date = "", "" })
	out := Read("edge-checker").String()
	require.Equal(t, "edge-checker "+want+"\n"+
		"commit:  0123456789abcdef0123456789abcdef01234567\n"+
		"built:   2026-01-02T03:04:05Z\n"+
		"go:      "+runtime.Version()+" "+runtime.GOOS+"/"+runtime.GOARCH+"\n"+
		"licence: Apache-2.0\n", out)

	Commit, Date = "", ""
	out = Info{Name: "tally", Version: want, GoVersion: "go1.26.8", Platform: "linux/arm64", Licence: Licence}.String()
	require.Regexp(t, regexp.MustCompile("(?m)^commit:  unknown$"), out)
	require.Regexp(t, regexp.MustCompile("(?m)^built:   unknown$"), out)
}

// The LICENSE file is the licence the binaries name.
func TestLicenceFile(t *testing.T) {
	raw, err := os.ReadFile("../../LICENSE")
	require.NoError(t, err)
	require.Contains(t, string(raw), "Apache License\n                           Version 2.0, January 2004")
	require.Contains(t, string(raw), "END OF TERMS AND CONDITIONS")
}
