package archive_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

type bundle struct {
	db     *dbtest.DB
	reader *pgxpool.Pool // connected as idempotency_reader
}

// setup creates partitions for every month of 2026 and three ahead.
func setup(t *testing.T) bundle {
	t.Helper()
	db := dbtest.New(t)
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	for mo := time.January; mo <= time.November; mo++ {
		_, err := m.EnsureMonth(context.Background(), time.Date(2026, mo, 1, 0, 0, 0, 0, time.UTC))
		require.NoError(t, err)
	}
	_, err = m.Run(context.Background(), false)
	require.NoError(t, err)
	return bundle{db: db, reader: db.NewPool(t, dbtest.AsRole(schema.ReaderRole))}
}

func newReader(t *testing.T, pool *pgxpool.Pool, emitter *metrics.Emitter) *archive.Reader {
	t.Helper()
	r, err := archive.NewReader(pool, archive.Config{Now: func() time.Time { return now }}, emitter)
	require.NoError(t, err)
	return r
}

func ptr(s string) *string { return &s }

// ulid builds a ULID with timestamp ts (random part fixed).
func ulid(ts time.Time) string {
	const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
	ms := uint64(ts.UnixMilli())
	var b strings.Builder
	for i := 9; i >= 0; i-- {
		b.WriteByte(crockford[(ms>>(5*uint(i)))&31])
	}
	return b.String() + "ABCDEFGHJKMNPQRS"
}

func TestLookupAsTheReaderRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	created := now.Add(-30 * time.Hour)
	dbtest.InsertArchive(t, b.db.Pool,
		dbtest.ArchiveRow{Key: "idem:v1:probe", Status: 201, ResourceID: ptr("ch_probe"), CreatedAt: created, ExpiredAt: now.Add(-6 * time.Hour)},
		// An older life of the same key: the newest one answers.
		dbtest.ArchiveRow{Key: "idem:v1:probe", Status: 500, CreatedAt: now.AddDate(0, -3, 0), ExpiredAt: now.AddDate(0, -3, 1)},
		dbtest.ArchiveRow{Key: "idem:v1:in-flight", Status: archive.InFlightStatus, ExpiredAt: now.Add(-time.Hour)},
	)
	var buf bytes.Buffer
	r := newReader(t, b.reader, metrics.New(&buf, "Test"))
	ctx := context.Background()

	rec, err := r.Lookup(ctx, "idem:v1:probe", dbtest.Fingerprint("idem:v1:probe"))
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	require.Equal(t, ptr("ch_probe"), rec.ResourceID)
	require.Equal(t, created, rec.CreatedAt)
	require.Equal(t, now.Add(-6*time.Hour), rec.ExpiredAt)
	require.NotNil(t, rec.FingerprintMatch)
	require.True(t, *rec.FingerprintMatch)
	require.False(t, rec.InFlight())

	rec, err = r.Lookup(ctx, "idem:v1:probe", dbtest.Fingerprint("another request"))
	require.NoError(t, err)
	require.False(t, *rec.FingerprintMatch)

	rec, err = r.Lookup(ctx, "idem:v1:probe", []byte{0})
	require.NoError(t, err)
	require.Nil(t, rec.FingerprintMatch, "a fingerprint that is not a digest proves nothing")

	rec, err = r.Lookup(ctx, "idem:v1:probe", nil)
	require.NoError(t, err)
	require.Nil(t, rec.FingerprintMatch)

	rec, err = r.Lookup(ctx, "idem:v1:in-flight", nil)
	require.NoError(t, err)
	require.True(t, rec.InFlight())

	_, err = r.Lookup(ctx, "idem:v1:never", nil)
	require.ErrorIs(t, err, archive.ErrNotFound)
	_, err = r.Lookup(ctx, "", nil)
	require.ErrorIs(t, err, archive.ErrInvalidKey)
	_, err = r.Lookup(ctx, strings.Repeat("k", archive.MaxScopedKeyBytes+1), nil)
	require.ErrorIs(t, err, archive.ErrInvalidKey)
	_, err = r.Lookup(ctx, "idem:v1:\xff", nil)
	require.ErrorIs(t, err, archive.ErrInvalidKey)

	// Every lookup that reached the database emitted its duration.
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.Len(t, lines, 6)
	var line map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &line))
	require.Contains(t, line, metrics.ArchiveLookupDurationMs)
}

