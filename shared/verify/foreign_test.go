package verify_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/verify"
)

// A partition made by hand over the months ahead, several months long or
// unbounded, covers them, but the manager can create, retire or compact
// none of the months it overlaps: every partitions run fails on it. The
// check used to pass (its figure saying "no partitions" for an unbounded
// one); it fails, naming the partition and what to do.
func TestAHandMadePartitionOverTheMonthsAheadFails(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ bound, figure string }{
		"six months": {"FROM ('2026-12-01 00:00:00+00') TO ('2027-06-01 00:00:00+00')", "newest partition ends 2027-06-01"},
		"unbounded":  {"FROM (MINVALUE) TO (MAXVALUE)", "a partition has no upper bound"},
		"open ended": {"FROM ('2026-12-01 00:00:00+00') TO (MAXVALUE)", "a partition has no upper bound"},
		// Bounds the manager does not read: which months they hold is
		// unknown, so they fail the check, and are not called unbounded.
		"unreadable": {"FROM ('infinity') TO (MAXVALUE)", "by_hand: bound FOR VALUES FROM ('infinity') TO (MAXVALUE) is not a range"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			ctx := context.Background()
			_, err := db.Pool.Exec(ctx, "CREATE TABLE by_hand PARTITION OF idempotency_key_archive FOR VALUES "+tc.bound)
			require.NoError(t, err)
			m, err := partition.NewManager(db.Pool, partition.Config{Now: func() time.Time { return now }}, nil)
			require.NoError(t, err)
			_, runErr := m.Run(ctx, false)
			if name != "unreadable" {
				require.Error(t, runErr, "the manager cannot run beside it")
			}
			c := partitionsCheck(t, db)
			require.False(t, c.Pass, c.Figure)
			require.Contains(t, c.Figure, tc.figure)
			require.Contains(t, c.Figure, "by_hand: b")
			require.NotContains(t, c.Figure, "no partitions")
			if name == "unreadable" {
				require.NotContains(t, c.Figure, "no upper bound")
			}
		})
	}
}

// --recent is echoed as given, not with its zeros cut ("10m" read "1").
func TestTheRecentWindowIsNamedAsGiven(t *testing.T) {
	t.Parallel()
	db := setup(t)
	for d, want := range map[time.Duration]string{
		24 * time.Hour: "24h", 10 * time.Minute: "10m", 30 * time.Minute: "30m", 50 * time.Second: "50s",
		70 * time.Minute: "1h10m", 90 * time.Second: "1m30s", 100 * time.Hour: "100h", 1500 * time.Millisecond: "1.5s",
	} {
		checks, err := verify.Run(context.Background(), db.Pool, verify.Options{Now: func() time.Time { return now }, Recent: d})
		require.NoError(t, err)
		require.True(t, strings.HasSuffix(checks[1].Figure, "in the last "+want), "%s: %q", d, checks[1].Figure)
	}
}

// Without Options.Now (archivectl verify), expiries are judged by the
// database's clock, as the sweeper judges them, not by the clock of the
// machine verify runs on.
func TestTheBacklogIsCountedByTheDatabasesClock(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	var dbNow time.Time
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:done", Status: 201, ExpiresAt: dbNow.Add(-5 * time.Minute)})
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:later", Status: 201, ExpiresAt: dbNow.Add(time.Hour)})
	checks, err := verify.Run(ctx, db.Pool, verify.Options{})
	require.NoError(t, err)
	require.False(t, checks[0].Pass)
	require.Equal(t, "1 expired live rows", checks[0].Figure)
}

// Another schema's partition of a month ahead, its detach interrupted: no
// partitions run touches another schema's table, so the check's advice is
// to finish the detach by hand, not to run one.
func TestAPendingPartitionOfAnotherSchemaIsNotLeftToAPartitionsRun(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	side := db.Schema + "_side"
	tbl := side + ".restored_jan"
	for _, sql := range []string{
		"CREATE SCHEMA " + side,
		"CREATE TABLE " + tbl + " (LIKE idempotency_key_archive INCLUDING DEFAULTS INCLUDING CONSTRAINTS)",
		"ALTER TABLE idempotency_key_archive ATTACH PARTITION " + tbl + " FOR VALUES FROM ('2027-01-01 00:00:00+00') TO ('2027-02-01 00:00:00+00')",
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+side+" CASCADE") })
	db.InterruptDetach(t, tbl)

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, side+`."restored_jan": attached from schema `+side)
	require.Contains(t, c.Figure, "its detach was interrupted, so its rows are invisible")
	require.Contains(t, c.Figure, `ALTER TABLE `+db.Schema+`.idempotency_key_archive DETACH PARTITION `+side+`."restored_jan" FINALIZE`)
	require.NotContains(t, c.Figure, "run archivectl partitions to attach it again")
}

// Another schema's DEFAULT partition is named with its schema.
func TestADefaultOfAnotherSchemaIsNamedWithItsSchema(t *testing.T) {
	t.Parallel()
	db := setup(t)
	ctx := context.Background()
	side := db.Schema + "_side"
	for _, sql := range []string{
		"CREATE SCHEMA " + side,
		"CREATE TABLE " + side + ".catchall PARTITION OF idempotency_key_archive DEFAULT",
	} {
		_, err := db.Pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+side+" CASCADE") })
	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, "DEFAULT partition "+side+`."catchall"`)
}
