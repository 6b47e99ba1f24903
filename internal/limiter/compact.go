package limiter

import (
	"strconv"
	"strings"
	"time"
)

// CompactWindow is a window in its compact form (lua/window.lua,
// docs/windows.md): one string "<used>:<reset s>:<length s>:<holder>", then
// ":<back s>" when the window replaced one that had ended, and
// ":<back s>:<given>" (back may be empty) when what the holder was given
// is not the count. Every unit of it is held by its one holder's producer.
type CompactWindow struct {
	Used     int64
	Start    time.Time
	ResetAt  time.Time
	Holder   string // <producer>.<n>
	Producer string
}

// ParseCompact reads a compact window from the string a window key holds;
// ok is false when v is not one.
func ParseCompact(v string) (w CompactWindow, ok bool) {
	parts := strings.SplitN(v, ":", 5)
	if len(parts) < 4 {
		return CompactWindow{}, false
	}
	used, err1 := strconv.ParseInt(parts[0], 10, 64)
	reset, err2 := strconv.ParseInt(parts[1], 10, 64)
	length, err3 := strconv.ParseInt(parts[2], 10, 64)
	dot := strings.LastIndexByte(parts[3], '.')
	if err1 != nil || err2 != nil || err3 != nil || used < 0 || length <= 0 || dot <= 0 || dot == len(parts[3])-1 {
		return CompactWindow{}, false
	}
	return CompactWindow{Used: used, Start: time.Unix(reset-length, 0), ResetAt: time.Unix(reset, 0), Holder: parts[3],
		Producer: parts[3][:dot]}, true
}

// CompactHolder reports whether holder, reserving for producer, can hold a
// compact window: <producer>.<n>, n of [A-Za-z0-9_-].
func CompactHolder(holder, producer string) bool {
	n, ok := strings.CutPrefix(holder, producer+".")
	if !ok || n == "" {
		return false
	}
	for i := 0; i < len(n); i++ {
		if c := n[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// AppendCompact appends the compact form of a window that opens with used
// units, all holder's, from start to reset (whole seconds; a first window,
// accepting events from its start less grace plus a second).
func AppendCompact(b []byte, used int64, start, reset time.Time, holder string) []byte {
	b = strconv.AppendInt(b, used, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, reset.Unix(), 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, reset.Unix()-start.Unix(), 10)
	b = append(b, ':')
	return append(b, holder...)
}