var scanOn = regexp.MustCompile(` on (idempotency_key_archive_\d{4}_\d{2})\b`)

// explainPartitions returns the archive partitions a query's plan reads.
func explainPartitions(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), "EXPLAIN (COSTS OFF) "+sql, args...)
	require.NoError(t, err)
	defer rows.Close()
	var touched []string
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		if m := scanOn.FindStringSubmatch(line); m != nil {
			touched = append(touched, m[1])
		}
	}
	require.NoError(t, rows.Err())
	return touched
}

// explainLookup returns the archive partitions that the statement r's Lookup
// runs for key reads.
func explainLookup(t *testing.T, pool *pgxpool.Pool, r *archive.Reader, key string) []string {
	t.Helper()
	sql, args := archive.LookupStatement(r, key)
	require.NotEmpty(t, sql, "the key has no archive row")
	return explainPartitions(t, pool, sql, args...)
}

// relationLocks runs sql on one connection of pool as often as a warm pool's
// connection has (so that the plan cache has settled), then once more in a
// transaction, and returns the relations that run holds locks on.
func relationLocks(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	for range 8 {
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, sql, args...)
	require.NoError(t, err)
	// The names are read after the transaction: reading pg_class in it
	// would lock pg_class and its indexes.
	var oids []uint32
	require.NoError(t, tx.QueryRow(ctx, `
		SELECT coalesce(array_agg(relation::int8), '{}') FROM pg_locks
		 WHERE pid = pg_backend_pid() AND locktype = 'relation' AND relation <> 'pg_catalog.pg_locks'::regclass`).Scan(&oids))
	require.NoError(t, tx.Rollback(ctx))
	var locked []string
	require.NoError(t, conn.QueryRow(ctx, "SELECT coalesce(array_agg(relname::text), '{}') FROM pg_class WHERE oid = ANY ($1::int8[]::oid[])", oids).Scan(&locked))
	require.Len(t, locked, len(oids))
	return locked
}

// A lookup whose bounds lie within a month or a few names those months as
// constants: its cached generic plan locks the parent, the month's partition
// and the primary key it reads, and no other index. With the bounds as
// parameters each run is planned again, and planning locks the created_at
// BRIN index too.
func TestALookupWithinAMonthLocksThreeRelations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	month := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	key := "idem:v1:" + ulid(month.Add(10*24*time.Hour))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: month.Add(11 * 24 * time.Hour)})
	lo := pgtype.Timestamptz{Time: month.Add(10*24*time.Hour - 5*time.Minute), Valid: true}
	hi := pgtype.Timestamptz{Time: month.Add(20 * 24 * time.Hour), Valid: true}

	sql, args := archive.WindowStatement(key, lo, hi, hi.Time)
	require.NotEqual(t, archive.LookupSQL, sql)
	require.ElementsMatch(t, []string{"idempotency_key_archive", "idempotency_key_archive_2026_11", "idempotency_key_archive_2026_11_pkey"},
		relationLocks(t, b.reader, sql, args...))
	rows, err := b.reader.Query(ctx, sql, args...)
	require.NoError(t, err)
	var status int16
	var rest [4]any
	n := 0
	for rows.Next() {
		require.NoError(t, rows.Scan(&status, &rest[0], &rest[1], &rest[2], &rest[3]))
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, n)
	require.EqualValues(t, 201, status)

	params := relationLocks(t, b.reader, archive.LookupSQL, key, lo, hi)
	require.Contains(t, params, "idempotency_key_archive_2026_11_created_at_idx", "the baseline this statement improves on")
	require.Greater(t, len(params), 3)
}

