package archive_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// pages lists q to its end, one page at a time.
func pages(t *testing.T, r *archive.Reader, q archive.Query) []string {
	t.Helper()
	var keys []string
	for range 20 {
		page, err := r.Investigate(context.Background(), q)
		require.NoError(t, err)
		for _, rec := range page.Records {
			keys = append(keys, rec.ScopedKey)
		}
		if page.NextCursor == "" {
			return keys
		}
		q.Cursor = page.NextCursor
	}
	t.Fatal("the query never ended")
	return nil
}

// A page that ends on a key JSON escapes heavily ('<', '>' and '&' are six
// bytes each in a cursor; a key another writer archived may be up to 2,000
// bytes) still has a cursor the Reader accepts: the rest of the scope is
// listed, never cut off at that key with invalid_cursor.
func TestACursorOfAKeyJSONEscapesIsAccepted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	keys := []string{
		"idem:v1:" + strings.Repeat("<&>", 120), // 368 bytes, 2,168 in JSON
		"idem:v1:" + strings.Repeat("k", 1990),  // from a writer whose keys are long
		"idem:v1:" + strings.Repeat("l", 1980) + "&&&&&&",
		"idem:v1:z",
	}
	for _, k := range keys {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	r := newReader(t, b.reader, nil)
	got := pages(t, r, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: x.Add(-time.Hour), CreatedTo: x.Add(time.Hour), Limit: 1})
	require.Equal(t, keys, got)
}

// Every key the archive holds can be looked up by the key an investigation
// lists: the sweeper archives keys of up to 2,000 bytes from any writer (the
// middleware's own are at most 512), so lookups accept as many. Before, a
// key over 512 bytes was listed, and its lookup answered "invalid key".
func TestEveryArchivedKeyCanBeLookedUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	keys := []string{
		"idem:v1:" + strings.Repeat("k", 600),
		"idem:v1:" + strings.Repeat("m", archive.MaxScopedKeyBytes-len("idem:v1:")),
		"idem:v1:" + strings.Repeat("t", archive.MaxScopedKeyBytes-len("idem:v1::")-26) + ":" + dbtest.ULID(x, ""),
	}
	for _, k := range keys {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, ResourceID: ptr("ch_long"), CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	r := newReader(t, b.reader, nil)
	listed := pages(t, r, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: x.Add(-time.Hour), CreatedTo: x.Add(time.Hour), Limit: 1})
	require.Len(t, listed, len(keys))
	for _, k := range listed {
		rec, err := r.Lookup(ctx, k, nil)
		require.NoError(t, err, "a key of %d bytes", len(k))
		require.Equal(t, 201, rec.Status)
	}
	_, err := r.Lookup(ctx, strings.Repeat("k", archive.MaxScopedKeyBytes+1), nil)
	require.ErrorIs(t, err, archive.ErrInvalidKey, "no key over the sweeper's bound is archived")
}

// A cursor continues only the query that issued it. One issued under a
// broader prefix, whose key also starts with a narrower one, or under a
// narrower prefix and then used with a broader one, or under another
// window, would answer a page that silently leaves out the keys before the
// cursor's: an investigation would read it as all there is.
func TestACursorOfAnotherQueryIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	for _, k := range []string{"idem:v1t:A:1", "idem:v1t:A:2", "idem:v1t:A:3", "idem:v1t:B:1"} {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	r := newReader(t, b.reader, nil)
	window := func(p string) archive.Query {
		return archive.Query{ScopePrefix: p, CreatedFrom: x.Add(-time.Hour), CreatedTo: x.Add(time.Hour), Limit: 2}
	}

	// Broader, then narrower: the cursor ends on A:2, which starts with
	// "idem:v1t:A:"; under that prefix A:1 would be left out.
	page, err := r.Investigate(ctx, window("idem:v1t:"))
	require.NoError(t, err)
	require.NotEmpty(t, page.NextCursor)
	q := window("idem:v1t:A:")
	q.Cursor = page.NextCursor
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrInvalidCursor, "a cursor of prefix idem:v1t: continued idem:v1t:A:")

	// Narrower, then broader.
	q = window("idem:v1t:B:")
	q.Limit = 1
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1t:B:2", Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	page, err = r.Investigate(ctx, q)
	require.NoError(t, err)
	require.NotEmpty(t, page.NextCursor)
	q = window("idem:v1t:")
	q.Cursor = page.NextCursor
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrInvalidCursor, "a cursor of prefix idem:v1t:B: continued idem:v1t:")

	// Another window, same prefix.
	page, err = r.Investigate(ctx, window("idem:v1t:A:"))
	require.NoError(t, err)
	require.NotEmpty(t, page.NextCursor)
	q = window("idem:v1t:A:")
	q.CreatedFrom = x.Add(-2 * time.Hour)
	q.Cursor = page.NextCursor
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrInvalidCursor, "a cursor continued another window")

	// The same query goes on, whatever its page size.
	q = window("idem:v1t:A:")
	q.Cursor, q.Limit = page.NextCursor, 5
	page, err = r.Investigate(ctx, q)
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, "idem:v1t:A:3", page.Records[0].ScopedKey)
}

