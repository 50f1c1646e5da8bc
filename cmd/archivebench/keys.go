package main

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"time"
)

// The key shapes the bench loads. Scoped keys are about 40 bytes, as the
// middleware stores them with SingleTenant ("idem:v1:" + the client's key):
// a ULID is 34 bytes scoped, a UUIDv7 44, a plain key 40.
const (
	shapeULID = iota
	shapeUUIDv7
	shapePlain
	shapes
)

const scopePrefix = "idem:v1:"

// keyGen makes keys from a seeded generator, so that two runs load the same
// shapes in the same proportions.
type keyGen struct{ r *rand.Rand }

func newKeyGen(seed uint64) *keyGen {
	return &keyGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// key returns a scoped key of the given shape minted at t.
func (g *keyGen) key(shape int, t time.Time) string {
	switch shape {
	case shapeULID:
		return scopePrefix + g.ulid(t)
	case shapeUUIDv7:
		return scopePrefix + g.uuidV7(t)
	default:
		return scopePrefix + g.plain()
	}
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// timed is 128 bits: t's 48 bits of milliseconds, then 80 random bits.
func (g *keyGen) timed(t time.Time) [16]byte {
	var b [16]byte
	ms := uint64(t.UnixMilli())
	for i := 0; i < 6; i++ {
		b[i] = byte(ms >> (40 - 8*i))
	}
	binary.BigEndian.PutUint64(b[6:14], g.r.Uint64())
	binary.BigEndian.PutUint16(b[14:], uint16(g.r.Uint32()))
	return b
}

// ulid is a canonical ULID: 48 bits of milliseconds, 80 random bits, in 26
// Crockford base32 characters.
func (g *keyGen) ulid(t time.Time) string {
	b := g.timed(t)
	hi := binary.BigEndian.Uint64(b[:8])
	lo := binary.BigEndian.Uint64(b[8:])
	var out [26]byte
	// 128 bits in 26 characters: the first carries the top 3 bits.
	for i := 25; i >= 0; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | hi<<59
		hi >>= 5
	}
	return string(out[:])
}

// uuidV7 is an RFC 9562 version 7 UUID for t.
func (g *keyGen) uuidV7(t time.Time) string {
	b := g.timed(t)
	b[6] = b[6]&0x0f | 0x70
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

// uuidV4 is a random (version 4) UUID: no timestamp.
func (g *keyGen) uuidV4() string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], g.r.Uint64())
	binary.BigEndian.PutUint64(b[8:], g.r.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return formatUUID(b)
}

func formatUUID(b [16]byte) string {
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// plain is a key without a timestamp: "ord_" and 28 hex digits (32
// characters, neither a ULID's 26 nor a UUID's 36).
func (g *keyGen) plain() string {
	var b [14]byte
	binary.BigEndian.PutUint64(b[:8], g.r.Uint64())
	binary.BigEndian.PutUint32(b[8:12], g.r.Uint32())
	binary.BigEndian.PutUint16(b[12:], uint16(g.r.Uint32()))
	return "ord_" + hex.EncodeToString(b[:])
}

// resourceID is a charge id like the demo API's: "ch_" and 24 hex digits.
func (g *keyGen) resourceID() string {
	var b [12]byte
	binary.BigEndian.PutUint64(b[:8], g.r.Uint64())
	binary.BigEndian.PutUint32(b[8:], g.r.Uint32())
	return "ch_" + hex.EncodeToString(b[:])
}

// fingerprint is 32 random bytes, as a SHA-256 digest looks.
func (g *keyGen) fingerprint() []byte {
	b := make([]byte, 32)
	for i := 0; i < 32; i += 8 {
		binary.BigEndian.PutUint64(b[i:], g.r.Uint64())
	}
	return b
}