// The rows at the very edges of a lookup's bounds, and at the edges of the
// months around them, are found by the statement Lookup runs, as by the
// bounds as parameters; from one month to the most a window spans, and past
// it.
func TestALookupWindowFindsTheRowsAtItsEdges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	count := func(sql string, args ...any) int {
		rows, err := b.reader.Query(ctx, "SELECT count(*) FROM ("+strings.Replace(sql, "LIMIT 1", "", 1)+") AS found", args...)
		require.NoError(t, err)
		defer rows.Close()
		require.True(t, rows.Next())
		var n int
		require.NoError(t, rows.Scan(&n))
		return n
	}
	for months := 1; months <= archive.MaxWindowMonths+1; months++ {
		first := time.Date(2026, time.Month(12-months), 1, 0, 0, 0, 0, time.UTC)
		lo := first
		hi := first.AddDate(0, months, 0).Add(-time.Microsecond)
		key := fmt.Sprintf("idem:v1:edges-%d", months)
		dbtest.InsertArchive(t, b.db.Pool,
			dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: lo},
			dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: hi},
			dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: lo.Add(time.Microsecond)},
			dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: hi.Add(-time.Microsecond)},
		)
		bounds := []any{pgtype.Timestamptz{Time: lo, Valid: true}, pgtype.Timestamptz{Time: hi, Valid: true}}
		sql, args := archive.WindowStatement(key, bounds[0].(pgtype.Timestamptz), bounds[1].(pgtype.Timestamptz), hi)
		if months <= archive.MaxWindowMonths {
			require.NotEqual(t, archive.LookupSQL, sql, "%d months", months)
			require.Len(t, explainPartitions(t, b.reader, sql, args...), months)
		} else {
			require.Equal(t, archive.LookupSQL, sql, "%d months are past a window", months)
		}
		require.Equal(t, 4, count(sql, args...), "%d months", months)
		require.Equal(t, 4, count(archive.LookupSQL, append([]any{key}, bounds...)...), "%d months", months)
	}
}

func TestACompletedRowAnswersOverANewerInFlightRow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dbtest.InsertArchive(t, b.db.Pool,
		dbtest.ArchiveRow{Key: "idem:v1:charged", Status: 201, ResourceID: ptr("ch_1"), ExpiredAt: now.Add(-48 * time.Hour)},
		// A later registration of the same key that was never released.
		dbtest.ArchiveRow{Key: "idem:v1:charged", Status: archive.InFlightStatus, ExpiredAt: now.Add(-time.Hour)},
	)
	rec, err := newReader(t, b.reader, nil).Lookup(context.Background(), "idem:v1:charged", nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)
	require.Equal(t, ptr("ch_1"), rec.ResourceID)
}

func TestInputPostgreSQLCannotHoldIsInvalid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := newReader(t, b.reader, nil)
	ctx := context.Background()
	_, err := r.Lookup(ctx, "idem:v1:a\x00b", nil)
	require.ErrorIs(t, err, archive.ErrInvalidKey)
	q := archive.Query{ScopePrefix: "idem:\x00", CreatedFrom: now.Add(-time.Hour), CreatedTo: now}
	_, err = r.Investigate(ctx, q)
	require.ErrorIs(t, err, archive.ErrInvalidQuery)
	cur := base64.RawURLEncoding.EncodeToString([]byte(`{"k":"a\u0000b","e":"2026-01-01T00:00:00Z"}`))
	_, err = r.Investigate(ctx, archive.Query{ScopePrefix: "idem:", CreatedFrom: now.Add(-time.Hour), CreatedTo: now, Cursor: cur})
	require.ErrorIs(t, err, archive.ErrInvalidCursor)
}

