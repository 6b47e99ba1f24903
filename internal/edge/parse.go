package edge

import "unicode/utf8"

// parseCheck reads the common shape of a check request, {"policy": "...",
// "identity": "...", "cost": n} in any order with optional cost, without
// reflection. It reports false for anything else (escapes in strings, other
// fields, a repeated field, a number that is not a small non-negative
// integer, trailing data): the caller then decodes with encoding/json,
// which accepts or refuses it and says why.
func parseCheck(b []byte) (CheckRequest, bool) {
	var req CheckRequest
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return req, false
	}
	i = skipSpace(b, i+1)
	var seen [3]bool
	for first := true; ; first = false {
		if i < len(b) && b[i] == '}' && first {
			i++
			break
		}
		key, j, ok := plainString(b, i)
		if !ok {
			return req, false
		}
		i = skipSpace(b, j)
		if i >= len(b) || b[i] != ':' {
			return req, false
		}
		i = skipSpace(b, i+1)
		switch key {
		case "policy", "identity":
			k := 0
			if key == "identity" {
				k = 1
			}
			v, j, ok := plainString(b, i)
			if !ok || seen[k] {
				return req, false
			}
			seen[k] = true
			if k == 0 {
				req.Policy = v
			} else {
				req.Identity = v
			}
			i = j
		case "cost":
			n, j, ok := smallInt(b, i)
			if !ok || seen[2] {
				return req, false
			}
			seen[2] = true
			req.Cost, i = n, j
		default:
			return req, false
		}
		i = skipSpace(b, i)
		if i < len(b) && b[i] == ',' {
			i = skipSpace(b, i+1)
			continue
		}
		if i < len(b) && b[i] == '}' {
			i++
			break
		}
		return req, false
	}
	return req, skipSpace(b, i) == len(b)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// plainString reads a JSON string of valid UTF-8 with no escapes and no
// control characters, returning it and the index after its closing quote.
func plainString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	ascii := true
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			if !ascii && !utf8.Valid(b[i+1:j]) { // encoding/json would replace the bad bytes
				return "", i, false
			}
			return string(b[i+1 : j]), j + 1, true
		case c == '\\' || c < 0x20:
			return "", i, false
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return "", i, false
}

// smallInt reads a non-negative integer of at most 10 digits.
func smallInt(b []byte, i int) (int64, int, bool) {
	var n int64
	j := i
	for j < len(b) && b[j] >= '0' && b[j] <= '9' && j-i < 10 {
		n = n*10 + int64(b[j]-'0')
		j++
	}
	if j == i || (j < len(b) && (b[j] == '.' || b[j] == 'e' || b[j] == 'E' || (b[j] >= '0' && b[j] <= '9'))) ||
		(b[i] == '0' && j-i > 1) {
		return 0, i, false
	}
	return n, j, true
}
