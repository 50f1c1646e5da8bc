package archive_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// Rows written by hand or by another writer with a created_at JSON cannot
// write (BC) or no instant at all ('-infinity') are still answered: found,
// with that time unknown (null in JSON), never an error that a middleware
// failing open would take for an unreachable archive and run the request.
func TestRowsWithOddCreationTimesAreAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	expired := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	dbtest.InsertArchive(t, b.db.Pool,
		dbtest.ArchiveRow{Key: "idem:v1:bc", Status: 201, ResourceID: ptr("ch_bc"), CreatedAt: time.Date(-44, 3, 15, 0, 0, 0, 0, time.UTC), ExpiredAt: expired},
		dbtest.ArchiveRow{Key: "idem:v1:infinite", Status: 201, ResourceID: ptr("ch_inf"), CreatedAt: expired.Add(-time.Hour), ExpiredAt: expired},
	)
	_, err := b.db.Pool.Exec(ctx, "UPDATE idempotency_key_archive SET created_at = '-infinity' WHERE scoped_key = 'idem:v1:infinite'")
	require.NoError(t, err)
	r := newReader(t, b.reader, nil)

	for key, resource := range map[string]string{"idem:v1:bc": "ch_bc", "idem:v1:infinite": "ch_inf"} {
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, key)
		require.Equal(t, 201, rec.Status)
		require.Equal(t, ptr(resource), rec.ResourceID)
		require.Equal(t, expired, rec.ExpiredAt)

		body, err := json.Marshal(rec)
		require.NoError(t, err, key)
		var got map[string]any
		require.NoError(t, json.Unmarshal(body, &got))
		require.Nil(t, got["created_at"], "%s: %s", key, body)
		require.Equal(t, "2026-11-20T00:00:00Z", got["expired_at"], key)
		require.Equal(t, resource, got["resource_id"])
	}

	// The investigation lists them too, the year-1 window included.
	page, err := r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: time.Time{}, CreatedTo: expired})
	require.NoError(t, err)
	require.Len(t, page.Records, 0, "a BC or infinite creation lies before year 1")
	_, err = json.Marshal(page)
	require.NoError(t, err)
}

// A window's bounds finer than PostgreSQL's microseconds keep exactly the
// times [from, to) holds: a row created at X is inside [X-0.5us, X+0.5us)
// and outside [X+0.5us, X+1.5us).
func TestWindowBoundsBelowAMicrosecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:x", Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	r := newReader(t, b.reader, nil)
	count := func(from, to time.Time) int {
		page, err := r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: from, CreatedTo: to})
		require.NoError(t, err)
		return len(page.Records)
	}
	require.Equal(t, 1, count(x.Add(-500*time.Nanosecond), x.Add(500*time.Nanosecond)))
	require.Equal(t, 1, count(x, x.Add(time.Nanosecond)))
	require.Equal(t, 0, count(x.Add(500*time.Nanosecond), x.Add(1500*time.Nanosecond)))
	require.Equal(t, 0, count(x.Add(-time.Microsecond), x))
	_, err := r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: x.Add(100 * time.Nanosecond), CreatedTo: x.Add(900 * time.Nanosecond)})
	require.ErrorIs(t, err, archive.ErrInvalidQuery, "a window holding no microsecond")
}

// A cursor continues the query it came from: under another scope prefix it
// is refused, not answered with an empty page that says the scope holds
// nothing more.
func TestACursorOfAnotherScopeIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	x := time.Date(2026, 11, 10, 10, 0, 0, 0, time.UTC)
	for _, k := range []string{"idem:v1t:A:1", "idem:v1t:A:2", "idem:v1t:B:1", "idem:v1t:B:2"} {
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: k, Status: 201, CreatedAt: x, ExpiredAt: x.Add(24 * time.Hour)})
	}
	r := newReader(t, b.reader, nil)
	q := archive.Query{ScopePrefix: "idem:v1t:B:", CreatedFrom: x.Add(-time.Hour), CreatedTo: x.Add(time.Hour), Limit: 1}
	page, err := r.Investigate(ctx, q)
	require.NoError(t, err)
	require.NotEmpty(t, page.NextCursor)

	q.ScopePrefix, q.Cursor = "idem:v1t:A:", page.NextCursor
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrInvalidCursor)

	// A narrower prefix of the same scope is another query too; the same
	// one goes on.
	q.ScopePrefix = "idem:v1t:B:2"
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrInvalidCursor)
	q.ScopePrefix = "idem:v1t:B:"
	page, err = r.Investigate(ctx, q)
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, "idem:v1t:B:2", page.Records[0].ScopedKey)
}

