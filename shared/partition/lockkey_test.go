package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// The advisory lock that serializes partition DDL is the archive's, keyed
// by the schema it lies in: a run whose search_path finds the archive behind
// another existing schema (the default "$user", public with a schema named
// after the login user, say) waits for a run holding it.
func TestTwoRunsOnOneArchiveShareOneLock(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	side := db.Schema + "_user"
	_, err := db.Pool.Exec(ctx, "CREATE SCHEMA "+side)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+side+" CASCADE") })
	cfg, err := pgxpool.ParseConfig(dbtest.WithSearchPath(t, dbtest.URL(t), side+","+db.Schema))
	require.NoError(t, err)
	other, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(other.Close)

	// A run of the first kind holds the lock (as during a long compaction).
	holder, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('idempotency_key_archive partitions ' || current_schema(), 0))")
	require.NoError(t, err)
	defer func() { _, _ = holder.Exec(ctx, "SELECT pg_advisory_unlock_all()") }()

	// A run through the other search_path must wait for it.
	rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	res, err := newManager(t, other, partition.Config{Now: at(decNow)}).Run(rctx, false)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "take partition advisory lock")
	require.Empty(t, res.Created, "the second run did its DDL on the same archive while the first held the lock: created=%v", res.Created)
}
