package limiter

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"sync"
	"time"
)

// This file is the only place that builds Redis keys.
//
// Layout (see docs/windows.md):
//
//	<prefix>:{<digest>}            hash: one window (u, s, r, p)
//	<prefix>:producer:{<digest>}   hash: one producer's applied sequence on a shard
//	<prefix>:lease:<shard>         string: the accountant that holds a shard
//	<prefix>:reply:{<digest>}:<n>  string: the last answer of a caller's runs, script call n
//	<prefix>:fin:{<digest>}:<holder>:<reset>  string of bits: the finished requests of a holder in a window
//
// A window digest is 32 lower-case hex digits: the first 128 bits of
// HMAC-SHA256(secret, "tally/key/v1" ‖ len(resource) ‖ resource ‖
// len(identity) ‖ identity), with uvarint lengths. The identity never reaches
// Redis, so a separator (alice:exp), a hash tag ({alice}), a NUL, a long
// string or a Unicode look-alike is just different input to the hash. The
// hash tag is Tally's own digest, so Redis Cluster slots, like shards, cannot
// be steered by clients. The secret (at least MinSecretLen random bytes)
// keeps digests of guessable identities (API tokens, IP addresses) from
// being reversed by hashing candidates.
//
// Producer ids and accountant ids are not secret: their keys are plain
// SHA-256 digests under their own labels, so that what a primary records
// of a producer's applied events is found under the same key by every
// process, whichever secret it holds (a process with another secret is
// refused by its key id instead: KeyID).

// ErrInvalidKey is wrapped by errors about key spaces, digests and names
// that become part of keys.
var ErrInvalidKey = errors.New("limiter: invalid key")

// Digest is a window key's 128-bit keyed digest: what events, logs and
// notices carry instead of the identity.
type Digest [16]byte

// String is the digest in 32 lower-case hex digits.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// AppendHex appends the digest's 32 hex digits to b.
func (d Digest) AppendHex(b []byte) []byte { return hex.AppendEncode(b, d[:]) }

// ParseDigest reads 32 lower-case hex digits. Errors wrap ErrInvalidKey.
func ParseDigest(s string) (Digest, error) {
	var d Digest
	if len(s) != 2*len(d) || !IsLowerHex(s) {
		return d, fmt.Errorf("%w: digest %q: want 32 lower-case hex digits", ErrInvalidKey, truncate(s, 40))
	}
	_, _ = hex.Decode(d[:], []byte(s))
	return d, nil
}

// IsLowerHex reports whether s is made of [0-9a-f] only: digests, key ids
// and epoch and format levels as Tally writes them.
func IsLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// MinSecretLen is the shortest key secret NewKeySpace accepts, in bytes.
const MinSecretLen = 32

// KeySpace builds keys. It is safe for concurrent use.
type KeySpace struct {
	prefix string
	secret []byte
	keyID  string
	pool   sync.Pool // of *hasher
	// Shard-wide key names that reservations send (RefillKey,
	// ReseedKey), built once.
	refillKey, reseedKey string
}

type hasher struct {
	mac hash.Hash // HMAC-SHA256 with the secret
	buf []byte
	sum [sha256.Size]byte
}

// NewKeySpace returns a key space whose keys start with prefix (1 to 32 of
// [a-z0-9_-]; "tally" is the usual choice) and whose digests are keyed with
// secret, at least MinSecretLen random bytes. Every process of one
// deployment must use the same prefix and secret; changing either starts
// every client on a fresh window. Errors wrap ErrInvalidKey.
func NewKeySpace(prefix string, secret []byte) (*KeySpace, error) {
	if !validName(prefix, 32) {
		return nil, fmt.Errorf("%w: prefix %q: want 1 to 32 of [a-z0-9_-]", ErrInvalidKey, truncate(prefix, 40))
	}
	if len(secret) < MinSecretLen {
		return nil, fmt.Errorf("%w: secret of %d bytes: want at least %d random bytes", ErrInvalidKey, len(secret), MinSecretLen)
	}
	secret = append([]byte(nil), secret...)
	ks := &KeySpace{prefix: prefix, secret: secret, refillKey: prefix + ":refill", reseedKey: prefix + ":reseed"}
	ks.pool.New = func() any { return &hasher{mac: hmac.New(sha256.New, secret)} }
	ks.keyID = hex.EncodeToString(ks.Derive("tally/key-id/v1")[:8])
	return ks, nil
}

