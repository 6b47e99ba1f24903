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
// ok is false when v is not one. It accepts exactly what the scripts' codec
// does (lua/compact.lua's decode), so that a string the scripts refuse is
// no window here either.
func ParseCompact(v string) (w CompactWindow, ok bool) {
	parts := strings.Split(v, ":")
	if len(parts) < 4 || len(parts) > 6 || !digits(parts[0], 1, 10) || !digits(parts[1], 1, 11) || !digits(parts[2], 1, 9) {
		return CompactWindow{}, false
	}
	switch len(parts) {
	case 5: // :<back>
		if !digits(parts[4], 1, 11) {
			return CompactWindow{}, false
		}
	case 6: // :<back>:<given>, back may be empty
		if !digits(parts[4], 0, 11) || !digits(parts[5], 1, 15) {
			return CompactWindow{}, false
		}
	}
	holder := parts[3]
	dot := strings.LastIndexByte(holder, '.')
	if dot <= 0 || dot == len(holder)-1 || !nameChars(holder[:dot], true) || !nameChars(holder[dot+1:], false) {
		return CompactWindow{}, false
	}
	used, _ := strconv.ParseInt(parts[0], 10, 64)
	reset, _ := strconv.ParseInt(parts[1], 10, 64)
	length, _ := strconv.ParseInt(parts[2], 10, 64)
	return CompactWindow{Used: used, Start: time.Unix(reset-length, 0), ResetAt: time.Unix(reset, 0), Holder: holder,
		Producer: holder[:dot]}, true
}

// digits reports whether s is lo to hi decimal digits.
func digits(s string, lo, hi int) bool {
	if len(s) < lo || len(s) > hi {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// nameChars reports whether s is made of [A-Za-z0-9_-], and dots where
// dots is set.
func nameChars(s string, dots bool) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || dots && c == '.') {
			return false
		}
	}
	return true
}

// CompactHolder reports whether holder, reserving for producer, can hold a
// compact window: <producer>.<n>, n of [A-Za-z0-9_-].
func CompactHolder(holder, producer string) bool {
	n, ok := strings.CutPrefix(holder, producer+".")
	return ok && n != "" && nameChars(n, false)
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
