package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/limiter"
)

// maxAPIBody bounds decision-API request bodies.
const maxAPIBody = 64 << 10

// jsonContentType is the Content-Type of every answer, shared (net/http
// never modifies it). The answers carry no Cache-Control: a response to a
// POST without explicit freshness is stored by no cache (RFC 9110 §9.3.3,
// RFC 9111 §3), and an allowed answer's headers then fit net/http's
// smallest header map (eight entries), which it copies once per response.
var jsonContentType = []string{"application/json"}

// apiBuf is the memory of one decision-API request: its body as read and its
// answer as written. Reused: net/http copies what a handler writes, and the
// parsed request holds copies of the strings it needs.
type apiBuf struct{ in, out []byte }

// maxPooledBuf is the largest buffer kept for reuse; a large body's is left
// to the collector.
const maxPooledBuf = 4 << 10

var apiBufs = sync.Pool{New: func() any { return &apiBuf{in: make([]byte, 0, 512), out: make([]byte, 0, 512)} }}

func getBuf() *apiBuf { return apiBufs.Get().(*apiBuf) }

func putBuf(b *apiBuf) {
	if cap(b.in) <= maxPooledBuf && cap(b.out) <= maxPooledBuf {
		apiBufs.Put(b)
	}
}

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	// Policy names the limit to apply.
	Policy string `json:"policy"`
	// Identity is whose window counts the request: an API token, a user id,
	// an address. It is hashed, never stored. 1 to MaxIdentityLen bytes.
	Identity string `json:"identity"`
	// Cost overrides the policy's cost (1 to the limit). Optional.
	Cost int64 `json:"cost,omitempty"`
	// Tier names the client's plan when the policy has tiers (the caller
	// vouches for it). Optional.
	Tier string `json:"tier,omitempty"`
}

// CheckResponse is the answer of POST /v1/check (status 200 when allowed,
// 429 when denied); the same values are in the rate-limit headers.
type CheckResponse struct {
	Allowed bool `json:"allowed"`
	// RequestID is the ticket to send to /v1/finish when the request is done
	// (allowed requests only).
	RequestID  string `json:"request_id,omitempty"`
	Resource   string `json:"resource"`
	Limit      int64  `json:"limit"`
	Remaining  int64  `json:"remaining"`
	Used       int64  `json:"used"`
	Reset      int64  `json:"reset"`
	RetryAfter int64  `json:"retry_after,omitempty"`
}

// FinishRequest is the body of POST /v1/finish.
type FinishRequest struct {
	RequestID string `json:"request_id"`
	Status    int    `json:"status"`
	// Cost, when set, is what the request actually cost (0 to 10^9), for a
	// request whose check charged an estimate: the excess is given back,
	// a shortfall charged in full, even past the limit. A 304 gives the
	// whole charge back and takes no cost.
	Cost *int64 `json:"cost,omitempty"`
}

// FinishResponse is the answer of POST /v1/finish when the request is
// finished (status 200): what its 304, or an estimate beyond its cost, gave
// back, and what a cost beyond its estimate charged. A request already
// finished is answered 409, one whose window has reset 410, an unknown
// request id 400 (problem details).
type FinishResponse struct {
	Finished bool  `json:"finished"`
	Refunded int64 `json:"refunded"`
	Charged  int64 `json:"charged,omitempty"`
}

// APIHandler serves the decision API: POST /v1/check decides and charges a
// request, POST /v1/finish reports its response status (304 refunds). When
// the edge makes spans, each API request has a server span, the child of
// the caller's traceparent.
func (s *Server) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", s.traced("/v1/check", s.apiCheck))
	mux.HandleFunc("POST /v1/finish", s.traced("/v1/finish", s.apiFinish))
	return mux
}

