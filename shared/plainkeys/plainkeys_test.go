package plainkeys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/schema"
)

var limits = plainkeys.Limits{LockTimeout: time.Second}

// month is the current one: dbtest.Partition creates it.
var month = partition.MonthStart(time.Now())

// archiveUnrecorded archives n plain and n timestamped keys (used as they
// were minted) in month and forgets the records of the plain ones, as for rows archived before
// migration 006, and marks everything pending as that migration does.
func archiveUnrecorded(t *testing.T, db *dbtest.DB, n int) []string {
	t.Helper()
	var plain []string
	for i := range n {
		key := fmt.Sprintf("idem:v1:plain-%03d", i)
		plain = append(plain, key)
		dbtest.InsertArchive(t, db.Pool,
			dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: month.Add(time.Duration(i) * time.Hour)},
			dbtest.ArchiveRow{Key: "idem:v1:" + dbtest.ULID(month.Add(time.Duration(i-24)*time.Hour), fmt.Sprintf("%016d", i)), Status: 201, ExpiredAt: month.Add(time.Duration(i) * time.Hour)})
	}
	_, err := db.Pool.Exec(context.Background(), `
		TRUNCATE idempotency_archive_plain_keys;
		INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('-infinity', 'infinity')`)
	require.NoError(t, err)
	return plain
}

// setup is a database with 10 plain and 10 timestamped keys archived and
// not recorded, and the plain keys.
func setup(t *testing.T) (*dbtest.DB, []string) {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 1)
	return db, archiveUnrecorded(t, db, 10)
}

func lookupAll(t *testing.T, pool *pgxpool.Pool, keys []string) {
	t.Helper()
	r, err := archive.NewReader(pool, archive.Config{}, nil)
	require.NoError(t, err)
	for _, k := range keys {
		_, err := r.Lookup(context.Background(), k, nil)
		require.NoError(t, err, k)
	}
}

func TestIndexRecordsPendingRowsInBatchesAndResumes(t *testing.T) {
	t.Parallel()
	db, plain := setup(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer func() { conn.Release() }()

	// A run out of time does nothing and says so.
	p, err := plainkeys.Index(ctx, conn.Conn(), 3, limits, time.Now())
	require.NoError(t, err)
	require.Equal(t, plainkeys.Progress{RangesLeft: 1}, p)

	// A cancelled run fails and leaves the range pending.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = plainkeys.Index(cancelled, conn.Conn(), 3, limits, time.Now().Add(time.Minute))
	require.ErrorIs(t, err, context.Canceled)
	conn.Release()
	conn, err = db.Pool.Acquire(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))

	p, err = plainkeys.Index(ctx, conn.Conn(), 7, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, 20, p.Scanned, "once: the range's copy under migration 010's rule went along in the same batches")
	require.EqualValues(t, 10, p.Recorded, "only the keys without a timestamp")
	require.Equal(t, 1, p.RangesDone)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_late_keys_pending"))
	require.EqualValues(t, 10, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))
	// Nothing pending any more: lookups rely on the records alone.
	lookupAll(t, db.NewPool(t, dbtest.AsRole(schema.ReaderRole)), plain)
}

func TestIndexStopsAtItsDeadlineBetweenBatches(t *testing.T) {
	t.Parallel()
	db, plain := setup(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	// A deadline that passes during the first batch: one batch runs.
	p, err := plainkeys.Index(ctx, conn.Conn(), 4, limits, time.Now().Add(time.Millisecond))
	time.Sleep(2 * time.Millisecond)
	require.NoError(t, err)
	require.LessOrEqual(t, p.Scanned, int64(20))
	left := dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending")
	if p.Scanned < 20 {
		require.EqualValues(t, 1, left)
		require.Equal(t, 1, p.RangesLeft)
	}
	// Still pending: every key is found meanwhile, recorded or not.
	lookupAll(t, db.NewPool(t, dbtest.AsRole(schema.ReaderRole)), plain)

	for left > 0 {
		_, err = plainkeys.Index(ctx, conn.Conn(), 4, limits, time.Now().Add(time.Minute))
		require.NoError(t, err)
		left = dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending")
	}
	require.EqualValues(t, 10, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))
	lookupAll(t, db.NewPool(t, dbtest.AsRole(schema.ReaderRole)), plain)
}