func TestLookupOfATimestampedKeyTouchesFewPartitions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	key := "idem:v1:" + ulid(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)})
	r := newReader(t, b.reader, nil)

	rec, err := r.Lookup(ctx, key, nil)
	require.NoError(t, err)
	require.Equal(t, 201, rec.Status)

	// A ULID minted on 20 November cannot have expired before it (less the
	// skew): only November onwards is read, not the eleven months before;
	// and with every archive row swept, none expired after the database's
	// clock: not the months ahead either.
	touched := explainLookup(t, b.reader, r, key)
	var want []string
	for m := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC); !m.After(time.Now().Add(time.Minute)) && m.Before(time.Date(2027, 4, 1, 0, 0, 0, 0, time.UTC)); m = m.AddDate(0, 1, 0) {
		want = append(want, partition.Name(m))
	}
	require.ElementsMatch(t, want, touched)

	// A key without a timestamp reads only the months its rows are in
	// (idempotency_archive_plain_keys), and a key not archived reads none.
	require.Nil(t, archive.ExpiryRange(r, "idem:v1:probe"))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:probe", Status: 201, ExpiredAt: time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)})
	touched = explainLookup(t, b.reader, r, "idem:v1:probe")
	require.Equal(t, []string{"idempotency_key_archive_2026_12"}, touched)

	// So does every key while a writer that bounded nothing is on record (a
	// database upgraded from before writers recorded their bounds): such a
	// writer may have stored this key two days before its timestamp.
	_, err = b.db.Pool.Exec(ctx, "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, false, '-infinity', 'infinity')")
	require.NoError(t, err)
	early := "idem:v1:" + ulid(time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC).Add(48*time.Hour))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: early, Status: 201, ExpiredAt: time.Date(2026, 11, 21, 0, 0, 0, 0, time.UTC)})
	upgraded := newReader(t, b.reader, nil)
	touched = explainLookup(t, b.reader, upgraded, early)
	require.Len(t, touched, 15)
	rec, err = upgraded.Lookup(ctx, early, nil)
	require.NoError(t, err, "a row stored before its timestamp is found")
	require.Equal(t, 201, rec.Status)
}

func TestInvestigate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	day := func(d int) time.Time { return time.Date(2026, 11, d, 10, 0, 0, 0, time.UTC) }
	var rows []dbtest.ArchiveRow
	for i := range 25 {
		rows = append(rows, dbtest.ArchiveRow{Key: fmt.Sprintf("idem:v1:t=acme:%02d", i), Status: 201, ResourceID: ptr(fmt.Sprintf("ch_%d", i)), CreatedAt: day(10), ExpiredAt: day(11)})
	}
	rows = append(rows,
		dbtest.ArchiveRow{Key: "idem:v1:t=acme:late", Status: 0, CreatedAt: day(12), ExpiredAt: day(13)},      // in flight
		dbtest.ArchiveRow{Key: "idem:v1:t=acme:outside", Status: 201, CreatedAt: day(20), ExpiredAt: day(21)}, // after the window
		dbtest.ArchiveRow{Key: "idem:v1:t=acmeco:00", Status: 201, CreatedAt: day(10), ExpiredAt: day(11)},    // another tenant
		dbtest.ArchiveRow{Key: "idem:v1:t=a%:00", Status: 201, CreatedAt: day(10), ExpiredAt: day(11)},        // LIKE metacharacters
		dbtest.ArchiveRow{Key: "idem:v1:t=ab:00", Status: 201, CreatedAt: day(10), ExpiredAt: day(11)},
	)
	dbtest.InsertArchive(t, b.db.Pool, rows...)
	r := newReader(t, b.reader, nil)

	// Paging through the window returns each matching key exactly once.
	q := archive.Query{ScopePrefix: "idem:v1:t=acme:", CreatedFrom: day(9), CreatedTo: day(15), Limit: 10}
	var got []string
	pages := 0
	for {
		page, err := r.Investigate(ctx, q)
		require.NoError(t, err)
		pages++
		for _, rec := range page.Records {
			got = append(got, rec.ScopedKey)
		}
		if page.NextCursor == "" {
			break
		}
		q.Cursor = page.NextCursor
	}
	require.Equal(t, 3, pages)
	require.Len(t, got, 26)
	require.Equal(t, "idem:v1:t=acme:00", got[0])
	require.Equal(t, "idem:v1:t=acme:late", got[25])

	// A prefix is a prefix: '%' and '_' match only themselves.
	page, err := r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:t=a%", CreatedFrom: day(1), CreatedTo: day(30)})
	require.NoError(t, err)
	require.Len(t, page.Records, 1)
	require.Equal(t, "idem:v1:t=a%:00", page.Records[0].ScopedKey)
	page, err = r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:t=a_", CreatedFrom: day(1), CreatedTo: day(30)})
	require.NoError(t, err)
	require.Empty(t, page.Records)

	// The plan reads only the partitions the window can reach: November (and
	// December, for keys created late in the window with a long TTL).
	touched := explainPartitions(t, b.reader, archive.QuerySQL, archive.QueryArgs(r, archive.Query{ScopePrefix: "idem:v1:", CreatedFrom: day(9), CreatedTo: day(15), Limit: 10})...)
	require.ElementsMatch(t, []string{"idempotency_key_archive_2026_11"}, touched)

	// Bad input is an error of its own kind, never a database error.
	for _, bad := range []archive.Query{
		{ScopePrefix: "", CreatedFrom: day(1), CreatedTo: day(2)},
		{ScopePrefix: "idem:", CreatedFrom: day(2), CreatedTo: day(1)},
		{ScopePrefix: "idem:", CreatedFrom: day(1)}, // no end: the zero time, before it
		{ScopePrefix: "idem:", CreatedFrom: day(1), CreatedTo: day(2), Limit: 100000},
		{ScopePrefix: "\U0010FFFF", CreatedFrom: day(1), CreatedTo: day(2)},
	} {
		_, err := r.Investigate(ctx, bad)
		require.ErrorIs(t, err, archive.ErrInvalidQuery, "%+v", bad)
	}
	for _, cur := range []string{"!!", "e30", "eyJrIjoiIn0"} {
		_, err := r.Investigate(ctx, archive.Query{ScopePrefix: "idem:", CreatedFrom: day(1), CreatedTo: day(2), Cursor: cur})
		require.ErrorIs(t, err, archive.ErrInvalidCursor, cur)
	}
}

