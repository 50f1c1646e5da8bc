package verify_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
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
	require.Len(t, checks, 4)
	require.Equal(t, "partitions exist two months ahead", checks[3].Name)
	return checks[3]
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
	ctx := context.Background()
	reader, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	require.NoError(t, err)
	conn, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET statement_timeout = '1s'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2026_12 CONCURRENTLY")
	require.ErrorContains(t, err, "statement timeout")
	_, err = conn.Exec(ctx, "RESET statement_timeout")
	require.NoError(t, err)
	conn.Release()
	require.NoError(t, reader.Rollback(ctx))

	c := partitionsCheck(t, db)
	require.False(t, c.Pass)
	require.Contains(t, c.Figure, "missing 2026-12; idempotency_key_archive_2026_12 is detach-pending (its rows are invisible): run archivectl partitions to attach it again")
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