// Rows archived before migration 010 lie in its pending range: Index
// records the late ones among them (timestamped keys used long after their
// timestamp), and removes the range, while the range of migration 006 is
// not reopened.
func TestIndexRecordsLateRowsOfThePendingRange(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 1)
	ctx := context.Background()
	var late []string
	for i := range 12 {
		expired := month.Add(time.Duration(i) * time.Hour)
		minted := expired.Add(-archive.PromptSpan + time.Hour + time.Millisecond) // used promptly enough: not recorded
		if i%2 == 0 {
			minted = expired.Add(-archive.PromptSpan - time.Millisecond)
			late = append(late, fmt.Sprintf("idem:v1:late-%02d:%s", i, dbtest.UUIDv7(minted, uint64(i))))
			dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: late[len(late)-1], Status: 201, ExpiredAt: expired})
			continue
		}
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:" + dbtest.ULID(minted, fmt.Sprintf("%016d", i)), Status: 201, ExpiredAt: expired})
	}
	require.EqualValues(t, 6, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"), "the trigger records the late rows")
	_, err := db.Pool.Exec(ctx, `
		TRUNCATE idempotency_archive_plain_keys;
		INSERT INTO idempotency_archive_late_keys_pending (expired_from, expired_to) VALUES ('-infinity', 'infinity')`)
	require.NoError(t, err)

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	p, err := plainkeys.Index(ctx, conn.Conn(), 5, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Equal(t, plainkeys.Progress{Scanned: 12, Recorded: 6, RangesDone: 1}, p)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_late_keys_pending"))
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	for _, k := range late {
		require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1)", k), k)
	}
}

func TestPruneDeletesOnlyRecordsOfMonthsNoPartitionHolds(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys
		SELECT g, '2026-09-15'::timestamptz + g * interval '1 day' FROM generate_series(0, 59) g`)
	require.NoError(t, err)

	// No partition at all: nothing tells retired months from future ones.
	n, err := plainkeys.Prune(ctx, conn.Conn(), 7, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = conn.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2026_10 PARTITION OF idempotency_key_archive
		   FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00');
		CREATE TABLE idempotency_key_archive_2026_11 PARTITION OF idempotency_key_archive
		   FOR VALUES FROM ('2026-11-01 00:00:00+00') TO ('2026-12-01 00:00:00+00')`)
	require.NoError(t, err)
	n, err = plainkeys.Prune(ctx, conn.Conn(), 7, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, 16, n, "15 to 30 September")
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE expired_at < '2026-10-01'"))
	require.EqualValues(t, 44, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))

	// A month detached (or restored) beside the archive may be attached
	// again: its records stay, whatever the session's time zone.
	_, err = conn.Exec(ctx, `
		SET TimeZone = 'America/New_York';
		INSERT INTO idempotency_archive_plain_keys VALUES (-2, '2026-08-01 00:30:00+00'), (-3, '2026-07-31 23:00:00+00');
		CREATE TABLE idempotency_key_archive_2026_08 (LIKE idempotency_key_archive)`)
	require.NoError(t, err)
	n, err = plainkeys.Prune(ctx, conn.Conn(), 7, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only the record of July")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = -2"))

	// A partition that can hold any expiry keeps every record.
	_, err = conn.Exec(ctx, `
		INSERT INTO idempotency_archive_plain_keys VALUES (-1, '2020-01-01');
		CREATE TABLE idempotency_key_archive_old PARTITION OF idempotency_key_archive
		   FOR VALUES FROM (MINVALUE) TO ('2026-10-01 00:00:00+00')`)
	require.NoError(t, err)
	n, err = plainkeys.Prune(ctx, conn.Conn(), 7, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Zero(t, n)

	_, err = plainkeys.Prune(ctx, conn.Conn(), 0, limits, time.Now().Add(time.Minute))
	require.ErrorContains(t, err, "batch must be positive")
}