// Every query is bounded: a lookup or investigation that cannot finish within
// its statement timeout (or the caller's deadline) is ErrTimeout, in every
// execution mode (exec and simple_protocol are the RDS Proxy modes), and the
// timeout is the query's alone: the connection goes back to the pool with
// its own statement_timeout. Where the server can enforce it (every mode
// but describe_exec, which prepares on every call), the server cancels the
// statement and the connection survives.
func TestQueriesAreBoundedByAStatementTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	stored := "idem:v1:" + ulid(now.Add(-2*time.Hour))
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: stored, Status: 201, ExpiredAt: now.Add(-time.Hour)})
	key := "idem:v1:" + ulid(now.Add(-time.Hour))
	q := archive.Query{ScopePrefix: "idem:", CreatedFrom: now.Add(-time.Hour), CreatedTo: now}
	lock := func(t *testing.T, table string) func() {
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		return func() { require.NoError(t, tx.Rollback(ctx)) }
	}
	for _, mode := range []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			pool, err := database.Open(ctx, database.Config{URL: b.db.URL, ExecMode: mode, MaxConns: 1}, nil)
			require.NoError(t, err)
			defer pool.Close()
			r, err := archive.NewReader(pool, archive.Config{StatementTimeout: 300 * time.Millisecond}, nil)
			require.NoError(t, err)
			// Warm the connection: found, not found, and an investigation.
			_, err = r.Lookup(ctx, stored, nil)
			require.NoError(t, err)
			_, err = r.Lookup(ctx, key, nil)
			require.ErrorIs(t, err, archive.ErrNotFound)
			_, err = r.Investigate(ctx, q)
			require.NoError(t, err)

			// Someone holds the archive exclusively: every query waits.
			unlock := lock(t, "idempotency_key_archive")
			for name, query := range map[string]func() error{
				"lookup":      func() error { _, err := r.Lookup(ctx, key, nil); return err },
				"investigate": func() error { _, err := r.Investigate(ctx, q); return err },
			} {
				start := time.Now()
				err := query()
				require.ErrorIs(t, err, archive.ErrTimeout, name)
				if mode != "describe_exec" {
					require.Equal(t, database.CodeQueryCanceled, database.SQLState(err), "%s: the server cancelled it", name)
					require.Less(t, time.Since(start), time.Second, name)
				} else {
					require.Less(t, time.Since(start), 2*time.Second, name)
				}
			}
			// A caller's deadline shorter than the statement timeout wins.
			short, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
			_, err = r.Lookup(short, key, nil)
			cancel()
			require.ErrorIs(t, err, archive.ErrTimeout)
			unlock()

			var setting string
			require.NoError(t, pool.QueryRow(ctx, "SHOW statement_timeout").Scan(&setting))
			require.Equal(t, "0", setting, "the statement timeout stayed with its query")

			// The writers' skews, read by a new reader on its first
			// timestamped lookup, are bounded too (migrate holds that
			// table exclusively for a moment on every deploy).
			unlock = lock(t, "idempotency_writers")
			cold, err := archive.NewReader(pool, archive.Config{StatementTimeout: 300 * time.Millisecond}, nil)
			require.NoError(t, err)
			start := time.Now()
			_, err = cold.Lookup(ctx, key, nil)
			require.ErrorIs(t, err, archive.ErrTimeout)
			require.Less(t, time.Since(start), 2*time.Second)
			unlock()
		})
	}
	_, err := archive.NewReader(nil, archive.Config{StatementTimeout: 500 * time.Microsecond}, nil)
	require.ErrorContains(t, err, "statement timeout")
}

