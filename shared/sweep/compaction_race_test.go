package sweep_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A batch that fails as a compaction's index swap makes it fail (XX000
// "invalid arbiter index list", injected here by a trigger on the archive)
// moved nothing and runs again, up to 5 times in a row; a sixth fails the
// run, and the rows stay live for the next.
func TestABatchThatMeetsAnIndexSwapRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	failFirst := func(n int) { swapFaults(t, b, n) }
	expired := time.Now().Add(-time.Hour)
	s := newSweeper(t, b.sweeper, sweep.Config{}, b.parts, nil)

	// Two attempts in a row meet the swap: the third moves the row.
	failFirst(2)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:swapped", Status: 201, ExpiresAt: expired})
	res, err := s.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.IndexSwapRetries)
	require.EqualValues(t, 1, res.Moved)
	require.Equal(t, 1, res.Batches)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:swapped'"))

	// The waits are not cut at MaxDuration (which stops a run only after a
	// batch: the attempts left would run back to back into the same swap).
	failFirst(2)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:swapped-short", Status: 201, ExpiresAt: expired})
	res, err = newSweeper(t, b.sweeper, sweep.Config{MaxDuration: time.Millisecond}, b.parts, nil).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.IndexSwapRetries)
	require.EqualValues(t, 1, res.Moved)
	require.GreaterOrEqual(t, res.DurationMS, int64(300), "the waits (100 and 200 ms) ran in full")

	// Nor does the pause ratio count them as work.
	failFirst(2)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:swapped-1", Status: 201, ExpiresAt: expired},
		dbtest.LiveRow{Key: "idem:v1:swapped-2", Status: 201, ExpiresAt: expired})
	ratio := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 1, Pause: time.Millisecond, PauseRatio: 10}, b.parts, nil)
	var pauses []time.Duration
	ratio.SetSleep(func(_ context.Context, d time.Duration) error { pauses = append(pauses, d); return nil })
	res, err = ratio.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, res.IndexSwapRetries)
	require.EqualValues(t, 2, res.Moved)
	require.NotEmpty(t, pauses)
	// 1 ms + 10 × the first batch's own work, jittered by 25%, where the
	// 300 ms of waits would make it 2.25 s or more: a batch of a row takes
	// milliseconds.
	require.Less(t, pauses[0], 2*time.Second, "the pause counted the waits as work")

	// Six in a row: the run fails with PostgreSQL's error, and the row waits.
	failFirst(6)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:still-swapped", Status: 201, ExpiresAt: expired})
	res, err = s.Run(ctx)
	require.ErrorContains(t, err, "invalid arbiter index list")
	require.Equal(t, 5, res.IndexSwapRetries)
	require.Zero(t, res.Moved)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = 'idem:v1:still-swapped'"))

	// Another error of the same code is no swap: it fails the run at once.
	_, err = b.db.Pool.Exec(ctx, `CREATE OR REPLACE FUNCTION swap_fault() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'something else broke' USING ERRCODE = 'internal_error'; END $$`)
	require.NoError(t, err)
	res, err = s.Run(ctx)
	require.ErrorContains(t, err, "something else broke")
	require.Zero(t, res.IndexSwapRetries)

	_, err = b.db.Pool.Exec(ctx, "DROP TRIGGER swap_fault ON idempotency_key_archive")
	require.NoError(t, err)
	res, err = s.Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Moved)
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
}

// swapFaults makes the first n inserts into the archive fail as a
// compaction's index swap makes them fail (XX000 "invalid arbiter index
// list").
func swapFaults(t *testing.T, b bundle, n int) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), fmt.Sprintf(`
		DROP SEQUENCE IF EXISTS swap_faults;
		CREATE SEQUENCE swap_faults;
		CREATE OR REPLACE FUNCTION swap_fault() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
		BEGIN
			IF nextval('swap_faults') <= %d THEN
				RAISE EXCEPTION 'invalid arbiter index list' USING ERRCODE = 'internal_error';
			END IF;
			RETURN NEW;
		END $$;
		CREATE OR REPLACE TRIGGER swap_fault BEFORE INSERT ON idempotency_key_archive FOR EACH ROW EXECUTE FUNCTION swap_fault();`, n))
	require.NoError(t, err)
}