// A partition bound is read back as an instant whatever DateStyle and time
// zone the session has ("IST" in the SQL style reads as Israel's).
func TestPruneReadsBoundsWhateverTheSessionsDateStyle(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	pool := db.NewPool(t, dbtest.WithParam("DateStyle", "SQL, DMY"), dbtest.WithParam("TimeZone", "Asia/Kolkata"))
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, `
		CREATE TABLE restored_2026_10 PARTITION OF idempotency_key_archive
		   FOR VALUES FROM ('2026-10-01 00:00:00+00') TO ('2026-11-01 00:00:00+00');
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:early', '\x00', 201, '2026-09-30 01:00:00+00', '2026-10-01 01:00:00+00')`)
	require.NoError(t, err)
	n, err := plainkeys.Prune(ctx, conn.Conn(), 7, limits, time.Now().Add(time.Minute))
	require.NoError(t, err)
	require.Zero(t, n)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))
}

// A lock held on the table bounds Index by its lock timeout, not the run.
func TestIndexWaitsForALockAtMostItsTimeout(t *testing.T) {
	t.Parallel()
	db, _ := setup(t)
	ctx := context.Background()
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_archive_plain_keys IN SHARE MODE")
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	start := time.Now()
	p, err := plainkeys.Index(ctx, conn.Conn(), 100, plainkeys.Limits{LockTimeout: 200 * time.Millisecond}, time.Now().Add(time.Minute))
	require.ErrorContains(t, err, "lock timeout")
	require.Less(t, time.Since(start), 30*time.Second)
	require.Equal(t, 1, p.RangesLeft, "a failed run still says what waits")
}

// A backfill longer than a run's budget is not a failure: a run whose
// budget runs out mid-batch stops without an error (the batch is rolled
// back and done again next run), and batches start small and grow, so a run
// whose budget is shorter than one full batch still records rows. With a
// fixed batch that outlasted the budget, every run would fail on the same
// batch, and the pending range (every lookup of a key without a timestamp
// reads every partition while it lasts) would never go.
func TestABackfillLongerThanItsBudgetResumesWithoutFailing(t *testing.T) {
	t.Parallel()
	// GIVEN 200,000 archive rows of keys without a timestamp, none recorded
	db := dbtest.New(t)
	db.Partition(t, 1)
	ctx := context.Background()
	const rows = 200_000
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		SELECT 'idem:v1:plain-' || g, '\x00', 201, $1::timestamptz, $1::timestamptz + g * interval '1 millisecond'
		  FROM generate_series(1, $2::int) g`, month, rows)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `TRUNCATE idempotency_archive_plain_keys;
		INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ('-infinity', 'infinity')`)
	require.NoError(t, err)

	// WHEN partition runs with a budget of 1 s each run until the range
	// is done (a few runs on 2 cores; the budget is every statement's
	// timeout too, and shorter ones, 400 ms the last, failed the run's
	// other steps on a loaded machine)
	m, err := partition.NewManager(db.Pool, partition.Config{StatementTimeout: time.Second}, nil)
	require.NoError(t, err)
	var runs, empty int
	for left := 1; left > 0; runs++ {
		require.Less(t, runs, 200, "the backfill does not finish")
		res, err := m.Run(ctx, false)

		// THEN no run fails, and runs record rows (on a loaded machine a
		// run's budget may pass before its first small batch ends: most
		// runs must still make progress)
		require.NoError(t, err, "run %d", runs)
		if res.PlainKeys.Scanned == 0 {
			empty++
		}
		left = res.PlainKeys.RangesLeft
	}
	require.LessOrEqual(t, empty, runs/2, "%d of %d runs recorded nothing", empty, runs)
	require.EqualValues(t, rows, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	t.Logf("%d runs", runs)
}
