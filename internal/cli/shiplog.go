package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// maxLogLine bounds one access-log entry, as the edge's log listener does
// (edge.maxLogDatagram).
const maxLogLine = 64 << 10

func init() {
	register(&command{name: "ship-access-log", args: "--to ADDRESS", summary: "send Traefik's access log to an edge, for 304 refunds",
		help: `Reads Traefik's JSON access log on standard input, one entry a line (accessLog.format: json, with
the request header Tally-Request-Id kept: deploy/traefik/traefik.yml), and sends each entry of a
304 Not Modified that carries a request id to the edge's access-log listener
(edge.forward_auth.log_listen) as one UDP datagram: the edge gives that request's charge back, once.
Other entries cost nothing and are not sent. It runs until its input ends:

  tail -F -n 0 /var/log/traefik/access.log | tally ship-access-log --to 127.0.0.1:5516

The edge reads datagrams from the addresses of edge.forward_auth.gateways only: run it where
its datagrams come from such an address (on Traefik's host). A line that is not such an entry is
skipped; at the end it says how many entries it sent and skipped.`,
		setup: func(c *call) func(context.Context) error {
			to := c.flags.String("to", "", "the edge's access-log listener, `host:port` (edge.forward_auth.log_listen)")
			return func(ctx context.Context) error {
				if *to == "" {
					return usagef("--to is required")
				}
				if len(c.args) > 0 {
					return usagef("the log comes on standard input")
				}
				conn, err := net.Dial("udp", *to)
				if err != nil {
					return err
				}
				defer conn.Close()
				sent, skipped, err := shipAccessLog(ctx, bufio.NewReaderSize(c.env.Stdin, maxLogLine), conn)
				fmt.Fprintf(c.env.Stderr, "tally ship-access-log: %s sent, %s skipped\n",
					plural(sent, "304", "304s"), plural(skipped, "line", "lines"))
				return err
			}
		}})
}

// traefikEntry is what the edge reads of Traefik's JSON access log.
type traefikEntry struct {
	DownstreamStatus int    `json:"DownstreamStatus"`
	RequestID        string `json:"request_Tally-Request-Id"`
}

// shipAccessLog sends every entry of in that gives a charge back (a 304
// with a request id) to conn, one datagram each, until in ends or ctx is
// done. It counts what it sent and the lines it could not read (too long,
// not a JSON object). A datagram the network refuses is counted as sent:
// UDP says nothing of delivery, and a lost 304 keeps its charge.
func shipAccessLog(ctx context.Context, in *bufio.Reader, conn net.Conn) (sent, skipped int, err error) {
	for ctx.Err() == nil {
		line, isPrefix, err := in.ReadLine()
		long := isPrefix
		for isPrefix && err == nil { // longer than an entry may be: skipped to its end
			_, isPrefix, err = in.ReadLine()
		}
		if long {
			skipped++
		}
		if errors.Is(err, io.EOF) {
			return sent, skipped, nil
		}
		if err != nil {
			return sent, skipped, err
		}
		if long {
			continue
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var e traefikEntry
		if json.Unmarshal(line, &e) != nil {
			skipped++
			continue
		}
		if e.DownstreamStatus != 304 || e.RequestID == "" {
			continue // nothing to give back
		}
		_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = conn.Write(line)
		sent++
	}
	return sent, skipped, ctx.Err()
}
