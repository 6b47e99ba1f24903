package edge

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// maxAPIBody bounds decision-API request bodies.
const maxAPIBody = 64 << 10

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	// Policy names the limit to apply.
	Policy string `json:"policy"`
	// Identity is whose window counts the request: an API token, a user id,
	// an address. It is hashed, never stored. 1 to 4096 bytes.
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
// request, POST /v1/finish reports its response status (304 refunds).
func (s *Server) APIHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", s.apiCheck)
	mux.HandleFunc("POST /v1/finish", s.apiFinish)
	return mux
}

func (s *Server) apiCheck(w http.ResponseWriter, r *http.Request) {
	var req CheckRequest
	if !s.readJSON(w, r, &req) {
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
	o, err := s.decide(r.Context(), p, "h:"+req.Identity)
	if err != nil && s.refuseOnError(w, err) {
		return
	}
	reqID := newRequestID()
	tp := r.Header.Get("Traceparent")
	d := o.decision
	resp := CheckResponse{Allowed: !o.decided || d.Allowed, Resource: p.Name, Limit: p.Limit}
	if o.decided {
		d.SetHeaders(w.Header())
		resp.Remaining, resp.Used, resp.Reset = d.Remaining, d.Used, d.ResetAt.Unix()
	}
	status := http.StatusOK
	if resp.Allowed {
		s.allowed.Add(1)
		s.publish(events.KindStarted, reqID, o, 0, tp)
		resp.RequestID = s.ticket(reqID, o)
	} else {
		s.denied.Add(1)
		s.publish(events.KindRejected, reqID, o, 0, tp)
		resp.RetryAfter = int64(d.RetryAfter() / time.Second)
		status = http.StatusTooManyRequests
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(resp)
}

func (s *Server) apiFinish(w http.ResponseWriter, r *http.Request) {
	var req FinishRequest
	if !s.readJSON(w, r, &req) {
		return
	}
	if req.Status < 100 || req.Status > 599 {
		s.badRequest(w, fmt.Sprintf("status %d: want 100 to 599", req.Status))
		return
	}
	reqID, o, err := s.readTicket(req.RequestID)
	if err != nil {
		s.badRequest(w, "request_id: "+err.Error())
		return
	}
	s.publish(events.KindFinished, reqID, o, req.Status, r.Header.Get("Traceparent"))
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAPIBody))
	if err != nil {
		s.badRequests.Add(1)
		problem(w, http.StatusRequestEntityTooLarge, "body-too-large", "Content Too Large",
			fmt.Sprintf("the body must be at most %d bytes", maxAPIBody))
		return false
	}
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

// A ticket carries what /v1/finish needs to publish the finish event, so
// that any edge instance can take it: the request id, key digest, shard,
// policy terms and start time, signed with the key secret so that a client
// cannot forge finishes for other keys.
type ticketData struct {
	ID     string `json:"i"`
	Key    string `json:"k"`
	Shard  string `json:"h"`
	Policy string `json:"p"`
	Limit  int64  `json:"l"`
	Window int64  `json:"w"`
	Cost   int64  `json:"c"`
	Start  int64  `json:"s"` // ms
}

var b64 = base64.RawURLEncoding

func (s *Server) ticket(reqID string, o outcome) string {
	payload, _ := json.Marshal(ticketData{
		ID: reqID, Key: o.key.Digest(), Shard: o.shard, Policy: o.policy.Name, Limit: o.policy.Limit,
		Window: int64(o.policy.Window / time.Second), Cost: o.policy.CostOrDefault(), Start: o.now.UnixMilli(),
	})
	p := b64.EncodeToString(payload)
	return p + "." + b64.EncodeToString(s.mac(p))
}

func (s *Server) mac(payload string) []byte {
	m := hmac.New(sha256.New, s.o.TicketSecret)
	m.Write([]byte("tally/ticket/v1|" + payload))
	return m.Sum(nil)[:16]
}

var errBadTicket = errors.New("not a request id issued by this deployment")

func (s *Server) readTicket(t string) (string, outcome, error) {
	if len(t) > 1024 {
		return "", outcome{}, errBadTicket
	}
	i := strings.LastIndexByte(t, '.')
	if i < 0 {
		return "", outcome{}, errBadTicket
	}
	p, sig := t[:i], t[i+1:]
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, s.mac(p)) {
		return "", outcome{}, errBadTicket
	}
	raw, err := b64.DecodeString(p)
	if err != nil {
		return "", outcome{}, errBadTicket
	}
	var td ticketData
	if err := json.Unmarshal(raw, &td); err != nil {
		return "", outcome{}, errBadTicket
	}
	k, err := s.o.Keys.KeyFromDigest(td.Key)
	if err != nil {
		return "", outcome{}, errBadTicket
	}
	return td.ID, outcome{
		key: k, shard: td.Shard, now: time.UnixMilli(td.Start),
		policy: limiter.Policy{Name: td.Policy, Limit: td.Limit, Window: time.Duration(td.Window) * time.Second, Cost: td.Cost},
	}, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
