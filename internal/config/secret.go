package config

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/tallyhq/tally/internal/limiter"
)

// ParseSecret reads TALLY_KEY_SECRET: at least limiter.MinSecretLen random
// bytes, written in hex (64 digits or more) or base64 (standard or URL
// alphabet, padded or not). Surrounding whitespace (a file's last newline)
// is ignored; anything else is an error that says what to do, never a
// weaker secret used quietly: a short secret lets anyone who sees a window
// key recover guessable identities by brute force.
func ParseSecret(s string) ([]byte, error) {
	s = strings.TrimSpace(s)
	how := fmt.Sprintf("want at least %d random bytes in hex or base64 (e.g. `openssl rand -hex 32`)", limiter.MinSecretLen)
	if s == "" {
		return nil, fmt.Errorf("%w: %s is not set: %s", ErrInvalid, EnvKeySecret, how)
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return nil, fmt.Errorf("%w: %s has whitespace inside: %s", ErrInvalid, EnvKeySecret, how)
	}
	var b []byte
	if len(s)%2 == 0 && isHex(s) {
		b, _ = hex.DecodeString(s)
	} else {
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
			if d, err := enc.Strict().DecodeString(s); err == nil {
				b = d
				break
			}
		}
		if b == nil {
			return nil, fmt.Errorf("%w: %s is neither hex nor base64: %s", ErrInvalid, EnvKeySecret, how)
		}
	}
	if len(b) < limiter.MinSecretLen {
		return nil, fmt.Errorf("%w: %s holds %d bytes: %s", ErrInvalid, EnvKeySecret, len(b), how)
	}
	return b, nil
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') && (c < 'A' || c > 'F') {
			return false
		}
	}
	return true
}
