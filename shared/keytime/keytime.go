// Package keytime reads the creation time that ULID and UUIDv7 idempotency keys
// carry, and states the invariant that lets that time spare work safely.
//
// A key's timestamp is read from the last ':'-separated segment of the scoped
// key (for "idem:v1:01JD..." that is the client's key itself), which must be a
// canonical ULID (26 Crockford base32 characters) or a UUID of version 7 (36
// characters, hyphenated). Anything else has no timestamp.
//
// # The invariant
//
// A timestamp is the client's claim, made with the client's clock. It is
// trusted only as far as the live store enforces it: every registration of a
// key happens at a time registered (the store's clock) with
//
//	minted <= registered + skew
//
// where skew is the writer's configured clock skew, at most MaxClockSkew. A
// key whose timestamp lies further ahead is refused at registration (the
// middleware answers it from the archive when the archive holds it, else 400
// idempotency_key_timestamp_ahead) and is never stored. A clock that runs
// slow needs no bound: an old timestamp only makes the key look older.
//
// Two shortcuts rest on it:
//
//   - Pruning. An archived row of a key was registered at or after
//     minted - MaxClockSkew and expired after it was registered, so a lookup
//     reads only partitions with expired_at >= minted - MaxClockSkew, however
//     far the key's timestamp lies in the past or the future.
//   - Skipping. With the Postgres live store, a fresh key needs no archive
//     lookup when no earlier registration of it can have expired yet: every
//     writer records the (TTL, skew) it uses and the time it used it (the
//     idempotency_writers table), and a registration by a writer with
//     (ttl, skew) cannot have expired before minted - skew + ttl. The store
//     skips only when that time is still ahead for every writer that could
//     have registered the key; a raised TTL, two TTLs during a rolling
//     deploy and a client clock hours fast are all covered, with no setting
//     to keep in step. A key without a timestamp is always looked up.
//
// Keys registered before writers recorded their bounds carry no bound:
// while such a writer is on record, every key is looked up and every
// partition read. A store that writes archive rows at completion (Redis) can
// hold a fresh key in the archive at once, so it never skips.
package keytime

import (
	"fmt"
	"strings"
	"time"
)

// FromKey returns the timestamp embedded in the last ':'-separated segment of
// key, and whether there was one.
func FromKey(key string) (time.Time, bool) {
	if i := strings.LastIndexByte(key, ':'); i >= 0 {
		key = key[i+1:]
	}
	switch len(key) {
	case 26:
		return fromULID(key)
	case 36:
		return fromUUIDv7(key)
	}
	return time.Time{}, false
}

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

var crockfordValue = func() (t [256]int8) {
	for i := range t {
		t[i] = -1
	}
	for i := 0; i < len(crockford); i++ {
		t[crockford[i]] = int8(i)
		t[crockford[i]|0x20] = int8(i) // lower case
	}
	return t
}()

// fromULID decodes the 48-bit millisecond timestamp of a ULID: its first ten
// characters. Every character must be valid Crockford base32, and the first at
// most '7' (a ULID is 128 bits; 26 characters hold 130).
func fromULID(s string) (time.Time, bool) {
	var ms uint64
	for i := 0; i < len(s); i++ {
		v := crockfordValue[s[i]]
		if v < 0 {
			return time.Time{}, false
		}
		if i < 10 {
			ms = ms<<5 | uint64(v)
		}
	}
	if crockfordValue[s[0]] > 7 {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(ms)).UTC(), true
}

// fromUUIDv7 decodes the 48-bit millisecond timestamp of a version 7 UUID
// (RFC 9562): the first 12 hex digits. The version nibble must be 7 and the
// variant bits 10.
func fromUUIDv7(s string) (time.Time, bool) {
	if s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return time.Time{}, false
	}
	var ms uint64
	n := 0
	for i := 0; i < len(s); i++ {
		if i == 8 || i == 13 || i == 18 || i == 23 {
			continue
		}
		v, ok := hexValue(s[i])
		if !ok {
			return time.Time{}, false
		}
		if n < 12 {
			ms = ms<<4 | uint64(v)
		}
		n++
	}
	if s[14] != '7' {
		return time.Time{}, false
	}
	if variant, _ := hexValue(s[19]); variant&0xC != 0x8 {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(ms)).UTC(), true
}

func hexValue(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// DefaultClockSkew is how far ahead of the store's clock a key's timestamp may
// lie by default.
const DefaultClockSkew = 5 * time.Minute

// MaxClockSkew bounds every writer's clock skew, and so how far before its
// timestamp a key can have been registered: archive lookups read from
// minted - MaxClockSkew on.
const MaxClockSkew = time.Hour

// ValidateSkew reports a clock skew no writer may use.
func ValidateSkew(skew time.Duration) error {
	if skew < 0 || skew > MaxClockSkew {
		return fmt.Errorf("clock skew must be between 0 and %s, got %s", MaxClockSkew, skew)
	}
	return nil
}

// Ahead reports whether key's timestamp lies further ahead of now than skew
// allows, with the timestamp. A key without a timestamp is never ahead.
func Ahead(key string, now time.Time, skew time.Duration) (time.Time, bool) {
	ts, ok := FromKey(key)
	return ts, ok && ts.After(now.Add(skew))
}
