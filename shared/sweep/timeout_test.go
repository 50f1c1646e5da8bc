package sweep_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/schema"
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

// A run whose batches all ran past the statement timeout before its
// deadline came started batches: its error says they were slow, not that
// the invocation was too short for the margin.
func TestTimeoutsThenTheDeadlineSayTheBatchesWereSlow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slowRows(t, b, "dl", 20, 100*time.Millisecond) // 64, 16 and 4 rows: all past 300 ms
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64, StatementTimeout: 300 * time.Millisecond, DeadlineMargin: 350 * time.Millisecond}, nil, nil).Run(ctx)
	var de *sweep.DeadlineError
	require.ErrorAs(t, err, &de)
	require.Positive(t, res.BatchTimeouts)
	require.Equal(t, res.BatchTimeouts, de.AfterTimeouts)
	require.ErrorContains(t, err, "batches ran past the statement timeout")
	require.NotContains(t, err.Error(), "started no batch")
}

// MaxDuration bounds a run whose batches all time out, and the run, which
// moved nothing, fails saying why.
func TestMaxDurationBoundsARunOfTimeouts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slowRows(t, b, "md", 20, 100*time.Millisecond)
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64, StatementTimeout: 300 * time.Millisecond, MaxDuration: 200 * time.Millisecond}, nil, nil).Run(context.Background())
	require.ErrorContains(t, err, "sweep moved nothing: 1 batches ran past the statement timeout (the last cut to 16 rows) before the run's max duration of 200ms ended it, and 20 expired rows wait")
	require.Equal(t, sweep.StoppedMaxDuration, res.Stopped)
	require.Equal(t, 1, res.BatchTimeouts)
	require.Less(t, res.BatchMaxMS, int64(300), "no batch moved rows: a timed-out attempt is no batch's time")

	// A run that moved rows after a timeout succeeds, and its longest
	// batch is a batch's own time, not the timeouts before it.
	// (A timeout of 600 ms: 4 rows of 50 ms fit in it with room for a
	// loaded machine, which once took 4 rows past 300 ms.)
	slowRows(t, b, "md2", 0, 50*time.Millisecond) // 16 rows take 800 ms, 4 take 200
	res, err = newSweeper(t, b.sweeper, sweep.Config{BatchSize: 16, StatementTimeout: 600 * time.Millisecond}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.BatchTimeouts)
	require.EqualValues(t, 20, res.Moved)
	require.Equal(t, 4, res.BatchSize)
	require.Less(t, res.BatchMaxMS, int64(800), "4 rows of 50 ms, without the 600 ms timeout before")
}

// An operator's pg_cancel_backend of a batch (SQLSTATE 57014, as a
// statement timeout says) long before the statement timeout fails the run,
// as it did before batches shrank, and leaves later runs their size.
func TestAnOperatorsCancelIsNoStatementTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slowRows(t, b, "cancel", 10, 150*time.Millisecond) // 1.5 s a batch, the timeout 20 s
	app := "sweep-cancel-" + b.db.Schema
	pool := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("application_name", app))
	canceled := make(chan struct{})
	go func() {
		defer close(canceled)
		for range 500 {
			time.Sleep(20 * time.Millisecond)
			var n int
			if err := b.db.Pool.QueryRow(context.Background(), `
				SELECT count(*)::int FROM (SELECT pg_cancel_backend(pid) FROM pg_stat_activity
				 WHERE application_name = $1 AND state = 'active' AND wait_event = 'PgSleep') c`, app).Scan(&n); err == nil && n > 0 {
				return
			}
		}
	}()
	memory := new(sweep.BatchMemory)
	cfg := sweep.Config{BatchSize: 16, StatementTimeout: 20 * time.Second, Batches: memory}
	res, err := newSweeper(t, pool, cfg, nil, nil).Run(context.Background())
	<-canceled
	require.Error(t, err)
	require.NotContains(t, err.Error(), "statement timeout")
	require.Zero(t, res.BatchTimeouts)
	require.Zero(t, res.Moved)

	next, err := newSweeper(t, pool, cfg, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 16, next.BatchSize)
	require.EqualValues(t, 10, next.Moved)
}

// The lock timeout must be shorter than the statement timeout: a batch
// waiting on a lock ends on the lock timeout, never taken for slow rows.
func TestALockWaitIsNoSlowBatch(t *testing.T) {
	t.Parallel()
	_, err := sweep.New(nil, sweep.Config{LockTimeout: 5 * time.Second, StatementTimeout: 300 * time.Millisecond}, nil, nil)
	var ce *sweep.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "LockTimeout", ce.Field)
	require.ErrorContains(t, err, "must be shorter than the statement timeout")

	b := setup(t)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:lockwait", Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	ctx := context.Background()
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "LOCK TABLE idempotency_key_archive IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	memory := new(sweep.BatchMemory)
	// The default lock timeout is half the statement timeout.
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64, StatementTimeout: 300 * time.Millisecond, Batches: memory}, nil, nil).Run(ctx)
	require.ErrorContains(t, err, "lock timeout")
	require.Zero(t, res.BatchTimeouts)
	require.NoError(t, holder.Rollback(ctx))
	res, err = newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64, Batches: memory}, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 64, res.BatchSize)
	require.EqualValues(t, 1, res.Moved)
}

// A run with a small batch size of its own that timed out leaves the next
// runs their own size cut as often, not its size.
func TestTheMemoryKeepsCutsNotASize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slowRows(t, b, "cuts", 8, 100*time.Millisecond) // 8 rows: 800 ms
	memory := new(sweep.BatchMemory)
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 8, StatementTimeout: 300 * time.Millisecond, Batches: memory}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.BatchTimeouts)
	require.Equal(t, 2, res.BatchSize)
	slowRows(t, b, "cuts-later", 2, time.Millisecond)
	res, err = newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64, Batches: memory}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 16, res.BatchSize, "64 cut once")
}

// The pause ratio's base is the time worked since the last pause: attempts
// that ran past the statement timeout, the database's busiest moments, are
// in it, though a batch's own time (Progress.Took) leaves them out. So the
// sweeper does not work most of the time exactly when batches time out.
func TestThePauseAfterTimedOutAttemptsCountsThem(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 64 rows take 600 ms and 16 take 480 ms: both past 300 ms. 4 take 120 ms.
	slowRows(t, b, "busy", 20, 30*time.Millisecond)
	const timeout = 300 * time.Millisecond
	var took []time.Duration
	s := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 64, StatementTimeout: timeout, PauseRatio: 3,
		OnBatch: func(p sweep.Progress) { took = append(took, p.Took) }}, nil, nil)
	var slept []time.Duration
	s.SetSleep(func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil })
	res, err := s.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2, res.BatchTimeouts)
	require.EqualValues(t, 20, res.Moved)
	require.NotEmpty(t, slept)
	require.Less(t, took[0], timeout, "the first batch's own time leaves out the attempts before it")
	// Two attempts of at least the statement timeout each, then the batch,
	// times 3, less the jitter's quarter.
	require.GreaterOrEqual(t, slept[0], time.Duration(0.75*3*float64(2*timeout+took[0])),
		"the first pause (%s) left out the timed-out attempts", slept[0])
	// The later pauses do not count those attempts again.
	for i := 1; i < len(slept); i++ {
		require.Less(t, slept[i], time.Duration(0.75*3*float64(2*timeout)), "pause %d after a batch of %s", i, took[i])
	}
}
