package partition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// managedArchive returns a schema of its own whose months the manager
// (clock at decNow, returned) has made.
func managedArchive(t *testing.T) (*dbtest.DB, *partition.Manager) {
	t.Helper()
	db := dbtest.New(t)
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	_, err := m.Run(context.Background(), false)
	require.NoError(t, err)
	return db, m
}

// A month restored from a dump and attached by hand (ALTER TABLE ...
// ATTACH PARTITION by the owner) holds rows no trigger recorded: a key
// without a timestamp, and a timestamped key used months after its
// timestamp. The next partitions run adopts the table (marks its bounds
// pending and records its rows), so that lookups find both; it adopts
// nothing the manager attached itself, and a dry run only names it.
func TestAMonthAttachedByHandIsAdoptedByTheNextRun(t *testing.T) {
	t.Parallel()
	// GIVEN an archive the manager made, and November 2025 restored by hand
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Adopted, "the manager's own months are covered")
	late := "idem:v1:" + dbtest.ULID(time.Date(2025, 1, 10, 0, 0, 0, 0, time.UTC), "")
	_, err = db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2025_11 (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive_2025_11 (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:restored-by-hand', '\x00', 201, 'ch_plain', '2025-11-01 10:00:00+00', '2025-11-02 10:00:00+00'),
		       ($1, '\x00', 201, 'ch_late', '2025-11-03 10:00:00+00', '2025-11-04 10:00:00+00')`, late)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2025_11
		FOR VALUES FROM ('2025-11-01 00:00:00+00') TO ('2025-12-01 00:00:00+00')`)
	require.NoError(t, err)

	// WHEN a dry run looks
	dry, err := m.Run(ctx, true)
	require.NoError(t, err)
	// THEN it names the table and changes nothing
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, dry.Adopted)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))

	// WHEN the manager runs
	res, err = m.Run(ctx, false)
	require.NoError(t, err)

	// THEN it adopts the table and records its rows
	require.Equal(t, []string{"idempotency_key_archive_2025_11"}, res.Adopted)
	require.NotNil(t, res.PlainKeys)
	require.EqualValues(t, 2, res.PlainKeys.Scanned)
	require.Zero(t, res.PlainKeys.RangesLeft)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	for key, rid := range map[string]string{"idem:v1:restored-by-hand": "ch_plain", late: "ch_late"} {
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, key)
		require.Equal(t, rid, *rec.ResourceID, key)
	}

	// AND the next run adopts nothing
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Adopted)
}

