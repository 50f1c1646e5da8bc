package partition_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// The tests in this file attack the invariant that archived rows are never
// lost: whatever the retention says, only months outside it are dropped, and a
// month inside it that was detached comes back with its rows.

const decNow = "2026-12-02T10:00:00Z"

// interruptDetach leaves name detach-pending, as a DETACH ... CONCURRENTLY
// cancelled while it waited for a reader does.
func interruptDetach(t *testing.T, db *dbtest.DB, name string) {
	t.Helper()
	db.InterruptDetach(t, name)
}

// archived creates the months from..to with two rows in each, and returns the
// number of rows.
func archived(t *testing.T, db *dbtest.DB, from, to time.Time) int64 {
	t.Helper()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	var n int64
	for mo := from; !mo.After(to); mo = mo.AddDate(0, 1, 0) {
		_, err := m.EnsureMonth(context.Background(), mo)
		require.NoError(t, err)
		dbtest.InsertArchive(t, db.Pool,
			dbtest.ArchiveRow{Key: "first " + partition.Name(mo), Status: 201, ExpiredAt: mo},
			dbtest.ArchiveRow{Key: "last " + partition.Name(mo), Status: 201, ExpiredAt: mo.AddDate(0, 1, 0).Add(-time.Microsecond)})
		n += 2
	}
	return n
}

func rowsThroughTheParent(t *testing.T, db *dbtest.DB) int64 {
	t.Helper()
	return dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive")
}

func attached(t *testing.T, db *dbtest.DB) []string {
	t.Helper()
	parts, err := partition.List(context.Background(), db.Pool)
	require.NoError(t, err)
	var out []string
	for _, p := range parts {
		if !p.DetachPending {
			out = append(out, p.Name)
		}
	}
	return out
}

func TestTheGuardRefusesEveryMonthTheRetentionKeeps(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC)
	for _, tc := range []struct {
		name      string
		to        time.Time
		retention int
		want      string // "" allows
	}{
		{"the current month", month(2027, time.January), 1, "inside or after the current month"},
		{"a future month", month(2030, time.January), 1, "inside or after the current month"},
		{"a month reaching a second into the current one", month(2026, time.December).Add(time.Second), 1, "inside or after"},
		{"last month, retention 1", month(2026, time.December), 1, "0 whole months before the current month, inside the retention of 1"},
		{"the last month kept by 3", month(2026, time.October), 3, "inside the retention of 3"},
		{"the first month retired by 3", month(2026, time.September), 3, ""},
		{"a partial month counts as kept", month(2026, time.September).Add(time.Nanosecond), 3, "inside the retention of 3"},
		{"a century ago", month(1926, time.December), partition.MaxRetentionMonths, ""},
		{"keep forever", month(1926, time.January), 0, "not between 1 and 1200"},
		{"negative", month(1926, time.January), -1, "not between 1 and 1200"},
		{"huge", month(1926, time.January), 1000000000000000, "not between 1 and 1200"},
		{"MaxInt", month(1926, time.January), math.MaxInt, "not between 1 and 1200"},
		{"unbounded", time.Time{}, 1, "no upper bound"},
	} {
		err := partition.MayRetire(tc.to, now, tc.retention)
		if tc.want == "" {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorContains(t, err, tc.want, tc.name)
		}
	}
}

func TestHostileRetentionPastValidationStillRetiresNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		retention int
		// overflows: the cutoff arithmetic lands in the future and picks every
		// partition, so the guard must be what saves them.
		overflows bool
	}{{1000000000000000, true}, {math.MaxInt, false}, {1 << 40, false}, {partition.MaxRetentionMonths + 1, false}} {
		t.Run(fmt.Sprint(tc.retention), func(t *testing.T) {
			t.Parallel()
			// GIVEN months from January 2026 through March 2027 with rows in each
			db := dbtest.New(t)
			rows := archived(t, db, month(2026, time.January), month(2027, time.March))
			before := attached(t, db)

			// WHEN a manager that skipped Validate runs with the hostile retention
			res, err := partition.UncheckedManager(db.Pool, partition.Config{RetentionMonths: tc.retention, Now: at(decNow)}).Run(context.Background(), false)

			// THEN nothing was detached or dropped and no row is lost
			require.Empty(t, res.Retired)
			require.NotContains(t, strings.Join(res.Statements, "\n"), "DROP")
			require.NotContains(t, strings.Join(res.Statements, "\n"), "DETACH")
			require.Equal(t, before, attached(t, db))
			require.Equal(t, rows, rowsThroughTheParent(t, db))
			if !tc.overflows {
				require.True(t, err == nil || errors.Is(err, partition.ErrRetirementRefused), "%v", err)
				return
			}
			// AND where the arithmetic chose every month, the guard refused each, loudly
			require.ErrorIs(t, err, partition.ErrRetirementRefused)
			var refused []string
			for _, r := range res.Refused {
				refused = append(refused, r.Partition)
			}
			require.Contains(t, refused, "idempotency_key_archive_2026_12")
			require.Contains(t, refused, "idempotency_key_archive_2027_03")
			require.Contains(t, refused, "idempotency_key_archive_2026_01")
		})
	}
}

func TestInterruptedDetachOfAMonthInsideTheRetentionIsAttachedAgainWithItsRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		month     time.Time
		retention int
	}{
		{"current month, keep forever", month(2026, time.December), 0},
		{"current month, retention 9", month(2026, time.December), 9},
		{"next month, retention 9", month(2027, time.January), 9},
		{"an old month, keep forever", month(2026, time.March), 0},
		{"the oldest month inside the retention", month(2026, time.March), 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// GIVEN rows from March 2026 on, and the month's detach interrupted:
			// its rows have gone from the parent
			db := dbtest.New(t)
			ctx := context.Background()
			rows := archived(t, db, month(2026, time.March), month(2027, time.March))
			name := partition.Name(tc.month)
			interruptDetach(t, db, name)
			require.Equal(t, rows-2, rowsThroughTheParent(t, db))

			// WHEN the manager runs
			res, err := newManager(t, db.Pool, partition.Config{RetentionMonths: tc.retention, Now: at(decNow)}).Run(ctx, false)
			require.NoError(t, err)

			// THEN it finalized the detach and attached the month again, with
			// its rows findable through the parent, in the same run
			require.Equal(t, []string{name}, res.Finalized)
			require.Equal(t, []string{name}, res.Reattached)
			require.Empty(t, res.Retired)
			require.Empty(t, res.Created)
			require.Contains(t, attached(t, db), name)
			require.Equal(t, rows, rowsThroughTheParent(t, db))
			require.EqualValues(t, 1, dbtest.Count(t, db.Pool,
				"SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1 AND tableoid = to_regclass($2)", "last "+name, name))
			require.EqualValues(t, 0, dbtest.Count(t, db.Pool,
				"SELECT count(*) FROM pg_constraint WHERE conrelid = to_regclass($1) AND conname LIKE '%_bounds'", name))

			// AND the next run has nothing to do
			res, err = newManager(t, db.Pool, partition.Config{RetentionMonths: tc.retention, Now: at(decNow)}).Run(ctx, false)
			require.NoError(t, err)
			require.Empty(t, res.Statements)
		})
	}
}

