package credit

import (
	"strconv"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// Path says how a request was decided.
type Path uint8

const (
	// PathCredit: from units this edge had reserved; no Redis call.
	PathCredit Path = iota + 1
	// PathReserve: after waiting for a reservation on the primary (mode
	// exact always).
	PathReserve
	// PathCache: denied because the window is known to be full; no Redis
	// call.
	PathCache
	// PathBorrow: admitted over credit from what the edge knows of the
	// window, charged by an accounting event (mode async, or Redis slow).
	PathBorrow
	// PathFailOpen: admitted with no knowledge of the window because Redis
	// could not be reached (FailOpen); charged by an event.
	PathFailOpen
	// PathFinish: a decision-API request finished on the primary by the
	// edge (a 304's charge given back); only in decision records.
	PathFinish
	// PathBackoff: denied by the edge's progressive backoff (the client
	// came back before the Retry-After it was given); no Redis call.
	PathBackoff
	// PathBlocked: denied by an operator's temporary block; no Redis call.
	PathBlocked
)

// Paths is the number of paths, for arrays indexed by Path.
const Paths = int(PathBlocked) + 1

var pathNames = [Paths]string{PathCredit: "credit", PathReserve: "reserve", PathCache: "cache", PathBorrow: "borrow",
	PathFailOpen: "fail-open", PathFinish: "finish", PathBackoff: "backoff", PathBlocked: "blocked"}

func (p Path) String() string {
	if int(p) < len(pathNames) && pathNames[p] != "" {
		return pathNames[p]
	}
	return "unknown"
}

// Verdict is one decision, and what its request's finish needs.
type Verdict struct {
	// Decision is what the response says (its headers). Decided is false
	// when the request was admitted without knowing its window (fail
	// open): the response carries no rate-limit headers.
	Decision limiter.Decision
	Decided  bool
	Path     Path
	Policy   limiter.Policy
	Cost     int64
	Key      limiter.Key
	Shard    int
	// Now is the time the request was decided at (its start).
	Now time.Time
	// Reset is the window the response showed (zero when not decided).
	Reset time.Time
	// ChargeSeq (> 0) is the accounting event that charged the request
	// (borrow, fail-open) of the deciding edge; 0: a reservation did.
	ChargeSeq uint64
	// Producer is the edge that decided the request; ReqNum numbers the
	// request there (its request id is both). HolderNum names the table
	// entry that admitted it (holder <Producer>.<HolderNum base 36>), and N
	// is its number among that entry's admissions in the window: where its
	// finish is marked.
	Producer  string
	ReqNum    uint64
	HolderNum uint64
	N         uint64
	// TraceParent is the request's trace context (validated), carried by
	// the events its finish sends.
	TraceParent string
}

// Allowed reports whether the request was admitted (decided and allowed,
// or admitted without knowing its window).
func (v Verdict) Allowed() bool { return !v.Decided || v.Decision.Allowed }

// RequestID is the request's id in decision records and events: its edge's
// producer id and its number there ("" without a number).
func (v Verdict) RequestID() string {
	if v.ReqNum == 0 || v.Producer == "" {
		return ""
	}
	return v.Producer + "-" + strconv.FormatUint(v.ReqNum, 10)
}

// Holder names the table entry that admitted the request in the windows it
// reserves in.
func (v Verdict) Holder() string { return HolderOf(v.Producer, v.HolderNum) }

// HolderOf names an edge's table entry num in the windows it reserves in.
func HolderOf(producer string, num uint64) string {
	return producer + "." + strconv.FormatUint(num, 36)
}

// Expires is when the request can no longer be finished: its window's
// reset (a sliding window's sub-window: when it leaves the last span), or,
// for a request admitted without knowing its window, the latest that
// window can reset.
func (v Verdict) Expires() time.Time {
	if v.Decided {
		return v.Reset.Add(v.Policy.Linger())
	}
	_, latest := algorithmOf(v.Policy.Algorithm).blind(v.Policy, v.Now)
	return latest
}
