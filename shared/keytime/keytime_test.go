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

func TestSkipRuleEdges(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	rule := SkipRule{LiveTTL: 24 * time.Hour, Margin: 10 * time.Minute, ClockSkew: 5 * time.Minute}
	if err := rule.Validate(); err != nil {
		t.Fatal(err)
	}
	oldest := now.Add(-24*time.Hour + 10*time.Minute) // first instant that may skip
	newest := now.Add(5 * time.Minute)                // last instant that may skip
	ms := time.Millisecond                            // key timestamps have millisecond resolution
	cases := []struct {
		name string
		key  string
		need bool
	}{
		{"no timestamp is always looked up", "idem:v1:probe", true},
		{"uuidv4 is always looked up", "idem:v1:9b2e1c1e-3f7a-4c55-9d2b-6f0e8f1b2a3c", true},
		{"minted now skips", "idem:v1:" + ulidAt(now), false},
		{"exactly at the old edge skips", "idem:v1:" + ulidAt(oldest), false},
		{"one ms older than the old edge looks up", "idem:v1:" + ulidAt(oldest.Add(-ms)), true},
		{"older than the TTL looks up", "idem:v1:" + ulidAt(now.Add(-30*time.Hour)), true},
		{"exactly at the future edge skips", "idem:v1:" + uuidv7At(newest), false},
		{"one ms beyond the allowed skew looks up", "idem:v1:" + uuidv7At(newest.Add(ms)), true},
		{"far future looks up", "idem:v1:" + ulidAt(now.Add(48*time.Hour)), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := rule.NeedsLookup(tc.key, now); got != tc.need {
				t.Fatalf("NeedsLookup(%q) = %v, want %v", tc.key, got, tc.need)
			}
		})
	}
}

func TestSkipRuleValidate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		rule SkipRule
		ok   bool
	}{
		{"defaults", SkipRule{LiveTTL: 24 * time.Hour}.WithDefaults(), true},
		{"no ttl", SkipRule{}.WithDefaults(), false},
		{"margin below skew", SkipRule{LiveTTL: time.Hour, Margin: time.Minute, ClockSkew: 2 * time.Minute}, false},
		{"margin not below ttl", SkipRule{LiveTTL: time.Hour, Margin: time.Hour, ClockSkew: time.Minute}, false},
		{"negative skew", SkipRule{LiveTTL: time.Hour, Margin: time.Minute, ClockSkew: -time.Second}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.rule.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
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
