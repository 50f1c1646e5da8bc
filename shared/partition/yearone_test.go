package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A hand-made partition for rows before year 1 (FROM MINVALUE TO
// '0001-01-01 00:00:00+00') holds nothing of any month the manager makes.
// Its upper bound, the zero time, was read as none: the partition seemed
// to cover every month, and no month could be created, by a run or by the
// sweeper. It is now a bound this package does not read, kept and reported.
func TestAPartitionEndingAtYearOneBlocksNoMonth(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `CREATE TABLE bc_rows PARTITION OF idempotency_key_archive FOR VALUES FROM (MINVALUE) TO ('0001-01-01 00:00:00+00')`)
	require.NoError(t, err)
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	// The sweeper's path for a month it meets without a partition.
	ddl, ensureErr := m.EnsureMonth(ctx, jan)
	t.Logf("EnsureMonth(2027-01): ddl=%d err=%v", len(ddl), ensureErr)
	res, err := m.Run(ctx, false)
	t.Logf("created=%v failed=%v foreign=%v", res.Created, res.Failed, res.Foreign)
	require.NoError(t, ensureErr, "the sweeper could not create a month")
	require.NoError(t, err)
	require.Contains(t, res.Created, partition.Name(dec))
}

// The manager's own partition for January of year 1 (made for a backlog
// row, FROM MINVALUE, as the zero time is also "no lower bound") is its
// month: the next run does not report it as a foreign partition to move
// rows out of and detach.
func TestTheManagersJanuaryOfYearOneIsItsMonth(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:year-one-jan", Status: 201, ExpiresAt: time.Date(1, time.January, 15, 0, 0, 0, 0, time.UTC)})
	m := newManager(t, db.Pool, partition.Config{Now: at(decNow)})
	res, err := m.Run(ctx, false)
	require.NoError(t, err)
	require.Contains(t, res.Created, "idempotency_key_archive_0001_01")
	res, err = m.Run(ctx, false)
	require.NoError(t, err)
	t.Logf("foreign=%v", res.Foreign)
	require.Empty(t, res.Foreign, "the manager's own month reported as not one UTC month")
}