// A cursor is about 4/3 of its key, whatever the key holds: one that ends a
// page on the longest key the archive holds, made of the bytes JSON
// escapes most, fits in the 10 KB request line API Gateway accepts (the
// JSON form made it 16 KB for a 2,000-byte key). Cursors issued in the
// JSON form before still continue their query.
func TestACursorStaysShortAndOldCursorsStillWork(t *testing.T) {
	at := time.Date(2026, 11, 10, 10, 0, 0, 123456000, time.UTC)
	for _, key := range []string{
		"idem:v1:" + strings.Repeat("<", 2000),
		"idem:v1:" + strings.Repeat("\x01\x1f", 1348), // 2,704 bytes: btree's limit
		"idem:v1:" + strings.Repeat("é", 900),
	} {
		c := archive.EncodeCursor(key, at)
		require.LessOrEqual(t, len(c), (len(key)+14+16)*4/3+2, "cursor of a %d-byte key (and a 16-byte query id)", len(key))
		require.Less(t, len("GET /v1/archive/keys?scope_prefix=idem%3Av1%3A&created_from=2026-11-10T00:00:00Z&created_to=2026-11-11T00:00:00Z&cursor="+c+" HTTP/1.1"), 10240)
		k, e, err := archive.DecodeCursor(c)
		require.NoError(t, err)
		require.Equal(t, key, k)
		require.True(t, e.Equal(at))
	}
	// AND the JSON form decodes as before, expiry as microseconds or RFC 3339
	for _, old := range []string{`{"k":"idem:v1:<a>","u":1794304800123456,"q":"x"}`, `{"k":"idem:v1:<a>","e":"2026-11-10T10:00:00.123456Z"}`} {
		k, e, err := archive.DecodeCursor(base64.RawURLEncoding.EncodeToString([]byte(old)))
		require.NoError(t, err, old)
		require.Equal(t, "idem:v1:<a>", k)
		require.True(t, e.Equal(at), "%s: %v", old, e)
	}
	// AND a binary cursor without its checksum (issued before it) still
	// decodes
	checked, err := base64.RawURLEncoding.DecodeString(archive.EncodeCursor("idem:v1:k", at))
	require.NoError(t, err)
	valid := append([]byte{0x02}, checked[1:len(checked)-4]...)
	k, e, err := archive.DecodeCursor(base64.RawURLEncoding.EncodeToString(valid))
	require.NoError(t, err)
	require.Equal(t, "idem:v1:k", k)
	require.True(t, e.Equal(at))
	// AND one cut short, with a NUL, or not UTF-8 is refused
	for name, b := range map[string][]byte{
		"no key":             valid[:len(valid)-len("idem:v1:k")],
		"cut in the expiry":  valid[:5],
		"query past the end": append(append([]byte{}, valid[:9]...), 200, 'x'),
		"NUL in the key":     append(append([]byte{}, valid...), 0),
		"not UTF-8":          append(append([]byte{}, valid...), 0xff),
		"JSON with trailing": []byte(`{"k":"idem:v1:k","u":1}{}`),
		"unknown version":    append([]byte{0x04}, valid[1:]...),
		"checked, unsummed":  append([]byte{0x03}, valid[1:]...),
	} {
		_, _, err := archive.DecodeCursor(base64.RawURLEncoding.EncodeToString(b))
		require.ErrorIs(t, err, archive.ErrInvalidCursor, name)
	}
}

// A cursor the Reader issues, cut short at any length or with any one
// byte changed (a copy or a log line cut short, a character mistyped), is
// refused: its key's tail would read as another key of the prefix, and the
// next page would list keys again or skip some without a word.
func TestACursorCutShortOrAlteredIsRefused(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 10, 10, 0, 0, 123456000, time.UTC)
	c := archive.EncodeCursor("idem:v1:ord_abcdef", at)
	for n := 0; n < len(c); n++ {
		_, _, err := archive.DecodeCursor(c[:n])
		require.ErrorIs(t, err, archive.ErrInvalidCursor, "cut to %d of %d characters", n, len(c))
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range len(c) {
		for _, r := range alphabet {
			if byte(r) == c[i] {
				continue
			}
			altered := c[:i] + string(r) + c[i+1:]
			k, _, err := archive.DecodeCursor(altered)
			if err == nil {
				// Base64's last character carries spare bits
				// the decoder ignores: the same bytes.
				require.Equal(t, "idem:v1:ord_abcdef", k, "character %d changed to %c", i, r)
				continue
			}
			require.ErrorIs(t, err, archive.ErrInvalidCursor, "character %d changed to %c", i, r)
		}
	}
}
