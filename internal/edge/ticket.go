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

func (s *Server) ticket(v verdict) string {
	b := make([]byte, 0, 128)
	var flags byte
	if v.decided {
		flags |= flagDecided
	}
	if v.chargeSeq != 0 {
		flags |= flagEvent
	}
	b = append(b, ticketVersion, flags)
	b = binary.AppendUvarint(b, uint64(v.shard))
	dg := v.key.Digest()
	b = append(b, dg[:]...)
	b = binary.AppendUvarint(b, uint64(v.cost))
	b = binary.AppendUvarint(b, uint64(v.reset))
	b = binary.AppendUvarint(b, uint64(v.now.UnixMilli()))
	b = binary.AppendUvarint(b, v.reqNum)
	b = binary.AppendUvarint(b, v.n)
	b = append(b, byte(len(v.policy.Name)))
	b = append(b, v.policy.Name...)
	b = append(b, byte(len(v.producer)))
	b = append(b, v.producer...)
	b = binary.AppendUvarint(b, v.holderNum)
	if v.chargeSeq != 0 {
		b = binary.AppendUvarint(b, v.chargeSeq)
	}
	out := make([]byte, 0, b64.EncodedLen(len(b))+1+b64.EncodedLen(16))
	out = b64.AppendEncode(out, b)
	mac := s.mac(out)
	out = append(out, '.')
	out = b64.AppendEncode(out, mac[:16])
	return string(out)
}

// mac is the ticket's signature: HMAC-SHA256 with the ticket key, 128
// bits. The keyed hashes are pooled: a ticket is made per allowed request.
func (s *Server) mac(payload []byte) []byte {
	m, _ := s.macs.Get().(hash.Hash)
	if m == nil {
		m = hmac.New(sha256.New, s.ticketKey)
	}
	m.Reset()
	m.Write(payload)
	sum := m.Sum(nil)
	s.macs.Put(m)
	return sum
}

// readTicket verifies a ticket and rebuilds the verdict its finish needs.
func (s *Server) readTicket(t string) (verdict, error) {
	i := strings.LastIndexByte(t, '.')
	if len(t) > maxTicketLen || i < 0 {
		return verdict{}, errBadTicket
	}
	sig, err := b64.DecodeString(t[i+1:])
	if err != nil || len(sig) != 16 || b64.EncodeToString(sig) != t[i+1:] || !hmac.Equal(sig, s.mac([]byte(t[:i]))[:16]) {
		return verdict{}, errBadTicket
	}
	b, err := b64.DecodeString(t[:i])
	if err != nil || len(b) < 2 || b[0] != ticketVersion || b64.EncodeToString(b) != t[:i] {
		return verdict{}, errBadTicket
	}
	r := ticketReader{b: b[2:]}
	flags := b[1]
	shard := r.uvarint()
	var dg limiter.Digest
	copy(dg[:], r.bytes(16))
	cost, reset, start := r.uvarint(), r.uvarint(), r.uvarint()
	var v verdict
	v.reqNum = r.uvarint()
	v.n = r.uvarint()
	name := string(r.bytes(int(r.byte())))
	v.producer = string(r.bytes(int(r.byte())))
	v.holderNum = r.uvarint()
	if flags&flagEvent != 0 {
		v.chargeSeq, v.chargeProducer = r.uvarint(), v.producer
	}
	p, ok := s.o.Policies[name]
	if r.bad || len(r.b) != 0 || flags&^(flagDecided|flagEvent) != 0 || shard >= uint64(s.o.Store.Shards()) || !ok ||
		cost < 1 || cost > uint64(p.Limit) || !limiter.ValidProducer(v.producer) || (flags&flagEvent != 0 && v.chargeSeq == 0) ||
		(flags&flagDecided != 0) != (reset != 0) || reset > limiter.MaxMS || start > limiter.MaxMS {
		return verdict{}, errBadTicket
	}
	p.Cost = int64(cost)
	v.policy, v.cost, v.key, v.shard = p, int64(cost), s.o.Keys.KeyOf(dg), int(shard)
	v.now, v.reset, v.decided = time.UnixMilli(int64(start)), int64(reset), flags&flagDecided != 0
	if v.decided {
		v.decision.Allowed = true
	}
	return v, nil
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
