package partition_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A rebuild killed after its build phase leaves an invalid *_ccnew index
// that every insert into the month still writes and checks. The next run
// drops it even when it compacts nothing (PARTITION_COMPACT_PER_RUN=0, or
// `archivectl partitions`, whose --compact-per-run defaults to 0).
func TestKilledRebuildLeftoverIsDroppedByARunThatDoesNotCompact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, keys, name, _ := october(t)
	killRebuild(t, db, name)
	require.EqualValues(t, 1, invalidIndexes(t, db), "the killed rebuild left its new index")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
		WHERE NOT x.indisvalid AND x.indisready AND c.relname = $1 AND c.relnamespace = current_schema()::regnamespace`, name+"_pkey_ccnew"), "maintained by every insert")

	// Lookups still work with the leftover in place.
	r, err := archive.NewReader(db.Pool, archive.Config{}, nil)
	require.NoError(t, err)
	_, err = r.Lookup(ctx, keys[0], nil)
	require.NoError(t, err)

	// WHEN the next runs do not compact (the CLI's default; or
	// PARTITION_COMPACT_PER_RUN=0)
	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{name + "_pkey_ccnew"}, res.DroppedIndexes)
	// THEN the first of them dropped it
	require.EqualValues(t, 0, invalidIndexes(t, db), "the killed rebuild's invalid %s_pkey_ccnew is still there", name)
	_, err = r.Lookup(ctx, keys[0], nil)
	require.NoError(t, err)
}
