package sweep_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// A batch whose backend is terminated while it runs fails the run: a sweeper
// that took the lost connection for an empty batch would report "drained"
// with every row still live. The fault lands deterministically: the batch is
// held on a lock, seen waiting in pg_stat_activity, and only then
// terminated.
func TestABatchWhoseBackendIsKilledFailsTheRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const total = 50
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, expires_at, created_at)
		SELECT 'idem:v1:h' || i, sha256(i::text::bytea), 'completed', 201, now() - interval '1 hour', now() - interval '2 days'
		  FROM generate_series(1, $1) AS i`, total)
	require.NoError(t, err)
	victims := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("application_name", "sweeper-held-batch"))

	// GIVEN the archive locked against inserts, so the batch waits inside
	// its statement
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "LOCK TABLE idempotency_key_archive IN SHARE MODE")
	require.NoError(t, err)

	type outcome struct {
		res sweep.Result
		err error
	}
	done := make(chan outcome, 1)
	s := newSweeper(t, victims, sweep.Config{BatchSize: 1000, LockTimeout: 29 * time.Second}, nil, nil)
	go func() {
		res, err := s.Run(ctx)
		done <- outcome{res, err}
	}()
	// WHEN its backend is terminated while it waits
	var pid int32
	require.Eventually(t, func() bool {
		return b.db.Pool.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = 'sweeper-held-batch'
			AND state = 'active' AND wait_event_type = 'Lock'`).Scan(&pid) == nil
	}, 30*time.Second, 5*time.Millisecond, "the batch never waited on the lock")
	var terminated bool
	require.NoError(t, b.db.Pool.QueryRow(ctx, "SELECT pg_terminate_backend($1)", pid).Scan(&terminated))
	require.True(t, terminated, "the fault was not injected")
	require.NoError(t, holder.Rollback(ctx))

	// THEN the run fails, says which batch, and moved nothing
	o := <-done
	require.ErrorContains(t, o.err, "sweep batch 1:", "a run whose batch was killed reported success: %+v", o.res)
	require.False(t, o.res.Drained, "a run whose batch was killed reported drained")
	require.Zero(t, o.res.Moved)
	require.EqualValues(t, total, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"), "the killed batch rolled back whole")
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

// Faults mid-batch, under live traffic: while writers register keys that
// expire within milliseconds and complete most of them, four sweepers drain
// a backlog and the traffic, and their backends are terminated
// (pg_terminate_backend, what a failover, a dropped connection or an
// operator's kill does) again and again, both mid-statement and between the
// batch statement and its COMMIT. A batch is one transaction, so every cut
// batch rolls back whole: no key is ever in the live table and the archive
// at once (checked while it all runs, not only at the end), the sweepers
// still drain before the deadline, and afterwards every key is in the
// archive exactly once, with the status its completion gave it.
func TestSweepersWhoseBackendsAreKilledLoseNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const backlog, writers, keysPerWriter, sweepers = 4000, 4, 500, 4
	// The deadline is a bound on liveness, far above a run's seconds.
	runCtx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()

	// GIVEN an expired backlog
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, expires_at, created_at)
		SELECT 'idem:v1:f' || i, sha256(i::text::bytea), 'completed', 201, jsonb_build_object('id', 'idem:v1:f' || i),
		       now() - interval '1 hour' - i * interval '1 millisecond', now() - interval '2 days'
		  FROM generate_series(1, $1) AS i`, backlog)
	require.NoError(t, err)
	// The sweepers' connections are tagged, so the killer finds them.
	victims := b.db.NewPool(t, dbtest.AsRole(schema.SweeperRole), dbtest.WithParam("application_name", "sweeper-under-fire"))

	// AND live traffic
	var completed sync.Map // key -> status, for completions that found the row
	for i := range backlog {
		key := fmt.Sprintf("idem:v1:f%d", i+1)
		completed.Store(key, 201)
	}
	var trafficDone atomic.Bool
	traffic := liveTraffic(ctx, t, b.db.Pool, writers, keysPerWriter, 20, 11, "idem:v1:t", &completed)
	go func() { traffic.Wait(); trafficDone.Store(true) }()

	// AND a killer and a monitor
	bgCtx, stopBackground := context.WithCancel(ctx)
	var bg sync.WaitGroup
	var killed, sightings atomic.Int64
	var sighted atomic.Value // a key seen in both tables
	bg.Add(2)
	go func() {
		defer bg.Done()
		// The faults end after killBudget terminations: on a loaded machine
		// every batch can outlast the killer's rounds, and a killer without
		// end then killed every run (20,598 of them) until the deadline. The
		// sweepers must still drain afterwards, without a batch lost.
		const killBudget = 150
		for bgCtx.Err() == nil && killed.Load() < killBudget {
			// Only transactions that have written (a batch claims rows, so
			// it has an xid): mid-statement, or between statement and
			// COMMIT. Counted only when the termination was signalled.
			// A backend younger than 300 ms is spared: a new connection's
			// first batch plans its statement and loads the partitions'
			// catalog entries, which on a loaded machine outlasts the
			// killer's 4-20 ms rounds, and killing it every time replaced
			// it with another new connection, forever (the sweepers made
			// no progress at all, which is not the fault this test is
			// about).
			var n int64
			_ = b.db.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE application_name = 'sweeper-under-fire' AND state IN ('active', 'idle in transaction')
				  AND backend_xid IS NOT NULL AND pid <> pg_backend_pid()
				  AND backend_start < now() - interval '300 milliseconds'`).Scan(&n)
			killed.Add(n)
			time.Sleep(time.Duration(4+rand.IntN(16)) * time.Millisecond)
		}
	}()
	go func() {
		defer bg.Done()
		for bgCtx.Err() == nil {
			var key string
			// One statement, one snapshot: a key in both is a key that was
			// committed into the archive without leaving the live table in
			// the same transaction, even if a later batch heals it.
			if err := b.db.Pool.QueryRow(ctx, `SELECT scoped_key FROM idempotency_keys k JOIN idempotency_key_archive a USING (scoped_key) LIMIT 1`).Scan(&key); err == nil {
				sightings.Add(1)
				sighted.Store(key)
			}
			time.Sleep(time.Millisecond)
		}
	}()

	// WHEN four sweepers run until, after the traffic, one of their runs
	// drains and finds no backlog
	var sweeps sync.WaitGroup
	var failures, runs atomic.Int64
	for range sweepers {
		sweeps.Add(1)
		go func() {
			defer sweeps.Done()
			s := newSweeper(t, victims, sweep.Config{BatchSize: 20, Pause: time.Millisecond}, nil, nil)
			for runCtx.Err() == nil {
				after := trafficDone.Load()
				res, err := s.Run(runCtx)
				runs.Add(1)
				if err != nil {
					failures.Add(1) // a killed batch: run again, as the next schedule would
					continue
				}
				if after && res.Drained && res.Backlog == 0 {
					return
				}
			}
		}()
	}
	traffic.Wait()
	sweeps.Wait()
	stopBackground()
	bg.Wait()
	t.Logf("terminated in a writing transaction: %d, runs: %d, failed: %d, key-in-both sightings: %d", killed.Load(), runs.Load(), failures.Load(), sightings.Load())

	// THEN faults landed and failed runs, no key was ever in both tables,
	// and the sweepers drained in time
	require.NoError(t, runCtx.Err(), "the sweepers did not drain before the deadline")
	require.Positive(t, killed.Load(), "no batch was killed: the test proved nothing")
	require.Positive(t, failures.Load(), "batches were killed but no run failed: the errors were swallowed")
	require.Zero(t, sightings.Load(), "a key was in the live table and the archive at once (%v)", sighted.Load())

	// AND nothing was left to a sweep nobody interrupts
	res, err := newSweeper(t, b.sweeper, sweep.Config{}, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Zero(t, res.Moved, "the sweepers reported drained with rows left")
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	total := int64(backlog + writers*keysPerWriter)
	require.EqualValues(t, total, dbtest.Count(t, b.db.Pool, "SELECT count(DISTINCT scoped_key) FROM idempotency_key_archive"), "none lost")
	require.EqualValues(t, total, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"), "none twice")
	rows, err := b.db.Pool.Query(ctx, "SELECT scoped_key, status_code, resource_id FROM idempotency_key_archive")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var key string
		var status int16
		var rid *string
		require.NoError(t, rows.Scan(&key, &status, &rid))
		if want, ok := completed.Load(key); ok {
			require.EqualValues(t, want, status, "%s completed before it was archived", key)
			require.Equal(t, &key, rid, "%s archived whole", key)
		} else {
			require.Zero(t, status, "%s was archived in flight", key)
		}
	}
	require.NoError(t, rows.Err())
}

