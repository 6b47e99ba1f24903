package loadgen

import (
	"bufio"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// next is appended to every response: reading it after the response shows
// the response was consumed exactly.
const next = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"

func TestReadResponse(t *testing.T) {
	tests := []struct {
		name   string
		resp   string
		head   bool
		status int
		close  bool
		header string
	}{
		{
			name:   "content-length",
			resp:   "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\ncOnTeNt-LeNgTh:  5 \r\n\r\nhello",
			status: 200,
			header: "Content-Type: text/plain\r\ncOnTeNt-LeNgTh:  5 \r\n",
		},
		{
			name:   "empty body",
			resp:   "HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nX-RateLimit-Remaining: 0\r\n\r\n",
			status: 429,
			header: "Content-Length: 0\r\nX-RateLimit-Remaining: 0\r\n",
		},
		{
			name:   "no reason phrase, bare newlines",
			resp:   "HTTP/1.1 503\nContent-Length: 2\n\nno",
			status: 503,
			header: "Content-Length: 2\n",
		},
		{
			name:   "chunked",
			resp:   "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nA;ext=1\r\n0123456789\r\n0\r\n\r\n",
			status: 200,
			header: "Transfer-Encoding: chunked\r\n",
		},
		{
			name:   "chunked with trailer, wins over length",
			resp:   "HTTP/1.1 201 Created\r\nContent-Length: 100\r\nTRANSFER-ENCODING: gzip, Chunked\r\n\r\n1f \r\n0123456789012345678901234567890\r\n0\r\nX-Trailer: yes\r\n\r\n",
			status: 201,
			header: "Content-Length: 100\r\nTRANSFER-ENCODING: gzip, Chunked\r\n",
		},
		{
			name:   "connection close",
			resp:   "HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 3\r\n\r\nbye",
			status: 200,
			close:  true,
			header: "Connection: Close\r\nContent-Length: 3\r\n",
		},
		{
			name:   "http/1.0 keep-alive",
			resp:   "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
			status: 200,
			header: "Connection: keep-alive\r\nContent-Length: 2\r\n",
		},
		{
			name:   "http/1.0 default close",
			resp:   "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
			status: 200,
			close:  true,
			header: "Content-Length: 2\r\n",
		},
		{
			name:   "interim 100 continue",
			resp:   "HTTP/1.1 100 Continue\r\nX-Interim: 1\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
			status: 200,
			header: "Content-Length: 1\r\n",
		},
		{
			name:   "204 has no body",
			resp:   "HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n",
			status: 204,
			header: "Content-Length: 10\r\n",
		},
		{
			name:   "304 has no body",
			resp:   "HTTP/1.1 304 Not Modified\r\n\r\n",
			status: 304,
		},
		{
			name:   "head has no body",
			resp:   "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
			head:   true,
			status: 200,
			header: "Content-Length: 1000\r\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(tt.resp+next), 64)
			var hdr []byte
			status, closeAfter, err := readResponse(br, tt.head, true, &hdr)
			require.NoError(t, err)
			assert.Equal(t, tt.status, status)
			assert.Equal(t, tt.close, closeAfter)
			assert.Equal(t, tt.header, string(hdr))

			status, closeAfter, err = readResponse(br, false, false, &hdr)
			require.NoError(t, err)
			assert.Equal(t, 200, status)
			assert.False(t, closeAfter)
			_, err = br.ReadByte()
			assert.Equal(t, io.EOF, err)
		})
	}
}

func TestReadResponseUntilClose(t *testing.T) {
	br := bufio.NewReaderSize(strings.NewReader("HTTP/1.1 200 OK\r\nX: y\r\n\r\n"+strings.Repeat("body", 100)), 64)
	var hdr []byte
	status, closeAfter, err := readResponse(br, false, false, &hdr)
	require.NoError(t, err)
	assert.Equal(t, 200, status)
	assert.True(t, closeAfter)
}

func TestReadResponseErrors(t *testing.T) {
	tests := map[string]string{
		"empty":              "",
		"garbage":            "garbage\r\n\r\n",
		"http/2":             "HTTP/2.0 200 OK\r\n\r\n",
		"bad status":         "HTTP/1.1 2x0 OK\r\n\r\n",
		"long status":        "HTTP/1.1 2000 OK\r\n\r\n",
		"short":              "HTTP/1.1 20\r\n",
		"header no colon":    "HTTP/1.1 200 OK\r\nbroken\r\n\r\n",
		"header empty name":  "HTTP/1.1 200 OK\r\n: x\r\n\r\n",
		"bad length":         "HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
		"negative length":    "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"huge length":        "HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"truncated headers":  "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n",
		"truncated body":     "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel",
		"bad chunk size":     "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
		"chunk without size": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n;x\r\n",
		"chunk missing crlf": "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n0\r\n\r\n",
		"chunk truncated":    "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
		"no last chunk":      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nab\r\n",
		"upgrade":            "HTTP/1.1 101 Switching Protocols\r\n\r\n",
		"line too long":      "HTTP/1.1 200 OK\r\nX: " + strings.Repeat("a", 200) + "\r\n\r\n",
	}
	for name, resp := range tests {
		t.Run(name, func(t *testing.T) {
			br := bufio.NewReaderSize(strings.NewReader(resp), 64)
			var hdr []byte
			_, _, err := readResponse(br, false, true, &hdr)
			assert.Error(t, err)
		})
	}
}

func TestReadResponseAllocs(t *testing.T) {
	resps := []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nX-RateLimit-Remaining: 7\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n5\r\nworld\r\n0\r\n\r\n",
	}
	for _, resp := range resps {
		rd := strings.NewReader(resp)
		br := bufio.NewReaderSize(rd, readBufferSize)
		hdr := make([]byte, 0, 512)
		allocs := testing.AllocsPerRun(100, func() {
			rd.Reset(resp)
			br.Reset(rd)
			if _, _, err := readResponse(br, false, true, &hdr); err != nil {
				t.Fatal(err)
			}
		})
		assert.Zero(t, allocs)
	}
}

func TestParseHelpers(t *testing.T) {
	n, ok := parseDecimal([]byte("1234567890"))
	assert.True(t, ok)
	assert.Equal(t, int64(1234567890), n)
	_, ok = parseDecimal(nil)
	assert.False(t, ok)

	n, ok = parseChunkSize([]byte("fF\t; name=value"))
	assert.True(t, ok)
	assert.Equal(t, int64(255), n)
	_, ok = parseChunkSize([]byte("1g"))
	assert.False(t, ok)
	_, ok = parseChunkSize([]byte("ffffffffffffffffff"))
	assert.False(t, ok)

	assert.True(t, hasToken([]byte("keep-alive, Close"), "close"))
	assert.False(t, hasToken([]byte("closed"), "close"))
	assert.True(t, isHead([]byte("HEAD / HTTP/1.1\r\n")))
	assert.False(t, isHead([]byte("GET / HTTP/1.1\r\n")))
}

func TestParseLimits(t *testing.T) {
	n, ok := parseDecimal([]byte("4611686018427387904")) // 1<<62
	assert.True(t, ok)
	assert.Equal(t, int64(maxLength), n)
	_, ok = parseDecimal([]byte("4611686018427387905"))
	assert.False(t, ok)
	_, ok = parseDecimal([]byte("92233720368547758070"))
	assert.False(t, ok)

	n, ok = parseChunkSize([]byte("3fffffffffffffff"))
	assert.True(t, ok)
	assert.Equal(t, int64(maxLength-1), n)
	_, ok = parseChunkSize([]byte("10000000000000000"))
	assert.False(t, ok)
}
