package plainkeys_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/plainkeys"
)

// halfIndexed archives n plain keys in month, marks the month pending
// (as the manager's attach does) and records the first half, leaving the
// range's position in the middle, as a run whose budget ran out does.
func halfIndexed(t *testing.T, n int) *dbtest.DB {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 1)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		SELECT format('idem:v1:k-%s', lpad(g::text, 6, '0')), '\x00', 201, $1::timestamptz, $1::timestamptz + g * interval '1 second'
		  FROM generate_series(1, $2::int) g`, month, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `TRUNCATE idempotency_archive_plain_keys`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ($1, $2)`,
		month, month.AddDate(0, 1, 0))
	require.NoError(t, err)
	// A first run recorded half of it (Index's own batches), then ran out of budget.
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_archive_plain_keys (key_hash, expired_at)
		SELECT idempotency_key_hash(scoped_key), expired_at FROM idempotency_key_archive WHERE scoped_key <= format('idem:v1:k-%s', lpad(($1/2)::text, 6, '0'));
	`, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		UPDATE idempotency_archive_plain_keys_pending p SET after_key = a.scoped_key, after_expired_at = a.expired_at
		  FROM idempotency_key_archive a WHERE a.scoped_key = format('idem:v1:k-%s', lpad(($1/2)::text, 6, '0'))`, n)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		UPDATE idempotency_archive_late_keys_pending l SET after_key = p.after_key, after_expired_at = p.after_expired_at
		  FROM idempotency_archive_plain_keys_pending p WHERE (l.expired_from, l.expired_to) = (p.expired_from, p.expired_to)`)
	require.NoError(t, err)
	return db
}

// A range marked pending again while a batch indexes it (the README's
// remedy for rows restored with triggers off: ON CONFLICT ... DO UPDATE
// resets its position) keeps its reset: the batch, which started from the
// old position and so never saw the restored rows before it, does not
// overwrite the reset with its own end. The next batches scan the range from
// its start.
func TestARangeMarkedAgainDuringABatchKeepsItsReset(t *testing.T) {
	t.Parallel()
	const n = 20_000
	db := halfIndexed(t, n)
	ctx := context.Background()
	middle := fmt.Sprintf("idem:v1:k-%06d", n/2)

	// The operator's reset, held uncommitted until Index's first batch
	// waits for the range's row.
	op, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = op.Rollback(ctx) }()
	_, err = op.Exec(ctx, `INSERT INTO idempotency_archive_plain_keys_pending (expired_from, expired_to) VALUES ($1, $2)
		ON CONFLICT (expired_from, expired_to) DO UPDATE SET after_key = '', after_expired_at = '-infinity'`, month, month.AddDate(0, 1, 0))
	require.NoError(t, err)
	var opPID int32
	require.NoError(t, op.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&opPID))

	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	done := make(chan error, 1)
	go func() {
		// Batches of one row, and a budget that ends long before a scan
		// from the start could pass the middle again.
		_, err := plainkeys.Index(ctx, conn.Conn(), 1, plainkeys.Limits{LockTimeout: 20 * time.Second}, time.Now().Add(3*time.Second))
		done <- err
	}()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity
			WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE '%FROM idempotency_archive_plain_keys_pending%FOR UPDATE%'`, opPID) > 0
	}, 10*time.Second, 20*time.Millisecond, "Index's batch waits for the operator's row")
	require.NoError(t, op.Commit(ctx))
	require.NoError(t, <-done)

	var after string
	require.NoError(t, db.Pool.QueryRow(ctx, `SELECT after_key FROM idempotency_archive_plain_keys_pending
		WHERE expired_from = $1 AND expired_to = $2`, month, month.AddDate(0, 1, 0)).Scan(&after))
	require.Less(t, after, middle, "the range is scanned again from its start, not from past the middle")
}
