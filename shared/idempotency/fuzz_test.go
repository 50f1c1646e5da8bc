package idempotency_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// Any header value is either refused or yields a scoped key PostgreSQL text
// can hold, and two different (tenant, key) pairs never share a scoped key.
func FuzzIdempotencyKeyHeader(f *testing.F) {
	f.Add("acme", "01JD8X3ZK6Q9W5T4R2M1N0P7BC", "acme:", "01JD8X3ZK6Q9W5T4R2M1N0P7BC")
	f.Add("", "probe", "", "probe")
	f.Add("a", "b:c", "a:b", "c")
	f.Add("ж", "k\x00", "%D0%B6", "k")
	f.Fuzz(func(t *testing.T, tenant1, key1, tenant2, key2 string) {
		s1, ok1 := scope(tenant1, key1)
		s2, ok2 := scope(tenant2, key2)
		if ok1 {
			if !utf8.ValidString(s1) || strings.IndexByte(s1, 0) >= 0 {
				t.Fatalf("scoped key %q cannot be stored", s1)
			}
		}
		if ok1 && ok2 && (tenant1 != tenant2 || key1 != key2) && s1 == s2 {
			t.Fatalf("(%q, %q) and (%q, %q) share the scoped key %q", tenant1, key1, tenant2, key2, s1)
		}
	})
}

// scope is what the middleware stores for a header value and tenant, and
// whether it accepts them at all.
func scope(tenant, key string) (string, bool) {
	if idempotency.ValidateKey(key) != nil {
		return "", false
	}
	return idempotency.ScopedKey(tenant, key), true
}
