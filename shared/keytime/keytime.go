// Package keytime reads the creation time that ULID and UUIDv7 idempotency keys
// carry, and decides from it whether an archive lookup can be skipped.
//
// A key's timestamp is read from the last ':'-separated segment of the scoped
// key (for "idem:v1:01JD..." that is the client's key itself), which must be a
// canonical ULID (26 Crockford base32 characters) or a UUID of version 7 (36
// characters, hyphenated). Anything else has no timestamp.
//
// The skip rule: a key's archive lookup may be skipped only when its timestamp
// lies within [now - liveTTL + margin, now + clockSkew]. Such a key was minted
// too recently to have expired, so the archive cannot hold it. A key without a
// timestamp, or one further in the future than the allowed skew (a broken
// clock or a forged key), is always looked up.
package keytime

import (
	"cmp"
	"errors"
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

// SkipRule decides when an archive lookup may be skipped.
type SkipRule struct {
	// LiveTTL is how long the live store keeps a key. Required.
	LiveTTL time.Duration
	// Margin is subtracted from LiveTTL to absorb clock differences between the
	// clients that mint keys and the servers that expire them. It must be at
	// least ClockSkew and less than LiveTTL. Default: 2 × ClockSkew.
	Margin time.Duration
	// ClockSkew is how far in the future a key's timestamp may lie before the
	// key is treated as untrustworthy. Default 5 minutes.
	ClockSkew time.Duration
}

// WithDefaults returns r with zero fields set to their defaults.
func (r SkipRule) WithDefaults() SkipRule {
	r.ClockSkew = cmp.Or(r.ClockSkew, 5*time.Minute)
	r.Margin = cmp.Or(r.Margin, 2*r.ClockSkew)
	return r
}

// Validate reports a rule that could skip a lookup that was needed.
func (r SkipRule) Validate() error {
	switch {
	case r.LiveTTL <= 0:
		return errors.New("live TTL must be positive")
	case r.ClockSkew < 0:
		return errors.New("clock skew must not be negative")
	case r.Margin < r.ClockSkew:
		return errors.New("skip margin must be at least the allowed clock skew, or a key minted by a fast clock could skip a lookup it needs")
	case r.Margin >= r.LiveTTL:
		return errors.New("skip margin must be shorter than the live TTL")
	}
	return nil
}

// NeedsLookup reports whether the archive must be consulted for key at now.
func (r SkipRule) NeedsLookup(key string, now time.Time) bool {
	ts, ok := FromKey(key)
	if !ok {
		return true
	}
	oldestSkippable := now.Add(-r.LiveTTL + r.Margin)
	newestSkippable := now.Add(r.ClockSkew)
	return ts.Before(oldestSkippable) || ts.After(newestSkippable)
}
