package limiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"regexp"
	"sync"
)

// This file is the only place that builds Redis keys and hash fields.
//
// Layout (one key per (resource, identity), see docs/windows.md):
//
//	<prefix>:{<digest>}      hash: u, s, r, p and e:<event digest> records
//
// digest is 32 lower-case hex digits: the first 128 bits of
// HMAC-SHA256(secret, "tally/key/v1" ‖ len(resource) ‖ resource ‖
// len(identity) ‖ identity), with uvarint lengths. The identity never reaches
// Redis, so a separator (alice:exp), a hash tag ({alice}), a NUL, a long
// string or a Unicode look-alike is just different input to the hash. The
// hash tag is Tally's own digest, so Redis Cluster slots, like shards, cannot
// be steered by clients. With a secret, digests of guessable identities (API
// tokens, IP addresses) cannot be reversed by hashing candidates.

// ErrInvalidKey is wrapped by errors about key spaces and key digests.
var ErrInvalidKey = errors.New("limiter: invalid key")

const digestHexLen = 32

var (
	prefixRE = regexp.MustCompile(`^[a-z0-9_-]{1,32}$`)
	digestRE = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// KeySpace builds window keys. It is safe for concurrent use.
type KeySpace struct {
	prefix string
	pool   sync.Pool // of hash.Hash (HMAC-SHA256 with the secret)
}

// NewKeySpace returns a key space whose keys start with prefix (1 to 32 of
// [a-z0-9_-]; "tally" is the usual choice) and whose digests are keyed with
// secret. Every process of one deployment must use the same prefix and
// secret; changing either starts every client on a fresh window.
func NewKeySpace(prefix string, secret []byte) (*KeySpace, error) {
	if !prefixRE.MatchString(prefix) {
		return nil, fmt.Errorf("%w: prefix %q: want 1 to 32 of [a-z0-9_-]", ErrInvalidKey, prefix)
	}
	secret = append([]byte(nil), secret...)
	ks := &KeySpace{prefix: prefix}
	ks.pool.New = func() any { return hmac.New(sha256.New, secret) }
	return ks, nil
}

// Key is one window's key: what a (resource, identity) pair becomes.
type Key struct {
	digest string // 32 hex
	redis  string
}

// Key returns the window key for an identity (an API token, a user id, a
// client IP prefix: any bytes) under a resource (a policy name).
func (ks *KeySpace) Key(resource, identity string) Key {
	h := ks.pool.Get().(hash.Hash)
	h.Reset()
	var buf [binary.MaxVarintLen64]byte
	h.Write([]byte("tally/key/v1"))
	h.Write(buf[:binary.PutUvarint(buf[:], uint64(len(resource)))])
	h.Write([]byte(resource))
	h.Write(buf[:binary.PutUvarint(buf[:], uint64(len(identity)))])
	h.Write([]byte(identity))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	ks.pool.Put(h)
	return ks.fromDigest(hex.EncodeToString(sum[:16]))
}

// KeyFromDigest rebuilds a key from its digest, as carried by events. It
// fails, wrapping ErrInvalidKey, unless digest is 32 lower-case hex digits.
func (ks *KeySpace) KeyFromDigest(digest string) (Key, error) {
	if !digestRE.MatchString(digest) {
		return Key{}, fmt.Errorf("%w: digest %q: want 32 lower-case hex digits", ErrInvalidKey, truncate(digest, 40))
	}
	return ks.fromDigest(digest), nil
}

func (ks *KeySpace) fromDigest(d string) Key {
	return Key{digest: d, redis: ks.prefix + ":{" + d + "}"}
}

// Digest is the key's identity-free name: safe to put in events and logs.
func (k Key) Digest() string { return k.digest }

// String is the Redis key.
func (k Key) String() string { return k.redis }

// IsZero reports whether k was never built.
func (k Key) IsZero() bool { return k.digest == "" }

// Hash is a 64-bit hash of the key for shard placement.
func (k Key) Hash() uint64 {
	var b [8]byte
	hex.Decode(b[:], []byte(k.digest[:16]))
	return binary.BigEndian.Uint64(b[:])
}

// eventField is the hash field that records one event id in a window: "e:"
// and 128 bits of SHA-256 of the id, so ids of any length and content cost
// the same and cannot collide with the window's own fields.
func eventField(eventID string) string {
	sum := sha256.Sum256([]byte(eventID))
	return "e:" + hex.EncodeToString(sum[:16])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