func (s *Server) apiCheck(w http.ResponseWriter, r *http.Request) {
	buf := getBuf()
	defer putBuf(buf)
	body, ok := s.readBody(w, r, buf.in)
	if !ok {
		return
	}
	buf.in = body
	req, ok := parseCheck(body)
	if !ok {
		if req, ok = s.decodeCheck(w, body); !ok {
			return
		}
	}
	rt := s.limits.Load()
	p, ok := rt.policies[req.Policy]
	switch {
	case !ok:
		s.badRequest(w, fmt.Sprintf("unknown policy %q", clip(req.Policy)))
		return
	case req.Identity == "" || len(req.Identity) > MaxIdentityLen:
		s.badRequest(w, fmt.Sprintf("identity: want 1 to %d bytes", MaxIdentityLen))
		return
	case len(req.Tier) > 256:
		s.badRequest(w, "tier: want at most 256 bytes")
		return
	}
	dg := s.o.Keys.Sum(p.Name, limiter.APIIdentity(req.Identity))
	p = rt.terms(p, req.Tier, dg)
	now, reqNum := s.o.Clock.Now(), s.reqs.Add(1)
	if req.Cost < 0 || req.Cost > p.Limit {
		s.badRequest(w, fmt.Sprintf("cost %d: want 1 to the limit (%d)", req.Cost, p.Limit))
		return
	}
	if req.Cost > 0 {
		p.Cost = req.Cost
	}
	limits := [1]credit.Limit{{Policy: p, Digest: dg, Cost: p.CostOrDefault()}}
	var one [1]credit.Verdict
	out, err := s.core.DecideRequest(r.Context(), limits[:], now, reqNum, one[:0])
	if err != nil {
		s.unavailable(w)
		return
	}
	v, p := out.Verdicts[0], limits[0].Policy
	allowed := !v.Decided || v.Decision.Allowed
	s.record(v, s.traceParent(r))

	h := w.Header()
	b := buf.out[:0]
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, allowed)
	if allowed {
		b = append(b, `,"request_id":"`...)
		b = s.appendTicket(b, v) // base64url and a dot: nothing to escape
		b = append(b, '"')
	}
	b = append(b, `,"resource":`...)
	b = strconv.AppendQuote(b, p.Name) // policy names are [a-z0-9_.-]
	b = append(b, `,"limit":`...)
	if v.Decided {
		b = strconv.AppendInt(b, v.Decision.Limit, 10) // the headers' (a block's is 0)
	} else {
		b = strconv.AppendInt(b, p.Limit, 10)
	}
	status := http.StatusOK
	if v.Decided {
		d := v.Decision
		setHeaders(h, d)
		b = append(b, `,"remaining":`...)
		b = strconv.AppendInt(b, d.Remaining, 10)
		b = append(b, `,"used":`...)
		b = strconv.AppendInt(b, d.Used, 10)
		b = append(b, `,"reset":`...)
		b = strconv.AppendInt(b, d.ResetAt.Unix(), 10)
		if !allowed {
			b = append(b, `,"retry_after":`...)
			b = strconv.AppendInt(b, int64(d.RetryAfter()/time.Second), 10)
			status = http.StatusTooManyRequests
		}
	}
	b = append(b, "}\n"...)
	buf.out = b
	h["Content-Type"] = jsonContentType
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// decodeCheck decodes a check request that parseCheck did not take, with
// encoding/json, answering 400 when it cannot.
func (s *Server) decodeCheck(w http.ResponseWriter, body []byte) (CheckRequest, bool) {
	var req CheckRequest
	ok := s.decodeJSON(w, body, &req)
	return req, ok
}

