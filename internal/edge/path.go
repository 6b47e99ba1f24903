package edge

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// One path: routes match exactly the path the upstream receives. A proxy
// that matches one spelling of a path and forwards another lets a client
// choose which limit applies: "/search/%2e%2e/cats" counted under the
// default policy while an upstream that decodes it serves /cats, or
// "/search/..%5Ccats" counted under /search while the upstream serves
// /cats. So the edge refuses (400) every request path whose meaning
// depends on who decodes or normalises it, and forwards the one it
// matched, in its canonical encoding:
//
//   - a dot segment, plain or encoded: /a/../b, /a/./b, /a/%2e%2e/b;
//   - an encoded slash or backslash (%2F, %5C), and any backslash;
//   - an encoded percent sign (%25: double encoding);
//   - an empty segment (//);
//   - a semicolon (path parameters, which some servers strip: /search;x);
//   - a NUL or other control character, encoded or not;
//   - anything that is not an absolute path ("*", an empty path).
//
// What is left decodes the same way everywhere: percent-encoded octets of
// other characters stand for themselves (%41 is A), and are forwarded
// decoded where that is their canonical form. Routes are matched
// case-sensitively, like the paths themselves: an upstream that routes
// without regard to case must be given routes for every spelling
// (docs/security.md).
var errAmbiguousPath = errors.New("the request path is ambiguous: dot segments, encoded slashes or backslashes, " +
	"double encoding, empty segments, semicolons and control characters are refused")

// requestPath returns the path a request is matched and forwarded by, or
// errAmbiguousPath.
func requestPath(r *http.Request) (string, error) { return urlPath(r.URL) }

// urlPath is requestPath of a URL (a forward-auth request's original URI).
func urlPath(u *url.URL) (string, error) {
	p := u.Path
	raw := u.RawPath
	if raw == "" {
		raw = p
	}
	if p == "" || p[0] != '/' || u.Opaque != "" {
		return "", errAmbiguousPath
	}
	for i := 0; i+2 < len(raw); i++ {
		if raw[i] != '%' {
			continue
		}
		switch strings.ToLower(raw[i+1 : i+3]) {
		case "2f", "5c", "25", "00", "2e":
			// An encoded dot is refused too: it is never needed, and it is
			// how dot segments hide.
			return "", errAmbiguousPath
		}
	}
	for i := 0; i < len(p); i++ {
		if c := p[i]; c < 0x20 || c == 0x7f || c == '\\' || c == ';' {
			return "", errAmbiguousPath
		}
	}
	if strings.Contains(p, "//") {
		return "", errAmbiguousPath
	}
	for seg := range strings.SplitSeq(p[1:], "/") {
		if seg == "." || seg == ".." {
			return "", errAmbiguousPath
		}
	}
	return p, nil
}
