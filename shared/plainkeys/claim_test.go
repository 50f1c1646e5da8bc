package plainkeys_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/database"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// restoreAndMark starts the README's remedy for rows restored with triggers
// off, uncommitted: a row of the month without its record (as a restore
// with triggers off leaves it), then the month marked pending again with
// ON CONFLICT ... DO UPDATE, which puts a range already pending back at its
// start. It returns the transaction and its backend's pid.
func restoreAndMark(t *testing.T, db *dbtest.DB, key string) (interface {
	Commit(context.Context) error
}, int32) {
	t.Helper()
	ctx := context.Background()
	op, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = op.Rollback(ctx) })
	_, err = op.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ($1, '\x00', 201, 'ch_restored', $2, $3)`, key, month, month.Add(2*time.Hour))
	require.NoError(t, err)
	_, err = op.Exec(ctx, `DELETE FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1)`, key)
	require.NoError(t, err)
	_, err = op.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ($1, $2)
		ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity'`, month, month.AddDate(0, 1, 0))
	require.NoError(t, err)
	var pid int32
	require.NoError(t, op.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	return op, pid
}

// A month marked pending again while Index runs the range's first batch
// (which starts where the mark puts it back, at the range's start) keeps
// the rows the mark was for: whichever commits first, the restored row is
// recorded or its range stays pending, and a lookup finds it. Before,
// checking the range's position only when the batch ended, a mark that
// committed after the batch's read began left the range where the batch
// expected it: the batch removed it, and the row, never read, was answered
// "not found" (a late retry would run again).
func TestAMarkDuringARangesFirstBatchKeepsItsRows(t *testing.T) {
	t.Parallel()
	for _, markFirst := range []bool{true, false} {
		db := dbtest.New(t)
		db.Partition(t, 1)
		ctx := context.Background()
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:already", Status: 201, ExpiredAt: month.Add(time.Hour)})
		_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ($1, $2)`, month, month.AddDate(0, 1, 0))
		require.NoError(t, err)

		conn, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		index := func() chan error {
			done := make(chan error, 1)
			go func() {
				_, err := plainkeys.Index(ctx, conn.Conn(), plainkeys.DefaultBatch, plainkeys.Limits{LockTimeout: 20 * time.Second}, time.Now().Add(30*time.Second))
				done <- err
			}()
			return done
		}
		key := "idem:v1:restored-row"
		if markFirst {
			// The mark holds the range's row; Index's batch waits for it.
			op, pid := restoreAndMark(t, db, key)
			done := index()
			require.Eventually(t, func() bool {
				return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pid) > 0
			}, 20*time.Second, 20*time.Millisecond, "Index's batch waits for the mark")
			require.NoError(t, op.Commit(ctx))
			require.NoError(t, <-done)
		} else {
			// The batch holds the range's row (an owner's lock taken
			// first stands in for the batch, which then waits on it
			// behind the mark): the mark waits for the batch.
			hold, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = hold.Rollback(ctx) })
			_, err = hold.Exec(ctx, `SELECT 1 FROM idempotency_archive_plain_keys_pending FOR UPDATE`)
			require.NoError(t, err)
			var holdPID int32
			require.NoError(t, hold.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&holdPID))
			done := index()
			require.Eventually(t, func() bool {
				return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, holdPID) > 0
			}, 20*time.Second, 20*time.Millisecond, "Index's batch waits for the lock")
			require.NoError(t, hold.Commit(ctx))
			require.NoError(t, <-done)
			// Index finished the range; the restore and mark come after.
			op, _ := restoreAndMark(t, db, key)
			require.NoError(t, op.Commit(ctx))
		}
		conn.Release()

		r, err := archive.NewReader(db.NewPool(t, dbtest.AsRole(schema.ReaderRole)), archive.Config{}, nil)
		require.NoError(t, err)
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, "mark first %v: the restored row is in the archive", markFirst)
		require.Equal(t, 201, rec.Status)

		// And once Index has run again, the row is recorded.
		c, err := db.Pool.Acquire(ctx)
		require.NoError(t, err)
		_, err = plainkeys.Index(ctx, c.Conn(), plainkeys.DefaultBatch, limits, time.Now().Add(30*time.Second))
		c.Release()
		require.NoError(t, err)
		require.EqualValues(t, 1, dbtest.Count(t, db.Pool, `SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash($1)`, key), "mark first %v", markFirst)
		require.Zero(t, dbtest.Count(t, db.Pool, `SELECT count(*) FROM idempotency_archive_plain_keys_pending`))
	}
}

// Settings at their extremes: a batch of the largest int over many ranges
// (its doubling once overflowed into a negative LIMIT), a deadline a month
// away (once a statement_timeout PostgreSQL refuses), and a lock timeout
// under a millisecond, which is a millisecond, not none (written "0ms", it
// once waited until the deadline).
func TestLimitsAtTheirExtremes(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 1)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to)
		SELECT '2001-01-01'::timestamptz + g * interval '1 day', '2001-01-01'::timestamptz + g * interval '1 day' + interval '1 hour'
		  FROM generate_series(1, 70) g`)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	// The lock timeout first, while the ranges are pending: a lock on
	// them makes the batch wait.
	hold, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(ctx) }) // before the schema is dropped, should the test fail
	_, err = hold.Exec(ctx, "SELECT 1 FROM idempotency_archive_plain_keys_pending FOR UPDATE")
	require.NoError(t, err)
	_, err = plainkeys.Index(ctx, conn.Conn(), plainkeys.DefaultBatch, plainkeys.Limits{LockTimeout: 500 * time.Microsecond}, time.Now().Add(time.Minute))
	require.Error(t, err, "a lock timeout of 500µs ends the wait long before the deadline")
	require.Equal(t, database.CodeLockNotAvailable, database.SQLState(err), "%v", err)
	require.NoError(t, hold.Rollback(ctx))

	p, err := plainkeys.Index(ctx, conn.Conn(), math.MaxInt, limits, time.Now().Add(30*24*time.Hour))
	require.NoError(t, err)
	require.Equal(t, 70, p.RangesDone)
	_, err = plainkeys.Prune(ctx, conn.Conn(), math.MaxInt, limits, time.Now().Add(30*24*time.Hour))
	require.NoError(t, err)
}
