package partition_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A rebuild by hand of a month the run cannot compact (owned by another
// role), when interrupted, leaves an invalid <pk>_ccnew owned by that role.
// Every run drops leftovers, compacting or not: that one it reports, naming
// its owner, instead of failing on "must be owner of index" every run.
func TestALeftoverOnAMonthOwnedByAnotherRoleIsReportedNotFailed(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	bloated(t, db, 1_000, sep, oct)

	stranger := ownedByAStranger(t, db, oct)

	// GIVEN the operator's rebuild by hand of October was interrupted
	killRebuild(t, db, partition.Name(oct))
	require.EqualValues(t, 1, invalidIndexes(t, db))

	owner := db.NewPool(t, dbtest.AsRole(schema.OwnerRole))
	for run := range 2 {
		for _, perRun := range []int{0, 1} {
			res, err := newManager(t, owner, partition.Config{Now: at(decNow), CompactPerRun: perRun}).Run(ctx, false)
			// THEN no run fails on a month it cannot act on, and each
			// says what is left and whose it is
			require.NoError(t, err, "run %d (compact per run %d): failed: %+v", run, perRun, res.Failed)
			require.Empty(t, res.Failed)
			require.Len(t, res.Foreign, 1)
			require.Equal(t, partition.Name(oct), res.Foreign[0].Name)
			require.Contains(t, res.Foreign[0].Problem, "owned by "+stranger)
			require.Contains(t, res.Foreign[0].Problem, "_ccnew")
			require.EqualValues(t, 1, invalidIndexes(t, db), "left for its owner")
		}
	}
}