// A lookup that must dial its connection first (TLS, an IAM token: slow)
// still has the server cancel its query at the timeout, which the Reader
// reckons from when it has the connection: the query ends with the
// server's 57014 before the context's backstop, and the connection stays
// in the pool rather than being closed and dialed again by the next lookup.
func TestATimeoutIsReckonedFromWhenTheConnectionIsReady(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			pool := b.db.NewPool(t, dbtest.AsRole(schema.ReaderRole), func(c *pgxpool.Config) {
				c.ConnConfig.DefaultQueryExecMode = mode
				c.MaxConns = 1
				c.AfterConnect = func(context.Context, *pgx.Conn) error {
					time.Sleep(150 * time.Millisecond) // a slow dial
					return nil
				}
			})
			r, err := archive.NewReader(pool, archive.Config{}, nil)
			require.NoError(t, err)
			// The lookup waits on a lock until its timeout.
			tx, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "LOCK TABLE idempotency_archive_plain_keys IN ACCESS EXCLUSIVE MODE")
			require.NoError(t, err)

			short, cancel := context.WithTimeout(ctx, time.Second)
			_, err = r.Lookup(short, "idem:v1:slow-dial", nil)
			cancel()
			require.ErrorIs(t, err, archive.ErrTimeout)
			require.ErrorIs(t, err, archive.ErrDeadlineBound)
			require.Equal(t, database.CodeQueryCanceled, database.SQLState(err), "the server cancelled it, not the backstop: %v", err)
			require.EqualValues(t, 1, pool.Stat().TotalConns(), "the connection stayed in the pool")
			dialed := pool.Stat().NewConnsCount()

			require.NoError(t, tx.Rollback(ctx))
			_, err = r.Lookup(ctx, "idem:v1:slow-dial", nil)
			require.ErrorIs(t, err, archive.ErrNotFound)
			require.Equal(t, dialed, pool.Stat().NewConnsCount(), "the next lookup dialed again")
		})
	}
}

