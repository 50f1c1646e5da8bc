package keytime

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ulidAt builds a canonical ULID whose timestamp is t and whose random part is
// fixed, so that the tests need no ULID library.
func ulidAt(t time.Time) string {
	ms := uint64(t.UnixMilli())
	var b strings.Builder
	for i := 9; i >= 0; i-- {
		b.WriteByte(crockford[(ms>>(5*uint(i)))&31])
	}
	return b.String() + "7ZZZZZZZZZZZZZZZ"
}

func uuidv7At(t time.Time) string {
	ms := uint64(t.UnixMilli())
	h := fmt.Sprintf("%012x", ms)
	return h[:8] + "-" + h[8:12] + "-7abc-9def-0123456789ab"
}

func TestFromKey(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 9, 30, 15, 123e6, time.UTC)
	cases := []struct {
		name string
		key  string
		want time.Time
		ok   bool
	}{
		{"ulid scoped", "idem:v1:" + ulidAt(at), at, true},
		{"ulid lower case", "idem:v1:" + strings.ToLower(ulidAt(at)), at, true},
		{"ulid bare", ulidAt(at), at, true},
		{"known ulid", "01ARZ3NDEKTSV4RRFFQ69G5FAV", time.UnixMilli(1469922850259).UTC(), true},
		{"uuidv7", "idem:v1:" + uuidv7At(at), at, true},
		{"uuidv7 upper case", "idem:v1:" + strings.ToUpper(uuidv7At(at)), at, true},
		{"uuidv4 has no time", "idem:v1:9b2e1c1e-3f7a-4c55-9d2b-6f0e8f1b2a3c", time.Time{}, false},
		{"uuidv7 wrong variant", "idem:v1:" + uuidv7At(at)[:19] + "c" + uuidv7At(at)[20:], time.Time{}, false},
		{"ulid overflow", "idem:v1:8" + ulidAt(at)[1:], time.Time{}, false},
		{"ulid bad alphabet (U)", "idem:v1:" + ulidAt(at)[:25] + "U", time.Time{}, false},
		{"ulid not last segment", "idem:v1:" + ulidAt(at) + ":x", time.Time{}, false},
		{"ulid with a prefix in the same segment", "idem:v1:order-" + ulidAt(at), time.Time{}, false},
		{"tenant-scoped ulid", "idem:v1:t=acme:" + ulidAt(at), at, true},
		{"plain key", "idem:v1:probe", time.Time{}, false},
		{"empty", "", time.Time{}, false},
		{"uuid misplaced hyphens", "idem:v1:" + strings.Replace(uuidv7At(at), "-", "", 1) + "-", time.Time{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := FromKey(tc.key)
			if ok != tc.ok || !got.Equal(tc.want) {
				t.Fatalf("FromKey(%q) = %v, %v; want %v, %v", tc.key, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestAheadEdges(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	skew := 5 * time.Minute
	newest := now.Add(skew) // the last instant a key may carry
	ms := time.Millisecond  // key timestamps have millisecond resolution
	cases := []struct {
		name  string
		key   string
		ahead bool
	}{
		{"no timestamp is never ahead", "idem:v1:probe", false},
		{"uuidv4 is never ahead", "idem:v1:9b2e1c1e-3f7a-4c55-9d2b-6f0e8f1b2a3c", false},
		{"minted now", "idem:v1:" + ulidAt(now), false},
		{"far in the past", "idem:v1:" + ulidAt(now.Add(-48*time.Hour)), false},
		{"exactly at the skew", "idem:v1:" + uuidv7At(newest), false},
		{"one ms beyond the skew", "idem:v1:" + uuidv7At(newest.Add(ms)), true},
		{"two hours fast (local time in UTC+2)", "idem:v1:" + ulidAt(now.Add(2*time.Hour)), true},
		{"far future", "idem:v1:" + ulidAt(now.Add(48*time.Hour)), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, got := Ahead(tc.key, now, skew); got != tc.ahead {
				t.Fatalf("Ahead(%q) = %v, want %v", tc.key, got, tc.ahead)
			}
		})
	}
	// A zero skew is zero: one millisecond ahead is ahead.
	if _, got := Ahead("idem:v1:"+ulidAt(now.Add(ms)), now, 0); !got {
		t.Fatal("with skew 0, a key 1ms ahead is not ahead")
	}
}

func TestValidateSkew(t *testing.T) {
	t.Parallel()
	for skew, ok := range map[time.Duration]bool{
		0: true, DefaultClockSkew: true, MaxClockSkew: true,
		-time.Nanosecond: false, MaxClockSkew + time.Nanosecond: false,
	} {
		if err := ValidateSkew(skew); (err == nil) != ok {
			t.Errorf("ValidateSkew(%s) = %v, want ok=%v", skew, err, ok)
		}
	}
}

// FuzzFromKey checks FromKey against an independent reading of the two
// formats. From a fuzzed millisecond and random bits it builds a canonical
// ULID and UUIDv7, which must give that instant back, under any scope
// prefix; then it changes one character, and the result must have a
// timestamp exactly when it is still canonical, and then the one its first
// 48 bits say. Any other key: no timestamp means the zero time.
func FuzzFromKey(f *testing.F) {
	f.Add("idem:v1:01ARZ3NDEKTSV4RRFFQ69G5FAV", uint64(1469922850259), uint64(0), uint64(0), "idem:v1", uint8(0), byte('8'))
	f.Add("idem:v1:018f3c1e-3f7a-7c55-9d2b-6f0e8f1b2a3c", uint64(1<<48-1), ^uint64(0), ^uint64(0), "idem:v1:t=acme", uint8(14), byte('4'))
	f.Add("", uint64(0), uint64(1), uint64(2), "", uint8(19), byte('c'))
	f.Add("x", uint64(1764667815123), uint64(3), uint64(4), "a:b", uint8(8), byte('0'))
	f.Add("y", uint64(1764667815123), uint64(5), uint64(6), "", uint8(25), byte('u'))
	f.Fuzz(func(t *testing.T, key string, ms, hi, lo uint64, prefix string, pos uint8, c byte) {
		if ts, ok := FromKey(key); !ok && !ts.IsZero() {
			t.Fatalf("FromKey(%q): no timestamp but non-zero time %v", key, ts)
		}
		ms &= 1<<48 - 1
		want := time.UnixMilli(int64(ms)).UTC()
		ulid := canonicalULID(ms, hi, lo)
		uuid := canonicalUUIDv7(ms, hi, lo)
		for _, id := range []string{ulid, strings.ToLower(ulid), uuid, strings.ToUpper(uuid)} {
			for _, k := range []string{id, prefix + ":" + id} {
				if got, ok := FromKey(k); !ok || !got.Equal(want) {
					t.Fatalf("FromKey(%q) = %v, %v; want %v, true", k, got, ok, want)
				}
			}
			b := []byte(id)
			b[int(pos)%len(b)] = c
			changed := string(b)
			wantTS, wantOK := referenceTime(changed)
			got, ok := FromKey(prefix + ":" + changed)
			if ok != wantOK || !got.Equal(wantTS) {
				t.Fatalf("FromKey(%q) = %v, %v; want %v, %v", prefix+":"+changed, got, ok, wantTS, wantOK)
			}
		}
	})
}

// canonicalULID writes 48 bits of milliseconds and 80 random bits (the low
// 16 of hi, all of lo) as 26 upper-case Crockford characters, most
// significant first.
func canonicalULID(ms, hi, lo uint64) string {
	v := new(big.Int).Lsh(new(big.Int).SetUint64(ms), 80)
	v.Or(v, new(big.Int).Lsh(new(big.Int).SetUint64(hi&0xFFFF), 64))
	v.Or(v, new(big.Int).SetUint64(lo))
	out := make([]byte, 26)
	mask := big.NewInt(31)
	for i := 25; i >= 0; i-- {
		out[i] = crockford[new(big.Int).And(v, mask).Int64()]
		v.Rsh(v, 5)
	}
	return string(out)
}

// canonicalUUIDv7 lays out RFC 9562's version 7: 48 bits of milliseconds,
// version 7, 12 random bits, variant 10, 62 random bits.
func canonicalUUIDv7(ms, hi, lo uint64) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], ms<<16|0x7000|hi&0x0FFF)
	binary.BigEndian.PutUint64(b[8:], lo&^(3<<62)|1<<63)
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// referenceTime is what FromKey must say of a bare id, read another way:
// the canonical forms by their spelling, the time by parsing the digits.
func referenceTime(id string) (time.Time, bool) {
	switch len(id) {
	case 26:
		var ms uint64
		for i := range len(id) {
			v := strings.IndexByte(crockford, strings.ToUpper(id[i : i+1])[0])
			if v < 0 || id[i] >= 0x80 {
				return time.Time{}, false
			}
			if i < 10 {
				ms = ms*32 + uint64(v)
			}
		}
		if strings.IndexByte(crockford, strings.ToUpper(id[:1])[0]) > 7 {
			return time.Time{}, false
		}
		return time.UnixMilli(int64(ms)).UTC(), true
	case 36:
		groups := strings.Split(id, "-")
		if len(groups) != 5 || len(groups[0]) != 8 || len(groups[1]) != 4 || len(groups[2]) != 4 || len(groups[3]) != 4 {
			return time.Time{}, false
		}
		for _, g := range groups {
			if _, err := hex.DecodeString(strings.Repeat("0", len(g)%2) + g); err != nil || strings.ContainsAny(g, "+-") {
				return time.Time{}, false
			}
		}
		if groups[2][0] != '7' || !strings.ContainsRune("89abAB", rune(groups[3][0])) {
			return time.Time{}, false
		}
		ms, err := strconv.ParseUint(groups[0]+groups[1], 16, 64)
		if err != nil {
			return time.Time{}, false
		}
		return time.UnixMilli(int64(ms)).UTC(), true
	}
	return time.Time{}, false
}
