package archive_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idemarchive/idemarchive/shared/archive"
)

// Any cursor string is either refused with ErrInvalidCursor or decodes to a
// key PostgreSQL can hold, which encodes back to an equal cursor.
func FuzzCursor(f *testing.F) {
	f.Add(archive.EncodeCursor("idem:v1:k", time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"k":"a\u0000b","e":"2026-01-01T00:00:00Z"}`)))
	f.Add(base64.RawURLEncoding.EncodeToString([]byte(`{"k":"x","e":"2026-01-01T00:00:00Z","extra":1}`)))
	f.Add("not-a-cursor")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		key, expired, err := archive.DecodeCursor(s)
		if err != nil {
			if err != archive.ErrInvalidCursor {
				t.Fatalf("decode %q: %v, want ErrInvalidCursor", s, err)
			}
			return
		}
		if key == "" || !utf8.ValidString(key) || strings.IndexByte(key, 0) >= 0 || expired.IsZero() {
			t.Fatalf("decode %q accepted key %q at %v", s, key, expired)
		}
		k2, e2, err := archive.DecodeCursor(archive.EncodeCursor(key, expired))
		if err != nil || k2 != key || !e2.Equal(expired) {
			t.Fatalf("round trip of %q: %q %v %v", s, k2, e2, err)
		}
	})
}
