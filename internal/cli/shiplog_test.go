package cli_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/cli"
	"github.com/tallyhq/tally/internal/testutil"
)

// ship-access-log sends the 304s of Traefik's JSON access log that carry a
// request id, one datagram each, and skips what it cannot read (a line
// longer than a datagram the edge reads, a line that is not JSON) without
// stopping.
func TestShipAccessLog(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	require.NoError(t, err)
	defer pc.Close()
	entry := `{"DownstreamStatus":304,"RequestMethod":"GET","request_Tally-Request-Id":"AQEA-ticket"}`
	in := strings.Join([]string{
		`{"DownstreamStatus":304,"request_Tally-Request-Id":"` + strings.Repeat("x", 70<<10) + `"}`,
		"not json",
		`{"DownstreamStatus":200,"request_Tally-Request-Id":"AQEA-other"}`,
		`{"DownstreamStatus":304}`,
		"",
		entry,
	}, "\n")
	var out, errOut testutil.Buffer
	code := cli.Main(context.Background(), cli.Env{Stdin: strings.NewReader(in), Stdout: &out, Stderr: &errOut},
		[]string{"ship-access-log", "--to", pc.LocalAddr().String()})
	require.Equal(t, 0, code, errOut.String())
	require.Contains(t, errOut.String(), "1 304 sent, 2 lines skipped")
	buf := make([]byte, 128<<10)
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(5*time.Second)))
	n, _, err := pc.ReadFrom(buf)
	require.NoError(t, err)
	require.Equal(t, entry, string(buf[:n]))
	require.NoError(t, pc.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, _, err = pc.ReadFrom(buf)
	require.Error(t, err, "one datagram only")

	code = cli.Main(context.Background(), cli.Env{Stdout: &out, Stderr: &errOut}, []string{"ship-access-log"})
	require.Equal(t, 2, code, "--to is required")
}