// A DETACH ... CONCURRENTLY of a month that was interrupted (a partition
// run killed, or its statement timed out, while it waited for an old
// snapshot) leaves the month detach-pending: new queries no longer route
// its rows there, so a batch of that month finds no partition. No row is
// lost: the sweeper that may not create partitions stops naming the month,
// with every row still live, and the one that may re-attaches the month and
// archives them, visible through the archive again.
func TestSweepingBesideAnInterruptedDetach(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	prev := partition.MonthStart(time.Now()).AddDate(0, -1, 0)
	name := partition.Name(prev)
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, expires_at, created_at)
		SELECT 'idem:v1:d' || i, sha256(i::text::bytea), 'completed', 201, $1::timestamptz + i * interval '1 second', $1::timestamptz - interval '1 day'
		  FROM generate_series(1, 100) AS i`, prev)
	require.NoError(t, err)

	// GIVEN last month's DETACH CONCURRENTLY cut short while an old
	// snapshot held it in its wait
	reader, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = reader.Exec(ctx, "SELECT count(*) FROM idempotency_key_archive")
	require.NoError(t, err)
	conn, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SET statement_timeout = '1s'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION "+pgx.Identifier{name}.Sanitize()+" CONCURRENTLY")
	require.ErrorContains(t, err, "statement timeout")
	_, err = conn.Exec(ctx, "RESET statement_timeout")
	require.NoError(t, err)
	conn.Release()
	require.NoError(t, reader.Rollback(ctx))
	pending := "SELECT count(*) FROM pg_inherits WHERE inhdetachpending AND inhrelid = to_regclass('" + name + "')"
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, pending), "the detach is not pending")

	// WHEN a sweeper that may not create partitions runs
	res, err := newSweeper(t, b.sweeper, sweep.Config{FailOnMissingPartition: true}, b.parts, nil).Run(ctx)
	// THEN it names the month and moves nothing
	var missing *sweep.MissingPartitionError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, []time.Time{prev.UTC()}, missing.Months)
	require.Zero(t, res.Moved)
	require.False(t, res.Drained)
	require.EqualValues(t, 100, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"), "the rows stay live")
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()))

	// WHEN one that may runs
	res, err = newSweeper(t, b.sweeper, sweep.Config{}, b.parts, nil).Run(ctx)
	// THEN the month is attached again and holds every row, once
	require.NoError(t, err)
	require.True(t, res.Drained)
	require.EqualValues(t, 100, res.Moved)
	require.Equal(t, []string{name}, res.PartitionsCreated)
	require.Zero(t, dbtest.Count(t, b.db.Pool, pending), "the month is still detach-pending")
	require.Zero(t, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 100, dbtest.Count(t, b.db.Pool, "SELECT count(DISTINCT scoped_key) FROM idempotency_key_archive"), "archived, and visible through the archive")
	require.EqualValues(t, 100, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()))
}
