package partition_test

// What migration 13's recording triggers and registry promise when an owner
// disables triggers, or interrupts a detach below a month.

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/verify"
)

const recordedCheck = "every partition's rows are recorded"

func triggerChecks(t *testing.T, db *dbtest.DB) map[string]verify.Check {
	t.Helper()
	checks, err := verify.Run(context.Background(), db.Pool, verify.Options{Now: at(decNow)})
	require.NoError(t, err)
	out := map[string]verify.Check{}
	for _, c := range checks {
		out[c.Name] = c
	}
	return out
}

func triggerLookup(t *testing.T, db *dbtest.DB, key string) error {
	t.Helper()
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(context.Background(), key, nil)
	return err
}

// A recording statement trigger switched to ENABLE REPLICA (tgenabled 'R')
// fires in no ordinary session: the partition counts as unadopted, verify
// fails, and the run adopts it (enabling the trigger again), so that the row
// written into it by name meanwhile is found.
func TestAReplicaOnlyRecordingTriggerCountsAsMissing(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive_2026_11 ENABLE REPLICA TRIGGER idempotency_key_archive_plain_keys`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:by-name-replica', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`)
	require.NoError(t, err)

	unrecorded, err := partition.ListUnrecorded(ctx, db.Pool)
	require.NoError(t, err)
	assert.NotEmpty(t, unrecorded, "a partition whose recording trigger does not fire must be listed")
	assert.False(t, triggerChecks(t, db)[recordedCheck].Pass, "verify must fail: %s", triggerChecks(t, db)[recordedCheck].Figure)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, []string{"idempotency_key_archive_2026_11"}, res.Adopted, "the run must adopt it again")
	assert.NoError(t, triggerLookup(t, db, "idem:v1:by-name-replica"), "an archived key must never be answered not found")
}

// The row trigger of migration 13 is what records a row a MERGE moves to
// another month on PostgreSQL 15. Its clone disabled on one partition, the
// partition counts as unadopted, verify fails, and the run adopts it with
// every expiry pending (the moved row may lie in any month), so that the
// row is found.
func TestADisabledRowTriggerMakesEveryExpiryPending(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:merged-control', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00'),
		       ('idem:v1:merged-moved', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`)
	require.NoError(t, err)
	merge := `MERGE INTO idempotency_key_archive a USING (SELECT $1::text AS k) s ON a.scoped_key = s.k
		WHEN MATCHED THEN UPDATE SET expired_at = '2026-12-20 10:00:00+00'`

	// Control: with the row trigger on, the moved row is found.
	_, err = db.Pool.Exec(ctx, merge, "idem:v1:merged-control")
	require.NoError(t, err)
	require.NoError(t, triggerLookup(t, db, "idem:v1:merged-control"))

	// The clone disabled on the month.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive_2026_11 DISABLE TRIGGER idempotency_key_archive_updated_plain_key`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, merge, "idem:v1:merged-moved")
	require.NoError(t, err)

	unrecorded, err := partition.ListUnrecorded(ctx, db.Pool)
	require.NoError(t, err)
	assert.NotEmpty(t, unrecorded, "a partition whose row trigger is disabled must be listed")
	assert.False(t, triggerChecks(t, db)[recordedCheck].Pass, "verify must fail")
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	assert.Equal(t, []string{"idempotency_key_archive_2026_11"}, res.Adopted)
	assert.NoError(t, triggerLookup(t, db, "idem:v1:merged-moved"), "an archived key must never be answered not found")
	// The trigger is on again: the month counts as adopted.
	unrecorded, err = partition.ListUnrecorded(ctx, db.Pool)
	require.NoError(t, err)
	assert.Empty(t, unrecorded)
}

// A month partitioned further, one of whose halves was left detach-pending
// by an interrupted DETACH ... CONCURRENTLY (of the half, from the month):
// its rows are invisible to every query. The manager finalizes and attaches
// again only months (the archive's own partitions): the half is reported in
// the run's failed list, with what to do, and verify fails until it is done.
func TestADetachPendingHalfOfAMonthIsReported(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_11 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (expired_at);
		CREATE TABLE idempotency_key_archive_2025_11a PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-11-16 00:00:00+00');
		CREATE TABLE idempotency_key_archive_2025_11b PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-16 00:00:00+00') TO ('2025-12-01 00:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_11
			FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)
	_, err = m.Run(ctx, false)
	require.NoError(t, err)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:in-second-half", Status: 201,
		ExpiredAt: time.Date(2025, 11, 20, 10, 0, 0, 0, time.UTC)})
	require.NoError(t, triggerLookup(t, db, "idem:v1:in-second-half"))

	// Interrupt a DETACH ... CONCURRENTLY of the half.
	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET statement_timeout = '1s'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER TABLE idempotency_key_archive_2025_11 DETACH PARTITION idempotency_key_archive_2025_11b CONCURRENTLY")
	require.ErrorContains(t, err, "statement timeout")
	_, err = conn.Exec(ctx, "RESET statement_timeout")
	require.NoError(t, err)
	conn.Release()
	require.NoError(t, reader.Rollback(ctx))

	res, err := m.Run(ctx, false)
	require.Error(t, err)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "idempotency_key_archive_2025_11b", res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, "DETACH PARTITION idempotency_key_archive_2025_11b FINALIZE")
	require.False(t, triggerChecks(t, db)[recordedCheck].Pass, "verify must fail while a table of the archive's tree is detach-pending")

	// Done as it says, the half is adopted and its rows found again.
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive_2025_11 DETACH PARTITION idempotency_key_archive_2025_11b FINALIZE;
		ALTER TABLE idempotency_key_archive_2025_11 ATTACH PARTITION idempotency_key_archive_2025_11b
			FOR VALUES FROM ('2025-11-16 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_11b"}, res.Adopted)
	require.True(t, triggerChecks(t, db)[recordedCheck].Pass)
	require.NoError(t, triggerLookup(t, db, "idem:v1:in-second-half"))
}
