package archive_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// 2,704 bytes ("btree's limit on an index entry") is not a bound on the
// keys the archive holds: btree compresses an index entry before that limit
// applies, so a compressible key far past it is archived (by another
// writer, or by hand; the schema has no length check). A page that ends on
// it has a cursor that continues the query: before, it was refused, and
// every later key of the scope was out of reach.
func TestAnIssuedCursorOfALongCompressibleKeyContinues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	long := "idem:v1:a" + strings.Repeat("a", 20_000)
	keys := []string{long, "idem:v1:b"}
	for _, k := range keys {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	var n int
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT max(octet_length(scoped_key)) FROM idempotency_key_archive").Scan(&n))
	require.Greater(t, n, 2704, "the archive holds a key past btree's 2,704-byte entry limit")

	r := newReader(t, b.reader, nil)
	q := archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: x.Add(-time.Hour), CreatedTo: x.Add(time.Hour), Limit: 1}
	page, err := r.Investigate(context.Background(), q)
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.NotEmpty(t, page.NextCursor)
	q.Cursor = page.NextCursor
	page, err = r.Investigate(context.Background(), q)
	require.NoError(t, err, "the cursor the Reader issued is accepted")
	require.Equal(t, "idem:v1:b", page.Records[0].ScopedKey)
}

// The "continues any query of a prefix its key starts with" leniency is for
// the JSON cursors of releases before query ids. Every binary cursor was
// issued with one: a binary cursor without (crafted) is refused, not taken
// for a legacy one that, continued under a narrower prefix, would answer a
// page silently leaving out the keys before its key.
func TestABinaryCursorWithoutQueryIDIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	for _, k := range []string{"idem:v1t:A:1", "idem:v1t:A:2", "idem:v1t:A:3"} {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	r := newReader(t, b.reader, nil)
	// a binary cursor (0x02 ...) with a zero-length query id
	c := archive.EncodeCursorOf("idem:v1t:A:2", x.Add(24*time.Hour), "")
	_, err := r.Investigate(context.Background(), archive.Query{ScopePrefix: "idem:v1t:A:", CreatedFrom: x.Add(-2 * time.Hour), CreatedTo: x.Add(time.Hour), Cursor: c})
	require.ErrorIs(t, err, archive.ErrInvalidCursor, "a binary cursor naming no query continued a query it was not issued by")
	_, _, err = archive.DecodeCursor(c)
	require.ErrorIs(t, err, archive.ErrInvalidCursor)
}

// A query that sets no page size gets DefaultPageSize, or the Reader's
// MaxPageSize where that is smaller: never refused for a limit it did not
// send.
func TestAQueryWithoutALimitFitsASmallMaxPageSize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	for i := range 3 {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: fmt.Sprintf("idem:v1:mp:%d", i), Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	r, err := archive.NewReader(b.reader, archive.Config{MaxPageSize: 2, Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	q := archive.Query{ScopePrefix: "idem:v1:mp:", CreatedFrom: x.Add(-time.Hour), CreatedTo: x.Add(time.Hour)}
	page, err := r.Investigate(context.Background(), q)
	require.NoError(t, err, "a query without a limit")
	require.Len(t, page.Records, 2)
	require.NotEmpty(t, page.NextCursor)
	q.Limit = 3
	_, err = r.Investigate(context.Background(), q)
	require.ErrorIs(t, err, archive.ErrInvalidQuery, "a limit over the maximum, sent")
}
