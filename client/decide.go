package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// DecisionClient calls an edge's decision API (edge.api_listen): POST
// /v1/check before serving a request, POST /v1/finish once it is done. It
// is safe for concurrent use.
type DecisionClient struct {
	base  string
	token string
	hc    *http.Client
}

// NewDecisionClient returns a client of the decision API at baseURL
// ("http://127.0.0.1:8081"), authenticating with token (the edge's
// TALLY_API_TOKEN). hc is http.DefaultClient when nil; give it a Timeout.
func NewDecisionClient(baseURL, token string, hc *http.Client) *DecisionClient {
	if hc == nil {
		hc = http.DefaultClient
	}
	return &DecisionClient{base: strings.TrimSuffix(baseURL, "/"), token: token, hc: hc}
}

// CheckRequest asks for one request's decision.
type CheckRequest struct {
	// Policy names the limit.
	Policy string `json:"policy"`
	// Identity is whose window: an API token, a user id (1 to 4096 bytes,
	// as given: the window of APIIdentity(Identity)).
	Identity string `json:"identity"`
	// Cost is what the request costs, when not the policy's (1 to the
	// limit).
	Cost int64 `json:"cost,omitempty"`
	// Tier is the client's plan, when the policy has tiers.
	Tier string `json:"tier,omitempty"`
}

// Decision is the decision API's answer.
type Decision struct {
	Allowed bool `json:"allowed"`
	// RequestID is the ticket Finish takes (allowed requests only).
	RequestID string `json:"request_id"`
	Resource  string `json:"resource"`
	Limit     int64  `json:"limit"`
	Remaining int64  `json:"remaining"`
	Used      int64  `json:"used"`
	// Reset is the seconds until the window resets.
	Reset int64 `json:"reset"`
	// RetryAfter is the seconds to wait before trying again (denials).
	RetryAfter int64 `json:"retry_after"`
}

// FinishRequest reports how an allowed request finished.
type FinishRequest struct {
	RequestID string `json:"request_id"`
	// Status is the response's status: 304 gives the charge back.
	Status int `json:"status"`
	// Cost, when set, is what the request turned out to cost (0 to 10^9):
	// the rest of the estimate is given back, a shortfall charged.
	Cost *int64 `json:"cost,omitempty"`
}

// Finished is what finishing a request did.
type Finished struct {
	Finished bool  `json:"finished"`
	Refunded int64 `json:"refunded"`
	Charged  int64 `json:"charged"`
}

// APIError is an answer of the decision API that is not a decision: its
// status and its problem details (RFC 9457). Status 409 means the request
// was finished already, 410 that its window has reset, 503 that the edge
// could not decide (its fail mode is closed and Redis is unreachable).
type APIError struct {
	Status int    `json:"status"`
	Type   string `json:"type"`
	Title  string `json:"title"`
	Detail string `json:"detail"`
}

func (e *APIError) Error() string {
	return fmt.Sprintf("tally decision API: %d %s: %s", e.Status, e.Title, e.Detail)
}

// Check asks whether a request may be served and charges it when it may.
// A denial is a Decision with Allowed false (and no error).
func (c *DecisionClient) Check(ctx context.Context, req CheckRequest) (Decision, error) {
	var d Decision
	err := c.call(ctx, "/v1/check", req, &d, http.StatusOK, http.StatusTooManyRequests)
	return d, err
}

// Finish reports an allowed request's response status (and its cost, when
// it was charged an estimate).
func (c *DecisionClient) Finish(ctx context.Context, req FinishRequest) (Finished, error) {
	var f Finished
	err := c.call(ctx, "/v1/finish", req, &f, http.StatusOK)
	return f, err
}

func (c *DecisionClient) call(ctx context.Context, path string, in, out any, ok ...int) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		r.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(r)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return err
	}
	for _, s := range ok {
		if resp.StatusCode == s {
			if err := json.Unmarshal(b, out); err != nil {
				return fmt.Errorf("tally decision API: %s: %w", path, err)
			}
			return nil
		}
	}
	e := &APIError{Status: resp.StatusCode, Title: http.StatusText(resp.StatusCode)}
	_ = json.Unmarshal(b, e) // problem details when the body has them
	e.Status = resp.StatusCode
	return e
}