func (s *Server) apiFinish(w http.ResponseWriter, r *http.Request) {
	var req FinishRequest
	buf := getBuf()
	defer putBuf(buf)
	body, ok := s.readBody(w, r, buf.in)
	if !ok {
		return
	}
	buf.in = body
	if !s.decodeJSON(w, body, &req) {
		return
	}
	switch {
	case req.Status < 100 || req.Status > 599:
		s.badRequest(w, fmt.Sprintf("status %d: want 100 to 599", req.Status))
		return
	case req.Cost != nil && (*req.Cost < 0 || *req.Cost > limiter.MaxLimit):
		s.badRequest(w, fmt.Sprintf("cost %d: want 0 to %d", *req.Cost, limiter.MaxLimit))
		return
	case req.Cost != nil && *req.Cost > 0 && req.Status == http.StatusNotModified:
		s.badRequest(w, "cost: a 304 costs nothing (it gives the whole charge back)")
		return
	}
	v, err := s.readTicket(req.RequestID)
	if err != nil {
		s.badRequests.Add(1)
		problem(w, http.StatusBadRequest, "unknown-request-id", "Bad Request", "request_id: "+err.Error())
		return
	}
	if req.Cost != nil && v.Policy.Algorithm == limiter.Concurrency {
		s.badRequest(w, "cost: a concurrency limit's finish gives the request's units back; it has no cost to report")
		return
	}
	now := s.o.Clock.Now()
	if !now.Before(v.Expires()) {
		s.finishes[finishExpired].Add(1)
		problem(w, http.StatusGone, "request-expired", "Gone",
			"the request's window has reset: there is nothing left to finish")
		return
	}
	if !v.Decided && v.ChargeSeq == 0 {
		// Admitted without a window and never charged (its charge event was
		// dropped): nothing to give back, nothing to mark; a cost it
		// reports is charged now.
		var charged int64
		if req.Cost != nil && *req.Cost > 0 {
			charged = *req.Cost
			s.core.Charge(r.Context(), v.Policy, charged, v.Key.Digest(), v.Now, v.ReqNum)
		}
		s.finishes[finishDone].Add(1)
		writeFinished(w, 0, charged)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), finishTimeout)
	var res limiter.FinishResult
	var charged int64
	if req.Cost != nil {
		res, charged, err = s.core.TrueUp(ctx, v, req.Status, *req.Cost, now)
	} else {
		res, err = s.core.Finish(ctx, v, req.Status, now)
	}
	cancel()
	if err != nil {
		s.finishes[finishFailed].Add(1)
		s.log.Warn("finishing a request on the primary failed; the caller may send it again", "shard", s.o.Store.ShardName(v.Shard), "err", err)
		s.unavailable(w)
		return
	}
	switch res.Outcome {
	case limiter.Finished, limiter.FinishPending:
		s.finishes[finishDone].Add(1)
		refunded := res.Amount
		if res.Outcome == limiter.FinishPending {
			refunded = v.Cost // its charge nets to zero when it is applied
		}
		if req.Status == http.StatusNotModified || refunded > 0 {
			s.recordFinish(v, res, now)
		}
		writeFinished(w, refunded, charged)
	case limiter.AlreadyFinished:
		s.finishes[finishRepeated].Add(1)
		problem(w, http.StatusConflict, "already-finished", "Conflict",
			"this request was finished before: a request is finished once, and this finish changed nothing")
	default:
		s.finishes[finishExpired].Add(1)
		problem(w, http.StatusGone, "request-expired", "Gone",
			"the request's window has reset: there is nothing left to finish")
	}
}

// finishTimeout bounds a finish's script call on the primary.
const finishTimeout = time.Second

// Counts of /v1/finish answers, by what they were.
const (
	finishDone     = iota // finished (a 304's charge given back)
	finishRepeated        // already finished: 409
	finishExpired         // the window has reset: 410
	finishFailed          // the primary could not be reached: 503
	finishKinds
)

var finishNames = [finishKinds]string{"finished", "already_finished", "expired", "unavailable"}

func writeFinished(w http.ResponseWriter, refunded, charged int64) {
	b := make([]byte, 0, 64)
	b = append(b, `{"finished":true,"refunded":`...)
	b = strconv.AppendInt(b, refunded, 10)
	if charged > 0 {
		b = append(b, `,"charged":`...)
		b = strconv.AppendInt(b, charged, 10)
	}
	b = append(b, "}\n"...)
	w.Header()["Content-Type"] = jsonContentType
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// readBody reads a request body of at most maxAPIBody bytes into body[:0],
// which grows with what arrives: a Content-Length header allocates nothing
// (a client that claims 64 KiB and sends slowly holds no 64 KiB buffer).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, body []byte) ([]byte, bool) {
	if r.ContentLength > maxAPIBody {
		s.tooLarge(w)
		return nil, false
	}
	body = body[:0]
	rd := http.MaxBytesReader(w, r.Body, maxAPIBody)
	for {
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)] // grow as the body arrives
		}
		n, err := rd.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				s.tooLarge(w)
			} else {
				s.badRequest(w, "body: "+err.Error())
			}
			return nil, false
		}
	}
	return body, true
}

func (s *Server) tooLarge(w http.ResponseWriter) {
	s.badRequests.Add(1)
	problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Content Too Large",
		fmt.Sprintf("the body must be at most %d bytes", maxAPIBody))
}

// decodeJSON decodes one JSON object into v, strictly (no unknown fields,
// nothing after it), answering 400 when it cannot.
func (s *Server) decodeJSON(w http.ResponseWriter, body []byte, v any) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		s.badRequest(w, "body: "+err.Error())
		return false
	}
	if dec.More() {
		s.badRequest(w, "body: one JSON object expected")
		return false
	}
	return true
}

func (s *Server) badRequest(w http.ResponseWriter, detail string) {
	s.badRequests.Add(1)
	problem(w, http.StatusBadRequest, "bad-request", "Bad Request", detail)
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
