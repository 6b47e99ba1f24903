package events

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tallyhq/tally/internal/limiter"
)

// A temporary limit is an operator's change to one window key's terms for
// a while: a tighter or looser limit, or a block (every request denied),
// that lifts itself at its expiry with no one acting. Operators set and
// clear them (the tally CLI, or an edge's admin API); each is one message
// on the limits stream, on a subject of its own per window key
// (<prefix>.<key digest>; the digest is of the policy and the identity),
// which keeps only the latest: clearing
// a limit publishes an entry that says so. Every edge reads the stream
// from its start and follows it, and applies an entry only while it is
// live (Set ≤ now < Expires by the edge's clock).
//
// Entries are signed like notices, with a key derived from the
// deployment's secret (LimitKeyLabel): anyone who can publish on NATS but
// does not hold the secret cannot block a client or lift its limit.

// LimitKeyLabel is the label of the key temporary limits are signed with
// (limiter.KeySpace.Derive).
const LimitKeyLabel = "tally/limit/v1"

// MaxTemporary is the longest a temporary limit may last.
const MaxTemporary = 7 * 24 * time.Hour

// HeaderLimitSignature carries a temporary limit's signature: the hex
// HMAC-SHA256 of the message's body.
const HeaderLimitSignature = "Tally-Signature"

// TemporaryLimit is one window key's temporary terms.
type TemporaryLimit struct {
	// Policy names the policy; Key is the window key's digest under it.
	Policy string         `json:"policy"`
	Key    limiter.Digest `json:"-"`
	// Limit replaces the policy's limit while the entry is live; Block
	// denies every request instead (Limit is then 0).
	Limit int64 `json:"limit,omitempty"`
	Block bool  `json:"block,omitempty"`
	// Cleared lifts an earlier entry before its expiry. Its own expiry is
	// how long edges remember it (MaxTemporary from when it is set: longer
	// than any entry it lifts), so that an earlier entry sent again is
	// known to be older.
	Cleared bool `json:"cleared,omitempty"`
	// Set is when the operator set it; Expires when it lifts itself.
	Set     time.Time `json:"set"`
	Expires time.Time `json:"expires"`
	// By and Reason say who set it and why (free text, at most 256 bytes).
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// limitFields are a TemporaryLimit's fields without its methods.
type limitFields TemporaryLimit

// wireLimit is a TemporaryLimit as it travels: the key as hex.
type wireLimit struct {
	limitFields
	KeyHex string `json:"key"`
}

// MarshalJSON writes l as the limits stream carries it (the key as hex).
func (l TemporaryLimit) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireLimit{limitFields: limitFields(l), KeyHex: l.Key.String()})
}

// UnmarshalJSON reads what MarshalJSON writes.
func (l *TemporaryLimit) UnmarshalJSON(b []byte) error {
	var w wireLimit
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	k, err := limiter.ParseDigest(w.KeyHex)
	if err != nil {
		return fmt.Errorf("key: %w", err)
	}
	*l = TemporaryLimit(w.limitFields)
	l.Key = k
	return nil
}

// ErrBadLimit is wrapped by every reason a temporary limit is refused.
var ErrBadLimit = errors.New("events: bad temporary limit")

// Validate reports what makes l unusable.
func (l TemporaryLimit) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBadLimit, fmt.Sprintf(format, args...))
	}
	switch {
	case !limiter.ValidPolicyName(l.Policy):
		return bad("policy %s: want a policy name", quote(l.Policy))
	case l.Set.IsZero() || !l.Expires.After(l.Set):
		return bad("want an expiry after the time it is set")
	case l.Expires.Sub(l.Set) > MaxTemporary:
		return bad("%v: want at most %v", l.Expires.Sub(l.Set), MaxTemporary)
	case l.Cleared:
		if l.Block || l.Limit != 0 {
			return bad("a cleared entry carries no terms")
		}
	case l.Block && l.Limit != 0:
		return bad("a block has no limit")
	case !l.Block && (l.Limit < 1 || l.Limit > limiter.MaxLimit):
		return bad("limit %d: want 1 to %d, or a block", l.Limit, limiter.MaxLimit)
	}
	if len(l.By) > 256 || len(l.Reason) > 256 {
		return bad("by and reason: want at most 256 bytes each")
	}
	return nil
}