// An investigation with a narrow created_at window over a broad prefix reads
// what it returns plus a bounded overhead, not every row of the month.
func TestANarrowInvestigationReadsLittle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// 60,000 rows over one day, inserted in created_at order as the sweeper
	// moves them.
	start := now.Add(-3 * 24 * time.Hour).Truncate(24 * time.Hour)
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		SELECT 'idem:v1:' || md5(i::text), sha256(i::text::bytea), 201, 'ch_' || i,
		       $1::timestamptz + i * interval '1440 milliseconds', $1::timestamptz + i * interval '1440 milliseconds' + interval '1 day'
		  FROM generate_series(1, 60000) AS i`, start)
	require.NoError(t, err)
	// What autovacuum does to an insert-only table: summarize the BRIN
	// ranges and gather statistics.
	_, err = b.db.Pool.Exec(ctx, "VACUUM ANALYZE idempotency_key_archive")
	require.NoError(t, err)

	r := newReader(t, b.reader, nil)
	from := start.Add(12 * time.Hour)
	q := archive.Query{ScopePrefix: "idem:", CreatedFrom: from, CreatedTo: from.Add(10 * time.Second), Limit: 100}
	page, err := r.Investigate(ctx, q)
	require.NoError(t, err)
	require.Len(t, page.Records, 7, "rows every 1.44s in a 10s window")

	var plan []map[string]any
	var raw []byte
	require.NoError(t, b.reader.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+archive.QuerySQL, archive.QueryArgs(r, q)...).Scan(&raw))
	require.NoError(t, json.Unmarshal(raw, &plan))
	top := plan[0]["Plan"].(map[string]any)
	buffers := top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)
	var heapPages int64
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT sum(relpages) FROM pg_class WHERE relname LIKE 'idempotency_key_archive_2%' AND relkind = 'r'").Scan(&heapPages))
	t.Logf("read %v blocks of %d heap pages", buffers, heapPages)
	require.Less(t, buffers, float64(heapPages)/10, "a 10-second window read more than a tenth of the archive: %s", raw)
}

// The upper bound of a timestamped key's lookup rests on a view of the
// writers up to a minute old and on the host's clock: when a writer that
// archives at completion appears meanwhile, or the host's clock steps back,
// the lookup proves the bound wrong and reads again without it.
func TestTheCeilingOfALookupIsProvenByEachLookup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var offset atomic.Int64 // how far this host's clock is behind, in ns
	r, err := archive.NewReader(b.reader, archive.Config{Now: func() time.Time { return time.Now().Add(-time.Duration(offset.Load())) }}, nil)
	require.NoError(t, err)
	real := time.Now()

	swept := "idem:v1:" + ulid(real.Add(-24*time.Hour))
	_, err = r.Lookup(ctx, swept, nil)
	require.ErrorIs(t, err, archive.ErrNotFound, "reads the writers: none archives at completion")

	// The host's clock steps back two hours after the Reader read the
	// database's: its bound would end before a row just swept.
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: swept, Status: 201, ExpiredAt: time.Now().Add(-time.Second)})
	offset.Store(int64(2 * time.Hour))
	rec, err := r.Lookup(ctx, swept, nil)
	require.NoError(t, err, "the proof fails and the lookup reads on")
	require.Equal(t, 201, rec.Status)
	offset.Store(0)
	_, err = r.Lookup(ctx, swept, nil)
	require.NoError(t, err, "reads the writers again")

	// A Redis store starts: it records itself, then archives at completion
	// with expired_at at the end of its window, weeks ahead.
	_, err = b.db.Pool.Exec(ctx, "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 300000, true, now(), now() + interval '10 minutes')")
	require.NoError(t, err)
	ahead := "idem:v1:" + ulid(real)
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: ahead, Status: 202, ExpiredAt: real.Add(20 * 24 * time.Hour)})
	rec, err = r.Lookup(ctx, ahead, nil)
	require.NoError(t, err, "the Reader's view of the writers is stale, and the proof says so")
	require.Equal(t, 202, rec.Status)
	// Read again, the writers allow no ceiling: the key's late row (20 days
	// past its timestamp, more than archive.PromptSpan) is recorded, and
	// bounds its lookup instead.
	hi := archive.ExpiryRange(r, ahead)[1].(pgtype.Timestamptz)
	require.Equal(t, pgtype.Finite, hi.InfinityModifier)
	require.WithinDuration(t, real.Add(20*24*time.Hour), hi.Time, time.Microsecond)
}

// A writer that bounds nothing (an older release during a rolling deploy)
// may appear after a Reader read the writers and store a key hours before
// its timestamp, with a TTL of a second: the proof after the lookup catches
// the stale view, and the lookup reads every partition.
func TestAStaleViewOfTheWritersIsCaughtByTheProof(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r, err := archive.NewReader(b.reader, archive.Config{}, nil)
	require.NoError(t, err)
	key := "idem:v1:" + ulid(time.Now().Add(3*time.Hour))
	_, err = r.Lookup(ctx, key, nil)
	require.ErrorIs(t, err, archive.ErrNotFound, "reads the writers: all bounded")

	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: key, Status: 201, ExpiresAt: time.Now().Add(-time.Second)})
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_writers WHERE NOT bounded"))
	sw, err := sweep.New(b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole)), sweep.Config{}, nil, nil)
	require.NoError(t, err)
	_, err = sw.Run(ctx)
	require.NoError(t, err)

	rec, err := r.Lookup(ctx, key, nil)
	require.NoError(t, err, "a row stored three hours before its timestamp, after the Reader read the writers")
	require.Equal(t, 201, rec.Status)
}

// A role, database or parameter group may set another DateStyle, or
// bytea_output = escape. In the exec and simple_protocol modes (RDS Proxy's)
// results come back as text, which pgx reads only in ISO dates and hex
// bytea: the Reader pins its own, so that every lookup and investigation
// reads the same in every mode (a lookup that failed on the fingerprint
// would run a late retry again behind a middleware that fails open).
func TestTheReaderReadsUnderAnyDateStyleOrByteaOutput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	created := time.Date(2026, 11, 14, 9, 30, 15, 123456000, time.UTC)
	plain := "idem:v1:t=acme:order-1"
	stamped := "idem:v1:t=acme:" + ulid(time.Now().Add(-time.Hour))
	dbtest.InsertArchive(t, b.db.Pool,
		dbtest.ArchiveRow{Key: plain, Status: 201, CreatedAt: created, ExpiredAt: created.Add(24 * time.Hour)},
		dbtest.ArchiveRow{Key: stamped, Status: 202, CreatedAt: time.Now().Add(-time.Hour), ExpiredAt: time.Now().Add(-time.Minute)})
	modes := []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe, pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol}
	for _, style := range []string{"SQL, DMY", "German", "Postgres, MDY"} {
		for _, mode := range modes {
			pool := b.db.NewPool(t, dbtest.AsRole(schema.ReaderRole), dbtest.WithParam("DateStyle", style), dbtest.WithParam("TimeZone", "Asia/Kathmandu"),
				dbtest.WithParam("bytea_output", "escape"), func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			r, err := archive.NewReader(pool, archive.Config{}, nil)
			require.NoError(t, err)
			rec, err := r.Lookup(ctx, plain, dbtest.Fingerprint(plain))
			require.NoError(t, err, "%s, %v", style, mode)
			require.Equal(t, created, rec.CreatedAt, "%s, %v", style, mode)
			require.Equal(t, true, *rec.FingerprintMatch, "%s, %v", style, mode)
			rec, err = r.Lookup(ctx, stamped, dbtest.Fingerprint("another request"))
			require.NoError(t, err, "%s, %v", style, mode)
			require.Equal(t, 202, rec.Status)
			require.Equal(t, false, *rec.FingerprintMatch, "%s, %v", style, mode)
			_, err = r.Lookup(ctx, "idem:v1:t=acme:never", nil)
			require.ErrorIs(t, err, archive.ErrNotFound, "%s, %v", style, mode)
			page, err := r.Investigate(ctx, archive.Query{ScopePrefix: "idem:v1:t=acme:order", CreatedFrom: created.Add(-time.Hour), CreatedTo: created.Add(time.Hour)})
			require.NoError(t, err, "%s, %v", style, mode)
			require.Len(t, page.Records, 1)
			require.Equal(t, created, page.Records[0].CreatedAt)
			pool.Close()
		}
	}
}
