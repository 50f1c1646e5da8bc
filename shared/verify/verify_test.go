package verify_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/verify"
)

var now = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

// setup returns a database whose partitions a manager run created for now.
func setup(t *testing.T) *dbtest.DB {
	t.Helper()
	db := dbtest.New(t)
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = m.Run(context.Background(), false)
	require.NoError(t, err)
	return db
}

func partitionsCheck(t *testing.T, db *dbtest.DB) verify.Check {
	t.Helper()
	checks, err := verify.Run(context.Background(), db.Pool, verify.Options{Now: func() time.Time { return now }})
	require.NoError(t, err, "a partition added by hand must fail a check, not stop verify")
	require.Len(t, checks, 6)
	require.Equal(t, "partitions exist two months ahead", checks[3].Name)
	return checks[3]
}

func recordedCheck(t *testing.T, db *dbtest.DB) verify.Check {
	t.Helper()
	checks, err := verify.Run(context.Background(), db.Pool, verify.Options{Now: func() time.Time { return now }})
	require.NoError(t, err)
	require.Len(t, checks, 6)
	require.Equal(t, "every partition's rows are recorded", checks[4].Name)
	return checks[4]
}

// interruptDetach leaves partition name detach-pending, as a DETACH ...
// CONCURRENTLY cut short (by hand, or a partitions run killed) does.
func interruptDetach(t *testing.T, db *dbtest.DB, name string) {
	t.Helper()
	db.InterruptDetach(t, name)
}

func TestPartitionsAhead(t *testing.T) {
	t.Parallel()
	c := partitionsCheck(t, setup(t))
	require.True(t, c.Pass, c.Figure)
	require.Equal(t, "newest partition ends 2027-04-01 (120 days ahead)", c.Figure)
}

func TestADefaultPartitionFailsWithWhatToDo(t *testing.T) {
	t.Parallel()
	db := setup(t)
	_, err := db.Pool.Exec(context.Background(), "CREATE TABLE archive_catchall PARTITION OF idempotency_key_archive DEFAULT")
	require.NoError(t, err)

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Equal(t, "newest partition ends 2027-04-01 (120 days ahead); DEFAULT partition archive_catchall: move its rows into monthly partitions and detach it", c.Figure)
}

func TestAFractionalBoundOverTheCurrentMonthFailsNamingIt(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE dec_by_hand PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2026-12-01 00:00:00.25+00') TO ('2027-01-01 00:00:00+00')`)
	require.NoError(t, err)
	// The manager creates every other month and reports December.
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = m.Run(context.Background(), false)
	require.ErrorIs(t, err, partition.ErrIncomplete)

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, "missing 2026-12; dec_by_hand: bounds [2026-12-01T00:00:00.25Z, 2027-01-01T00:00:00Z) are not one UTC month; move its rows out, detach it")
}

func TestADetachPendingCurrentMonthFailsWithWhatToDo(t *testing.T) {
	t.Parallel()
	db := setup(t)
	interruptDetach(t, db, "idempotency_key_archive_2026_12")

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, "missing 2026-12; idempotency_key_archive_2026_12 is detach-pending (its rows are invisible): run archivectl partitions, which attaches it again inside the retention and finishes its retirement outside it")
}

