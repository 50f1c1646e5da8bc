package archive_test

import (
	"encoding/base64"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"

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

var windowLiterals = regexp.MustCompile(`expired_at >= '([^']+)' AND expired_at < '([^']+)'`)

// Whatever two bounds a lookup has, the statement it runs reads every expiry
// between them: a window of whole months holds both (it starts at or before
// the lower bound and ends after the upper one), spans at most
// MaxWindowMonths and ends within a month of now, and anything else keeps
// the bounds as parameters.
func FuzzLookupWindowHoldsItsBounds(f *testing.F) {
	at := func(y int, m time.Month, d, h int) int64 { return time.Date(y, m, d, h, 0, 0, 0, time.UTC).UnixMicro() }
	now := at(2026, 12, 3, 13)
	f.Add(at(2026, 12, 3, 12)-1, at(2026, 12, 3, 13), now)
	f.Add(at(2026, 12, 1, 0), at(2027, 1, 1, 0)-1, now)                       // a whole month, to the microsecond
	f.Add(at(2026, 11, 30, 23), at(2027, 3, 31, 23), at(2027, 3, 1, 0))       // four months
	f.Add(at(2026, 11, 30, 23), at(2027, 4, 1, 0), at(2027, 4, 1, 0))         // five
	f.Add(at(2026, 9, 3, 0), at(2026, 10, 3, 0), now)                         // ending two months before now
	f.Add(at(2026, 12, 31, 23), at(2027, 1, 1, 0), at(2026, 12, 31, 23))      // into the next month
	f.Add(at(2028, 2, 29, 0), at(2028, 3, 1, 0), at(2028, 3, 1, 0))           // a leap day
	f.Add(at(2026, 12, 3, 0), at(2026, 11, 3, 0), now)                        // upper before lower
	f.Add(at(1969, 12, 31, 23), at(1970, 1, 1, 1), at(1970, 1, 1, 1))         // a ULID of 1970 less the skew
	f.Add(at(9999, 12, 31, 23), at(9999, 12, 31, 23)+10, at(9999, 12, 31, 0)) // the last month a literal holds
	f.Add(at(999, 12, 31, 0), at(1000, 1, 2, 0), at(1000, 1, 2, 0))
	f.Fuzz(func(t *testing.T, lo, hi, clock int64) {
		earliest := pgtype.Timestamptz{Time: time.UnixMicro(lo), Valid: true}
		latest := pgtype.Timestamptz{Time: time.UnixMicro(hi), Valid: true}
		now := time.UnixMicro(clock)
		sql, args := archive.WindowStatement("idem:v1:k", earliest, latest, now)
		m := windowLiterals.FindStringSubmatch(sql)
		if m == nil {
			if sql != archive.LookupSQL || len(args) != 3 {
				t.Fatalf("[%v, %v]: neither a window nor the bounds as parameters: %s %v", earliest.Time, latest.Time, sql, args)
			}
			return
		}
		if len(args) != 1 || args[0] != "idem:v1:k" {
			t.Fatalf("a window takes the key alone, got %v", args)
		}
		from, err1 := time.Parse("2006-01-02 15:04:05-07", m[1])
		to, err2 := time.Parse("2006-01-02 15:04:05-07", m[2])
		if err1 != nil || err2 != nil {
			t.Fatalf("literals %q %q: %v %v", m[1], m[2], err1, err2)
		}
		months := func(a, b time.Time) int { return (b.Year()-a.Year())*12 + int(b.Month()) - int(a.Month()) }
		if from.After(earliest.Time) || !to.After(latest.Time) || months(from, to) < 1 || months(from, to) > archive.MaxWindowMonths ||
			from.Day() != 1 || to.Day() != 1 || from.Hour()+from.Minute()+from.Second() != 0 || to.Hour()+to.Minute()+to.Second() != 0 {
			t.Fatalf("[%v, %v] read as [%v, %v)", earliest.Time, latest.Time, from, to)
		}
		if ahead := months(to, now.UTC()); ahead < -2 || ahead > 0 {
			t.Fatalf("the window [%v, %v) ends %d months from now (%v)", from, to, ahead, now)
		}
	})
}