func TestAMonthDetachedByHandInsideTheRetentionIsAttachedAgainWithItsRows(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		month     time.Time
		retention int
	}{
		{"current month, keep forever", month(2026, time.December), 0},
		{"current month, retention 9", month(2026, time.December), 9},
		{"an old month, keep forever", month(2026, time.March), 0},
		{"the oldest month inside the retention", month(2026, time.March), 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// GIVEN rows from March 2026 on, and the month detached by hand
			db := dbtest.New(t)
			ctx := context.Background()
			rows := archived(t, db, month(2026, time.March), month(2027, time.March))
			name := partition.Name(tc.month)
			_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION "+name)
			require.NoError(t, err)
			require.Equal(t, rows-2, rowsThroughTheParent(t, db))

			// WHEN the manager runs
			res, err := newManager(t, db.Pool, partition.Config{RetentionMonths: tc.retention, Now: at(decNow)}).Run(ctx, false)
			require.NoError(t, err)

			// THEN the table is attached again, never dropped, rows and all
			require.Equal(t, []string{name}, res.Reattached)
			require.Empty(t, res.Retired)
			require.Empty(t, res.Created)
			require.Contains(t, attached(t, db), name)
			require.Equal(t, rows, rowsThroughTheParent(t, db))
		})
	}
}

func TestADetachedTableThatCannotGoBackIsKeptAndReported(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	rows := archived(t, db, month(2026, time.November), month(2027, time.March))
	// GIVEN December detached by hand, with a row of January put in it
	_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2026_12")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "INSERT INTO idempotency_key_archive_2026_12 VALUES ('stray', '\\x00', 201, NULL, '2027-01-01', '2027-01-02')")
	require.NoError(t, err)

	// WHEN the manager runs
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)

	// THEN it says which table and why, drops nothing, and the table keeps its rows
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "reattach", res.Failed[0].Action)
	require.Equal(t, "idempotency_key_archive_2026_12", res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, "violated")
	require.Empty(t, res.Retired)
	require.EqualValues(t, 3, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive_2026_12"))
	require.Equal(t, rows-2, rowsThroughTheParent(t, db))
}

func TestEnsureMonthAttachesAPendingMonthAgain(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	rows := archived(t, db, month(2026, time.December), month(2026, time.December))
	interruptDetach(t, db, "idempotency_key_archive_2026_12")

	// WHEN the sweeper finds December missing and ensures it
	stmts, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).EnsureMonth(ctx, month(2026, time.December).Add(time.Hour))
	require.NoError(t, err)

	// THEN the month came back with its rows rather than being skipped as covered
	require.Contains(t, strings.Join(stmts, "\n"), "FINALIZE")
	require.Equal(t, rows, rowsThroughTheParent(t, db))
}

func TestADefaultPartitionIsReportedAndTheRestManaged(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// GIVEN November through February, then a DEFAULT partition added by hand
	// holding a row of March, which has no partition yet
	_, err := newManager(t, db.Pool, partition.Config{LeadMonths: 2, Now: at(decNow)}).Run(ctx, false)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "CREATE TABLE archive_catchall PARTITION OF idempotency_key_archive DEFAULT")
	require.NoError(t, err)
	dbtest.InsertArchive(t, db.Pool,
		dbtest.ArchiveRow{Key: "march", Status: 201, ExpiredAt: month(2027, time.March).Add(time.Hour)},
		dbtest.ArchiveRow{Key: "december", Status: 201, ExpiredAt: month(2026, time.December).Add(time.Hour)})

	// WHEN the manager runs four months ahead
	res, err := newManager(t, db.Pool, partition.Config{LeadMonths: 4, Now: at(decNow)}).Run(ctx, false)

	// THEN it reports the DEFAULT partition by name and bound
	require.Equal(t, []partition.Foreign{{Name: "archive_catchall", Bound: "DEFAULT", Problem: res.Foreign[0].Problem}}, res.Foreign)
	require.Contains(t, res.Foreign[0].Problem, "move its rows into monthly partitions and detach it")
	// AND March, whose rows sit in DEFAULT, fails with what to do
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Len(t, res.Failed, 1)
	require.Equal(t, "idempotency_key_archive_2027_03", res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, "the DEFAULT partition archive_catchall holds rows of this month")
	require.Contains(t, err.Error(), "archive_catchall")
	// AND April is still created, and no row moved or went missing
	require.Equal(t, []string{"idempotency_key_archive_2027_04"}, res.Created)
	require.Equal(t, time.Date(2027, 5, 1, 0, 0, 0, 0, time.UTC), res.NewestUpperBound)
	require.EqualValues(t, 2, rowsThroughTheParent(t, db))
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM archive_catchall"))

	// AND a retention cannot detach concurrently beside DEFAULT: reported, nothing dropped
	res, err = newManager(t, db.Pool, partition.Config{RetentionMonths: 1, LeadMonths: 2, Now: at("2027-02-02T00:00:00Z")}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Empty(t, res.Retired)
	require.Contains(t, fmt.Sprint(res.Failed), "cannot detach concurrently while the DEFAULT partition archive_catchall exists")
	require.EqualValues(t, 2, rowsThroughTheParent(t, db))

	// AND the sweeper's coverage check does not count DEFAULT as a month
	parts, err := partition.List(ctx, db.Pool)
	require.NoError(t, err)
	require.False(t, partition.Covers(parts, month(2027, time.March)))
	require.True(t, partition.Covers(parts, month(2026, time.December)))
}