// An older month whose DETACH ... CONCURRENTLY was interrupted hides its
// rows from every lookup until a partitions run attaches it again: the
// partitions check fails, though every month ahead exists.
func TestADetachPendingOlderMonthFails(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = m.EnsureMonth(ctx, time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:june", Status: 201, ExpiredAt: time.Date(2026, 6, 10, 0, 0, 0, 0, time.UTC)})
	interruptDetach(t, db, "idempotency_key_archive_2026_06")
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:june", nil)
	require.ErrorIs(t, err, archive.ErrNotFound, "the month's rows are invisible")

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Equal(t, "newest partition ends 2027-04-01 (120 days ahead); idempotency_key_archive_2026_06 is detach-pending (its rows are invisible): run archivectl partitions, which attaches it again inside the retention and finishes its retirement outside it", c.Figure)

	// AND once a run has attached it again, the check passes
	_, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.True(t, partitionsCheck(t, db).Pass)
	_, err = r.Lookup(ctx, "idem:v1:june", nil)
	require.NoError(t, err)
}

// A month detached entirely (by hand, or a retirement whose DROP failed
// before the retention was lengthened) hides its rows as a detach-pending
// one does: the partitions check fails and names it, until a run attaches
// it again. A table of the name without the archive's columns is another
// table, and one named for no month (2026_13) is none that a run attaches:
// neither is listed.
func TestAMonthDetachedEntirelyFails(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = m.EnsureMonth(ctx, time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:june", Status: 201, ExpiredAt: time.Date(2026, 6, 10, 0, 0, 0, 0, time.UTC)})
	_, err = db.Pool.Exec(ctx, `ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2026_06;
		CREATE TABLE idempotency_key_archive_2025_01 (note text);
		CREATE TABLE idempotency_key_archive_2026_13 (LIKE idempotency_key_archive)`)
	require.NoError(t, err)

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Equal(t, "newest partition ends 2027-04-01 (120 days ahead); idempotency_key_archive_2026_06 is detached (its rows are invisible): run archivectl partitions, which attaches it again inside the retention and drops it outside it, or says why it cannot", c.Figure)

	_, err = db.Pool.Exec(ctx, `DROP TABLE idempotency_key_archive_2025_01`) // a run fails on it until it is renamed
	require.NoError(t, err)
	_, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.True(t, partitionsCheck(t, db).Pass)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:june", nil)
	require.NoError(t, err)
}

func TestEveryPartitionRecordedPasses(t *testing.T) {
	t.Parallel()
	c := recordedCheck(t, setup(t))
	require.True(t, c.Pass, c.Figure)
	require.Equal(t, "every attached partition is adopted, with the recording triggers", c.Figure)
}

// A month restored from a dump and attached by hand holds rows no trigger
// recorded: until a partitions run adopts it, a lookup of a key without a
// timestamp answers not found for its rows, and the check fails naming it.
func TestAPartitionAttachedByHandFailsUntilAdopted(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
		CREATE TABLE hand_range (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS);
		INSERT INTO hand_range (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:restored', '\x00', 201, '2024-02-01 10:00:00+00', '2024-02-02 10:00:00+00');
		ALTER TABLE idempotency_key_archive ATTACH PARTITION hand_range FOR VALUES FROM ('2024-02-01 00:00:00+00') TO ('2024-03-01 00:00:00+00')`)
	require.NoError(t, err)
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, "idem:v1:restored", nil)
	require.ErrorIs(t, err, archive.ErrNotFound, "the lookup misses the row until the table is adopted")

	c := recordedCheck(t, db)
	require.False(t, c.Pass)
	require.Equal(t, "hand_range: attached by hand and not adopted: the rows it held when attached are not recorded; "+
		"lookups of keys without a timestamp can miss these rows until a partitions run adopts the partition: run archivectl partitions", c.Figure)

	// AND once a run has adopted it, the check passes and the row is found
	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	_, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.True(t, recordedCheck(t, db).Pass)
	_, err = r.Lookup(ctx, "idem:v1:restored", nil)
	require.NoError(t, err)
}

// A month of the archive's schema without one of its recording triggers
// (dropped by hand) records no row written into it by name: the check
// fails naming it, and the next partitions run gives the trigger back.
func TestAPartitionWithoutItsRecordingTriggerFails(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "DROP TRIGGER idempotency_key_archive_plain_keys ON idempotency_key_archive_2026_11")
	require.NoError(t, err)

	c := recordedCheck(t, db)
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, "idempotency_key_archive_2026_11: lacks a recording trigger (or one is disabled, replica-only, not what its name says, or was turned off and on again since it was adopted): rows written into it by name, or moved out of it, are not recorded")

	m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2026_11"}, res.Adopted)
	require.True(t, recordedCheck(t, db).Pass)
}

// A key still in flight within the sweeper's grace past its expiry is no
// backlog; one past it, or a completed one, is.
func TestTheBacklogCheckLeavesKeysInTheirGrace(t *testing.T) {
	t.Parallel()
	db := setup(t)
	backlog := func(grace time.Duration) verify.Check {
		checks, err := verify.Run(context.Background(), db.Pool, verify.Options{Now: func() time.Time { return now }, InFlightGrace: grace})
		require.NoError(t, err)
		require.Equal(t, "expired backlog is zero", checks[0].Name)
		return checks[0]
	}
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:running", ExpiresAt: now.Add(-time.Minute)})
	require.True(t, backlog(15*time.Minute).Pass)
	require.False(t, backlog(0).Pass, "no grace")
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:done", Status: 201, ExpiresAt: now.Add(-time.Minute)})
	c := backlog(15 * time.Minute)
	require.False(t, c.Pass)
	require.Equal(t, "1 expired live rows", c.Figure)
}

// A role that may not read the owner's registry of recorded partitions
// cannot tell whether lookups find every row: the check fails saying so,
// rather than pass.
func TestTheRecordedCheckFailsForARoleThatCannotReadTheRegistry(t *testing.T) {
	t.Parallel()
	db := setup(t)
	sweeper := db.NewPool(t, dbtest.AsRole(schema.SweeperRole))
	checks, err := verify.Run(context.Background(), sweeper, verify.Options{Now: func() time.Time { return now }})
	require.NoError(t, err)
	require.Len(t, checks, 6)
	require.False(t, checks[4].Pass)
	require.Contains(t, checks[4].Figure, "run verify as a member of idempotency_owner")
}