// A run whose deadline comes while it waits for an index swap to end says
// so: it started batches, which met the swap, and it was not too short to
// start one.
func TestADeadlineWhileWaitingForAnIndexSwapSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	swapFaults(t, b, 6)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:swapped", Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res, err := newSweeper(t, b.sweeper, sweep.Config{DeadlineMargin: 2200 * time.Millisecond}, b.parts, nil).Run(ctx)
	var noBatch *sweep.DeadlineError
	require.ErrorAs(t, err, &noBatch)
	require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	require.Positive(t, res.IndexSwapRetries)
	require.Less(t, res.IndexSwapRetries, 6)
	require.Equal(t, res.IndexSwapRetries, noBatch.AfterIndexSwaps)
	require.ErrorContains(t, err, "batches met a compaction's index swap")
	require.NotContains(t, err.Error(), "started no batch")
	require.EqualValues(t, 1, res.Backlog)
}

// The partition manager compacts a closed month by rebuilding its primary
// key with REINDEX INDEX CONCURRENTLY. While the rebuilt copy is swapped
// in, an INSERT ... ON CONFLICT routed to that month fails (XX000 "invalid
// arbiter index list"), whether or not its rows conflict. The sweeper
// inserts so for an hour after it met a conflict, which is when it clears
// an old backlog (rows restored into the live table) into closed months: a
// batch that meets the swap runs again, no run fails, and every row ends
// up archived once.
func TestSweepsGoOnWhileACompactionRebuildsTheMonthsIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	month := partition.MonthStart(time.Now()).AddDate(0, -3, 0)
	expiry := month.Add(36 * time.Hour)
	conflicts := new(sweep.ConflictMemory)
	// GIVEN a restored row whose archive row exists: the first run meets
	// the conflict, and the sweeper inserts with ON CONFLICT from then on
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:restored", Status: 201, CreatedAt: expiry.Add(-time.Hour), ExpiresAt: expiry})
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:restored", Status: 201, CreatedAt: expiry.Add(-time.Hour), ExpiredAt: expiry})
	// (a row a batch: many inserts, many chances to meet the swap)
	s := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 1, Conflicts: conflicts}, b.parts, nil)
	res, err := s.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, res.ConflictRetries)

	// AND a compaction rebuilding that month's primary key again and again
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		index := pgx.Identifier{partition.Name(month) + "_pkey"}.Sanitize()
		for !stop.Load() {
			_, err := b.db.Pool.Exec(ctx, "REINDEX INDEX CONCURRENTLY "+index)
			if err != nil && !stop.Load() {
				t.Errorf("rebuild %s: %v", index, err)
				return
			}
		}
	}()
	defer func() { stop.Store(true); wg.Wait() }()

	// WHEN old rows keep arriving for that month and sweeps move them, until
	// a batch has met the swap (within seconds on an idle machine; on a
	// loaded one the test may end first, having proved only that no run
	// failed: TestABatchThatMeetsAnIndexSwapRunsAgain proves the retry)
	inserted, swaps := 0, 0
	for end := time.Now().Add(20 * time.Second); swaps == 0 && time.Now().Before(end); {
		rows := make([]dbtest.LiveRow, 20)
		for j := range rows {
			rows[j] = dbtest.LiveRow{Key: fmt.Sprintf("idem:v1:late-%d", inserted+j), Status: 201, CreatedAt: expiry.Add(-time.Hour), ExpiresAt: expiry.Add(time.Duration(j) * time.Second)}
		}
		dbtest.InsertLive(t, b.db.Pool, rows...)
		inserted += len(rows)
		// THEN no run fails
		res, err := s.Run(ctx)
		require.NoError(t, err, "a sweep failed while the month's index was rebuilt (after %d rows)", inserted)
		require.EqualValues(t, len(rows), res.Moved)
		swaps += res.IndexSwapRetries
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d rows swept, %d batches met the index swap", inserted, swaps)

	// AND every row is archived, once
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, inserted+1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}