func TestAFractionalBoundIsReportedWithItsRealBounds(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// GIVEN hand-made partitions whose bounds have fractional seconds: one in
	// an old month, one over the current month
	_, err := db.Pool.Exec(ctx, `CREATE TABLE old_by_hand PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2026-03-01 00:00:00.5+00') TO ('2026-04-01 00:00:00+00')`)
	require.NoError(t, err)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "old", Status: 201, ExpiredAt: month(2026, time.March).Add(time.Hour)})

	// WHEN the manager runs
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)

	// THEN the old one is reported with its exact bounds, and the run succeeds
	require.NoError(t, err)
	require.Len(t, res.Foreign, 1)
	require.Equal(t, "old_by_hand", res.Foreign[0].Name)
	require.Equal(t, "FOR VALUES FROM ('2026-03-01 00:00:00.5+00') TO ('2026-04-01 00:00:00+00')", res.Foreign[0].Bound)
	require.Contains(t, res.Foreign[0].Problem, "[2026-03-01T00:00:00.5Z, 2026-04-01T00:00:00Z) are not one UTC month")
	require.Len(t, res.Created, 5)

	// AND one over a wanted month fails that month alone, naming its bounds
	db2 := dbtest.New(t)
	_, err = db2.Pool.Exec(ctx, `CREATE TABLE dec_by_hand PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2026-12-01 00:00:00.25+00') TO ('2027-01-01 00:00:00+00')`)
	require.NoError(t, err)
	res, err = newManager(t, db2.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.ErrorContains(t, err, "partition dec_by_hand covers [2026-12-01T00:00:00.25Z, 2027-01-01T00:00:00Z), which overlaps UTC month 2026-12")
	require.Len(t, res.Failed, 1)
	require.Equal(t, "idempotency_key_archive_2026_12", res.Failed[0].Partition)
	require.Equal(t, []string{"idempotency_key_archive_2026_11", "idempotency_key_archive_2027_01", "idempotency_key_archive_2027_02", "idempotency_key_archive_2027_03"}, res.Created)
}

func TestDryRunReportsTheNewestBoundAfterTheRun(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})

	// On an empty archive: what the run would create
	res, err := m.Run(ctx, true)
	require.NoError(t, err)
	require.Equal(t, month(2027, time.April), res.NewestUpperBound)
	require.InDelta(t, 119.583, res.NewestPartitionDays, 0.001)
	b, err := json.Marshal(res)
	require.NoError(t, err)
	require.Contains(t, string(b), `"newest_upper_bound":"2027-04-01T00:00:00Z"`)

	// With everything in place: what is there
	_, err = m.Run(ctx, false)
	require.NoError(t, err)
	res, err = newManager(t, db.Pool, partition.Config{LeadMonths: 2, Now: at(decNow)}).Run(ctx, true)
	require.NoError(t, err)
	require.Empty(t, res.Statements)
	require.Equal(t, month(2027, time.April), res.NewestUpperBound)

	// With no partition at all the fields are left out, not year 1
	b, err = json.Marshal(partition.Result{})
	require.NoError(t, err)
	require.NotContains(t, string(b), "newest_upper_bound")
	require.NotContains(t, string(b), "newest_partition_days")
}

