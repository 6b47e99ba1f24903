package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"

	"github.com/tallyhq/tally/internal/limiter"
)

// 304 refunds behind a gateway: the edge that answered a forward-auth
// request does not see the response, so the gateway tells it — its access
// log, sent as UDP datagrams to ServeAccessLog, one entry each, carrying the
// request's Tally-Request-Id and the response's status. Two forms:
//
//   - a syslog line (nginx: access_log syslog:server=…,tag=tally with
//     log_format tally '$tally_request_id $status'): its last two fields
//     are the request ids and the status;
//   - a JSON access-log entry (Caddy: log { output net udp/… format json }):
//     "status", and the Tally-Request-Id header among "resp_headers" or the
//     request's "headers"; or Traefik's JSON access log, which Traefik
//     writes to a file only, sent on by `tally ship-access-log`:
//     "DownstreamStatus" and "request_Tally-Request-Id".
//
// Only what gives something back is acted on — a 304, and any status of a
// request held to a concurrency limit, whose finish gives its units back
// (limiter.Algorithm.GivesBack) — so that other entries cost no Redis
// call; each request is finished once on its window's primary whatever
// the log repeats; only datagrams from a configured gateway are read, and
// request ids are signed tickets nobody can forge.

// maxLogDatagram bounds one access-log entry.
const maxLogDatagram = 64 << 10

// logFinishers bounds the finishes in flight from access logs.
const logFinishers = 8

// ServeAccessLog reads gateways' access-log entries from pc until ctx ends
// or pc fails, and gives 304s their charge back.
func (s *Server) ServeAccessLog(ctx context.Context, pc net.PacketConn) error {
	go func() {
		<-ctx.Done()
		_ = pc.Close()
	}()
	sem := make(chan struct{}, logFinishers)
	var wg sync.WaitGroup
	defer wg.Wait()
	buf := make([]byte, maxLogDatagram)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		if a, ok := udpAddr(from); !ok || !s.isGateway(a) {
			s.logEntries[logNotGateway].Add(1)
			if ok {
				s.stranger(a, "an access-log entry")
			}
			continue
		}
		ids, status, ok := parseAccessLog(buf[:n])
		switch {
		case !ok:
			s.logEntries[logUnreadable].Add(1)
			continue
		case len(ids) == 0 || (status != http.StatusNotModified && !s.limits.Load().concurrent):
			s.logEntries[logIgnored].Add(1)
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		wg.Go(func() {
			defer func() { <-sem }()
			for _, id := range ids {
				outcome, err := s.finishTicket(ctx, id, status)
				switch {
				case err != nil:
					s.logEntries[logFailed].Add(1)
					s.log.Warn("a 304 from a gateway's access log was not given back", "err", err)
				case outcome == limiter.AlreadyFinished:
					s.logEntries[logRepeated].Add(1)
				case outcome == limiter.FinishLate:
					s.logEntries[logLate].Add(1)
				case outcome == finishNothing:
					s.logEntries[logIgnored].Add(1)
				default:
					s.logEntries[logRefunded].Add(1)
				}
			}
		})
	}
}

// Counts of access-log entries, by what was done with them.
const (
	logRefunded   = iota // a request finished (a 304's charge, a concurrency limit's units given back once)
	logRepeated          // a request finished before: nothing changed
	logLate              // a request whose window has reset: nothing to give back
	logIgnored           // a status that gives nothing back, or no request id
	logUnreadable        // neither form
	logNotGateway        // from an address that is not a gateway's
	logFailed            // an unknown request id, or the primary did not answer
	logKinds
)

var logNames = [logKinds]string{"refunded", "repeated", "late", "ignored", "unreadable", "not_gateway", "failed"}

// udpAddr is the IP address of a datagram's sender.
func udpAddr(a net.Addr) (netip.Addr, bool) {
	ua, ok := a.(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, false
	}
	ip, ok := netip.AddrFromSlice(ua.IP)
	return ip.Unmap(), ok
}

// parseAccessLog reads one entry: the request ids and the status.
func parseAccessLog(b []byte) (ids []string, status int, ok bool) {
	b = bytes.TrimSpace(b)
	if i := bytes.IndexByte(b, '{'); i >= 0 && b[len(b)-1] == '}' {
		return parseJSONLog(b[i:])
	}
	fields := strings.Fields(string(b))
	if len(fields) < 2 {
		return nil, 0, false
	}
	status, err := strconv.Atoi(fields[len(fields)-1])
	if err != nil || status < 100 || status > 599 {
		return nil, 0, false
	}
	idField := fields[len(fields)-2]
	if idField == "-" || idField == "" { // nginx's empty variable
		return nil, status, true
	}
	return strings.Split(idField, ","), status, true
}

// parseJSONLog reads a JSON access-log entry: Caddy's ("status", the id
// among "resp_headers" or the request's "headers"), or Traefik's
// ("DownstreamStatus", the id as the request header authResponseHeaders
// copied, kept as "request_Tally-Request-Id").
func parseJSONLog(b []byte) ([]string, int, bool) {
	var e struct {
		Status      int                 `json:"status"`
		RespHeaders map[string][]string `json:"resp_headers"`
		Request     struct {
			Headers map[string][]string `json:"headers"`
		} `json:"request"`
		DownstreamStatus int    `json:"DownstreamStatus"`
		TraefikID        string `json:"request_Tally-Request-Id"`
	}
	if json.Unmarshal(b, &e) != nil {
		return nil, 0, false
	}
	if e.Status == 0 && e.DownstreamStatus != 0 {
		e.Status = e.DownstreamStatus
		if e.TraefikID != "" {
			e.RespHeaders = map[string][]string{RequestIDHeader: {e.TraefikID}}
		}
	}
	if e.Status < 100 || e.Status > 599 {
		return nil, 0, false
	}
	v := e.RespHeaders[RequestIDHeader]
	if len(v) == 0 {
		v = e.Request.Headers[RequestIDHeader]
	}
	if len(v) == 0 || v[0] == "" {
		return nil, e.Status, true
	}
	return strings.Split(v[0], ","), e.Status, true
}
