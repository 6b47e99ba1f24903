#!/usr/bin/env python3
"""Check an implementation of Tally's key contract against its test vectors.

This is docs/keys.md written in Python with nothing but the standard library:
identities from each source, window digests and Redis keys, shard placement,
rate-limit-service policy names and the key id. It reads the vectors Tally's
Go tests check (docs/keys.vectors.json), computes every result from the
inputs, and exits 1 naming each difference.

    python3 examples/python/check_keys.py docs/keys.vectors.json

A service in another language that publishes accounting events copies these
functions: window_digest() and shard_of() are what it needs to address an
event to the right window on the right shard.
"""

import hashlib
import hmac
import ipaddress
import json
import sys

MASK64 = (1 << 64) - 1


def uvarint(n):
    """Unsigned LEB128, as Go's binary.AppendUvarint writes it."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def normalise_credential(header, value):
    """The identity header's value as one identity: no surrounding spaces or
    tabs; for Authorization and Proxy-Authorization, the scheme in lower case
    and single spaces between words."""
    value = value.strip(" \t")
    if header.lower() not in ("authorization", "proxy-authorization"):
        return value
    words = [w for w in value.replace("\t", " ").split(" ") if w]
    if not words:
        return ""
    words[0] = words[0].lower()
    return " ".join(words)


def address_identity(address, ipv4_prefix=32, ipv6_prefix=64):
    """A client address grouped by its prefix: "ip:" and the network."""
    ip = ipaddress.ip_address(address)
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    bits = ipv4_prefix if ip.version == 4 else ipv6_prefix
    bits = min(bits, ip.max_prefixlen)
    return "ip:" + str(ipaddress.ip_network(f"{ip}/{bits}", strict=False))


def header_identity(header, value, address, ipv4_prefix=32, ipv6_prefix=64):
    v = normalise_credential(header, value)
    if v:
        return ("h:" + v).encode()
    return address_identity(address, ipv4_prefix, ipv6_prefix).encode()


def api_identity(value):
    """The decision API's identity field, as given."""
    return ("h:" + value).encode()


def descriptor_identity(domain, entries):
    """An Envoy rate-limit descriptor: the domain, then each entry's key and
    value, every one preceded by its length in bytes."""
    b = bytearray(b"d:")
    b += uvarint(len(domain.encode())) + domain.encode()
    for e in entries:
        k, v = e["key"].encode(), e["value"].encode()
        b += uvarint(len(k)) + k + uvarint(len(v)) + v
    return bytes(b)


def window_digest(secret, policy, identity):
    """The first 16 bytes of HMAC-SHA256(secret, "tally/key/v1" ‖
    uvarint(len(policy)) ‖ policy ‖ uvarint(len(identity)) ‖ identity)."""
    p = policy.encode()
    msg = b"tally/key/v1" + uvarint(len(p)) + p + uvarint(len(identity)) + identity
    return hmac.new(secret, msg, hashlib.sha256).digest()[:16]


def key_id(secret):
    return hmac.new(secret, b"tally/key-id/v1", hashlib.sha256).digest()[:8].hex()


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for c in data:
        h ^= c
        h = (h * 0x100000001B3) & MASK64
    return h


def splitmix64(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK64
    x ^= x >> 31
    return x


def shard_of(digest, shard_names):
    """Rendezvous hashing: the shard whose name scores highest for the key
    (the first in the list on a tie)."""
    key_hash = int.from_bytes(digest[:8], "big")
    best, best_score = None, -1
    for name in shard_names:
        score = splitmix64(key_hash ^ fnv1a64(name.encode()))
        if score > best_score:
            best, best_score = name, score
    return best


def rls_policy(rule_key):
    """The policy a descriptor rule's full key counts under."""
    out = "rls."
    for c in rule_key.encode():
        if len(out) >= 47:
            break
        ch = chr(c)
        if "A" <= ch <= "Z":
            ch = ch.lower()
        elif not ("a" <= ch <= "z" or "0" <= ch <= "9" or ch in "_.-"):
            ch = "-"
        out += ch
    return out + "." + hashlib.sha256(rule_key.encode()).digest()[:4].hex()


def identity_of(v):
    src = v["source"]
    if src == "header":
        return header_identity(v["header"], v["value"], v.get("address", "192.0.2.200"),
                               v.get("ipv4_prefix", 32), v.get("ipv6_prefix", 64))
    if src == "address":
        return address_identity(v["address"], v.get("ipv4_prefix", 32), v.get("ipv6_prefix", 64)).encode()
    if src == "api":
        return api_identity(v["value"])
    if src == "descriptors":
        return descriptor_identity(v["domain"], v["entries"])
    raise ValueError("unknown source " + src)


def check(vectors):
    """Every difference between the vectors and this implementation."""
    bad = []
    secret = bytes.fromhex(vectors["secret_hex"])
    prefix = vectors["prefix"]
    if key_id(secret) != vectors["key_id"]:
        bad.append(f"key_id: got {key_id(secret)}, want {vectors['key_id']}")
    for i, v in enumerate(vectors["identities"]):
        got = identity_of(v).hex()
        if got != v["identity_hex"]:
            bad.append(f"identities[{i}] ({v['source']}): got {got}, want {v['identity_hex']}")
    for i, w in enumerate(vectors["windows"]):
        d = window_digest(secret, w["policy"], bytes.fromhex(w["identity_hex"]))
        got = {
            "digest": d.hex(),
            "redis_key": f"{prefix}:{{{d.hex()}}}",
            "key_hash": str(int.from_bytes(d[:8], "big")),
            "shards": [shard_of(d, names) for names in vectors["shard_sets"]],
        }
        for field, value in got.items():
            if value != w[field]:
                bad.append(f"windows[{i}].{field}: got {value}, want {w[field]}")
    for i, r in enumerate(vectors["rls_rules"]):
        if rls_policy(r["rule_key"]) != r["policy"]:
            bad.append(f"rls_rules[{i}]: got {rls_policy(r['rule_key'])}, want {r['policy']}")
    return bad


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "docs/keys.vectors.json"
    with open(path, encoding="utf-8") as f:
        vectors = json.load(f)
    bad = check(vectors)
    for line in bad:
        print(line, file=sys.stderr)
    n = 1 + len(vectors["identities"]) + len(vectors["windows"]) + len(vectors["rls_rules"])
    if bad:
        print(f"{len(bad)} of the key contract's checks failed", file=sys.stderr)
        sys.exit(1)
    print(f"key contract: {n} vectors agree ({path})")


if __name__ == "__main__":
    main()