// Derive is a 32-byte key for one purpose (label), derived from the secret
// (HMAC-SHA256(secret, label)): request ids and notices are signed with
// keys of their own, never with the secret itself.
func (ks *KeySpace) Derive(label string) []byte {
	m := hmac.New(sha256.New, ks.secret)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// KeyID names the secret without revealing it: 16 hex digits of
// HMAC-SHA256(secret, "tally/key-id/v1"). Accounting events carry it, so
// that an accountant refuses events whose digests were made with another
// secret (their windows would be other windows).
func (ks *KeySpace) KeyID() string { return ks.keyID }

// Prefix is the prefix of every key.
func (ks *KeySpace) Prefix() string { return ks.prefix }

// validName reports whether s is 1 to max of [a-z0-9_-].
func validName(s string, max int) bool {
	if len(s) < 1 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// Sum is the digest of an identity (an API token, a user id, a client IP
// prefix: any bytes) under a resource (a policy name). It does not allocate.
func (ks *KeySpace) Sum(resource, identity string) Digest {
	return ks.sum("tally/key/v1", resource, identity)
}

func (ks *KeySpace) sum(label, a, b string) Digest {
	h := ks.pool.Get().(*hasher)
	buf := append(h.buf[:0], label...)
	buf = binary.AppendUvarint(buf, uint64(len(a)))
	buf = append(buf, a...)
	buf = binary.AppendUvarint(buf, uint64(len(b)))
	buf = append(buf, b...)
	h.mac.Reset()
	h.mac.Write(buf)
	var d Digest
	copy(d[:], h.mac.Sum(h.sum[:0]))
	if cap(buf) <= 1<<16 {
		h.buf = buf
	} else {
		h.buf = nil
	}
	ks.pool.Put(h)
	return d
}

// Key is one window's key: what a (resource, identity) pair becomes.
type Key struct {
	digest Digest
	redis  string
}

// Key returns the window key for an identity under a resource.
func (ks *KeySpace) Key(resource, identity string) Key { return ks.KeyOf(ks.Sum(resource, identity)) }

// KeyOf returns the window key with digest d.
func (ks *KeySpace) KeyOf(d Digest) Key {
	b := make([]byte, 0, len(ks.prefix)+3+2*len(d))
	b = append(b, ks.prefix...)
	b = append(b, ":{"...)
	b = d.AppendHex(b)
	b = append(b, '}')
	return Key{digest: d, redis: string(b)}
}

// KeyFromDigest rebuilds a key from its digest in hex, as events carry it.
// Errors wrap ErrInvalidKey.
func (ks *KeySpace) KeyFromDigest(s string) (Key, error) {
	d, err := ParseDigest(s)
	if err != nil {
		return Key{}, err
	}
	return ks.KeyOf(d), nil
}

// Digest is the key's identity-free name: safe to put in events and logs.
func (k Key) Digest() Digest { return k.digest }

// SliceKey is the Redis key of one sub-window of k's sliding window
// (Policy.Slices): the window key, a colon and the sub-window's reset in
// whole seconds since the Unix epoch. It has k's hash tag, so it is on k's
// shard, and every sub-window of a span is under one tag.
func (k Key) SliceKey(reset time.Time) string {
	b := make([]byte, 0, len(k.redis)+12)
	b = append(b, k.redis...)
	b = append(b, ':')
	b = strconv.AppendInt(b, reset.Unix(), 10)
	return string(b)
}

// SpanKeys appends to keys the keys of the sub-windows that the spans of
// slices consecutive sub-windows of length holding the one that resets at
// reset count besides it: the slices - 1 before it, nearest first, then
// the slices - 1 after it, nearest first (lua/take.lua's and
// lua/slide.lua's order). They are SliceKey's, built in one allocation:
// over many keys a sliding window's every reservation names them. A
// window, or more than MaxSlices sub-windows, adds none.
func (k Key) SpanKeys(keys []string, reset time.Time, length time.Duration, slices int) []string {
	if slices < 2 || slices > MaxSlices { // TakeArgs.Validate refuses them first
		return keys
	}
	n := 2 * (slices - 1)
	var b strings.Builder // its String is its buffer: no copy
	b.Grow(n * (len(k.redis) + 12))
	var ends [2 * MaxSlices]int
	var num [20]byte
	for j, dir := range [...]time.Duration{-1, 1} {
		for i := 1; i < slices; i++ {
			b.WriteString(k.redis)
			b.WriteByte(':')
			b.Write(strconv.AppendInt(num[:0], reset.Add(dir*time.Duration(i)*length).Unix(), 10))
			ends[j*(slices-1)+i-1] = b.Len()
		}
	}
	all, start := b.String(), 0
	for _, end := range ends[:n] {
		keys = append(keys, all[start:end])
		start = end
	}
	return keys
}

// BucketKeys appends to keys what a token bucket's reservation in the
// period that resets at reset reads besides that period and the shard's
// own keys, in lua/take.lua's and lua/bucket.lua's order: the period
// before it and the one after it, the bucket's record (BucketKey), and the
// periods two and three before it. They are SliceKey's and BucketKey's,
// built in one allocation: over many keys every reservation of a bucket
// names them.
func (k Key) BucketKeys(keys []string, reset time.Time) []string {
	var b strings.Builder // its String is its buffer: no copy
	b.Grow(5 * (len(k.redis) + 12))
	var ends [5]int
	var num [20]byte
	for i, d := range [...]time.Duration{-1, 1, 0, -2, -3} {
		b.WriteString(k.redis)
		b.WriteByte(':')
		if d == 0 {
			b.WriteByte('b')
		} else {
			b.Write(strconv.AppendInt(num[:0], reset.Add(d*BucketPeriod).Unix(), 10))
		}
		ends[i] = b.Len()
	}
	all, start := b.String(), 0
	for _, end := range ends {
		keys = append(keys, all[start:end])
		start = end
	}
	return keys
}

// BucketKey is the Redis key of what k's token bucket spent and has not
// refilled yet (lua/take.lua's bucket): the window key and ":b", on k's
// shard as its periods are.
func (k Key) BucketKey() string { return k.redis + ":b" }

// SpanRecordKey is the Redis key of the record of k's sliding window that
// says what the other sub-windows of one sub-window's spans hold
// (lua/slide.lua writes it, lua/window.lua's touch_span removes it): the
// window key and ":s", on k's shard as its sub-windows are. The scripts
// that change a sub-window derive it from the sub-window's key (SliceKey)
// as this does.
func (k Key) SpanRecordKey() string { return k.redis + ":s" }

// WindowKey is the Redis key of k's window that resets at reset: k's own
// key, or for a sliding window of slices sub-windows (slices > 0) the
// sub-window's (SliceKey).
func (k Key) WindowKey(reset time.Time, slices int) string {
	if slices > 0 {
		return k.SliceKey(reset)
	}
	return k.redis
}

// String is the Redis key.
func (k Key) String() string { return k.redis }

// IsZero reports whether k was never built.
func (k Key) IsZero() bool { return k.redis == "" }

// Hash is a 64-bit hash of the key for shard placement.
func (k Key) Hash() uint64 { return k.digest.Hash() }

// Hash is a 64-bit hash of the digest for shard placement and tables.
func (d Digest) Hash() uint64 { return binary.BigEndian.Uint64(d[:8]) }

// MaxProducerLen bounds producer ids.
const MaxProducerLen = 64

// ValidProducer reports whether id is a producer id: 1 to MaxProducerLen of
// [A-Za-z0-9_.-], dot-separated tokens none of which is empty. A producer
// publishes on the subject that ends with its id (its tokens are the
// subject's last tokens), which is what NATS permissions grant.
func ValidProducer(id string) bool {
	return validID(id, MaxProducerLen) && id[0] != '.' && id[len(id)-1] != '.' && !strings.Contains(id, "..")
}

// validID reports whether id is 1 to max of [A-Za-z0-9_.-].
func validID(id string, max int) bool {
	if len(id) < 1 || len(id) > max {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' && c != '.' && c != '-' {
			return false
		}
	}
	return true
}

// plainSum is the first 128 bits of SHA-256(label ‖ len(id) ‖ id): a
// digest of a name that is not secret (a producer id, an accountant id).
func plainSum(label, id string) Digest {
	h := sha256.New()
	h.Write([]byte(label))
	h.Write(binary.AppendUvarint(nil, uint64(len(id))))
	h.Write([]byte(id))
	var d Digest
	copy(d[:], h.Sum(nil))
	return d
}

// ProducerKey is the hash in which a shard's primary records what it
// applied of one producer's events. The id is hashed (SHA-256, not keyed:
// every process finds the same record whatever its secret).
func (ks *KeySpace) ProducerKey(producer string) string {
	d := plainSum("tally/producer/v1", producer)
	b := make([]byte, 0, len(ks.prefix)+12+2*len(d))
	b = append(b, ks.prefix...)
	b = append(b, ":producer:{"...)
	b = d.AppendHex(b)
	b = append(b, '}')
	return string(b)
}

// ReplyKey holds what the last call of a caller's runs (Run) through
// script call slot chunk returned, for that call sent again to learn what
// it did. The caller id is hashed like producer ids are.
func (ks *KeySpace) ReplyKey(caller string, chunk int) string {
	d := plainSum("tally/reply/v1", caller)
	b := make([]byte, 0, len(ks.prefix)+16+2*len(d))
	b = append(b, ks.prefix...)
	b = append(b, ":reply:{"...)
	b = d.AppendHex(b)
	b = append(b, "}:"...)
	b = strconv.AppendInt(b, int64(chunk), 10)
	return string(b)
}

// FinishKey holds the finish marks of one holder's requests in one window
// (lua/finish.lua): under the window's hash tag, with the holder hashed
// and the window named by its reset (ms).
func (ks *KeySpace) FinishKey(d Digest, holder string, reset int64) string {
	h := plainSum("tally/holder/v1", holder)
	b := make([]byte, 0, len(ks.prefix)+60)
	b = append(b, ks.prefix...)
	b = append(b, ":fin:{"...)
	b = d.AppendHex(b)
	b = append(b, "}:"...)
	b = hex.AppendEncode(b, h[:8])
	b = append(b, ':')
	b = strconv.AppendInt(b, reset, 10)
	return string(b)
}

// LeaseKey is the lease of the accountant that applies one shard's events.
// Shard names are validated configuration ([a-z0-9_-]).
func (ks *KeySpace) LeaseKey(shardName string) string {
	return ks.prefix + ":lease:" + shardName
}

// EpochKey is a shard primary's epoch record: which primary the shard's
// windows were last reseeded for (lua/epoch.lua). ReseedKey is the marker that
// exists while a reseed of the shard is in progress.
func (ks *KeySpace) EpochKey() string { return ks.prefix + ":epoch" }

// RefillKey is when a shard's primary last began a reseed (lua/epoch.lua),
// ms since the Unix epoch: a token bucket that has no record of what it
// spent is taken as emptied then (lua/take.lua's bucket).
func (ks *KeySpace) RefillKey() string { return ks.refillKey }

// ReseedKey: see EpochKey.
func (ks *KeySpace) ReseedKey() string { return ks.reseedKey }

// SharedSecretKey is the key, on the first shard's primary, that holds the
// key secret every tally serve started with envoyproxy/ratelimit's settings
// and no TALLY_KEY_SECRET shares (internal/serve). It is named by the
// prefix alone: no KeySpace exists before the secret is known.
func SharedSecretKey(prefix string) string { return prefix + ":shared:key-secret" }

// FormatKey is a shard primary's window format record: "compact" once every
// process of the deployment reads compact windows (lua/window.lua,
// docs/windows.md).
func (ks *KeySpace) FormatKey() string { return ks.prefix + ":windows" }

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
