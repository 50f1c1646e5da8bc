package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A month attached by hand that is itself partitioned (two halves): the
// adoption gives every table of its tree the recording triggers, so that a
// row written by name into a half is recorded like one written into the
// month.
func TestAWriteByNameIntoASubPartitionOfAnAdoptedMonthIsRecorded(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	var err error
	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_11 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (expired_at);
		CREATE TABLE idempotency_key_archive_2025_11a PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-11-16 00:00:00+00');
		CREATE TABLE idempotency_key_archive_2025_11b PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-16 00:00:00+00') TO ('2025-12-01 00:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_11
			FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Adopted)

	// WHEN the owner writes a row into a half by name
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2025_11a (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:into-a-half', '\x00', 201, 'ch_half', '2025-11-01 10:00:00+00', '2025-11-02 10:00:00+00')`)
	require.NoError(t, err)

	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	rec, err := r.Lookup(ctx, "idem:v1:into-a-half", nil)
	require.NoError(t, err, "an archived key must never be answered not found")
	require.Equal(t, "ch_half", *rec.ResourceID)
}

// A hand-made partition covering a quarter (reported Foreign) covers every
// month of an expired backlog in it, and the sweeper sweeps into it: the
// partition run creates no month for that backlog (it would overlap the
// quarter), and does not fail.
func TestABacklogMonthInsideAWiderPartitionNeedsNoMonthOfItsOwn(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	var err error
	_, err = db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2024_q1 PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2024-01-01 00:00:00+00') TO ('2024-04-01 00:00:00+00')`)
	require.NoError(t, err)
	before, err := m.Run(ctx, false)
	require.NoError(t, err, "a wider partition alone fails no run")
	require.NotEmpty(t, before.Foreign)

	// GIVEN an expired live row of February 2024
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at)
		VALUES ('idem:v1:old-live', decode(repeat('00', 32), 'hex'), 'completed', 201, '2024-02-01 10:00:00+00', '2024-02-02 10:00:00+00')`)
	require.NoError(t, err)
	parts, err := partition.List(ctx, db.Pool)
	require.NoError(t, err)
	require.True(t, partition.Covers(parts, time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC)), "the quarter covers February")

	res, err := m.Run(ctx, false)
	require.NoError(t, err, "a month already covered needs no partition")
	require.NotContains(t, res.Created, "idempotency_key_archive_2024_02")
}

// A backlog month of year 1 is created and kept while its rows wait, under
// the exec modes of RDS Proxy too; a BC row, which no batch claims, needs
// none.
func TestABacklogMonthOfYearOneIsCreatedInEveryExecMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		db := dbtest.New(t)
		ctx := context.Background()
		pool := db.NewPool(t, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
		_, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at)
			VALUES ('idem:v1:year-one', decode(repeat('00', 32), 'hex'), 'completed', 201, '0001-01-01 10:00:00+00', '0001-01-15 10:00:00+00'),
			       ('idem:v1:bc', decode(repeat('00', 32), 'hex'), 'completed', 201, '0002-12-01 10:00:00+00 BC', '0001-12-15 10:00:00+00 BC')`)
		require.NoError(t, err)
		m := newManager(t, pool, partition.Config{Now: at(decNow), RetentionMonths: 12})
		res, err := m.Run(ctx, false)
		require.NoError(t, err, mode)
		require.Contains(t, res.Created, "idempotency_key_archive_0001_01")
		res, err = m.Run(ctx, false)
		require.NoError(t, err, mode)
		require.Empty(t, res.Retired, "the backlog still needs year 1")
	}
}

// An insert through the archive (as the sweeper role) is recorded once, by
// the archive's trigger alone; an UPDATE through the archive that moves a
// row to another month fires only the archive's UPDATE trigger, which
// records the row at its new expiry.
func TestWritesThroughTheArchiveFireOnlyItsTriggers(t *testing.T) {
	t.Parallel()
	db, _ := managedArchive(t)
	ctx := context.Background()
	sweeper := db.NewPool(t, dbtest.AsRole("idempotency_sweeper"))
	_, err := sweeper.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:moved', '\x00', 201, '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:moved')"))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SET LOCAL idemarchive.bulk_archive = 'on'")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE idempotency_key_archive SET expired_at = '2026-12-02 10:00:00+00' WHERE scoped_key = 'idem:v1:moved'`)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.EqualValues(t, 2, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:moved')"))
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:moved') AND expired_at = '2026-12-02 10:00:00+00'"))
}