// Until the run has recorded an adopted table's rows, its range stays
// pending and lookups read it in full: a run whose recording is cut short
// still leaves the rows found. A DEFAULT partition attached by hand is
// adopted with every expiry pending.
func TestAnAdoptedTableIsReadInFullUntilItsRowsAreRecorded(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE hand_default (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO hand_default (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:in-the-default', '\x00', 201, 'ch_default', '2024-02-01 10:00:00+00', '2024-02-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_default DEFAULT`)
	require.NoError(t, err)

	// WHEN a run adopts it but has no time to record anything (its
	// deadline closer than the 30 s the recording leaves before it)
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(short, false)
	require.NoError(t, err)
	require.Equal(t, []string{"hand_default"}, res.Adopted)
	require.NotNil(t, res.PlainKeys)
	require.Zero(t, res.PlainKeys.Scanned)
	require.Positive(t, res.PlainKeys.RangesLeft)

	// THEN every expiry is pending, and the lookup finds the row
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool,
		"SELECT count(*) FROM idempotency_archive_plain_keys_pending WHERE expired_from = '-infinity' AND expired_to = 'infinity'"))
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	rec, err := r.Lookup(ctx, "idem:v1:in-the-default", nil)
	require.NoError(t, err)
	require.Equal(t, "ch_default", *rec.ResourceID)
}

// Rows written into a partition directly (a statement that names it: an
// owner's INSERT, a COPY of pg_restore --data-only -t, an UPDATE) fire none
// of the archive's statement triggers, only the partition's own, which the
// manager gives every table it attaches (migration 012): they are recorded
// at once, with no partitions run, and so are rows loaded into a month while
// it was detached by hand and attached again.
func TestRowsWrittenIntoAPartitionDirectlyAreRecorded(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
	require.NoError(t, err)
	late := "idem:v1:" + dbtest.ULID(time.Date(2025, 1, 10, 0, 0, 0, 0, time.UTC), "")

	// WHEN rows are inserted, copied and updated into a month by name
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:inserted-into-the-month', '\x00', 201, 'ch_insert', '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00'),
		       ('idem:v1:to-be-renamed', '\x00', 201, 'ch_update', '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00'),
		       ($1, '\x00', 201, 'ch_late', '2026-11-01 10:00:00+00', '2026-11-02 10:00:00+00')`, late)
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Conn().PgConn().CopyFrom(ctx, strings.NewReader("idem:v1:copied-into-the-month\t\\\\x00\t201\tch_copy\t2026-11-03 10:00:00+00\t2026-11-04 10:00:00+00\n"),
		"COPY idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at) FROM STDIN")
	conn.Release()
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `UPDATE idempotency_key_archive_2026_11 SET scoped_key = 'idem:v1:renamed' WHERE scoped_key = 'idem:v1:to-be-renamed'`)
	require.NoError(t, err)

	// AND a month is detached, loaded and attached again by hand
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2027_01`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `
		INSERT INTO idempotency_key_archive_2027_01 (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:loaded-while-detached', '\x00', 201, 'ch_detached', '2027-01-01 10:00:00+00', '2027-01-02 10:00:00+00')`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive ATTACH PARTITION idempotency_key_archive_2027_01
		FOR VALUES FROM ('2027-01-01 00:00:00+00') TO ('2027-02-01 00:00:00+00')`)
	require.NoError(t, err)

	// THEN, with no partitions run and nothing pending, lookups find them all
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	for key, rid := range map[string]string{
		"idem:v1:inserted-into-the-month": "ch_insert", "idem:v1:copied-into-the-month": "ch_copy",
		"idem:v1:renamed": "ch_update", late: "ch_late", "idem:v1:loaded-while-detached": "ch_detached",
	} {
		rec, err := r.Lookup(ctx, key, nil)
		require.NoError(t, err, key)
		require.Equal(t, rid, *rec.ResourceID, key)
	}

	// AND a row written through the archive is recorded once, as before
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:through-the-archive", Status: 201, ExpiredAt: time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)})
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool,
		"SELECT count(*) FROM idempotency_archive_plain_keys WHERE key_hash = idempotency_key_hash('idem:v1:through-the-archive')"))
}

// A table detached by hand and attached again by hand, after a run saw it
// detached, is another attachment the records may not cover (the run may
// have pruned them meanwhile): the run after it adopts it again.
func TestATableAttachedAgainByHandIsAdoptedAgain(t *testing.T) {
	t.Parallel()
	db, m := managedArchive(t)
	ctx := context.Background()
	var err error
	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE hand_range (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO hand_range (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:again', '\x00', 201, '2024-02-01 10:00:00+00', '2024-02-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2024-02-01 00:00:00+00') TO ('2024-03-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"hand_range"}, res.Adopted)

	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION hand_range")
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Adopted)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_recorded_partitions WHERE partition = 'hand_range'::regclass"),
		"a table no longer attached is forgotten")

	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2024-02-01 00:00:00+00') TO ('2024-03-01 00:00:00+00')")
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"hand_range"}, res.Adopted)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:again", nil)
	require.NoError(t, err)
}

// Adoption takes a partition's SHARE ROW EXCLUSIVE lock without waiting:
// while a writer of the month holds it busy, archive inserts into it go on
// (none queues behind a waiting lock request, as a sweep batch or a Redis
// store's completion would, and fails on its lock_timeout), the run leaves
// the month for later and reports it (lookups can miss its rows until it
// is adopted, so the run must not look clean), and the next run adopts it.
func TestAdoptionNeverQueuesArchiveInsertsBehindItsLock(t *testing.T) {
	t.Parallel()
	// GIVEN a month attached by hand, and a transaction writing into it
	db, m := managedArchive(t)
	ctx := context.Background()
	var err error
	_, err = db.Pool.Exec(ctx, `CREATE TABLE hand_month (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_month FOR VALUES FROM ('2024-05-01 00:00:00+00') TO ('2024-06-01 00:00:00+00')`)
	require.NoError(t, err)
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:in-progress', '\x00', 201, '2024-05-01 10:00:00+00', '2024-05-02 10:00:00+00')`)
	require.NoError(t, err)

	// WHEN a run tries to adopt it, while another insert into the month arrives
	runDone := make(chan error, 1)
	var res partition.Result
	go func() {
		var err error
		res, err = m.Run(ctx, false)
		runDone <- err
	}()
	time.Sleep(500 * time.Millisecond)
	insert, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = insert.Exec(ctx, "SET LOCAL lock_timeout = '1s'")
	require.NoError(t, err)
	_, err = insert.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:sweep-meanwhile', '\x00', 201, '2024-05-03 10:00:00+00', '2024-05-04 10:00:00+00')`)
	require.NoError(t, err, "an archive insert queued behind the adoption's lock")
	require.NoError(t, insert.Commit(ctx))

	// THEN the run leaves the busy month for later, and says so
	require.ErrorIs(t, <-runDone, partition.ErrIncomplete)
	require.Empty(t, res.Adopted)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "adopt", res.Failed[0].Action)
	require.Equal(t, "hand_month", res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, "was not adopted: it was never free of writers long enough")

	// AND the next run, the writer done, adopts it
	require.NoError(t, tx.Commit(ctx))
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"hand_month"}, res.Adopted)
}

