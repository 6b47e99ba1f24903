package descriptors

import (
	"encoding/binary"
	"strings"
)

// Entry is one (key, value) of a request's descriptor.
type Entry struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Match is the rule a descriptor falls under.
type Match struct {
	// Rule limits the descriptor; nil when none does.
	Rule *Rule
	// Counter is what the descriptor counts under within its rule: the
	// domain and its entries' keys and values (a value matched by a
	// share_threshold wildcard replaced by the pattern), each length-
	// prefixed so that no two lists of entries share one.
	Counter string
}

// Known reports whether the configuration has domain.
func (c *Config) Known(domain string) bool { return c.domains[domain] != nil }

// Match finds the rule of one descriptor of a request for domain, as
// envoyproxy/ratelimit's GetLimit does: entry by entry, key_value first,
// then the first wildcard that matches, then the key alone; the rule is the
// one the last entry lands on. An unknown domain, or a descriptor that no
// rule ends on, matches nothing.
func (c *Config) Match(domain string, entries []Entry) Match {
	n := c.domains[domain]
	if n == nil || len(entries) == 0 {
		return Match{}
	}
	var rule *Rule
	var shared []string // the pattern a share_threshold wildcard counts entry i under
	for i, e := range entries {
		kv := e.Key + "_" + e.Value
		next := n.children[kv]
		if next == nil {
			for _, w := range n.wildcards {
				if wildcardMatch(w.parts, kv) {
					next = n.children[w.key]
					if next.share {
						if shared == nil {
							shared = make([]string, len(entries))
						}
						shared[i] = strings.TrimPrefix(next.pattern, e.Key+"_")
					}
					break
				}
			}
		}
		if next == nil {
			next = n.children[e.Key]
		}
		if next != nil && next.rule != nil && i == len(entries)-1 {
			rule = next.rule
		}
		if next == nil || len(next.children) == 0 {
			break
		}
		n = next
	}
	if rule == nil {
		return Match{}
	}
	return Match{Rule: rule, Counter: counter(domain, entries, shared)}
}

// Counter is what a descriptor of domain with entries counts under when
// nothing is shared: Match.Counter's encoding.
func Counter(domain string, entries []Entry) string { return counter(domain, entries, nil) }

// counter encodes domain and entries unambiguously.
func counter(domain string, entries []Entry, shared []string) string {
	size := len(domain) + binary.MaxVarintLen64
	for _, e := range entries {
		size += len(e.Key) + len(e.Value) + 2*binary.MaxVarintLen64
	}
	b := make([]byte, 0, size)
	b = binary.AppendUvarint(b, uint64(len(domain)))
	b = append(b, domain...)
	for i, e := range entries {
		v := e.Value
		if shared != nil && shared[i] != "" {
			v = shared[i]
		}
		b = binary.AppendUvarint(b, uint64(len(e.Key)))
		b = append(b, e.Key...)
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return string(b)
}

// wildcardMatch reports whether value matches a pattern split at its
// stars: each * stands for any run of characters, none included.
func wildcardMatch(parts []string, value string) bool {
	if len(parts) == 1 {
		return parts[0] == value
	}
	first, last := parts[0], parts[len(parts)-1]
	if !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) || len(value) < len(first)+len(last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return true
}
