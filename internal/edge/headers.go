package edge

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tallyhq/tally/internal/limiter"
)

// setHeaders writes the decision's rate-limit headers into h: GitHub's
// X-RateLimit-Limit, -Remaining, -Used, -Reset (Unix seconds) and
// -Resource; the IETF draft's RateLimit-Policy and RateLimit; and, when the
// request is denied, Retry-After (never earlier than RateLimit's t).
//
// It writes the canonical header keys directly (as Header.Set would store
// them) and builds the values in one buffer: it runs on every response.
func setHeaders(h http.Header, d limiter.Decision) {
	var buf [192]byte
	b := buf[:0]
	var ends [8]int
	n := 0
	mark := func() { ends[n] = len(b); n++ }
	b = strconv.AppendInt(b, d.Limit, 10)
	mark()
	b = strconv.AppendInt(b, d.Remaining, 10)
	mark()
	b = strconv.AppendInt(b, d.Used, 10)
	mark()
	b = strconv.AppendInt(b, d.ResetAt.Unix(), 10)
	mark()
	b = append(b, d.Resource...)
	mark()
	b = append(append(append(b, '"'), d.Resource...), `";q=`...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = strconv.AppendInt(append(b, ";w="...), int64(d.Window/time.Second), 10)
	mark()
	b = append(append(append(b, '"'), d.Resource...), `";r=`...)
	b = strconv.AppendInt(b, d.Remaining, 10)
	b = strconv.AppendInt(append(b, ";t="...), int64(d.ResetIn()/time.Second), 10)
	mark()
	if !d.Allowed {
		b = strconv.AppendInt(b, int64(d.RetryAfter()/time.Second), 10)
		mark()
	}
	all := string(b) // one allocation for every value
	vals := make([]string, n)
	start := 0
	for i := range n {
		vals[i] = all[start:ends[i]]
		start = ends[i]
	}
	for i, k := range headerKeys[:n] {
		h[k] = vals[i : i+1 : i+1]
	}
}

// headerKeys are the canonical forms (textproto.CanonicalMIMEHeaderKey) of
// the headers setHeaders writes, in its order.
var headerKeys = [...]string{"X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Used", "X-Ratelimit-Reset",
	"X-Ratelimit-Resource", "Ratelimit-Policy", "Ratelimit", "Retry-After"}
