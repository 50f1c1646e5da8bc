package verify_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A sweep inserts through the archive table itself, which fires that
// table's statement triggers, not its partitions'. With them off (an owner's
// DISABLE TRIGGER ALL for a bulk load, left so; ENABLE REPLICA; a dropped
// or redefined trigger), every key without a timestamp swept since went
// unrecorded and was answered not found, while the recorded check and the
// partitions run saw nothing wrong. Now the check fails naming the archive;
// the run marks every expiry pending (the rows swept meanwhile are read in
// full, so found), gives the archive its triggers back, and the check
// passes; later runs record the pending rows.
func TestTheArchivesOwnRecordingTriggersAreCheckedAndRepaired(t *testing.T) {
	t.Parallel()
	for _, alter := range []string{
		"ALTER TABLE idempotency_key_archive DISABLE TRIGGER idempotency_key_archive_plain_keys",
		"ALTER TABLE idempotency_key_archive ENABLE REPLICA TRIGGER idempotency_key_archive_plain_keys",
		"ALTER TABLE idempotency_key_archive DISABLE TRIGGER ALL",
		"DROP TRIGGER idempotency_key_archive_plain_keys ON idempotency_key_archive",
		"DROP TRIGGER idempotency_key_archive_plain_keys_update ON idempotency_key_archive",
		// Its clones go with it, and the partitions' check stops asking
		// for them: a MERGE moving a row to another month (PostgreSQL 15)
		// would go unrecorded.
		"DROP TRIGGER idempotency_key_archive_updated_plain_key ON idempotency_key_archive",
	} {
		t.Run(alter, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, alter)
			require.NoError(t, err)
			swept := dbtest.ArchiveRow{Key: "idem:v1:swept-while-off", Status: 201, ExpiredAt: time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)}
			dbtest.InsertArchive(t, db.Pool, swept)

			c := recordedCheck(t, db)
			require.False(t, c.Pass, c.Figure)
			require.Contains(t, c.Figure, "idempotency_key_archive")
			require.Contains(t, c.Figure, "rows swept into the archive are not recorded")

			m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
			require.NoError(t, err)
			res, err := m.Run(ctx, false)
			require.NoError(t, err)
			require.Empty(t, res.Failed)
			require.Contains(t, res.Adopted, "idempotency_key_archive")

			require.True(t, recordedCheck(t, db).Pass)
			later := dbtest.ArchiveRow{Key: "idem:v1:swept-after", Status: 201, ExpiredAt: time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)}
			dbtest.InsertArchive(t, db.Pool, later)
			moved := dbtest.ArchiveRow{Key: "idem:v1:merged", Status: 201, ExpiredAt: time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)}
			dbtest.InsertArchive(t, db.Pool, moved)
			_, err = db.Pool.Exec(ctx, `MERGE INTO idempotency_key_archive a USING (VALUES ('idem:v1:merged')) AS s (k) ON a.scoped_key = s.k
				WHEN MATCHED THEN UPDATE SET expired_at = '2027-01-03 00:00:00+00'`)
			require.NoError(t, err)
			lookupAll := func() {
				t.Helper()
				r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
				require.NoError(t, err)
				for _, key := range []string{swept.Key, later.Key, moved.Key} {
					rec, err := r.Lookup(ctx, key, nil)
					require.NoError(t, err, key)
					require.Equal(t, 201, rec.Status, key)
				}
			}
			lookupAll()

			// The next runs record the rows of the pending range and
			// remove it; every key is still found by its records.
			for range 5 {
				_, err = m.Run(ctx, false)
				require.NoError(t, err)
			}
			require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
			lookupAll()
			res, err = m.Run(ctx, false)
			require.NoError(t, err)
			require.NotContains(t, res.Adopted, "idempotency_key_archive")
		})
	}
}

