package events

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"sync"
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

// NoticeKeyLabel is the label of the key notices are signed with
// (limiter.KeySpace.Derive).
const NoticeKeyLabel = "tally/notice/v1"

// NoticeMaxAge is how far a notice's time may lie from the receiver's
// clock, either way, for the notice to be believed: a notice recorded and
// sent again later is ignored.
const NoticeMaxAge = 10 * time.Second

// Notices signs and reads notices. Each line carries the time it was sent
// and an HMAC-SHA256 (128 bits) of the rest with a key derived from the
// deployment's secret (limiter.KeySpace.Derive("tally/notice/v1")): a
// notice from anyone without the secret, or one replayed long after it was
// sent, is refused, so a forged "full" cannot deny a client and a forged
// "room" cannot admit one. It is safe for concurrent use.
type Notices struct {
	macs sync.Pool // of hash.Hash
}

// NewNotices returns notices signed with key.
func NewNotices(key []byte) *Notices {
	key = append([]byte(nil), key...)
	n := &Notices{}
	n.macs.New = func() any { return hmac.New(sha256.New, key) }
	return n
}

func (ns *Notices) mac(line []byte) [16]byte {
	m := ns.macs.Get().(hash.Hash)
	m.Reset()
	m.Write(line)
	var sum [sha256.Size]byte
	m.Sum(sum[:0])
	ns.macs.Put(m)
	var out [16]byte
	copy(out[:], sum[:16])
	return out
}

// Append appends n, sent at now, as one line:
// "full|room <key> <reset ms> <used> <sent ms> <mac>\n".
func (ns *Notices) Append(b []byte, n Notice, now time.Time) []byte {
	start := len(b)
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
	b = append(b, ' ')
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	mac := ns.mac(b[start:])
	b = append(b, ' ')
	b = hex.AppendEncode(b, mac[:])
	return append(b, '\n')
}

// Decode reads the lines of a notice message received at now. Lines that
// are malformed, unsigned, signed with another key, or sent more than
// NoticeMaxAge from now are left out; the error (wrapping ErrInvalidEvent)
// says how many and why the first was.
func (ns *Notices) Decode(body []byte, now time.Time) ([]Notice, error) {
	var out []Notice
	var first error
	refused := 0
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
		n, err := ns.decodeLine(line, now)
		if err != nil {
			refused++
			if first == nil {
				first = err
			}
			continue
		}
		out = append(out, n)
	}
	if refused > 0 {
		return out, fmt.Errorf("%w: %d notice(s) refused, the first: %v", ErrInvalidEvent, refused, first)
	}
	return out, nil
}

func (ns *Notices) decodeLine(line []byte, now time.Time) (Notice, error) {
	f := bytes.Fields(line)
	if len(f) != 6 || (string(f[0]) != "full" && string(f[0]) != "room") || !validDigest(string(f[1])) {
		return Notice{}, fmt.Errorf("malformed (%d bytes)", len(line))
	}
	reset, err1 := strconv.ParseInt(string(f[2]), 10, 64)
	used, err2 := strconv.ParseInt(string(f[3]), 10, 64)
	sent, err3 := strconv.ParseInt(string(f[4]), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || reset <= 0 || used < 0 {
		return Notice{}, fmt.Errorf("malformed (%d bytes)", len(line))
	}
	var got [16]byte
	if len(f[5]) != 32 {
		return Notice{}, fmt.Errorf("not signed")
	}
	if _, err := hex.Decode(got[:], f[5]); err != nil {
		return Notice{}, fmt.Errorf("not signed")
	}
	signed := line[:bytes.LastIndexByte(line, ' ')]
	if want := ns.mac(signed); !hmac.Equal(got[:], want[:]) {
		return Notice{}, fmt.Errorf("bad signature: not from a process holding the deployment's secret")
	}
	if d := now.Sub(time.UnixMilli(sent)); d > NoticeMaxAge || d < -NoticeMaxAge {
		return Notice{}, fmt.Errorf("sent %v from now: too old or too far ahead", d.Round(time.Millisecond))
	}
	return Notice{Full: string(f[0]) == "full", Key: string(f[1]), ResetAt: time.UnixMilli(reset), Used: used}, nil
}
