package idempotency_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// Any header value is either refused or yields a scoped key PostgreSQL text
// can hold; two header values share a scoped key only when they carry the
// same key for the same tenant; and a key's quoted form (the draft's
// Structured Field String) carries that key.
func FuzzIdempotencyKeyHeader(f *testing.F) {
	f.Add("acme", "01JD8X3ZK6Q9W5T4R2M1N0P7BC", "acme:", "01JD8X3ZK6Q9W5T4R2M1N0P7BC")
	f.Add("", "probe", "", "probe")
	f.Add("a", "b:c", "a:b", "c")
	f.Add("ж", "k\x00", "%D0%B6", "k")
	f.Add("", `"probe"`, "", "probe")
	f.Add("t", `"a\"b"`, "t", `a"b`)
	f.Add("", `"a\\b\"`, "", `"ab\`)
	f.Fuzz(func(t *testing.T, tenant1, header1, tenant2, header2 string) {
		key1, err1 := idempotency.ParseKey(header1)
		key2, err2 := idempotency.ParseKey(header2)
		if err1 == nil {
			s1 := idempotency.ScopedKey(tenant1, key1)
			if !utf8.ValidString(s1) || strings.IndexByte(s1, 0) >= 0 || idempotency.ValidateKey(key1) != nil {
				t.Fatalf("header %q: scoped key %q cannot be stored", header1, s1)
			}
			if err2 == nil && (tenant1 != tenant2 || key1 != key2) && s1 == idempotency.ScopedKey(tenant2, key2) {
				t.Fatalf("(%q, %q) and (%q, %q) share the scoped key %q", tenant1, header1, tenant2, header2, s1)
			}
			if !strings.HasPrefix(header1, `"`) && header1 != key1 {
				t.Fatalf("bare header %q read as %q", header1, key1)
			}
		}
		// Quoting a printable ASCII key (escaping '"' and '\') carries it.
		if idempotency.ValidateKey(header2) == nil && isPrintableASCII(header2) {
			quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(header2) + `"`
			if got, err := idempotency.ParseKey(quoted); err != nil || got != header2 {
				t.Fatalf("quoted %q read as %q, %v", quoted, got, err)
			}
		}
	})
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}
