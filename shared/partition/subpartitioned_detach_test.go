package partition_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/verify"
)

// mustExec runs sql on db's pool.
func mustExec(t *testing.T, db *dbtest.DB, sql string) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), sql)
	require.NoError(t, err)
}

// subPartitionedNovember2025 attaches November 2025 as a month partitioned
// in two halves (a shape the README supports: "to a month that is
// partitioned itself"), with one archived row, and lets a run adopt it.
func subPartitionedNovember2025(t *testing.T, db *dbtest.DB, m *partition.Manager) {
	t.Helper()
	mustExec(t, db, `
		CREATE TABLE idempotency_key_archive_2025_11 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (expired_at);
		CREATE TABLE idempotency_key_archive_2025_11a PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-11-16 00:00:00+00');
		CREATE TABLE idempotency_key_archive_2025_11b PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-16 00:00:00+00') TO ('2025-12-01 00:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_11
			FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-12-01 00:00:00+00');
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:sub-nov', '\x00', 201, 'ch_sub', '2025-11-20 10:00:00+00', '2025-11-21 10:00:00+00')`)
	res, err := m.Run(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Adopted)
}

// A month inside the retention that is partitioned itself and was detached
// by hand is attached again with its rows, as a plain month is: left out,
// lookups would answer its keys "never seen" while the run exits clean and
// verify passes.
func TestASubPartitionedMonthDetachedByHandIsAttachedAgain(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t) // retention 0: keep everything
	ctx := context.Background()
	subPartitionedNovember2025(t, db, m)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:sub-nov", nil)
	require.NoError(t, err)

	// WHEN an operator detaches the month by hand, and the next run comes
	mustExec(t, db, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2025_11")
	res, err := m.Run(ctx, false)
	require.NoError(t, err)

	// THEN it is attached again with its rows
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Reattached)
	_, err = r.Lookup(ctx, "idem:v1:sub-nov", nil)
	require.NoError(t, err)
}

// The manager's own retirement of such a month, interrupted between its
// DETACH ... CONCURRENTLY and its DROP (or a month detached by hand outside
// the retention): the next run drops it, partitioned or not.
func TestASubPartitionedMonthLeftDetachedOutsideTheRetentionIsDropped(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	subPartitionedNovember2025(t, db, m)
	mustExec(t, db, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2025_11 CONCURRENTLY")

	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 6}).Run(ctx, false)
	require.NoError(t, err)
	require.Contains(t, res.Retired, "idempotency_key_archive_2025_11", "the detached month outside the retention is left behind")
}

// An interrupted DETACH ... CONCURRENTLY of a month that is partitioned
// itself, inside the retention: the next run finalizes it and attaches it
// again, and its rows are found.
func TestAnInterruptedDetachOfASubPartitionedMonthIsAttachedAgain(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	subPartitionedNovember2025(t, db, m)
	interruptDetach(t, db, "idempotency_key_archive_2025_11")
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Reattached)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:sub-nov", nil)
	require.NoError(t, err)
	checks, err := verify.Run(ctx, db.Pool, verify.Options{Now: at(decNow)})
	require.NoError(t, err)
	for _, c := range checks {
		require.True(t, c.Pass || c.Name == "recent archive rows exist", "verify %q: %s", c.Name, c.Figure)
	}
}
