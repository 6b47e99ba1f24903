package client

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/shard"
)

// Keys computes window keys and their shards as every Tally process of a
// deployment does: with the deployment's key prefix and secret
// (TALLY_KEY_SECRET) and its shards' names. It is safe for concurrent use.
type Keys struct {
	ks     *limiter.KeySpace
	shards []string
	place  *shard.Map
}

// Window is one rate-limit window's address: the digest events carry in
// place of the identity, and the shard that counts it.
type Window struct {
	// Digest is the window key's digest: 32 lower-case hex digits.
	Digest string
	// Shard is the name of the shard that owns the window.
	Shard string
}

// NewKeys returns the key space of a deployment: its key prefix ("tally"
// unless configured otherwise), its key secret (the bytes, at least 32)
// and the names of its shards (redis.shards[].name, in any order).
func NewKeys(prefix string, secret []byte, shards []string) (*Keys, error) {
	ks, err := limiter.NewKeySpace(prefix, secret)
	if err != nil {
		return nil, err
	}
	if len(shards) == 0 {
		return nil, errors.New("client: no shards")
	}
	seen := map[string]bool{}
	for _, s := range shards {
		if seen[s] {
			return nil, fmt.Errorf("client: shard %q named twice", s)
		}
		seen[s] = true
	}
	return &Keys{ks: ks, shards: append([]string(nil), shards...), place: shard.NewMap(shards)}, nil
}

// KeyID names the secret without revealing it; events carry it.
func (k *Keys) KeyID() string { return k.ks.KeyID() }

// Window is the window of an identity (one of the Identity functions'
// results) under a policy.
func (k *Keys) Window(policy, identity string) Window {
	d := k.ks.Sum(policy, identity)
	return Window{Digest: d.String(), Shard: k.shards[k.place.Pick(d.Hash())]}
}

// HeaderIdentity is the identity an edge reads from its identity header
// (edge.identity.header) when the header has value v; "" when nothing is
// left of v once normalised (the edge then keys the request by address).
func HeaderIdentity(header, v string) string { return limiter.HeaderIdentity(header, v) }

// AddressIdentity is the identity an edge gives a request without an
// identity header from client address a, grouped by the edge's prefixes
// (edge.identity.ipv4_prefix and ipv6_prefix: 32 and 64 by default).
func AddressIdentity(a netip.Addr, ipv4Bits, ipv6Bits int) string {
	return limiter.AddressIdentity(limiter.GroupAddress(a, ipv4Bits, ipv6Bits))
}

// APIIdentity is the identity the decision API counts a check's identity
// field under: pass HeaderIdentity's value without its "h:" to share the
// window of requests the edge keys by that header.
func APIIdentity(identity string) string { return limiter.APIIdentity(identity) }