// A live table the run cannot read costs the months of the expired
// backlog, and this run's retirements (which months its rows still need is
// unknown): the run still creates and adopts, and reports the failure
// (exit 2 from the CLI).
func TestARunThatCannotReadTheLiveTableStillManagesTheMonths(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2024_01 PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2024-01-01 00:00:00+00') TO ('2024-02-01 00:00:00+00');
		ALTER TABLE idempotency_keys RENAME TO idempotency_keys_elsewhere`)
	require.NoError(t, err)
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12})
	res, err := m.Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Len(t, res.Created, 5)
	require.Empty(t, res.Retired)
	require.Len(t, res.Failed, 1)
	require.Contains(t, res.Failed[0].Error, "list months of expired live rows")

	// AND once it can, the month outside the retention is retired
	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_keys_elsewhere RENAME TO idempotency_keys")
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2024_01"}, res.Retired)
}

// A table detached while a run maintains the plain-key table (after the
// run's adoption step, before its prune, which deletes the records of
// months no table holds) and attached again by hand before the next run is
// another attachment, which the registry does not vouch for (migration
// 013): the next run adopts it again, marking its bounds pending, and its
// row is found. With the registry keyed by OID alone, the table stayed
// "recorded" and its row was never found again.
func TestATableDetachedBeforeARunsPruneIsAdoptedWhenAttachedAgain(t *testing.T) {
	t.Parallel()
	db, _ := managedArchive(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow), LockTimeout: 30 * time.Second})

	// GIVEN a month restored by hand, adopted and fully recorded
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE hand_range (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO hand_range (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:restored', '\x00', 201, '2024-02-01 10:00:00+00', '2024-02-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2024-02-01 00:00:00+00') TO ('2024-03-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"hand_range"}, res.Adopted)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:restored", nil)
	require.NoError(t, err)

	// WHEN a run is past its adoption step but not yet at its prune (held
	// there by a lock the prune's DELETE needs), the owner detaches the
	// table, the prune deletes its month's records ...
	holder, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, "LOCK TABLE idempotency_archive_plain_keys IN SHARE MODE")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := m.Run(ctx, false)
		done <- err
	}()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_locks
			WHERE NOT granted AND relation = 'idempotency_archive_plain_keys'::regclass`) > 0
	}, 20*time.Second, 20*time.Millisecond, "the run should reach its prune")
	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION hand_range")
	require.NoError(t, err)
	require.NoError(t, holder.Commit(ctx))
	require.NoError(t, <-done)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"),
		"the run pruned the records of the detached month")

	// ... and attaches it again by hand before the next run
	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2024-02-01 00:00:00+00') TO ('2024-03-01 00:00:00+00')")
	require.NoError(t, err)
	unrecorded, err := partition.ListUnrecorded(ctx, db.Pool)
	require.NoError(t, err)
	require.Len(t, unrecorded, 1)
	require.Equal(t, "hand_range", unrecorded[0].Name)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)

	// THEN the next run adopts it again, records its row, and the lookup finds it
	require.Equal(t, []string{"hand_range"}, res.Adopted)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys"))
	_, err = r.Lookup(ctx, "idem:v1:restored", nil)
	require.NoError(t, err)
	unrecorded, err = partition.ListUnrecorded(ctx, db.Pool)
	require.NoError(t, err)
	require.Empty(t, unrecorded)
}