// A trigger of a recording trigger's name that is not one is not replaced
// (DROP TRIGGER would stop lookups for its lock), but reported by every run
// and by the check, and the rows swept meanwhile stay found (pending).
func TestAnArchiveTriggerOfTheRightNameButAnotherKindIsReported(t *testing.T) {
	t.Parallel()
	for i, def := range []string{
		"AFTER TRUNCATE ON idempotency_key_archive FOR EACH STATEMENT EXECUTE FUNCTION idempotency_index_plain_keys()",
		"AFTER DELETE ON idempotency_key_archive REFERENCING OLD TABLE AS archived_rows FOR EACH STATEMENT EXECUTE FUNCTION idempotency_index_plain_keys()",
		"AFTER INSERT ON idempotency_key_archive FOR EACH STATEMENT EXECUTE FUNCTION idempotency_archive_noop()",
		"AFTER INSERT ON idempotency_key_archive REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION idempotency_index_plain_keys()",
		"AFTER INSERT ON idempotency_key_archive REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT EXECUTE FUNCTION idempotency_index_plain_keys('x')",
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, `CREATE FUNCTION idempotency_archive_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
				DROP TRIGGER idempotency_key_archive_plain_keys ON idempotency_key_archive;
				CREATE TRIGGER idempotency_key_archive_plain_keys `+def)
			require.NoError(t, err)
			swept := dbtest.ArchiveRow{Key: "idem:v1:swept-while-wrong", Status: 201, ExpiredAt: time.Date(2026, 11, 20, 5, 0, 0, 0, time.UTC)}
			dbtest.InsertArchive(t, db.Pool, swept)
			require.False(t, recordedCheck(t, db).Pass)

			m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
			require.NoError(t, err)
			res, err := m.Run(ctx, false)
			require.ErrorContains(t, err, "another definition")
			require.Len(t, res.Failed, 1, "%+v", res.Failed)
			require.Contains(t, res.Failed[0].Error, "another definition")
			require.False(t, recordedCheck(t, db).Pass)
			require.True(t, res.PlainKeys.Held)
			// The pending range is kept, not recorded and removed by the
			// run: a row swept after it, which the trigger misses too, is
			// found, this run and the next.
			after := dbtest.ArchiveRow{Key: "idem:v1:swept-after-the-run", Status: 201, ExpiredAt: time.Date(2026, 11, 21, 5, 0, 0, 0, time.UTC)}
			dbtest.InsertArchive(t, db.Pool, after)
			_, err = m.Run(ctx, false)
			require.ErrorContains(t, err, "another definition")
			require.Positive(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
			r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
			require.NoError(t, err)
			for _, key := range []string{swept.Key, after.Key} {
				_, err = r.Lookup(ctx, key, nil)
				require.NoError(t, err, key)
			}
		})
	}
}

