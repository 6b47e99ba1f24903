package edge

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/tallyhq/tally/internal/descriptors"
	"github.com/tallyhq/tally/internal/limiter"
	"github.com/tallyhq/tally/internal/shard"
)

// The key contract's test vectors (docs/keys.md) are checked against the
// code that makes keys: the edge's identities, the key space's digests and
// Redis keys, shard placement. With -update the file is written from the
// inputs instead; a change of any output is then a change of contract
// (every client's window moves) and shows in review as such.
var updateVectors = flag.Bool("update", false, "rewrite docs/keys.vectors.json from its inputs")

const vectorsPath = "../../docs/keys.vectors.json"

// KeyVectors is the shape of docs/keys.vectors.json.
type KeyVectors struct {
	About      string           `json:"about"`
	SecretHex  string           `json:"secret_hex"`
	Prefix     string           `json:"prefix"`
	KeyID      string           `json:"key_id"`
	Identities []IdentityVector `json:"identities"`
	ShardSets  [][]string       `json:"shard_sets"`
	Windows    []WindowVector   `json:"windows"`
	RLSRules   []RLSRuleVector  `json:"rls_rules"`
}

// IdentityVector is one request's identity, by source: "header" (the
// identity header's value), "address" (no identity header: the client's
// address), "api" (the decision API's identity field), "descriptors"
// (Envoy's rate-limit service).
type IdentityVector struct {
	Source     string              `json:"source"`
	Header     string              `json:"header,omitempty"`
	Value      string              `json:"value,omitempty"`
	Address    string              `json:"address,omitempty"`
	IPv4Prefix int                 `json:"ipv4_prefix,omitempty"`
	IPv6Prefix int                 `json:"ipv6_prefix,omitempty"`
	Domain     string              `json:"domain,omitempty"`
	Entries    []descriptors.Entry `json:"entries,omitempty"`
	// Identity is the result when it is valid UTF-8; IdentityHex always.
	Identity    string `json:"identity,omitempty"`
	IdentityHex string `json:"identity_hex"`
}

// WindowVector is one window key: the digest of an identity under a
// policy, its Redis key, the 64-bit hash placement uses, and its shard in
// each of the shard sets.
type WindowVector struct {
	Policy      string   `json:"policy"`
	IdentityHex string   `json:"identity_hex"`
	Digest      string   `json:"digest"`
	RedisKey    string   `json:"redis_key"`
	KeyHash     string   `json:"key_hash"`
	Shards      []string `json:"shards"`
}

// RLSRuleVector is the policy name a descriptor rule's full key counts
// under.
type RLSRuleVector struct {
	RuleKey string `json:"rule_key"`
	Policy  string `json:"policy"`
}

func TestKeyVectors(t *testing.T) {
	raw, err := os.ReadFile(vectorsPath)
	require.NoError(t, err)
	var v KeyVectors
	require.NoError(t, json.Unmarshal(raw, &v))
	require.NotEmpty(t, v.Identities)
	require.NotEmpty(t, v.ShardSets)

	secret, err := hex.DecodeString(v.SecretHex)
	require.NoError(t, err)
	ks, err := limiter.NewKeySpace(v.Prefix, secret)
	require.NoError(t, err)
	got := v
	got.KeyID = ks.KeyID()
	got.Identities = make([]IdentityVector, len(v.Identities))
	got.Windows = nil
	for i, iv := range v.Identities {
		id := identityOf(t, iv)
		iv.IdentityHex = hex.EncodeToString([]byte(id))
		iv.Identity = ""
		if utf8.ValidString(id) {
			iv.Identity = id
		}
		got.Identities[i] = iv
		got.Windows = append(got.Windows, window(ks, v.ShardSets, "core", id))
	}
	// More windows: other policies, long and non-ASCII identities, and
	// enough of them that every shard of every set is someone's.
	for _, id := range []string{"h:" + strings.Repeat("k", 200), "h:ünïcødé", "h:"} {
		got.Windows = append(got.Windows, window(ks, v.ShardSets, "search", id))
	}
	for n := range 16 {
		got.Windows = append(got.Windows, window(ks, v.ShardSets, "core", limiter.APIIdentity("user-"+strconv.Itoa(n))))
	}
	got.RLSRules = make([]RLSRuleVector, len(v.RLSRules))
	for i, r := range v.RLSRules {
		got.RLSRules[i] = RLSRuleVector{RuleKey: r.RuleKey, Policy: rlsPolicyName(r.RuleKey)}
		got.Windows = append(got.Windows, window(ks, v.ShardSets, got.RLSRules[i].Policy,
			limiter.DescriptorIdentity(descriptors.Counter("api", []descriptors.Entry{{Key: "remote_address", Value: "192.0.2.1"}}))))
	}

	if *updateVectors {
		b, err := json.MarshalIndent(got, "", "  ")
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(vectorsPath, append(b, '\n'), 0o644))
		return
	}
	require.Equal(t, got.KeyID, v.KeyID, "key id")
	for i := range v.Identities {
		require.Equal(t, got.Identities[i], v.Identities[i], "identity %d", i)
	}
	require.Equal(t, got.RLSRules, v.RLSRules)
	require.Equal(t, len(got.Windows), len(v.Windows), "windows")
	for i := range got.Windows {
		require.Equal(t, got.Windows[i], v.Windows[i], "window %d", i)
	}
	// Placement spreads: every shard of every set holds some window.
	for s, names := range v.ShardSets {
		held := map[string]bool{}
		for _, w := range v.Windows {
			held[w.Shards[s]] = true
		}
		require.Len(t, held, len(names), "shard set %v", names)
	}
}

// identityOf runs a vector's inputs through the edge's own code.
func identityOf(t *testing.T, iv IdentityVector) string {
	t.Helper()
	switch iv.Source {
	case "header", "address":
		id := Identifier{Header: iv.Header, IPv4Prefix: iv.IPv4Prefix, IPv6Prefix: iv.IPv6Prefix}
		if id.IPv4Prefix == 0 {
			id.IPv4Prefix = 32
		}
		if id.IPv6Prefix == 0 {
			id.IPv6Prefix = 64
		}
		r, err := http.NewRequest(http.MethodGet, "http://api.example/", nil)
		require.NoError(t, err)
		r.RemoteAddr = "192.0.2.200:40000"
		if iv.Address != "" {
			r.RemoteAddr = "[" + iv.Address + "]:40000"
		}
		if iv.Source == "header" {
			r.Header.Set(iv.Header, iv.Value)
		}
		s, err := id.Identity(r)
		require.NoError(t, err)
		return s
	case "api":
		return limiter.APIIdentity(iv.Value)
	case "descriptors":
		return limiter.DescriptorIdentity(descriptors.Counter(iv.Domain, iv.Entries))
	}
	t.Fatalf("unknown source %q", iv.Source)
	return ""
}

func window(ks *limiter.KeySpace, sets [][]string, policy, identity string) WindowVector {
	k := ks.Key(policy, identity)
	w := WindowVector{Policy: policy, IdentityHex: hex.EncodeToString([]byte(identity)), Digest: k.Digest().String(),
		RedisKey: k.String(), KeyHash: strconv.FormatUint(k.Hash(), 10)}
	for _, names := range sets {
		w.Shards = append(w.Shards, names[shard.NewMap(names).Pick(k.Hash())])
	}
	return w
}
