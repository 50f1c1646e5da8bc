package keytime

import (
	"fmt"
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

func FuzzFromKey(f *testing.F) {
	f.Add("idem:v1:01ARZ3NDEKTSV4RRFFQ69G5FAV")
	f.Add("idem:v1:018f3c1e-3f7a-7c55-9d2b-6f0e8f1b2a3c")
	f.Fuzz(func(t *testing.T, key string) {
		ts, ok := FromKey(key)
		if !ok && !ts.IsZero() {
			t.Fatalf("no timestamp but non-zero time %v", ts)
		}
	})
}