// A partition's trigger of a recording trigger's name but another kind or
// function passed the check (names alone were read), and rows written into
// the partition by name went unrecorded. Now the check fails, the run
// reports it (adoption does not replace a trigger), and once an owner drops
// it the next run recreates it and the check passes.
func TestAPartitionTriggerOfTheRightNameButAnotherKindIsReported(t *testing.T) {
	t.Parallel()
	for i, def := range []string{
		"AFTER TRUNCATE ON idempotency_key_archive_2026_11 FOR EACH STATEMENT EXECUTE FUNCTION idempotency_index_plain_keys()",
		"AFTER INSERT ON idempotency_key_archive_2026_11 FOR EACH ROW EXECUTE FUNCTION idempotency_archive_noop()",
		"AFTER INSERT ON idempotency_key_archive_2026_11 REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT EXECUTE FUNCTION idempotency_archive_noop()",
		"AFTER INSERT ON idempotency_key_archive_2026_11 REFERENCING NEW TABLE AS archived_rows FOR EACH STATEMENT WHEN (false) EXECUTE FUNCTION idempotency_index_plain_keys()",
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, `CREATE FUNCTION idempotency_archive_noop() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
				DROP TRIGGER idempotency_key_archive_plain_keys ON idempotency_key_archive_2026_11;
				CREATE TRIGGER idempotency_key_archive_plain_keys `+def)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
				VALUES ('idem:v1:by-name', '\x00', 201, '2026-11-02 00:00:00+00', '2026-11-03 00:00:00+00')`)
			require.NoError(t, err)
			c := recordedCheck(t, db)
			require.False(t, c.Pass)
			require.Contains(t, c.Figure, "idempotency_key_archive_2026_11: lacks a recording trigger (or one is disabled, replica-only, not what its name says, or was turned off and on again since it was adopted)")

			m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
			require.NoError(t, err)
			res, err := m.Run(ctx, false)
			require.ErrorContains(t, err, "another definition")
			require.Len(t, res.Failed, 1, "%+v", res.Failed)
			require.Contains(t, res.Failed[0].Error, "DROP TRIGGER ... ON idempotency_key_archive_2026_11")
			require.False(t, recordedCheck(t, db).Pass)
			require.True(t, res.PlainKeys.Held)
			_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
				VALUES ('idem:v1:by-name-while-broken', '\x00', 201, '2026-11-02 00:00:00+00', '2026-11-05 00:00:00+00')`)
			require.NoError(t, err)
			r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
			require.NoError(t, err)
			for _, key := range []string{"idem:v1:by-name", "idem:v1:by-name-while-broken"} {
				_, err = r.Lookup(ctx, key, nil)
				require.NoError(t, err, "%s: its rows are pending, and kept so", key)
			}

			_, err = db.Pool.Exec(ctx, "DROP TRIGGER idempotency_key_archive_plain_keys ON idempotency_key_archive_2026_11")
			require.NoError(t, err)
			res, err = m.Run(ctx, false)
			require.NoError(t, err)
			require.Contains(t, res.Adopted, "idempotency_key_archive_2026_11")
			require.True(t, recordedCheck(t, db).Pass)
			_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
				VALUES ('idem:v1:by-name-after', '\x00', 201, '2026-11-02 00:00:00+00', '2026-11-04 00:00:00+00')`)
			require.NoError(t, err)
			for range 3 {
				_, err = m.Run(ctx, false)
				require.NoError(t, err)
			}
			require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
			for _, key := range []string{"idem:v1:by-name", "idem:v1:by-name-while-broken", "idem:v1:by-name-after"} {
				_, err = r.Lookup(ctx, key, nil)
				require.NoError(t, err, key)
			}
		})
	}
}

// Turned off and on again between two runs (a bulk load with DISABLE
// TRIGGER ALL, as pg_restore --data-only --disable-triggers does), the
// archive's triggers looked whole to the next run and the check, and every
// key without a timestamp swept in between was answered not found for good.
// The registry of migration 017 sees the triggers' rows rewritten: the
// check fails, and the run marks every expiry pending and vouches for them
// again.
func TestTriggersTurnedOffAndOnAgainBetweenRunsAreSeen(t *testing.T) {
	t.Parallel()
	for _, off := range []string{
		"ALTER TABLE idempotency_key_archive DISABLE TRIGGER ALL",
		"ALTER TABLE idempotency_key_archive DISABLE TRIGGER idempotency_key_archive_plain_keys",
		"ALTER TABLE idempotency_key_archive ENABLE REPLICA TRIGGER idempotency_key_archive_plain_keys",
	} {
		t.Run(off, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ctx := context.Background()
			require.True(t, recordedCheck(t, db).Pass)
			_, err := db.Pool.Exec(ctx, off)
			require.NoError(t, err)
			swept := dbtest.ArchiveRow{Key: "idem:v1:swept-during-bulk-load", Status: 201, ExpiredAt: time.Date(2026, 12, 1, 5, 0, 0, 0, time.UTC)}
			dbtest.InsertArchive(t, db.Pool, swept)
			_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive ENABLE TRIGGER ALL")
			require.NoError(t, err)

			c := recordedCheck(t, db)
			require.False(t, c.Pass, c.Figure)
			require.Contains(t, c.Figure, "idempotency_key_archive")
			m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
			require.NoError(t, err)
			res, err := m.Run(ctx, false)
			require.NoError(t, err)
			require.Contains(t, res.Adopted, "idempotency_key_archive")
			require.True(t, recordedCheck(t, db).Pass)
			r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
			require.NoError(t, err)
			_, err = r.Lookup(ctx, swept.Key, nil)
			require.NoError(t, err)

			// Vouched for again: later runs leave them be, and the
			// pending range is recorded and gone.
			for range 3 {
				res, err = m.Run(ctx, false)
				require.NoError(t, err)
				require.NotContains(t, res.Adopted, "idempotency_key_archive")
			}
			require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
			_, err = r.Lookup(ctx, swept.Key, nil)
			require.NoError(t, err)
		})
	}
}

// pg_restore --data-only --disable-triggers restores a partitioned table
// partition by partition (DISABLE TRIGGER ALL, COPY, ENABLE TRIGGER ALL on
// each month), and an owner may turn a month's triggers off around a MERGE
// that moves rows out of it: the rows written so went unrecorded, and the
// next run, reading the triggers as they were by then, found the month whole.
// The registry of migration 018 sees the month's triggers rewritten: the
// check fails, and the run adopts the month again (its rows pending, then
// recorded).
func TestAMonthsTriggersTurnedOffAndOnAgainAreSeen(t *testing.T) {
	t.Parallel()
	for name, write := range map[string]string{
		"a restore by name": `INSERT INTO idempotency_key_archive_2026_11 (scoped_key, fingerprint, status_code, created_at, expired_at)
			VALUES ('idem:v1:written-while-off', '\x00', 201, '2026-11-02 00:00:00+00', '2026-11-03 00:00:00+00')`,
		"a MERGE out of the month": `MERGE INTO idempotency_key_archive a USING (VALUES ('idem:v1:written-while-off')) AS s (k) ON a.scoped_key = s.k
			WHEN MATCHED THEN UPDATE SET expired_at = '2027-01-03 00:00:00+00'`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := setup(t)
			ctx := context.Background()
			if name == "a MERGE out of the month" {
				dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:written-while-off", Status: 201, ExpiredAt: time.Date(2026, 11, 3, 0, 0, 0, 0, time.UTC)})
			}
			require.True(t, recordedCheck(t, db).Pass)
			_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive_2026_11 DISABLE TRIGGER ALL")
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, write)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive_2026_11 ENABLE TRIGGER ALL")
			require.NoError(t, err)

			c := recordedCheck(t, db)
			require.False(t, c.Pass)
			require.Contains(t, c.Figure, "idempotency_key_archive_2026_11: lacks a recording trigger (or one is disabled, replica-only, not what its name says, or was turned off and on again since it was adopted)")
			m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
			require.NoError(t, err)
			res, err := m.Run(ctx, false)
			require.NoError(t, err)
			require.Contains(t, res.Adopted, "idempotency_key_archive_2026_11")
			require.True(t, recordedCheck(t, db).Pass)
			r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
			require.NoError(t, err)
			_, err = r.Lookup(ctx, "idem:v1:written-while-off", nil)
			require.NoError(t, err)
			for range 3 {
				res, err = m.Run(ctx, false)
				require.NoError(t, err)
				require.Empty(t, res.Adopted)
			}
			require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_archive_plain_keys_pending"))
			_, err = r.Lookup(ctx, "idem:v1:written-while-off", nil)
			require.NoError(t, err)
		})
	}
}
