package partition_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// README: "A detached table that cannot go back (rows outside its month, or
// another partition now covers it) is kept and reported." It is kept only
// while its *name's* month is inside the retention: once that month falls
// out, plan() drops it by name (DROP TABLE IF EXISTS) without looking at
// what it holds, and mayRetire checks only the name's month. Rows of months
// still inside the retention go with it.
func TestADetachedTableHoldingRowsOfARetainedMonthIsNeverDropped(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	archived(t, db, month(2026, time.November), month(2027, time.March))
	// GIVEN December detached by hand with a row of January 2027 put in it
	// (TestADetachedTableThatCannotGoBackIsKeptAndReported: kept, reported)
	_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2026_12")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "INSERT INTO idempotency_key_archive_2026_12 VALUES ('idem:v1:stray-january', '\\x00', 201, NULL, '2027-01-01', '2027-01-02')")
	require.NoError(t, err)
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Equal(t, "reattach", res.Failed[0].Action)

	// WHEN, two months on, a run with a retention of 1 month comes (January
	// 2027 is inside it; December 2026 is not)
	res, err = newManager(t, db.Pool, partition.Config{Now: at("2027-02-02T10:00:00Z"), RetentionMonths: 1}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Contains(t, fmt.Sprint(res.Failed), "holds rows that expired outside its month")

	// THEN the January row, inside the retention, is not destroyed
	n := dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'idempotency_key_archive_2026_12' AND relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())")
	require.EqualValues(t, 1, n, "the detached table holding a January 2027 row (inside the 1-month retention) was dropped: retired=%v", res.Retired)
}

// A table that was never a partition, of another shape, merely named like
// an old month (an operator's scratch copy, another tool's table), is
// dropped by the first run with a retention: orphansSQL matches by name
// and relkind only, and nothing checks the table's columns or rows.
func TestATableOfAnotherShapeNamedLikeAnOldMonthIsNotDropped(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2025_01 (invoice_id bigint PRIMARY KEY, note text);
		INSERT INTO idempotency_key_archive_2025_01 VALUES (1, 'not an archive row')`)
	require.NoError(t, err)
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow), RetentionMonths: 6}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Contains(t, fmt.Sprint(res.Failed), "has not the archive's columns: rename it")
	n := dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'idempotency_key_archive_2025_01' AND relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema())")
	require.EqualValues(t, 1, n, "a table that was never an archive partition was dropped: retired=%v", res.Retired)
}

// A table of another shape named like a month the run must create (here
// the lead month) blocks that month for good: every run fails on it, and
// when the month comes the sweeper's EnsureMonth fails the same way.
func TestATableOfAnotherShapeNamedLikeALeadMonth(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2027_03 (invoice_id bigint PRIMARY KEY)`)
	require.NoError(t, err)
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
	require.ErrorIs(t, err, partition.ErrIncomplete)
	require.Contains(t, fmt.Sprint(res.Failed), "idempotency_key_archive_2027_03 is named like a month of the archive but has not the archive's columns: rename it")
	require.Contains(t, res.Created, "idempotency_key_archive_2027_02", "the other months are created")
	_, err = newManager(t, db.Pool, partition.Config{Now: at(decNow)}).EnsureMonth(ctx, month(2027, time.March))
	require.Error(t, err)
}

// A detached month outside the retention, in a schema whose name holds the
// dollar quote the drop's check is written in, is checked and dropped.
func TestADetachedMonthIsDroppedInASchemaNamedWithTheDollarQuote(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	name := db.Schema + "$drop$x"
	ident := pgx.Identifier{name}.Sanitize()
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+ident)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+ident+" CASCADE") })
	cfg, err := pgxpool.ParseConfig(db.URL)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["search_path"] = ident
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = schema.Migrate(ctx, conn.Conn(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	conn.Release()
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `
		CREATE TABLE idempotency_key_archive_2025_01 (LIKE idempotency_key_archive);
		INSERT INTO idempotency_key_archive_2025_01 VALUES ('idem:v1:old', '\x00', 201, NULL, '2025-01-09', '2025-01-10')`)
	require.NoError(t, err)
	res, err := newManager(t, pool, partition.Config{Now: at(decNow), RetentionMonths: 6}).Run(ctx, false)
	require.NoError(t, err)
	require.Contains(t, res.Retired, "idempotency_key_archive_2025_01")
	var gone bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass('idempotency_key_archive_2025_01') IS NULL").Scan(&gone))
	require.True(t, gone)
}
