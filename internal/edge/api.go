package edge

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// maxAPIBody bounds decision-API request bodies.
const maxAPIBody = 64 << 10

// Header values set on every answer, shared (net/http never modifies them).
var (
	jsonContentType = []string{"application/json"}
	noStore         = []string{"no-store"}
)

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	// Policy names the limit to apply.
	Policy string `json:"policy"`
	// Identity is whose window counts the request: an API token, a user id,
	// an address. It is hashed, never stored. 1 to MaxIdentityLen bytes.
	Identity string `json:"identity"`
	// Cost overrides the policy's cost (1 to the limit). Optional.
	Cost int64 `json:"cost,omitempty"`
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
	var req CheckRequest
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	if req, ok = parseCheck(body); !ok && !s.decodeJSON(w, body, &req) {
		return
	}
	p, ok := s.o.Policies[req.Policy]
	switch {
	case !ok:
		s.badRequest(w, fmt.Sprintf("unknown policy %q", clip(req.Policy)))
		return
	case req.Identity == "" || len(req.Identity) > MaxIdentityLen:
		s.badRequest(w, fmt.Sprintf("identity: want 1 to %d bytes", MaxIdentityLen))
		return
	case req.Cost < 0 || req.Cost > p.Limit:
		s.badRequest(w, fmt.Sprintf("cost %d: want 1 to the limit (%d)", req.Cost, p.Limit))
		return
	}
	if req.Cost > 0 {
		p.Cost = req.Cost
	}
	v, err := s.check(r.Context(), p, "h:"+req.Identity, s.o.Clock.Now(), s.reqs.Add(1))
	if err != nil {
		s.unavailable(w)
		return
	}
	ticket := ""
	allowed := !v.decided || v.decision.Allowed
	if allowed {
		ticket = s.ticket(v)
	}
	s.record(v, s.traceParent(r))

	h := w.Header()
	b := make([]byte, 0, 256)
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, allowed)
	if allowed {
		b = append(b, `,"request_id":"`...)
		b = append(b, ticket...) // base64url and a dot: nothing to escape
		b = append(b, '"')
	}
	b = append(b, `,"resource":`...)
	b = strconv.AppendQuote(b, p.Name) // policy names are [a-z0-9_.-]
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, p.Limit, 10)
	status := http.StatusOK
	if v.decided {
		d := v.decision
		d.SetHeaders(h)
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
	h["Content-Type"], h["Cache-Control"] = jsonContentType, noStore
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Server) apiFinish(w http.ResponseWriter, r *http.Request) {
	var req FinishRequest
	body, ok := s.readBody(w, r)
	if !ok || !s.decodeJSON(w, body, &req) {
		return
	}
	if req.Status < 100 || req.Status > 599 {
		s.badRequest(w, fmt.Sprintf("status %d: want 100 to 599", req.Status))
		return
	}
	v, err := s.readTicket(req.RequestID)
	if err != nil {
		s.badRequest(w, "request_id: "+err.Error())
		return
	}
	s.finish([]verdict{v}, req.Status)
	w.WriteHeader(http.StatusAccepted)
}

// readBody reads a request body of at most maxAPIBody bytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	var body []byte
	var err error
	if n := r.ContentLength; n >= 0 && n <= maxAPIBody {
		body = make([]byte, n)
		_, err = io.ReadFull(r.Body, body)
	} else {
		body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, maxAPIBody))
	}
	if err != nil {
		s.badRequests.Add(1)
		problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Content Too Large",
			fmt.Sprintf("the body must be at most %d bytes", maxAPIBody))
		return nil, false
	}
	return body, true
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
