package events

import (
	"bytes"
	"fmt"
	"strconv"
	"time"
)

// Notice tells every edge that a window is full, or has room again: an edge
// that learns a window is full answers 429 for it from memory, with no
// Redis call, until its reset or until a notice says it has room. Notices
// travel on core NATS (at most once, no storage); an edge that misses one
// converges by reading the window (docs/accuracy.md).
type Notice struct {
	// Full is true for "full", false for "room".
	Full bool
	// Key is the window key's digest (32 hex).
	Key string
	// ResetAt names the window.
	ResetAt time.Time
	// Used is the window's count when the notice was sent.
	Used int64
}

// NoticeSubject is where notices about a shard's windows are published.
func NoticeSubject(prefix, shard string) string { return prefix + "." + shard }

// AppendNotice appends n as one line: "full|room <key> <reset ms> <used>\n".
func AppendNotice(b []byte, n Notice) []byte {
	if n.Full {
		b = append(b, "full "...)
	} else {
		b = append(b, "room "...)
	}
	b = append(b, n.Key...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, n.ResetAt.UnixMilli(), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, n.Used, 10)
	return append(b, '\n')
}

// DecodeNotices reads the lines of a notice message. Errors wrap
// ErrInvalidEvent.
func DecodeNotices(body []byte) ([]Notice, error) {
	var out []Notice
	for len(body) > 0 {
		line := body
		if i := bytes.IndexByte(body, '\n'); i >= 0 {
			line, body = body[:i], body[i+1:]
		} else {
			body = nil
		}
		if len(line) == 0 {
			continue
		}
		f := bytes.Fields(line)
		if len(f) != 4 || (string(f[0]) != "full" && string(f[0]) != "room") || !validDigest(string(f[1])) {
			return out, fmt.Errorf("%w: notice %q", ErrInvalidEvent, clip(string(line)))
		}
		reset, err1 := strconv.ParseInt(string(f[2]), 10, 64)
		used, err2 := strconv.ParseInt(string(f[3]), 10, 64)
		if err1 != nil || err2 != nil || reset <= 0 || used < 0 {
			return out, fmt.Errorf("%w: notice %q", ErrInvalidEvent, clip(string(line)))
		}
		out = append(out, Notice{Full: string(f[0]) == "full", Key: string(f[1]), ResetAt: time.UnixMilli(reset), Used: used})
	}
	return out, nil
}
