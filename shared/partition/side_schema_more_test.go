package partition_test

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// finalizeRE finds the statement a message gives to run by hand.
var finalizeRE = regexp.MustCompile(`\((ALTER TABLE \S+ DETACH PARTITION .+? FINALIZE)\)`)

// Another schema's table left detach-pending blocks every DETACH ...
// CONCURRENTLY of the archive: the run blocks its retirements up front,
// naming the table and the statement that finishes its detach, rather
// than failing each on PostgreSQL's error that names neither.
func TestAPendingDetachOfAnotherSchemaBlocksRetirementsAndSaysSo(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	_, err := m.EnsureMonth(ctx, time.Date(2025, 1, 5, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	side := sideSchema(t, db)
	tbl := attachSide(t, db, side, "restored", "FOR VALUES FROM ('2024-06-01 00:00:00+00') TO ('2024-07-01 00:00:00+00')")
	db.InterruptDetach(t, tbl)

	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Empty(t, res.Retired)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "idempotency_key_archive_2025_01", res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, side+`."restored"`)
	require.Regexp(t, finalizeRE, res.Failed[0].Error)
	require.NotContains(t, res.Failed[0].Error, "SQLSTATE")
}

// A detached table of the archive's schema whose month another schema's
// table holds: named with its schema, and, when that table's detach is
// pending, not said to cover the month (it takes no rows).
func TestADetachedMonthBesideAnotherSchemasTableIsToldWhich(t *testing.T) {
	t.Parallel()
	jun := time.Date(2026, 6, 1, 0, 0, 0, 0, time.UTC)
	name := partition.Name(jun)
	for _, pending := range []bool{false, true} {
		db := dbtest.New(t)
		ctx := context.Background()
		side := sideSchema(t, db)
		tbl := attachSide(t, db, side, name, "FOR VALUES FROM ('2026-06-01 00:00:00+00') TO ('2026-07-01 00:00:00+00')")
		if pending {
			db.InterruptDetach(t, tbl)
		}
		_, err := db.Pool.Exec(ctx, "CREATE TABLE "+name+" (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
		require.NoError(t, err)
		res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
		require.ErrorIs(t, err, partition.ErrIncomplete)
		var msg string
		for _, f := range res.Failed {
			if f.Partition == name {
				msg = f.Error
			}
		}
		require.Contains(t, msg, side, "pending %v", pending)
		if pending {
			require.NotContains(t, msg, "covers now")
			require.Regexp(t, finalizeRE, msg)
		} else {
			require.Contains(t, msg, "covers now")
		}
	}
}

// Hand DDL while a run waits to retire a month: the expired month is moved
// away and a month inside the retention renamed to its name. The run's
// statements find tables by name when they run, after the wait: it
// detached and dropped November, rows and all. It now checks, after
// waiting for whatever the DETACH would wait for (a lock taken by hand, an
// ANALYZE of the month), that the name still means the table it listed,
// and retires nothing else.
func TestARetirementNeverActsOnATableRenamedMeanwhile(t *testing.T) {
	t.Parallel()
	for _, hold := range []string{"LOCK TABLE %s IN ACCESS EXCLUSIVE MODE", "ANALYZE %s", "LOCK TABLE %s IN SHARE MODE"} {
		t.Run(hold, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			ctx := context.Background()
			m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
			expired := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
			_, err := m.EnsureMonth(ctx, expired)
			require.NoError(t, err)
			_, err = m.Run(ctx, false)
			require.NoError(t, err)
			dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:nov", Status: 201, ExpiredAt: time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC)})
			side := sideSchema(t, db)

			hand, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = hand.Rollback(ctx) }()
			_, err = hand.Exec(ctx, fmt.Sprintf(hold, partition.Name(expired)))
			require.NoError(t, err)
			done := make(chan struct{})
			var res partition.Result
			var runErr error
			go func() {
				defer close(done)
				res, runErr = newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12, LockTimeout: 20 * time.Second}).Run(ctx, false)
			}()
			// The run waits for the hand session.
			require.Eventually(t, func() bool {
				return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid))`, pidOf(t, hand)) > 0
			}, 10*time.Second, 20*time.Millisecond)
			for _, sql := range []string{
				"ALTER TABLE " + partition.Name(expired) + " SET SCHEMA " + side,
				"ALTER TABLE " + partition.Name(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)) + " RENAME TO " + partition.Name(expired),
			} {
				_, err = hand.Exec(ctx, sql)
				require.NoError(t, err, sql)
			}
			require.NoError(t, hand.Commit(ctx))
			<-done

			require.ErrorIs(t, runErr, partition.ErrIncomplete)
			require.Empty(t, res.Retired)
			require.Len(t, res.Failed, 1)
			require.Contains(t, res.Failed[0].Error, "no longer the partition this run listed")
			require.Contains(t, res.Failed[0].Error, "not retired", "refused before the DETACH")
			require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:nov'"),
				"November's row, inside the retention, is still in the archive")
		})
	}
}

// A retirement's checks pass for the table listed: the month is retired.
func TestARetirementOfTheTableListedGoesThrough(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	_, err := m.EnsureMonth(ctx, time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2025_01"}, res.Retired)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('idempotency_key_archive_2025_01')"))
}

// pidOf is the backend of tx.
func pidOf(t *testing.T, tx pgx.Tx) int32 {
	t.Helper()
	var pid int32
	require.NoError(t, tx.QueryRow(context.Background(), "SELECT pg_backend_pid()").Scan(&pid))
	return pid
}