// Live reports whether l holds at now: it is not a clear and has not
// expired (a time set ahead of now, by a clock ahead of this one, does not
// delay it).
func (l TemporaryLimit) Live(now time.Time) bool { return !l.Cleared && now.Before(l.Expires) }

// After returns the time to set an entry that follows held: now, or just
// after held's when a clock behind the one that set held would make the new
// entry look older (edges apply an entry only if it is set no earlier than
// the one they hold).
func After(held *TemporaryLimit, now time.Time) time.Time {
	if held != nil && !now.After(held.Set) {
		return held.Set.Add(time.Millisecond)
	}
	return now
}

// LimitSubject is the subject of the temporary limit of one window key.
func LimitSubject(prefix string, l TemporaryLimit) string { return prefix + "." + l.Key.String() }

// Limits signs and reads temporary limits.
type Limits struct{ key []byte }

// NewLimits returns a signer and reader of temporary limits keyed with key
// (KeySpace.Derive(LimitKeyLabel)).
func NewLimits(key []byte) *Limits { return &Limits{key: append([]byte(nil), key...)} }

func (ls *Limits) sign(body []byte) string {
	m := hmac.New(sha256.New, ls.key)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// Msg is l, validated and signed, as a message of the limits stream whose
// subjects begin with prefix.
func (ls *Limits) Msg(prefix string, l TemporaryLimit) (*nats.Msg, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	body, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	m := nats.NewMsg(LimitSubject(prefix, l))
	m.Header = nats.Header{HeaderContentType: {"application/json"}, HeaderLimitSignature: {ls.sign(body)}}
	m.Data = body
	return m, nil
}

// Read returns the temporary limit a message of the limits stream carries,
// refusing one that is not signed with the deployment's key, is not valid,
// or whose subject does not name its key.
func (ls *Limits) Read(prefix, subject string, header nats.Header, body []byte) (TemporaryLimit, error) {
	sig, err := hex.DecodeString(header.Get(HeaderLimitSignature))
	if err != nil || !hmac.Equal(sig, mustHex(ls.sign(body))) {
		return TemporaryLimit{}, fmt.Errorf("%w: not signed with the deployment's key", ErrBadLimit)
	}
	var l TemporaryLimit
	if err := json.Unmarshal(body, &l); err != nil {
		return TemporaryLimit{}, fmt.Errorf("%w: %v", ErrBadLimit, err)
	}
	if err := l.Validate(); err != nil {
		return TemporaryLimit{}, err
	}
	if subject != LimitSubject(prefix, l) {
		return TemporaryLimit{}, fmt.Errorf("%w: subject %s does not name its key", ErrBadLimit, quote(subject))
	}
	return l, nil
}

func mustHex(s string) []byte {
	b, _ := hex.DecodeString(s)
	return b
}

// LimitRecord is the decision record of a temporary limit set or cleared
// (path "operator"); the caller sets Source, Edge and Seq. window and
// limit are the policy's configured terms; shard is the key's shard.
func LimitRecord(l TemporaryLimit, window time.Duration, limit int64, shard string) Decision {
	d := Decision{Time: l.Set, Shard: shard, Key: l.Key, Policy: l.Policy, Limit: limit,
		WindowSeconds: int64(window / time.Second), Allowed: true, Path: "operator", Outcome: "limit_cleared",
		Note: OperatorNote(l.By, l.Reason)}
	if !l.Cleared {
		d.Outcome, d.Until, d.Limit, d.Allowed = "limit_set", l.Expires, l.Limit, !l.Block
	}
	return d
}

// OperatorNote is an operator's action's note: who, and why.
func OperatorNote(by, reason string) string {
	switch {
	case by == "":
		return reason
	case reason == "":
		return by
	}
	return by + ": " + reason
}
