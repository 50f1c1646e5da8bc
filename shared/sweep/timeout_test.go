package sweep_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// slowRows inserts n expired completed keys, each of which takes perRow to
// delete (a row trigger that sleeps, standing in for a response of many
// megabytes), in the order they expire.
func slowRows(t *testing.T, b bundle, prefix string, n int, perRow time.Duration) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), fmt.Sprintf(`
		CREATE OR REPLACE FUNCTION slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(%f); RETURN OLD; END $$;
		CREATE OR REPLACE TRIGGER slow_delete BEFORE DELETE ON idempotency_keys FOR EACH ROW EXECUTE FUNCTION slow_delete()`,
		perRow.Seconds()))
	require.NoError(t, err)
	past := time.Now().Add(-2 * time.Hour)
	for i := range n {
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("idem:v1:%s-%03d", prefix, i), Status: 201,
			Response: map[string]any{"id": "ch"}, ExpiresAt: past.Add(time.Duration(i) * time.Second)})
	}
}

// A batch that runs past the statement timeout moves nothing and is tried
// again at a quarter of its size until batches fit; every row is archived,
// once, and the next run of a Sweeper sharing the memory starts at the
// smaller size without timing out again.
func TestABatchPastItsStatementTimeoutIsTriedAgainSmaller(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	// 64 rows take 1.9 s, 16 take 480 ms: both past 300 ms. 4 take 120 ms.
	slowRows(t, b, "slow", 40, 30*time.Millisecond)
	memory := new(sweep.BatchMemory)
	cfg := sweep.Config{BatchSize: 64, StatementTimeout: 300 * time.Millisecond, Batches: memory}
	res, err := newSweeper(t, b.sweeper, cfg, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.BatchTimeouts)
	require.Equal(t, 4, res.BatchSize)
	require.True(t, res.Drained)
	require.EqualValues(t, 40, res.Moved)
	require.EqualValues(t, 40, res.Archived)
	require.EqualValues(t, 40, dbtest.Count(t, b.db.Pool, "SELECT count(DISTINCT scoped_key) FROM idempotency_key_archive"))
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))

	slowRows(t, b, "later", 8, 30*time.Millisecond)
	res, err = newSweeper(t, b.sweeper, cfg, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Zero(t, res.BatchTimeouts, "started at the remembered size")
	require.Equal(t, 4, res.BatchSize)
	require.EqualValues(t, 8, res.Moved)

	// A Sweeper of its own starts at its configured size.
	slowRows(t, b, "fresh", 4, time.Millisecond)
	res, err = newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64}, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 64, res.BatchSize)
	require.EqualValues(t, 4, res.Moved)
}

// A row that alone takes longer than the statement timeout stops the run
// with an error that says so, once batches are down to one row; nothing is
// lost: every row stays live, none is archived.
func TestARowPastTheStatementTimeoutFailsTheRunLoudly(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slowRows(t, b, "stuck", 3, 2*time.Second)
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 16, StatementTimeout: 200 * time.Millisecond}, nil, nil).Run(context.Background())
	require.ErrorContains(t, err, "a batch of one row ran past the statement timeout (200ms)")
	require.ErrorContains(t, err, "SWEEP_STATEMENT_TIMEOUT")
	require.Equal(t, 2, res.BatchTimeouts, "16, 4, then 1")
	require.Equal(t, 1, res.BatchSize)
	require.Zero(t, res.Moved)
	require.EqualValues(t, 3, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}
