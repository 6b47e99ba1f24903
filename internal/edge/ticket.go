package edge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"hash"
	"strings"
	"time"

	"github.com/tallyhq/tally/internal/credit"
	"github.com/tallyhq/tally/internal/limiter"
)

// A ticket is the request_id the decision API hands out: what /v1/finish
// needs to finish the request (and give a 304's charge back), so that any
// edge of the deployment can take it. It is a compact binary record,
// base64url without padding, signed with a key derived from the key secret
// (HMAC-SHA256, 128 bits) so that nobody can forge one:
//
//	version 2 | flags | shard | key digest (16) | cost | reset ms | start ms |
//	request number | n | policy name | producer | holder number | [charge seq]
//
// integers as uvarints, strings length-prefixed. Flags: 1 the window was
// known (decided), 2 charged by an accounting event (else by a
// reservation). The request was the n-th admission (from 0) of the edge's
// holder <producer>.<holder number, base 36> in its window: where its finish
// is marked (lua/finish.lua), so that it is finished once.
//
// A ticket has one spelling: a string that decodes to a valid ticket but is
// not exactly what encoding it gives (base64's unused bits set, line breaks,
// padding) is refused, so that one ticket cannot pass as many.

const (
	ticketVersion  = 2
	flagDecided    = 1
	flagEvent      = 2
	maxTicketLen   = 1024
	ticketKeyLabel = "tally/ticket/v1"
)

var b64 = base64.RawURLEncoding

var errBadTicket = errors.New("not a request id issued by this deployment")

// appendTicket appends v's ticket to dst: the payload, base64url, a dot and
// its signature. It allocates nothing when dst has room.
func (s *Server) appendTicket(dst []byte, v credit.Verdict) []byte {
	var raw [192]byte
	b := raw[:0]
	var flags byte
	if v.Decided {
		flags |= flagDecided
	}
	if v.ChargeSeq != 0 {
		flags |= flagEvent
	}
	b = append(b, ticketVersion, flags)
	b = binary.AppendUvarint(b, uint64(v.Shard))
	dg := v.Key.Digest()
	b = append(b, dg[:]...)
	b = binary.AppendUvarint(b, uint64(v.Cost))
	b = binary.AppendUvarint(b, unixMilli(v.Reset))
	b = binary.AppendUvarint(b, uint64(v.Now.UnixMilli()))
	b = binary.AppendUvarint(b, v.ReqNum)
	b = binary.AppendUvarint(b, v.N)
	b = append(b, byte(len(v.Policy.Name)))
	b = append(b, v.Policy.Name...)
	b = append(b, byte(len(v.Producer)))
	b = append(b, v.Producer...)
	b = binary.AppendUvarint(b, v.HolderNum)
	if v.ChargeSeq != 0 {
		b = binary.AppendUvarint(b, v.ChargeSeq)
	}
	start := len(dst)
	dst = b64.AppendEncode(dst, b)
	sig := s.mac(dst[start:])
	dst = append(dst, '.')
	return b64.AppendEncode(dst, sig[:])
}

// macState is a keyed HMAC-SHA256 and room for its sum, pooled: a ticket is
// made per allowed request.
type macState struct {
	h   hash.Hash
	sum [sha256.Size]byte
}

// mac is the ticket's signature: HMAC-SHA256 with the ticket key, its first
// 128 bits.
func (s *Server) mac(payload []byte) (sig [16]byte) {
	m, _ := s.macs.Get().(*macState)
	if m == nil {
		m = &macState{h: hmac.New(sha256.New, s.ticketKey)}
	}
	m.h.Reset()
	m.h.Write(payload)
	copy(sig[:], m.h.Sum(m.sum[:0]))
	s.macs.Put(m)
	return sig
}

// readTicket verifies a ticket and rebuilds the credit.Verdict its finish needs.
func (s *Server) readTicket(t string) (credit.Verdict, error) {
	i := strings.LastIndexByte(t, '.')
	if len(t) > maxTicketLen || i < 0 {
		return credit.Verdict{}, errBadTicket
	}
	sig, err := b64.DecodeString(t[i+1:])
	if err != nil || len(sig) != 16 || b64.EncodeToString(sig) != t[i+1:] || !macEqual(sig, s.mac([]byte(t[:i]))) {
		return credit.Verdict{}, errBadTicket
	}
	b, err := b64.DecodeString(t[:i])
	if err != nil || len(b) < 2 || b[0] != ticketVersion || b64.EncodeToString(b) != t[:i] {
		return credit.Verdict{}, errBadTicket
	}
	r := ticketReader{b: b[2:]}
	flags := b[1]
	shard := r.uvarint()
	var dg limiter.Digest
	copy(dg[:], r.bytes(16))
	cost, reset, start := r.uvarint(), r.uvarint(), r.uvarint()
	var v credit.Verdict
	v.ReqNum = r.uvarint()
	v.N = r.uvarint()
	name := string(r.bytes(int(r.byte())))
	v.Producer = string(r.bytes(int(r.byte())))
	v.HolderNum = r.uvarint()
	if flags&flagEvent != 0 {
		v.ChargeSeq = r.uvarint()
	}
	p, ok := s.limits.Load().policies[name]
	if r := s.rls.Load(); !ok && r != nil {
		p, ok = r.held[name] // a concurrency rule of the rate-limit service
	}
	if r.bad || len(r.b) != 0 || flags&^(flagDecided|flagEvent) != 0 || shard >= uint64(s.o.Store.Shards()) || !ok ||
		cost < 1 || cost > limiter.MaxLimit || !limiter.ValidProducer(v.Producer) || (flags&flagEvent != 0 && v.ChargeSeq == 0) ||
		(flags&flagDecided != 0) != (reset != 0) || reset > limiter.MaxMS || start > limiter.MaxMS {
		return credit.Verdict{}, errBadTicket
	}
	p.Cost = int64(cost)
	v.Policy, v.Cost, v.Key, v.Shard = p, int64(cost), s.o.Keys.KeyOf(dg), int(shard)
	v.Now, v.Decided = time.UnixMilli(int64(start)), flags&flagDecided != 0
	if v.Decided {
		v.Reset, v.Decision.Allowed = time.UnixMilli(int64(reset)), true
	}
	return v, nil
}

// unixMilli is t in Unix milliseconds; 0 for the zero time (no window).
func unixMilli(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMilli())
}

type ticketReader struct {
	b   []byte
	bad bool
}

func (r *ticketReader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.bad = true
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *ticketReader) byte() byte {
	if len(r.b) < 1 {
		r.bad = true
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *ticketReader) bytes(n int) []byte {
	if len(r.b) < n {
		r.bad = true
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// macEqual compares a signature read from a ticket with the one it should
// have, in constant time.
func macEqual(got []byte, want [16]byte) bool { return hmac.Equal(got, want[:]) }
