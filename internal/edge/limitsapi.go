package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tallyhq/tally/internal/events"
	"github.com/tallyhq/tally/internal/limiter"
)

// The admin listener's temporary-limits API (behind the admin token):
//
//	GET    /v1/limits   the temporary limits this edge applies now
//	POST   /v1/limits   set one: {"policy", "identity" or "digest",
//	                    "limit" or "block", "for" (a duration, at most 7
//	                    days), "by", "reason"}
//	DELETE /v1/limits   lift one before its expiry: {"policy", "identity"
//	                    or "digest", "by", "reason"}
//
// A change is published, signed, on the limits stream (every edge applies
// it from there), applied here at once, and recorded on the decisions
// stream with who made it ("by"; without one, "admin API of <edge>"). "identity" names the client as limiter.NamedIdentity reads it.
// Answers show entries as the limits stream carries them
// (events.TemporaryLimit: policy, key, limit or block, set, expires, by,
// reason).

// LimitRequest is a body of POST and DELETE /v1/limits.
type LimitRequest struct {
	Policy   string `json:"policy"`
	Identity string `json:"identity,omitempty"`
	Digest   string `json:"digest,omitempty"`
	Limit    int64  `json:"limit,omitempty"`
	Block    bool   `json:"block,omitempty"`
	For      string `json:"for,omitempty"`
	By       string `json:"by,omitempty"`
	Reason   string `json:"reason,omitempty"`
}

func (s *Server) limitsAPI(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/limits", func(w http.ResponseWriter, _ *http.Request) {
		out := s.Temporary(s.o.Clock.Now())
		if out == nil {
			out = []events.TemporaryLimit{}
		}
		writeJSON(w, http.StatusOK, out)
	})
	change := func(w http.ResponseWriter, r *http.Request, clear bool) {
		var req LimitRequest
		dec := json.NewDecoder(io.LimitReader(r.Body, 16<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			s.badRequest(w, "want a JSON object: "+err.Error())
			return
		}
		l, err := s.temporaryLimit(req, clear)
		if err != nil {
			s.badRequest(w, err.Error())
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		if err := s.PublishLimit(ctx, l); err != nil {
			problem(w, http.StatusServiceUnavailable, "limits-unavailable", "Service Unavailable",
				"the limits stream did not take the change (every edge reads it there); retry: "+err.Error())
			return
		}
		writeJSON(w, http.StatusOK, l)
	}
	mux.HandleFunc("POST /v1/limits", func(w http.ResponseWriter, r *http.Request) { change(w, r, false) })
	mux.HandleFunc("DELETE /v1/limits", func(w http.ResponseWriter, r *http.Request) { change(w, r, true) })
}

// temporaryLimit is the entry req asks for, set now.
func (s *Server) temporaryLimit(req LimitRequest, clear bool) (events.TemporaryLimit, error) {
	rt := s.limits.Load()
	p, ok := rt.policies[req.Policy]
	if !ok {
		return events.TemporaryLimit{}, fmt.Errorf("unknown policy %q", clip(req.Policy))
	}
	var dg limiter.Digest
	var err error
	switch {
	case (req.Identity == "") == (req.Digest == ""):
		return events.TemporaryLimit{}, errors.New("name the client by identity or by digest (one of them)")
	case req.Digest != "":
		if dg, err = limiter.ParseDigest(req.Digest); err != nil {
			return events.TemporaryLimit{}, fmt.Errorf("digest: %v", err)
		}
	default:
		id := s.o.Identity
		name, err := limiter.NamedIdentity(req.Identity, id.Header, id.IPv4Prefix, id.IPv6Prefix)
		if err != nil {
			return events.TemporaryLimit{}, err
		}
		dg = s.o.Keys.Sum(p.Name, name)
	}
	now := s.o.Clock.Now()
	by := req.By
	if by == "" { // a record names who acts: here, at least, through which edge
		by = "admin API of " + s.o.Producer
	}
	l := events.TemporaryLimit{Policy: p.Name, Key: dg, Set: events.After(s.held(dg), now), By: by, Reason: req.Reason}
	if clear {
		if req.Limit != 0 || req.Block || req.For != "" {
			return events.TemporaryLimit{}, errors.New("lifting a limit takes no limit, block or duration")
		}
		l.Cleared, l.Expires = true, l.Set.Add(events.MaxTemporary) // outlives every entry it may lift
		return l, l.Validate()
	}
	d, err := time.ParseDuration(req.For)
	if err != nil || d <= 0 {
		return events.TemporaryLimit{}, fmt.Errorf("for %q: want a duration such as 15m or 2h (at most %v)", clip(req.For), events.MaxTemporary)
	}
	l.Limit, l.Block, l.Expires = req.Limit, req.Block, l.Set.Add(d)
	return l, l.Validate()
}

// PublishLimit publishes a temporary limit set or lifted on the limits
// stream (signed), applies it here at once and records it on the
// decisions stream. Without NATS there is no stream every edge reads: it
// fails.
func (s *Server) PublishLimit(ctx context.Context, l events.TemporaryLimit) error {
	if s.o.NATS == nil {
		return errors.New("no NATS: temporary limits travel on its limits stream")
	}
	m, err := s.limitReader.Msg(s.o.Streams.Limits.SubjectPrefix, l)
	if err != nil {
		return err
	}
	js, err := jetstream.New(s.o.NATS)
	if err != nil {
		return err
	}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		return err
	}
	s.SetTemporary(l)
	if s.batcher != nil {
		p := s.limits.Load().policies[l.Policy]
		d := events.LimitRecord(l, p.Window, p.Limit, s.o.Store.ShardName(s.o.Store.ShardOf(s.o.Keys.KeyOf(l.Key))))
		d.Source, d.Edge, d.Seq = s.o.Source, s.o.Producer, s.dseq.Add(1)
		s.batcher.Add(d)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
