package partition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
)

// A closed month the partitions function's role cannot rebuild (owned by
// another user: attached or restored by hand) is left pending with what to
// do, and neither fails the run nor takes the run's one compaction: before,
// the newest closed month failed every daily run and the older ones waited
// behind it forever.
func TestAMonthOwnedByAnotherRoleDoesNotStarveOlderMonths(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	bloated(t, db, 1_000, sep, oct)

	// GIVEN every partition owned by the archive's owner role, as the
	// migration leaves them, except October, owned by a stranger
	stranger := ownedByAStranger(t, db, oct)

	// WHEN the partitions run, as the owner role, compacts one month
	owner := db.NewPool(t, dbtest.AsRole(schema.OwnerRole))
	res, err := newManager(t, owner, partition.Config{Now: at(decNow), CompactPerRun: 1}).Run(ctx, false)

	// THEN it succeeds, compacts September, and says why October waits
	require.NoError(t, err)
	require.Empty(t, res.Failed)
	require.Equal(t, []string{partition.Name(sep)}, res.Compacted)
	require.Len(t, res.CompactPending, 1)
	require.Equal(t, partition.Name(oct), res.CompactPending[0].Partition)
	require.Contains(t, res.CompactPending[0].Reason, "owned by "+stranger)
	require.Contains(t, res.CompactPending[0].Reason, "OWNER TO")
	require.Equal(t, "", pkOf(t, db, partition.Name(oct)).Comment, "October untouched")

	// AND once October is given back, the next run compacts it
	_, err = db.Pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{partition.Name(oct)}.Sanitize()+" OWNER TO idempotency_owner")
	require.NoError(t, err)
	res, err = newManager(t, owner, partition.Config{Now: at(decNow), CompactPerRun: 1}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{partition.Name(oct)}, res.Compacted)
	require.Empty(t, res.CompactPending)
}

// ownedByAStranger gives every partition to the archive's owner role, as
// the migration leaves them, except month's, which it gives to a role of
// its own (made for the test, dropped after it), whose name it returns.
func ownedByAStranger(t *testing.T, db *dbtest.DB, month time.Time) string {
	t.Helper()
	ctx := context.Background()
	stranger := "stranger_" + strings.ToLower(db.Schema)
	_, err := db.Pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{stranger}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), "ALTER TABLE "+pgx.Identifier{partition.Name(month)}.Sanitize()+" OWNER TO CURRENT_USER")
		_, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{stranger}.Sanitize())
	})
	_, err = db.Pool.Exec(ctx, `
		DO $$DECLARE r record; BEGIN
		  FOR r IN SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		            WHERE i.inhparent = 'idempotency_key_archive'::regclass LOOP
		    EXECUTE format('ALTER TABLE %I OWNER TO idempotency_owner', r.relname);
		  END LOOP;
		END$$`)
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{partition.Name(month)}.Sanitize()+" OWNER TO "+pgx.Identifier{stranger}.Sanitize())
	require.NoError(t, err)
	return stranger
}