func TestRunErrorsWrapBothSentinels(t *testing.T) {
	t.Parallel()
	// A run both refused and incomplete reports both kinds.
	db := dbtest.New(t)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE dec_by_hand PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2026-12-01 00:00:00.25+00') TO ('2027-01-01 00:00:00+00')`)
	require.NoError(t, err)
	_, err = partition.UncheckedManager(db.Pool, partition.Config{RetentionMonths: 1000000000000000, Now: at(decNow)}).Run(context.Background(), false)
	require.True(t, errors.Is(err, partition.ErrIncomplete) && errors.Is(err, partition.ErrRetirementRefused), "%v", err)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'dec_by_hand' AND relnamespace = current_schema()::regnamespace"))
}

func TestABoundThePackageCannotReadIsReportedNotFatal(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE far_future PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('12026-01-01 00:00:00+00') TO ('12026-02-01 00:00:00+00')`)
	require.NoError(t, err)

	res, err := newManager(t, db.Pool, partition.Config{RetentionMonths: 1, Now: at(decNow)}).Run(ctx, false)
	require.NoError(t, err)
	require.Len(t, res.Created, 5)
	require.Empty(t, res.Retired)
	require.Len(t, res.Foreign, 1)
	require.Equal(t, "far_future", res.Foreign[0].Name)
	require.Contains(t, res.Foreign[0].Problem, "bound FOR VALUES FROM ('12026-01-01 00:00:00+00') TO ('12026-02-01 00:00:00+00') is not a range of timestamps")
	// Its unknown bounds neither cover a month nor count as the newest.
	require.Equal(t, month(2027, time.April), res.NewestUpperBound)
	parts, err := partition.List(ctx, db.Pool)
	require.NoError(t, err)
	require.False(t, partition.Covers(parts, month(12026, time.January)))
}

// By default the manager reads both clocks: it retires by the earlier of the
// host's and the database's, and creates from the later. A clock that runs
// ahead can never retire a month the archive still writes to.
func TestRetirementFollowsTheEarlierClock(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// Months from four back through three ahead, each with a row.
	db.Partition(t, 3)
	cur := partition.MonthStart(time.Now())
	for i := -4; i <= 3; i++ {
		m := cur.AddDate(0, i, 0)
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: fmt.Sprintf("k%d", i), Status: 201, ExpiredAt: m.Add(time.Hour)})
	}
	// This connection's now() runs five years behind the host: the host
	// clock is the one that is ahead.
	_, err := db.Pool.Exec(ctx, "CREATE FUNCTION "+db.Schema+".now() RETURNS timestamptz LANGUAGE sql AS $$ SELECT pg_catalog.now() - interval '5 years' $$")
	require.NoError(t, err)
	behind := db.NewPool(t, dbtest.WithParam("search_path", db.Schema+", pg_catalog"))
	var dbNow time.Time
	require.NoError(t, behind.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	require.Less(t, dbNow, time.Now().AddDate(-4, 0, 0), "the shadowing now() is in force")

	m, err := partition.NewManager(behind, partition.Config{RetentionMonths: 1}, nil)
	require.NoError(t, err)
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Retired, "by the earlier clock every month is inside the retention")
	require.LessOrEqual(t, len(res.Created), 2*(3+2), "months around each clock, nothing in between")
	require.EqualValues(t, 8, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"), "no row was lost")

	// With both clocks agreeing, the months outside the retention go.
	m, err = partition.NewManager(db.Pool, partition.Config{RetentionMonths: 1}, nil)
	require.NoError(t, err)
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.NotEmpty(t, res.Retired)
}

// DETACH ... FINALIZE waits for every older snapshot in the database, so it
// can deadlock with a transaction that holds a snapshot and then waits for
// the archive's lock. PostgreSQL aborts one of them; when it is the
// finalize, the manager tries again, the detach still pending, and the run
// completes instead of failing.
func TestAFinalizeChosenAsADeadlockVictimIsTriedAgain(t *testing.T) {
	t.Parallel()
	// GIVEN a month whose detach was interrupted
	db := dbtest.New(t)
	ctx := context.Background()
	rows := archived(t, db, month(2026, time.March), month(2026, time.May))
	name := partition.Name(month(2026, time.April))
	interruptDetach(t, db, name)

	// AND a transaction holding a snapshot, which the finalize waits for
	other, err := db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer other.Rollback(ctx) //nolint:errcheck // committed below
	var vxid string
	require.NoError(t, other.QueryRow(ctx, "SELECT virtualtransaction FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'virtualxid'").Scan(&vxid))
	// Only the finalize looks for the deadlock within the test: PostgreSQL
	// checks once per wait, deadlock_timeout after it began.
	_, err = other.Exec(ctx, "SET LOCAL deadlock_timeout = '30s'")
	require.NoError(t, err)

	// WHEN the manager finalizes, and that transaction then waits for the
	// archive's lock, which the finalize holds: a deadlock, whose victim is
	// the finalize, the first to wait
	type outcome struct {
		res partition.Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
		done <- outcome{res, err}
	}()
	// The finalize waits for every older snapshot in turn (other tests'
	// too): act the moment it waits for this one, well within its
	// deadlock_timeout.
	require.Eventually(t, func() bool {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_locks WHERE locktype = 'virtualxid' AND virtualxid = $1 AND NOT granted", vxid) > 0
	}, 30*time.Second, time.Millisecond, "the finalize waits for the snapshot")
	_, err = other.Exec(ctx, "LOCK TABLE idempotency_key_archive IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err, "the finalize, not this transaction, is the deadlock's victim")
	require.NoError(t, other.Commit(ctx))

	// THEN the run tried the finalize again and completed it
	got := <-done
	require.NoError(t, got.err)
	require.Equal(t, []string{name}, got.res.Finalized)
	require.Equal(t, []string{name}, got.res.Reattached)
	require.Equal(t, rows, rowsThroughTheParent(t, db))
}

// An infinity on the wrong side of a hand-made partition's bounds (a
// partition of the single value infinity, or of none) is a bound the manager
// does not read, not an unbounded one: it covers no month, and every month
// is still created around it. A stray table named for year 0 (no such year
// in PostgreSQL) is not a month either, and fails no run.
func TestOddBoundsAndNamesMadeByHandLeaveTheMonthsManaged(t *testing.T) {
	t.Parallel()
	for _, bound := range []string{"FOR VALUES FROM ('infinity') TO (MAXVALUE)", "FOR VALUES FROM (MINVALUE) TO ('-infinity')"} {
		t.Run(bound, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, "CREATE TABLE odd_by_hand PARTITION OF idempotency_key_archive "+bound)
			require.NoError(t, err)
			_, err = db.Pool.Exec(ctx, "CREATE TABLE idempotency_key_archive_0000_01 (LIKE idempotency_key_archive)")
			require.NoError(t, err)

			parts, err := partition.List(ctx, db.Pool)
			require.NoError(t, err)
			require.False(t, partition.Covers(parts, month(2026, time.December)))
			for range 2 {
				res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
				require.NoError(t, err)
				require.Empty(t, res.Failed)
			}
			parts, err = partition.List(ctx, db.Pool)
			require.NoError(t, err)
			require.True(t, partition.Covers(parts, month(2026, time.December)))
		})
	}
}
