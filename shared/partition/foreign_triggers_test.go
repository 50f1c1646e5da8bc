package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A partitions run reads the triggers of its own archive's partitions only.
// Deparsing a trigger's WHEN clause (pg_get_triggerdef) opens the trigger's
// table, so deparsing one of another schema's tables waits on that table's
// DROP and then fails with "could not open relation with OID" (a second
// deployment in the same database, a test's cleanup): a CI run failed so. The
// adoption's checks ran as a filter on pg_class, which a hash join plan
// evaluates for every relation of the database; an owner's
// idempotency_archive_partition_recorded answering true for any relation
// (the owner may replace it) then let idempotency_archive_partition_triggered
// read every table's triggers. The plan is forced here (no nested loops);
// the planner chose it by itself on a large catalog.
func TestARunNeverReadsTriggersOfAnotherSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := dbtest.New(t)
	db.Partition(t, 0)
	other := dbtest.New(t)

	_, err := db.Pool.Exec(ctx, `
CREATE OR REPLACE FUNCTION idempotency_archive_partition_recorded(part oid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE AS $f$ BEGIN RETURN true; END $f$`)
	require.NoError(t, err)

	// The other schema's archive, which carries a recording trigger with a
	// WHEN clause, locked as its DROP locks it.
	holder, err := other.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(context.Background()) }()
	_, err = holder.Exec(ctx, "LOCK TABLE idempotency_key_archive IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	pool := db.NewPool(t, dbtest.WithParam("enable_nestloop", "off"), dbtest.WithParam("enable_mergejoin", "off"))
	m := newManager(t, pool, partition.Config{LockTimeout: time.Second})
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Failed)
}
