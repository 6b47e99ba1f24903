package events

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Hand-written JSON: events are encoded on the request path, so the
// encoders append to a caller's buffer without reflection.

const hexDigits = "0123456789abcdef"

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	plain := true // most strings (digests, names, ids) need no escaping
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			plain = false
			break
		}
	}
	if plain {
		return append(append(b, s...), '"')
	}
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				switch c {
				case '\n':
					b = append(b, '\\', 'n')
				case '\r':
					b = append(b, '\\', 'r')
				case '\t':
					b = append(b, '\\', 't')
				default:
					b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
				}
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// appendField appends ,"name": (or "name": first in an object).
func appendField(b []byte, name string) []byte {
	if n := len(b); n > 0 && b[n-1] != '{' && b[n-1] != '[' {
		b = append(b, ',')
	}
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

func appendStringField(b []byte, name, v string) []byte {
	return appendString(appendField(b, name), v)
}

func appendIntField(b []byte, name string, v int64) []byte {
	return strconv.AppendInt(appendField(b, name), v, 10)
}

func appendUintField(b []byte, name string, v uint64) []byte {
	return strconv.AppendUint(appendField(b, name), v, 10)
}

// timeLayout is the events' times: RFC 3339 with microseconds, UTC.
const timeLayout = "2006-01-02T15:04:05.000000Z07:00"

// appendTimeField appends a time in RFC 3339 with microseconds, UTC.
func appendTimeField(b []byte, name string, t time.Time) []byte {
	return append(appendTime(append(appendField(b, name), '"'), t), '"')
}

// appendTime appends t as timeLayout does, without reading the layout:
// every decision's event carries two or three times, and AppendFormat's
// layout walk was 4% of the edge's CPU on one key (the edge's profile in
// make bench). Years outside 0000–9999 take AppendFormat's way.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		return t.AppendFormat(b, timeLayout)
	}
	hour, minute, sec := t.Clock()
	us := t.Nanosecond() / 1000
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-')
	b = append(b, byte('0'+int(month)/10), byte('0'+int(month)%10), '-', byte('0'+day/10), byte('0'+day%10), 'T')
	b = append(b, byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+minute/10), byte('0'+minute%10), ':')
	b = append(b, byte('0'+sec/10), byte('0'+sec%10), '.')
	for d := 100000; d > 0; d /= 10 {
		b = append(b, byte('0'+us/d%10))
	}
	return append(b, 'Z')
}
