package loadgen

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

var (
	errStatusLine = errors.New("loadgen: malformed status line")
	errHeader     = errors.New("loadgen: malformed header line")
	errLength     = errors.New("loadgen: malformed Content-Length")
	errChunk      = errors.New("loadgen: malformed chunked body")
	errUpgrade    = errors.New("loadgen: unexpected 101 Switching Protocols")
)

// isHead reports whether req is a HEAD request, whose response has no body.
func isHead(req []byte) bool {
	return len(req) >= 5 && string(req[:5]) == "HEAD "
}

// readResponse reads one response from br, skipping interim 1xx responses,
// and discards its body. It returns the status code and whether the
// connection must be closed after the response. head says the request was a
// HEAD request. If keep is set, the header block of the response is left in
// *hdr, whose storage is reused.
func readResponse(br *bufio.Reader, head, keep bool, hdr *[]byte) (status int, closeAfter bool, err error) {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return 0, false, err
		}
		status, minor, ok := parseStatusLine(line)
		if !ok {
			return 0, false, errStatusLine
		}
		closeAfter = minor == 0
		length := int64(-1)
		chunked := false
		if keep {
			*hdr = (*hdr)[:0]
		}
		for {
			line, err = br.ReadSlice('\n')
			if err != nil {
				return 0, false, noEOF(err)
			}
			l := trimEOL(line)
			if len(l) == 0 {
				break
			}
			if keep {
				*hdr = append(*hdr, line...)
			}
			colon := bytes.IndexByte(l, ':')
			if colon <= 0 {
				return 0, false, errHeader
			}
			name, value := l[:colon], trimSpace(l[colon+1:])
			switch len(name) {
			case len("content-length"):
				if equalFold(name, "content-length") {
					n, ok := parseDecimal(value)
					if !ok {
						return 0, false, errLength
					}
					length = n
				}
			case len("transfer-encoding"):
				if equalFold(name, "transfer-encoding") && hasToken(value, "chunked") {
					chunked = true
				}
			case len("connection"):
				if equalFold(name, "connection") {
					if hasToken(value, "close") {
						closeAfter = true
					} else if minor == 0 && hasToken(value, "keep-alive") {
						closeAfter = false
					}
				}
			}
		}
		if status >= 100 && status < 200 {
			if status == 101 {
				return 0, false, errUpgrade
			}
			continue
		}
		switch {
		case head || status == 204 || status == 304:
		case chunked:
			err = readChunked(br)
		case length >= 0:
			err = discard(br, length)
		default:
			// The body ends when the server closes the connection.
			_, err = br.WriteTo(io.Discard)
			closeAfter = true
		}
		if err != nil {
			return 0, false, err
		}
		return status, closeAfter, nil
	}
}

// readChunked reads and discards a chunked body and its trailer.
func readChunked(br *bufio.Reader) error {
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return noEOF(err)
		}
		n, ok := parseChunkSize(trimEOL(line))
		if !ok {
			return errChunk
		}
		if n == 0 {
			for {
				line, err := br.ReadSlice('\n')
				if err != nil {
					return noEOF(err)
				}
				if len(trimEOL(line)) == 0 {
					return nil
				}
			}
		}
		if err := discard(br, n); err != nil {
			return err
		}
		line, err = br.ReadSlice('\n')
		if err != nil {
			return noEOF(err)
		}
		if len(trimEOL(line)) != 0 {
			return errChunk
		}
	}
}

// discard skips n bytes of br.
func discard(br *bufio.Reader, n int64) error {
	for n > 0 {
		k := int(min(n, 1<<30))
		if _, err := br.Discard(k); err != nil {
			return noEOF(err)
		}
		n -= int64(k)
	}
	return nil
}

// noEOF turns io.EOF in the middle of a response into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseStatusLine parses "HTTP/1.x ddd[ reason]" followed by a line ending.
func parseStatusLine(line []byte) (status int, minor int, ok bool) {
	if len(line) < len("HTTP/1.1 200\n") || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return 0, 0, false
	}
	if line[7] != '0' && line[7] != '1' {
		return 0, 0, false
	}
	d0, d1, d2 := line[9]-'0', line[10]-'0', line[11]-'0'
	if d0 > 9 || d1 > 9 || d2 > 9 {
		return 0, 0, false
	}
	if c := line[12]; c != ' ' && c != '\r' && c != '\n' {
		return 0, 0, false
	}
	return int(d0)*100 + int(d1)*10 + int(d2), int(line[7] - '0'), true
}

// maxLength bounds Content-Length and chunk sizes, keeping them far from
// overflow.
const maxLength = 1 << 62

// parseDecimal parses a non-empty string of decimal digits.
func parseDecimal(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		c -= '0'
		if c > 9 {
			return 0, false
		}
		if n > (maxLength-int64(c))/10 {
			return 0, false
		}
		n = n*10 + int64(c)
	}
	return n, true
}

// parseChunkSize parses a chunk-size line without its line ending: hex
// digits, optionally followed by whitespace and chunk extensions.
func parseChunkSize(b []byte) (int64, bool) {
	var n int64
	i := 0
	for ; i < len(b); i++ {
		d, ok := unhex(b[i])
		if !ok {
			break
		}
		if n > maxLength>>4 {
			return 0, false
		}
		n = n<<4 | int64(d)
	}
	if i == 0 {
		return 0, false
	}
	if i < len(b) && b[i] != ';' && b[i] != ' ' && b[i] != '\t' {
		return 0, false
	}
	return n, true
}

// unhex returns the value of the hexadecimal digit c.
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// trimEOL removes a trailing "\n" or "\r\n".
func trimEOL(b []byte) []byte {
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
		if n := len(b); n > 0 && b[n-1] == '\r' {
			b = b[:n-1]
		}
	}
	return b
}

// trimSpace removes leading and trailing spaces and tabs.
func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// equalFold reports whether b equals lower, ignoring ASCII case. lower must
// be lower-case.
func equalFold(b []byte, lower string) bool {
	if len(b) != len(lower) {
		return false
	}
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// hasToken reports whether the comma-separated list v holds token, ignoring
// ASCII case. token must be lower-case.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		var t []byte
		if i := bytes.IndexByte(v, ','); i >= 0 {
			t, v = v[:i], v[i+1:]
		} else {
			t, v = v, nil
		}
		if equalFold(trimSpace(t), token) {
			return true
		}
	}
	return false
}