// An investigation reads as far as the longest TTL a writer on record has
// leased, when that is longer than MaxLiveTTL: a TTL raised without raising
// the setting leaves no row out.
func TestAnInvestigationReadsAsFarAsTheLongestTTLOnRecord(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	created := time.Date(2026, 9, 10, 10, 0, 0, 0, time.UTC)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:long-lived", Status: 201, CreatedAt: created, ExpiredAt: created.Add(20 * 24 * time.Hour)})
	q := archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: created.Add(-time.Hour), CreatedTo: created.Add(time.Hour)}
	// One Reader throughout, as an investigator's paging through a
	// long-lived one: a writer that comes on record between two pages
	// widens the next page, though lookups would still trust their view of
	// the writers for up to a minute.
	warm := newReader(t, b.reader, nil)

	// Without a writer of that TTL on record, the 7-day MaxLiveTTL bounds it
	page, err := warm.Investigate(ctx, q)
	require.NoError(t, err)
	require.Empty(t, page.Records)

	// With one, its 30 days do
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO idempotency_writers (ttl_ms, skew_ms, first_used, used_until)
		VALUES ($1, 0, '2026-09-01', '2026-10-01')`, (30 * 24 * time.Hour).Milliseconds())
	require.NoError(t, err)
	page, err = warm.Investigate(ctx, q)
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, "idem:v1:long-lived", page.Records[0].ScopedKey)

	// AND a writer that archives at completion (a Redis store, its TTL not
	// recorded) widens it to MaxCompletionTTL
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:redis-lived", Status: 201, CreatedAt: created, ExpiredAt: created.Add(archive.MaxCompletionTTL)})
	page, err = warm.Investigate(ctx, q)
	require.NoError(t, err)
	require.Len(t, page.Records, 1, "not yet: no such writer")
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO idempotency_writers (ttl_ms, skew_ms, first_used, used_until) VALUES (0, 0, '2026-09-01', '2026-10-01')`)
	require.NoError(t, err)
	page, err = warm.Investigate(ctx, q)
	require.NoError(t, err)
	require.Len(t, page.Records, 2)

	// AND while the writers cannot be read (a migration holds them), the
	// query fails as timed out rather than answer a narrower page
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_writers IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	r, err := archive.NewReader(b.reader, archive.Config{Now: func() time.Time { return now }, StatementTimeout: 300 * time.Millisecond}, nil)
	require.NoError(t, err)
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrTimeout)
}

// A page that ends on a row JSON's RFC 3339 cannot write (a BC expiry, in a
// partition made by hand) still says where the next page starts, and the
// next page goes on from it.
func TestAPageEndingOnABCExpiryHasANextCursor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `CREATE TABLE archive_bc PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('0002-12-01 00:00:00+00 BC') TO ('0001-01-01 00:00:00+00 BC')`)
	require.NoError(t, err)
	_, err = b.db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive
		(scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:bc-1', '\x00', 201, 'ch_1', '0002-12-31 11:00:00+00 BC', '0002-12-31 12:00:00+00 BC'),
		       ('idem:v1:bc-2', '\x00', 201, 'ch_2', '0002-12-31 11:00:00+00 BC', '0002-12-31 12:00:00+00 BC')`)
	require.NoError(t, err)
	q := archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: time.Date(-1, 12, 1, 0, 0, 0, 0, time.UTC), CreatedTo: time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), Limit: 1}
	r := newReader(t, b.reader, nil)
	var keys []string
	for range 3 {
		page, err := r.Investigate(ctx, q)
		require.NoError(t, err)
		for _, rec := range page.Records {
			keys = append(keys, rec.ScopedKey)
		}
		if page.NextCursor == "" {
			break
		}
		q.Cursor = page.NextCursor
	}
	require.Equal(t, []string{"idem:v1:bc-1", "idem:v1:bc-2"}, keys)

	// A cursor issued before, its expiry as RFC 3339, still goes on; one
	// past PostgreSQL's range is refused as invalid, not a database error.
	old := base64.RawURLEncoding.EncodeToString([]byte(`{"k":"idem:v1:bc-1","e":"2026-11-10T10:00:00Z"}`))
	_, err = r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: q.CreatedFrom, CreatedTo: q.CreatedTo, Cursor: old})
	require.NoError(t, err)
	far := base64.RawURLEncoding.EncodeToString([]byte(`{"k":"idem:v1:bc-1","u":-9223372036854775808}`))
	_, err = r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: q.CreatedFrom, CreatedTo: q.CreatedTo, Cursor: far})
	require.ErrorIs(t, err, archive.ErrInvalidCursor)
}