// The same for a table detached while a run indexes its pending range
// (here while the run is busy trying to adopt another month): the indexing
// reads the range through the archive, sees none of the table's rows and
// finishes the range. Attached again by hand, the table is adopted again
// by the next run, its range pending again, and its row is found.
func TestATableDetachedWhileARunIndexesItIsAdoptedWhenAttachedAgain(t *testing.T) {
	t.Parallel()
	db, _ := managedArchive(t)
	ctx := context.Background()
	// The run's connections are named, so that its adoption is told from
	// those of other tests' schemas in the same database.
	app := "adopt " + db.Schema
	m := newManager(t, db.NewPool(t, dbtest.WithParam("application_name", app)), partition.Config{Now: at(decNow)})

	// GIVEN a table attached by hand and adopted by a run with no budget
	// left for the plain-key maintenance (its range stays pending)
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE hand_range (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO hand_range (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:restored', '\x00', 201, '2025-06-01 10:00:00+00', '2025-06-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2025-06-01 00:00:00+00') TO ('2025-07-01 00:00:00+00')`)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	res, err := m.Run(short, false)
	cancel()
	require.NoError(t, err)
	require.Equal(t, []string{"hand_range"}, res.Adopted)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))

	// AND another month attached by hand whose writer keeps it busy (the
	// lock a writer of the month holds, taken alone so that the DETACH
	// below does not queue behind it)
	_, err = db.Pool.Exec(ctx, `
		CREATE TABLE hand_busy (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_busy FOR VALUES FROM ('2025-08-01 00:00:00+00') TO ('2025-09-01 00:00:00+00')`)
	require.NoError(t, err)
	writer, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	// A failure below must not leave the writer's connection out of the
	// pool: the pool's cleanup would wait for it until the test timeout,
	// hiding the failure.
	t.Cleanup(func() { _ = writer.Rollback(context.Background()) })
	_, err = writer.Exec(ctx, "LOCK TABLE hand_busy IN ROW EXCLUSIVE MODE")
	require.NoError(t, err)

	// WHEN the owner detaches hand_range while the next run tries to adopt
	// the busy month, and the run then indexes hand_range's range without it
	done := make(chan error, 1)
	go func() {
		_, err := m.Run(ctx, false)
		done <- err
	}()
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity
			WHERE query LIKE '%idempotency_archive_adopt_partition%' AND application_name = $1 AND state = 'active'`, app) > 0
	}, 20*time.Second, 10*time.Millisecond)
	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION hand_range")
	require.NoError(t, err, "detach hand_range beside the run")
	require.ErrorIs(t, <-done, partition.ErrIncomplete, "the busy month is reported")
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"),
		"the run finished the range without the detached table's rows")
	require.NoError(t, writer.Commit(ctx))

	// ... and attaches it again by hand
	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2025-06-01 00:00:00+00') TO ('2025-07-01 00:00:00+00')")
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)

	// THEN the next run adopts both, and the row is found
	require.Equal(t, []string{"hand_busy", "hand_range"}, res.Adopted)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:restored", nil)
	require.NoError(t, err)
}
