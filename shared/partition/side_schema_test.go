package partition_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// The manager's statements name partitions in the archive's schema. A table
// of another schema attached by hand (a month restored into a side schema)
// is therefore never the manager's to retire, finalize, reattach or compact,
// whatever its name or bounds: it is reported, with its schema, and left
// alone, and the archive's own table of the same name is not mistaken for it.
func TestAPartitionOfAnotherSchemaIsReportedAndLeftAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// table is the side schema's table; bound its bounds.
		table, from, to string
		// pending leaves its detach interrupted.
		pending bool
		// closed says the archive's own table of that name is a closed
		// month, which the run compacts for itself.
		closed bool
	}{
		// Outside the retention, named like a month the archive does not
		// have: the run retired it by the archive schema's name and failed
		// every time ("relation does not exist").
		{name: "old month", table: "idempotency_key_archive_2025_01", from: "2025-01-01", to: "2025-02-01"},
		// Named like the archive's current month, bounded two years ago:
		// the run detached and dropped the archive's December, rows and all.
		{name: "current month's name", table: "idempotency_key_archive_2026_12", from: "2024-01-01", to: "2024-02-01"},
		// Named like a closed month the archive has, bounded outside the
		// retention, detach interrupted: the run finalized and dropped the
		// archive's October.
		{name: "pending, closed month's name", table: "idempotency_key_archive_2026_10", from: "2024-03-01", to: "2024-04-01", pending: true, closed: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db, m := managedArchive(t)
			ctx := context.Background()
			_, err := m.EnsureMonth(ctx, time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC))
			require.NoError(t, err)
			exec := func(sql string) {
				t.Helper()
				_, err := db.Pool.Exec(ctx, sql)
				require.NoError(t, err, sql)
			}
			// Every month the archive has holds a row.
			months := []time.Time{time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 11, 5, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
			for i, at := range months {
				dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: fmt.Sprintf("idem:v1:own-%d", i), Status: 201, ExpiredAt: at})
			}
			side := db.Schema + "_side"
			exec("CREATE SCHEMA " + side)
			t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+side+" CASCADE") })
			exec(fmt.Sprintf("CREATE TABLE %s.%s (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", side, tc.table))
			exec(fmt.Sprintf("ALTER TABLE idempotency_key_archive ATTACH PARTITION %s.%s FOR VALUES FROM ('%s 00:00:00+00') TO ('%s 00:00:00+00')", side, tc.table, tc.from, tc.to))
			exec(fmt.Sprintf("INSERT INTO %s.%s (scoped_key, fingerprint, status_code, created_at, expired_at) VALUES ('idem:v1:side', '\\x00', 201, '%[3]s 05:00:00+00', '%[3]s 06:00:00+00')", side, tc.table, tc.from))
			if tc.pending {
				db.InterruptDetach(t, side+"."+tc.table)
			}

			// WHEN partition runs go (twice: nothing left for a later one)
			m = newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 12, CompactPerRun: 5})
			for range 2 {
				res, err := m.Run(ctx, false)
				// THEN none fails, retires, finalizes or compacts anything,
				require.NoError(t, err)
				require.Empty(t, res.Failed)
				require.Empty(t, res.Retired)
				require.Empty(t, res.Finalized)
				require.Empty(t, res.Reattached)
				if !tc.closed {
					require.NotContains(t, res.Compacted, tc.table, "the archive's table of the side table's name was compacted for it")
				}
				// and the side table is reported, with its schema.
				i := strings.Index(fmt.Sprint(res.Foreign), tc.table)
				require.GreaterOrEqual(t, i, 0, "%+v", res.Foreign)
				require.Contains(t, fmt.Sprint(res.Foreign), side)
			}
			// Every row is where it was: the archive's months and the side table.
			for i := range months {
				require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", fmt.Sprintf("idem:v1:own-%d", i)))
			}
			require.EqualValues(t, 1, dbtest.Count(t, db.Pool, fmt.Sprintf("SELECT count(*) FROM %s.%s", side, tc.table)))
			require.EqualValues(t, 1, dbtest.Count(t, db.Pool,
				"SELECT count(*) FROM pg_inherits WHERE inhrelid = to_regclass($1) AND inhparent = to_regclass('idempotency_key_archive')", side+"."+tc.table))
		})
	}
}

// sideSchema makes a schema beside db's whose name needs quoting, and
// returns it quoted.
func sideSchema(t *testing.T, db *dbtest.DB) string {
	t.Helper()
	side := pgx.Identifier{db.Schema + ` Side "Q"`}.Sanitize()
	_, err := db.Pool.Exec(context.Background(), "CREATE SCHEMA "+side)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+side+" CASCADE") })
	return side
}