// A wider partition outside the retention is kept while a month of the
// expired backlog it covers, not only its first, still needs it.
func TestAWiderPartitionIsKeptWhileTheBacklogNeedsIt(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2024_q1 PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2024-01-01 00:00:00+00') TO ('2024-04-01 00:00:00+00');
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at)
		VALUES ('idem:v1:old-live', decode(repeat('00', 32), 'hex'), 'completed', 201, '2024-02-01 10:00:00+00', '2024-02-02 10:00:00+00')`)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.NotContains(t, res.Retired, "idempotency_key_archive_2024_q1", "expired live rows of February wait for it")
}

// A month attached by hand that the manager's role may lock and write but
// not give triggers (restored by another login, which owns it) is reported
// by name, its rows marked pending all the same, and holds up no other
// adoption: both months' keys are found.
func TestAMonthThatCannotBeGivenTriggersIsReportedAndHoldsUpNoOther(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	other := "restorer_" + db.Schema
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{other}.Sanitize()+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{other}.Sanitize()+"; DROP ROLE IF EXISTS "+pgx.Identifier{other}.Sanitize())
	})
	_, err = db.Pool.Exec(ctx, "GRANT CREATE ON SCHEMA "+pgx.Identifier{db.Schema}.Sanitize()+" TO idempotency_owner")
	require.NoError(t, err)
	ownerPool := db.NewPool(t, dbtest.AsRole("idempotency_owner"))
	m := newManager(t, ownerPool, partition.Config{Now: at(decNow)})
	_, err = m.Run(ctx, false)
	require.NoError(t, err)

	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_10 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO idempotency_key_archive_2025_10 (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:restored-by-another', '\x00', 201, 'ch_other', '2025-10-01 10:00:00+00', '2025-10-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive_2025_10 OWNER TO `+pgx.Identifier{other}.Sanitize()+`;
		GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_key_archive_2025_10 TO idempotency_owner;
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_10
			FOR VALUES FROM ('2025-10-01 00:00:00+00') TO ('2025-11-01 00:00:00+00');
		CREATE TABLE idempotency_key_archive_2025_11 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		ALTER TABLE idempotency_key_archive_2025_11 OWNER TO idempotency_owner;
		INSERT INTO idempotency_key_archive_2025_11 (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:restored-by-hand', '\x00', 201, 'ch_plain', '2025-11-01 10:00:00+00', '2025-11-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_11
			FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)

	res, err := m.Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Adopted)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "idempotency_key_archive_2025_10", res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, "make idempotency_owner its owner")
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	for key, rid := range map[string]string{"idem:v1:restored-by-hand": "ch_plain", "idem:v1:restored-by-another": "ch_other"} {
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, "an archived key must never be answered not found")
		require.Equal(t, rid, *rec.ResourceID)
	}
}

// A month attached by hand as a partitioned table is adopted while its
// tree holds only the first half; the owner later restores the second half
// from a dump and attaches it by hand to the month (not to the archive).
// Adoption covers every table of the archive's tree: the next run adopts
// the half (its month's bounds marked pending, its triggers given), so its
// rows, and rows written into it by name later, are found.
func TestAHalfAttachedLaterToAnAdoptedMonthIsAdopted(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_11 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (expired_at);
		CREATE TABLE idempotency_key_archive_2025_11a PARTITION OF idempotency_key_archive_2025_11 FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-11-16 00:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_11
			FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Adopted)

	// The second half, restored from a dump, attached by hand to the month.
	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_11b (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO idempotency_key_archive_2025_11b (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:second-half', '\x00', 201, 'ch_half', '2025-11-20 10:00:00+00', '2025-11-21 10:00:00+00');
		ALTER TABLE idempotency_key_archive_2025_11 ATTACH PARTITION idempotency_key_archive_2025_11b
			FOR VALUES FROM ('2025-11-16 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_11b"}, res.Adopted)
	require.EqualValues(t, 2, dbtest.Count(t, db.Pool,
		"SELECT count(*) FROM pg_trigger WHERE tgrelid = 'idempotency_key_archive_2025_11b'::regclass AND NOT tgisinternal AND tgparentid = 0"),
		"the recording statement triggers of its own (beside the row trigger cloned from the archive)")

	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	rec, err := r.Lookup(ctx, "idem:v1:second-half", nil)
	require.NoError(t, err, "an archived key must never be answered not found")
	require.Equal(t, "ch_half", *rec.ResourceID)

	// And a row written by name into the half afterwards is recorded too.
	_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2025_11b (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:by-name-into-late-half', '\x00', 201, 'ch_late', '2025-11-20 10:00:00+00', '2025-11-22 10:00:00+00')`)
	require.NoError(t, err)
	rec, err = r.Lookup(ctx, "idem:v1:by-name-into-late-half", nil)
	require.NoError(t, err, "a row written by name into a half must be found")
	require.Equal(t, "ch_late", *rec.ResourceID)
}

// A hand-made partition outside the retention that straddles two months is
// kept while an expired live row of a month it overlaps waits, even where
// the month starts before it.
func TestAPartitionStraddlingMonthsIsKeptWhileTheBacklogNeedsIt(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12})
	_, err := db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2024_mid PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2024-01-15 00:00:00+00') TO ('2024-02-15 00:00:00+00');
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at)
		VALUES ('idem:v1:old-live', decode(repeat('00', 32), 'hex'), 'completed', 201, '2024-01-19 10:00:00+00', '2024-01-20 10:00:00+00')`)
	require.NoError(t, err)
	res, _ := m.Run(ctx, false) // fails: January 2024 overlaps it, and is reported
	require.NotContains(t, res.Retired, "idempotency_key_archive_2024_mid", "an expired live row of January 20 waits for it")
}
