package partition_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A month past the retention that the run cannot drop (owned by another
// role) is not detached: before, DETACH (which needs only the parent's
// ownership) took it out of lookups, DROP failed, and every later run
// failed on the detached table it left. It stays attached, and each run
// fails naming its owner and what to do, until it is given back.
func TestAMonthToRetireOwnedByAnotherRoleStaysAttached(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	bloated(t, db, 100, sep, oct)
	stranger := ownedByAStranger(t, db, oct)
	owner := db.NewPool(t, dbtest.AsRole(schema.OwnerRole))
	attached := func() bool {
		var a bool
		require.NoError(t, db.Pool.QueryRow(ctx, "SELECT relispartition FROM pg_class WHERE oid = $1::regclass", partition.Name(oct)).Scan(&a))
		return a
	}

	// GIVEN a retention of one month: September and October are past it
	for range 2 {
		res, err := newManager(t, owner, partition.Config{Now: at(decNow), RetentionMonths: 1}).Run(ctx, false)
		// THEN September is retired, October stays attached, and the run
		// fails naming its owner
		require.ErrorIs(t, err, partition.ErrIncomplete)
		require.Len(t, res.Failed, 1)
		require.Equal(t, partition.Name(oct), res.Failed[0].Partition)
		require.Contains(t, res.Failed[0].Error, "owned by "+stranger)
		require.True(t, attached(), "October is still where lookups read it")
		require.NotContains(t, res.Retired, partition.Name(oct))
	}
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = $1 AND relnamespace = current_schema()::regnamespace", partition.Name(sep)), "September retired")

	// AND once given back, the next run retires it
	_, err := db.Pool.Exec(ctx, "ALTER TABLE "+partition.Name(oct)+" OWNER TO idempotency_owner")
	require.NoError(t, err)
	res, err := newManager(t, owner, partition.Config{Now: at(decNow), RetentionMonths: 1}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{partition.Name(oct)}, res.Retired)
}