// attachSide attaches a new table of schema side, of the archive's shape,
// with the bound given (the text after PARTITION ... ), and returns its
// qualified name.
func attachSide(t *testing.T, db *dbtest.DB, side, name, bound string) string {
	t.Helper()
	tbl := side + "." + pgx.Identifier{name}.Sanitize()
	for _, sql := range []string{
		fmt.Sprintf("CREATE TABLE %s (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)", tbl),
		fmt.Sprintf("ALTER TABLE idempotency_key_archive ATTACH PARTITION %s %s", tbl, bound),
	} {
		_, err := db.Pool.Exec(context.Background(), sql)
		require.NoError(t, err, sql)
	}
	return tbl
}

// Another schema's table holding exactly a wanted month, its detach
// interrupted: the month takes no rows. A run reported nothing (it left
// the table alone, and took the month as covered), and EnsureMonth, which
// the sweeper calls, named the table in the archive's schema ("does not
// exist"). Both now say what is wrong and what to do, naming the schema,
// and neither touches the table.
func TestAPendingMonthOfAnotherSchemaIsReported(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	side := sideSchema(t, db)
	jan := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	tbl := attachSide(t, db, side, partition.Name(jan), "FOR VALUES FROM ('2027-01-01 00:00:00+00') TO ('2027-02-01 00:00:00+00')")
	db.InterruptDetach(t, tbl)

	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	res, err := m.Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Len(t, res.Failed, 1)
	require.Equal(t, partition.Name(jan), res.Failed[0].Partition)
	require.Contains(t, res.Failed[0].Error, side)
	require.Contains(t, res.Failed[0].Error, "FINALIZE")
	require.Contains(t, fmt.Sprint(res.Foreign), "its detach was interrupted")

	_, err = m.EnsureMonth(ctx, jan.AddDate(0, 0, 14))
	require.Error(t, err)
	require.Contains(t, err.Error(), side)
	require.NotContains(t, err.Error(), "does not exist")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_inherits WHERE inhdetachpending AND inhrelid = to_regclass($1)", tbl),
		"the other schema's table is left as it was")

	// The statement given runs as printed in an operator's session, whose
	// search_path does not hold the archive's schema (the archive was
	// named unqualified, and not found there), and the next run then
	// creates the month.
	found := finalizeRE.FindStringSubmatch(res.Failed[0].Error)
	require.NotNil(t, found, res.Failed[0].Error)
	conn, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, found[1])
	require.NoError(t, err, found[1])
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.Contains(t, res.Created, partition.Name(jan))
}

// Another schema's DEFAULT partition is reported as a DEFAULT (it blocks
// every retirement), and named with its schema where it blocks one.
func TestADefaultOfAnotherSchemaIsNamedAsSuch(t *testing.T) {
	t.Parallel()
	db, _ := managedArchive(t)
	side := sideSchema(t, db)
	attachSide(t, db, side, "dflt", "DEFAULT")
	m := newManager(t, db.Pool, partition.Config{Now: at("2027-06-02T10:00:00Z"), RetentionMonths: 1})
	res, err := m.Run(context.Background(), false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Len(t, res.Foreign, 1)
	require.Contains(t, res.Foreign[0].Problem, side)
	require.Contains(t, res.Foreign[0].Problem, "DEFAULT partition")
	require.NotEmpty(t, res.Failed)
	for _, f := range res.Failed {
		require.Contains(t, f.Error, side+`."dflt"`)
	}
}

// A table of another schema that covers the current month takes its rows
// and is left alone; moved into the archive's schema (ALTER TABLE ... SET
// SCHEMA), it is managed: no longer reported, and retired in its time.
func TestAPartitionMovedIntoTheArchivesSchemaIsManaged(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	side := sideSchema(t, db)
	const name = `Restored "Dec" 2026`
	tbl := attachSide(t, db, side, name, "FOR VALUES FROM ('2026-12-01 00:00:00+00') TO ('2027-01-01 00:00:00+00')")
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 1})
	for range 2 {
		res, err := m.Run(ctx, false)
		require.NoError(t, err)
		require.Contains(t, fmt.Sprint(res.Foreign), name)
	}
	stmts, err := m.EnsureMonth(ctx, time.Date(2026, 12, 20, 0, 0, 0, 0, time.UTC))
	require.NoError(t, err)
	require.Empty(t, stmts, "the month is covered")
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:dec", Status: 201, ExpiredAt: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)})
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM "+tbl))

	_, err = db.Pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s SET SCHEMA %s", tbl, pgx.Identifier{db.Schema}.Sanitize()))
	require.NoError(t, err)
	res, err := newManager(t, db.Pool, partition.Config{Now: at("2027-03-02T10:00:00Z"), RetentionMonths: 1}).Run(ctx, false)
	require.NoError(t, err)
	require.NotContains(t, fmt.Sprint(res.Foreign), name)
	require.Contains(t, res.Retired, name)
}
