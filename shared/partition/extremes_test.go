package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// Extreme settings together: the longest lead, the shortest retention and
// the most compactions a run may do, then the longest retention; a backlog
// row of year 1. Nothing inside the retention may go, the current and
// previous months stay, and every month of the lead exists.
func TestExtremeLeadRetentionAndCompaction(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	rows := archived(t, db, month(2026, time.June), month(2027, time.January))
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:year-one", Status: 201, ExpiresAt: time.Date(1, time.March, 3, 0, 0, 0, 0, time.UTC)})

	res, err := newManager(t, db.Pool, partition.Config{Now: at(decNow), LeadMonths: partition.MaxLeadMonths, RetentionMonths: 1,
		CompactPerRun: partition.MaxCompactPerRun}).Run(ctx, false)
	require.NoError(t, err)
	t.Logf("retired=%v compacted=%v created=%d newest=%s days=%.0f", res.Retired, res.Compacted, len(res.Created), res.NewestUpperBound, res.NewestPartitionDays)
	require.Equal(t, month(2026, time.December).AddDate(0, partition.MaxLeadMonths+1, 0), res.NewestUpperBound)
	require.Contains(t, res.Created, "idempotency_key_archive_0001_03", "the year-1 backlog month")
	require.ElementsMatch(t, []string{"idempotency_key_archive_2026_06", "idempotency_key_archive_2026_07", "idempotency_key_archive_2026_08",
		"idempotency_key_archive_2026_09", "idempotency_key_archive_2026_10"}, res.Retired)
	require.Equal(t, rows-10, rowsThroughTheParent(t, db))

	// The longest retention keeps every month of this century, and retires
	// year 1's month once its row is gone.
	_, err = db.Pool.Exec(ctx, "DELETE FROM idempotency_keys")
	require.NoError(t, err)
	res, err = newManager(t, db.Pool, partition.Config{Now: at(decNow), LeadMonths: partition.MaxLeadMonths, RetentionMonths: partition.MaxRetentionMonths}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_0001_03"}, res.Retired)
	require.Equal(t, rows-10, rowsThroughTheParent(t, db))
}
