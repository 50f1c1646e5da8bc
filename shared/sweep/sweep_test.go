package sweep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

type bundle struct {
	db      *dbtest.DB
	sweeper *pgxpool.Pool // connected as the least-privilege sweeper role
	parts   *partition.Manager
}

// setup gives a migrated schema with partitions from three months back to
// three months ahead, and a pool that runs as idempotency_sweeper.
func setup(t *testing.T) bundle {
	t.Helper()
	db := dbtest.New(t)
	parts := db.Partition(t, 2)
	return bundle{db: db, sweeper: db.NewPool(t, dbtest.AsRole(schema.SweeperRole)), parts: parts}
}

func newSweeper(t *testing.T, pool *pgxpool.Pool, cfg sweep.Config, parts sweep.PartitionEnsurer, m *metrics.Emitter) *sweep.Sweeper {
	t.Helper()
	s, err := sweep.New(pool, cfg, parts, m)
	require.NoError(t, err)
	return s
}

type archived struct {
	Status     int
	ResourceID *string
	CreatedAt  time.Time
	ExpiredAt  time.Time
}

func archiveRow(t *testing.T, pool *pgxpool.Pool, key string) archived {
	t.Helper()
	var a archived
	var status int16
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT status_code, resource_id, created_at, expired_at FROM idempotency_key_archive WHERE scoped_key = $1", key).
		Scan(&status, &a.ResourceID, &a.CreatedAt, &a.ExpiredAt), key)
	a.Status = int(status)
	return a
}

func ptr(s string) *string { return &s }

func TestSweepMovesExpiredRowsAsTheSweeperRole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	// GIVEN expired keys of every kind, and keys still inside their window
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:done", Status: 201, Response: map[string]any{"id": "ch_1", "amount": 4500}, CreatedAt: now.Add(-30 * time.Hour), ExpiresAt: now.Add(-6 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:numeric-id", Status: 200, Response: map[string]any{"id": 42}, ExpiresAt: now.Add(-5 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:no-id", Status: 400, Response: map[string]any{"error": "bad"}, ExpiresAt: now.Add(-4 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:array-body", Status: 200, Response: []int{1, 2}, ExpiresAt: now.Add(-4 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:in-flight", ExpiresAt: now.Add(-3 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:last-month", Status: 201, Response: map[string]any{"id": "ch_old"}, ExpiresAt: now.AddDate(0, -1, 0)},
		dbtest.LiveRow{Key: "idem:v1:fresh", Status: 201, Response: map[string]any{"id": "ch_2"}, ExpiresAt: now.Add(time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:fresh-in-flight", ExpiresAt: now.Add(2 * time.Hour)},
	)
	var buf bytes.Buffer

	// WHEN the sweeper runs with small batches
	s := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 2}, nil, metrics.New(&buf, "Test"))
	res, err := s.Run(context.Background())

	// THEN every expired row moved, nothing else did
	require.NoError(t, err)
	require.Equal(t, int64(6), res.Moved)
	require.Equal(t, int64(6), res.Archived)
	require.Equal(t, 4, res.Batches) // 2+2+2, then an empty batch proves drained
	require.True(t, res.Drained)
	require.Equal(t, sweep.StoppedDrained, res.Stopped)
	require.Zero(t, res.Backlog)
	require.EqualValues(t, 2, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys WHERE expires_at < now()"))

	done := archiveRow(t, b.db.Pool, "idem:v1:done")
	require.Equal(t, archived{201, ptr("ch_1"), now.Add(-30 * time.Hour), now.Add(-6 * time.Hour)}, archived{done.Status, done.ResourceID, done.CreatedAt.UTC(), done.ExpiredAt.UTC()})
	require.Nil(t, archiveRow(t, b.db.Pool, "idem:v1:numeric-id").ResourceID, "a non-string id is NULL")
	require.Nil(t, archiveRow(t, b.db.Pool, "idem:v1:no-id").ResourceID)
	require.Nil(t, archiveRow(t, b.db.Pool, "idem:v1:array-body").ResourceID)
	inFlight := archiveRow(t, b.db.Pool, "idem:v1:in-flight")
	require.Equal(t, 0, inFlight.Status, "a key that expired in flight is archived with status 0")
	require.Nil(t, inFlight.ResourceID)
	require.Equal(t, ptr("ch_old"), archiveRow(t, b.db.Pool, "idem:v1:last-month").ResourceID)

	// AND the metrics line carries the runbook's names
	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.EqualValues(t, 6, line[metrics.ArchivedTotal])
	require.EqualValues(t, 0, line[metrics.ExpiredBacklog])
}

func TestResourceIDPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := time.Now().Add(-time.Hour)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "nested", Status: 201, Response: map[string]any{"data": map[string]any{"id": "re_9"}}, ExpiresAt: past},
		dbtest.LiveRow{Key: "top-level-only", Status: 201, Response: map[string]any{"id": "ch_top"}, ExpiresAt: past},
	)
	_, err := newSweeper(t, b.sweeper, sweep.Config{ResourceIDPath: "data.id"}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, ptr("re_9"), archiveRow(t, b.db.Pool, "nested").ResourceID)
	require.Nil(t, archiveRow(t, b.db.Pool, "top-level-only").ResourceID)
}

// The runbook's DELETE ... USING archived never deletes a live row whose
// archive row already exists, so it would be selected again by every batch.
func TestRowAlreadyArchivedStillLeavesTheLiveTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	// GIVEN expired live rows whose archive rows were already written (as the
	// Redis live store does at completion)
	for i := range 5 {
		key := fmt.Sprintf("idem:v1:dup-%d", i)
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: key, Status: 201, Response: map[string]any{"id": "ch_live"}, ExpiresAt: past})
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ResourceID: ptr("ch_archived"), ExpiredAt: past})
	}
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:new", Status: 201, ExpiresAt: past})

	// WHEN the sweeper runs with batches smaller than the duplicates
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 2}, nil, nil).Run(context.Background())

	// THEN it drains: every live row is gone, each key archived exactly once
	require.NoError(t, err)
	require.True(t, res.Drained)
	require.Equal(t, int64(6), res.Moved)
	require.Equal(t, int64(1), res.Archived)
	require.Zero(t, res.Backlog)
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 6, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.Equal(t, ptr("ch_archived"), archiveRow(t, b.db.Pool, "idem:v1:dup-0").ResourceID, "the first archive row wins")
}

// Batches insert without ON CONFLICT until one meets an archive row that
// exists: that batch moves nothing, runs again with the clause, and so does
// the rest of the run. Rows of the fast batches and of the safe ones alike
// leave the live table with exactly one archive row each.
func TestAConflictLaterInTheRunSwitchesToTheSafeBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := time.Now().UTC().Add(-2 * time.Hour).Truncate(time.Microsecond)
	// GIVEN 6 expired rows, oldest first, whose fifth already has its archive
	// row, and a new row after it
	for i := range 7 {
		key := fmt.Sprintf("idem:v1:k-%d", i)
		at := base.Add(time.Duration(i) * time.Minute)
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: key, Status: 201, Response: map[string]any{"id": "ch_live"}, ExpiresAt: at})
		if i == 4 {
			dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ResourceID: ptr("ch_archived"), ExpiredAt: at})
		}
	}
	var batches []sweep.Progress
	// WHEN the sweeper runs in batches of 2
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 2, OnBatch: func(p sweep.Progress) { batches = append(batches, p) }}, nil, nil).Run(context.Background())

	// THEN two fast batches moved 4 rows, the conflicting batch moved nothing
	// and ran again with the clause, and the last row moved after it
	require.NoError(t, err)
	require.True(t, res.Drained)
	require.Equal(t, int64(7), res.Moved)
	require.Equal(t, int64(6), res.Archived)
	require.Len(t, batches, 4, "the batch that met the conflict is not counted: it moved nothing")
	require.Equal(t, int64(4), batches[1].Moved)
	require.Equal(t, int64(6), batches[2].Moved)
	require.Equal(t, int64(5), batches[2].Archived)
	longest := time.Duration(0)
	for _, p := range batches {
		longest = max(longest, p.Took)
	}
	require.Equal(t, longest.Milliseconds(), res.BatchMaxMS, "the result's longest batch is the longest reported")
	for i, p := range batches {
		require.Positive(t, p.Took, "batch %d", i)
		require.LessOrEqual(t, p.Took, p.Elapsed, "batch %d", i)
		if i > 0 {
			require.LessOrEqual(t, p.Took, p.Elapsed-batches[i-1].Elapsed, "batch %d took longer than the time since the last one", i)
		}
	}
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 7, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.Equal(t, ptr("ch_archived"), archiveRow(t, b.db.Pool, "idem:v1:k-4").ResourceID, "the first archive row wins")
	require.Equal(t, ptr("ch_live"), archiveRow(t, b.db.Pool, "idem:v1:k-5").ResourceID)
	require.Equal(t, 1, res.ConflictRetries)
}

// After a conflict the same Sweeper (a warm Lambda function's) keeps the
// conflict clause for its next runs: a lasting source of conflicts costs one
// wasted batch, not one a run.
func TestAfterAConflictLaterRunsStartSafe(t *testing.T) {
	t.Parallel()
	b := setup(t)
	past := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	s := newSweeper(t, b.sweeper, sweep.Config{}, nil, nil)
	for run := range 3 {
		key := fmt.Sprintf("idem:v1:restored-%d", run)
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: key, Status: 201, ExpiresAt: past})
		dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: past})
		res, err := s.Run(context.Background())
		require.NoError(t, err)
		require.Equal(t, int64(1), res.Moved)
		require.Zero(t, res.Archived)
		require.Equal(t, map[bool]int{true: 1, false: 0}[run == 0], res.ConflictRetries, "run %d", run)
	}
	// A new Sweeper, without a shared ConflictMemory, starts on the fast
	// path again.
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:restored-new", Status: 201, ExpiresAt: past})
	dbtest.InsertArchive(t, b.db.Pool, dbtest.ArchiveRow{Key: "idem:v1:restored-new", Status: 201, ExpiredAt: past})
	res, err := newSweeper(t, b.sweeper, sweep.Config{}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, res.ConflictRetries)
}

// A run whose only batch met a conflict and whose deadline then came
// before the batch could run again moved nothing while rows wait: an error,
// and one that says the batch did start (a plain "started no batch" would
// send an operator to the function's timeout alone).
func TestADeadlineAfterAConflictSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	past := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:held", Status: 201, ExpiresAt: past})
	// GIVEN an archive insert of the same key, uncommitted: the batch's
	// insert waits for it, then conflicts once it commits
	holder, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = holder.Exec(ctx, `INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, created_at, expired_at)
		VALUES ('idem:v1:held', '\x00', 201, $1::timestamptz - interval '1 day', $1)`, past)
	require.NoError(t, err)
	committed := make(chan error, 1)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		committed <- holder.Commit(ctx)
	}()

	// WHEN the deadline margin is crossed while the batch waits
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conflicts := new(sweep.ConflictMemory)
	res, err := newSweeper(t, b.sweeper, sweep.Config{DeadlineMargin: 2 * time.Second, LockTimeout: 5 * time.Second, Conflicts: conflicts}, nil, nil).Run(runCtx)

	// THEN the run stops at the deadline with an error that names the conflict
	require.NoError(t, <-committed)
	var noBatch *sweep.DeadlineError
	require.ErrorAs(t, err, &noBatch)
	require.True(t, noBatch.AfterConflict)
	require.ErrorContains(t, err, "sweep moved nothing: its first batch met an archive row that existed already")
	require.EqualValues(t, 1, noBatch.Backlog)
	require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	require.Zero(t, res.Batches)
	require.Equal(t, 1, res.ConflictRetries)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"), "the row waits for the next run")

	// AND the next run, sharing the memory, moves it without a conflict
	res, err = newSweeper(t, b.sweeper, sweep.Config{Conflicts: conflicts}, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Moved)
	require.Zero(t, res.ConflictRetries)
}

func TestMissingPartition(t *testing.T) {
	t.Parallel()
	old := time.Date(2020, 3, 15, 12, 0, 0, 0, time.UTC)
	seed := func(t *testing.T, b bundle) {
		dbtest.InsertLive(t, b.db.Pool,
			dbtest.LiveRow{Key: "idem:v1:ancient", Status: 201, ExpiresAt: old},
			dbtest.LiveRow{Key: "idem:v1:recent", Status: 201, ExpiresAt: time.Now().Add(-time.Minute)},
		)
	}
	requireMissing := func(t *testing.T, b bundle, err error) {
		t.Helper()
		var missing *sweep.MissingPartitionError
		require.ErrorAs(t, err, &missing)
		require.ErrorContains(t, err, "archive has no partition for 2020-03")
		require.EqualValues(t, 2, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"), "no row may be lost")
		require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	}

	t.Run("fail mode stops with the month named", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		res, err := newSweeper(t, b.db.Pool, sweep.Config{FailOnMissingPartition: true}, b.parts, nil).Run(context.Background())
		requireMissing(t, b, err)
		require.EqualValues(t, 2, res.Backlog)
	})
	t.Run("named under any DateStyle, in the text modes too", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			pool := b.db.NewPool(t, dbtest.WithParam("DateStyle", "SQL, DMY"), dbtest.WithParam("TimeZone", "Pacific/Kiritimati"),
				func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			_, err := newSweeper(t, pool, sweep.Config{FailOnMissingPartition: true}, b.parts, nil).Run(context.Background())
			requireMissing(t, b, err)
		}
	})
	t.Run("sweeper role may not create it and says so", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		rolesParts, err := partition.NewManager(b.sweeper, partition.Config{}, nil)
		require.NoError(t, err)
		_, err = newSweeper(t, b.sweeper, sweep.Config{}, rolesParts, nil).Run(context.Background())
		requireMissing(t, b, err)
		require.ErrorContains(t, err, "permission denied")
	})
	t.Run("owner creates it and retries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		seed(t, b)
		res, err := newSweeper(t, b.db.Pool, sweep.Config{}, b.parts, nil).Run(context.Background())
		require.NoError(t, err)
		require.Equal(t, []string{"idempotency_key_archive_2020_03"}, res.PartitionsCreated)
		require.Equal(t, int64(2), res.Moved)
		require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
		require.Equal(t, 201, archiveRow(t, b.db.Pool, "idem:v1:ancient").Status)
	})
}

// racingEnsurer plays the sweeper that loses a race to create a month: the
// partition appears (another sweeper made it), and this one made nothing.
type racingEnsurer struct{ winner *partition.Manager }

func (r racingEnsurer) EnsureMonth(ctx context.Context, m time.Time) ([]string, error) {
	_, err := r.winner.EnsureMonth(ctx, m)
	return nil, err
}

func TestLosingARaceToCreateAPartitionRetriesTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:ancient", Status: 201, ExpiresAt: time.Date(2020, 3, 15, 12, 0, 0, 0, time.UTC)},
		dbtest.LiveRow{Key: "idem:v1:recent", Status: 201, ExpiresAt: time.Now().Add(-time.Minute)},
	)
	res, err := newSweeper(t, b.db.Pool, sweep.Config{}, racingEnsurer{winner: b.parts}, nil).Run(context.Background())
	require.NoError(t, err, "the loser must retry its batch, not fail")
	require.Empty(t, res.PartitionsCreated, "this sweeper created nothing")
	require.Equal(t, int64(2), res.Moved)
	require.Equal(t, 201, archiveRow(t, b.db.Pool, "idem:v1:ancient").Status)
}

func TestZeroPauseMeansNoPause(t *testing.T) {
	t.Parallel()
	require.Zero(t, sweep.Config{Pause: 0}.WithDefaults().Pause, "an explicit zero pause must not become the default")
	b := setup(t)
	for i := range 30 {
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("z%02d", i), Status: 200, ExpiresAt: time.Now().Add(-time.Hour)})
	}
	s, err := sweep.New(b.db.Pool, sweep.Config{BatchSize: 1, Pause: 0}, nil, nil)
	require.NoError(t, err)
	var sleeps atomic.Int32
	s.SetSleep(func(context.Context, time.Duration) error { sleeps.Add(1); return nil })
	res, err := s.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, int64(30), res.Moved)
	require.Zero(t, sleeps.Load(), "a zero pause slept between batches")

	// The same sweep with a pause sleeps between every full batch.
	for i := range 3 {
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("p%02d", i), Status: 200, ExpiresAt: time.Now().Add(-time.Hour)})
	}
	var batches []sweep.Progress
	s, err = sweep.New(b.db.Pool, sweep.Config{BatchSize: 1, Pause: time.Millisecond, OnBatch: func(p sweep.Progress) { batches = append(batches, p) }}, nil, nil)
	require.NoError(t, err)
	const slept = 50 * time.Millisecond
	s.SetSleep(func(context.Context, time.Duration) error { sleeps.Add(1); time.Sleep(slept); return nil })
	_, err = s.Run(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 3, sleeps.Load())
	// A batch's own time leaves out the pause before it.
	require.Len(t, batches, 4)
	for i := 1; i < len(batches); i++ {
		require.GreaterOrEqual(t, batches[i].Elapsed-batches[i-1].Elapsed-batches[i].Took, slept, "batch %d counts the pause before it", i)
	}
}

// With a pause ratio, each pause grows with the work before it: Pause +
// PauseRatio × the time worked since the last pause, jittered by ±25%, so
// that a sweeper whose batches a loaded database slows yields in
// proportion. Only relations between figures of the same run are checked,
// never a time: the time worked lies between the batch's own (Progress.Took)
// and the span from the end of the last pause to the start of this one.
func TestThePauseRatioScalesEachPauseWithItsBatch(t *testing.T) {
	t.Parallel()
	require.Zero(t, sweep.Config{}.WithDefaults().PauseRatio, "an unset ratio must stay zero: none")
	b := setup(t)
	for _, c := range []struct {
		pause time.Duration
		ratio float64
	}{{0, 3}, {10 * time.Millisecond, 2}, {0, sweep.MaxPauseRatio}} {
		for i := range 4 {
			dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("r%g-%d", c.ratio, i), Status: 200, ExpiresAt: time.Now().Add(-time.Hour)})
		}
		var took []time.Duration
		s, err := sweep.New(b.db.Pool, sweep.Config{BatchSize: 1, Pause: c.pause, PauseRatio: c.ratio,
			OnBatch: func(p sweep.Progress) { took = append(took, p.Took) }}, nil, nil)
		require.NoError(t, err)
		var slept, spans []time.Duration
		last := time.Now()
		s.SetSleep(func(_ context.Context, d time.Duration) error {
			spans = append(spans, time.Since(last))
			slept = append(slept, d)
			last = time.Now()
			return nil
		})
		res, err := s.Run(context.Background())
		require.NoError(t, err)
		require.EqualValues(t, 4, res.Moved)
		require.Len(t, slept, 4, "a pause after every full batch (the fifth finds nothing)")
		for i, d := range slept {
			least := float64(c.pause) + c.ratio*float64(took[i])
			most := float64(c.pause) + c.ratio*float64(spans[i])
			require.GreaterOrEqual(t, float64(d), 0.75*least-1, "pause %d: %s after a batch of %s (pause %s, ratio %g)", i, d, took[i], c.pause, c.ratio)
			require.LessOrEqual(t, float64(d), 1.25*most+1, "pause %d: %s after %s of work (pause %s, ratio %g)", i, d, spans[i], c.pause, c.ratio)
		}
	}
}

func TestStopsBeforeTheDeadlineAndAfterMaxDuration(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 30 {
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("k%02d", i), Status: 200, ExpiresAt: time.Now().Add(-time.Hour)})
	}

	// A deadline closer than the margin: no batch starts.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// While expired rows wait, that is a *DeadlineError, not a quiet success.
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 5, DeadlineMargin: 3 * time.Second}, nil, nil).Run(ctx)
	var noBatch *sweep.DeadlineError
	require.ErrorAs(t, err, &noBatch)
	require.Equal(t, 3*time.Second, noBatch.Margin)
	require.EqualValues(t, 30, noBatch.Backlog)
	require.Less(t, noBatch.Remaining, 3*time.Second)
	require.ErrorContains(t, err, "sweep started no batch")
	require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	require.Zero(t, res.Batches)
	require.EqualValues(t, 30, res.Backlog)

	// MaxDuration: batches until it passes, whole batches only.
	res, err = newSweeper(t, b.sweeper, sweep.Config{BatchSize: 5, Pause: 40 * time.Millisecond, MaxDuration: 60 * time.Millisecond}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.StoppedMaxDuration, res.Stopped)
	require.False(t, res.Drained)
	require.Positive(t, res.Batches)
	require.Equal(t, int64(res.Batches*5), res.Moved)
	require.Equal(t, 30-res.Moved, res.Backlog)

	// With nothing expired, a deadline stop before the first batch is success:
	// there was no work to miss.
	empty := setup(t)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	res, err = newSweeper(t, empty.sweeper, sweep.Config{BatchSize: 5, DeadlineMargin: 3 * time.Second}, nil, nil).Run(ctx2)
	require.NoError(t, err)
	require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	require.Zero(t, res.Backlog)
}

// A pause never sleeps into the deadline or past MaxDuration: it ends when
// the run would stop, and the run says why it stopped.
func TestALongPauseEndsAtTheDeadlineMargin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 30 {
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("k%02d", i), Status: 200, ExpiresAt: time.Now().Add(-time.Hour)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	res, err := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 5, Pause: 10 * time.Minute, DeadlineMargin: time.Second}, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	require.Equal(t, 1, res.Batches)
	require.Less(t, time.Since(start), 2500*time.Millisecond, "woke before the deadline, not at it")

	res, err = newSweeper(t, b.sweeper, sweep.Config{BatchSize: 5, Pause: 10 * time.Minute, MaxDuration: 300 * time.Millisecond}, nil, nil).Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, sweep.StoppedMaxDuration, res.Stopped)
	require.Equal(t, 1, res.Batches)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, cfg := range []sweep.Config{
		{BatchSize: -1},
		{BatchSize: sweep.MaxBatchSize + 1},
		{ResourceIDPath: "data..id"},
		{LockTimeout: -time.Second},
	} {
		_, err := sweep.New(nil, cfg, nil, nil)
		require.Error(t, err, "%+v", cfg)
	}
	// Timeouts PostgreSQL would read as "no timeout" or shorten, and settings
	// no Lambda invocation can honour, are refused naming the field.
	for _, c := range []struct {
		cfg   sweep.Config
		field string
	}{
		{sweep.Config{LockTimeout: 900 * time.Microsecond}, "LockTimeout"},
		{sweep.Config{LockTimeout: 1500 * time.Microsecond}, "LockTimeout"},
		{sweep.Config{StatementTimeout: time.Nanosecond}, "StatementTimeout"},
		{sweep.Config{StatementTimeout: 16 * time.Minute}, "StatementTimeout"},
		{sweep.Config{LockTimeout: sweep.MaxInvocation + time.Millisecond}, "LockTimeout"},
		{sweep.Config{DeadlineMargin: sweep.MaxInvocation}, "DeadlineMargin"},
		{sweep.Config{Pause: -time.Second}, "Pause"},
		{sweep.Config{Pause: sweep.MaxInvocation + 1}, "Pause"},
		{sweep.Config{Pause: 100 * time.Nanosecond}, "Pause"},
		{sweep.Config{Pause: time.Millisecond - 1}, "Pause"},
		{sweep.Config{PauseRatio: -0.5}, "PauseRatio"},
		{sweep.Config{PauseRatio: sweep.MaxPauseRatio + 0.001}, "PauseRatio"},
		{sweep.Config{PauseRatio: math.NaN()}, "PauseRatio"},
		{sweep.Config{PauseRatio: math.Inf(1)}, "PauseRatio"},
		{sweep.Config{PauseRatio: math.Inf(-1)}, "PauseRatio"},
		{sweep.Config{StatementTimeout: 1<<63 - 1}, "StatementTimeout"},
		{sweep.Config{LockTimeout: 30 * time.Second}, "LockTimeout"},
		{sweep.Config{LockTimeout: time.Second, StatementTimeout: time.Second}, "LockTimeout"},
		{sweep.Config{StatementTimeout: time.Millisecond}, "StatementTimeout"},
		{sweep.Config{StatementTimeout: 2 * time.Millisecond, LockTimeout: 2 * time.Millisecond}, "LockTimeout"},
	} {
		_, err := sweep.New(nil, c.cfg, nil, nil)
		var cerr *sweep.ConfigError
		require.ErrorAs(t, err, &cerr, "%+v", c.cfg)
		require.Equal(t, c.field, cerr.Field, "%+v", c.cfg)
	}
	// The error for an out-of-range value with a fraction says the range,
	// not a rounding suggestion out of range itself.
	_, err := sweep.New(nil, sweep.Config{StatementTimeout: 1<<63 - 1}, nil, nil)
	require.ErrorContains(t, err, "must be at most 15m0s")
	// A statement timeout at its limit gets a default margin Validate takes.
	_, err = sweep.New(nil, sweep.Config{StatementTimeout: sweep.MaxInvocation}, nil, nil)
	require.NoError(t, err)
	// The bounds themselves are accepted.
	_, err = sweep.New(nil, sweep.Config{StatementTimeout: sweep.MinStatementTimeout}, nil, nil)
	require.NoError(t, err, "the default lock timeout is under it")
	_, err = sweep.New(nil, sweep.Config{LockTimeout: time.Millisecond, StatementTimeout: sweep.MaxInvocation,
		DeadlineMargin: sweep.MaxInvocation - time.Millisecond}, nil, nil)
	require.NoError(t, err)
}

// Four sweepers run while live traffic registers keys that expire quickly
// and completes some of them. Afterwards every key is in exactly one of the
// live table and the archive, and an archived key's status tells whether its
// completion won the race with expiry.
func TestConcurrentSweepersWithLiveTraffic(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const writers, keysPerWriter, sweepers = 4, 400, 4

	var completed sync.Map // key -> status, for completions that found the row
	traffic := liveTraffic(ctx, t, b.db.Pool, writers, keysPerWriter, 30, 7, "idem:v1:w", &completed)

	var stop atomic.Bool
	var sweeps sync.WaitGroup
	var moved atomic.Int64
	for range sweepers {
		sweeps.Add(1)
		go func() {
			defer sweeps.Done()
			s := newSweeper(t, b.sweeper, sweep.Config{BatchSize: 25, Pause: time.Millisecond}, nil, nil)
			for !stop.Load() {
				res, err := s.Run(ctx)
				if err != nil {
					t.Errorf("sweep: %v", err)
					return
				}
				moved.Add(res.Moved)
			}
		}()
	}
	traffic.Wait()
	time.Sleep(50 * time.Millisecond) // let the last keys expire
	stop.Store(true)
	sweeps.Wait()
	// A final sweep drains what the racing sweepers left.
	res, err := newSweeper(t, b.sweeper, sweep.Config{}, nil, nil).Run(ctx)
	require.NoError(t, err)
	moved.Add(res.Moved)
	require.Zero(t, res.Backlog)

	total := int64(writers * keysPerWriter)
	live := dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys")
	arch := dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive")
	require.Equal(t, total, live+arch, "every key is in exactly one place")
	require.Equal(t, arch, moved.Load(), "each archived row was moved exactly once")
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, `
		SELECT count(*) FROM idempotency_keys k JOIN idempotency_key_archive a USING (scoped_key)`), "no key is in both")
	require.EqualValues(t, total, dbtest.Count(t, b.db.Pool, `
		SELECT count(DISTINCT scoped_key) FROM (SELECT scoped_key FROM idempotency_keys UNION ALL SELECT scoped_key FROM idempotency_key_archive) s`))

	rows, err := b.db.Pool.Query(ctx, "SELECT scoped_key, status_code, resource_id FROM idempotency_key_archive")
	require.NoError(t, err)
	defer rows.Close()
	for rows.Next() {
		var key string
		var status int16
		var rid *string
		require.NoError(t, rows.Scan(&key, &status, &rid))
		want, ok := completed.Load(key)
		if ok {
			require.EqualValues(t, want, status, "%s completed before it was archived", key)
			require.Equal(t, &key, rid)
		} else {
			require.Zero(t, status, "%s was archived in flight", key)
		}
	}
	require.NoError(t, rows.Err())
}

func TestMissingPartitionErrorUnwraps(t *testing.T) {
	t.Parallel()
	cause := errors.New("permission denied for table idempotency_key_archive")
	err := &sweep.MissingPartitionError{Months: []time.Time{time.Date(2020, 3, 1, 0, 0, 0, 0, time.UTC)}, Err: cause}
	require.ErrorIs(t, err, cause)
	require.Contains(t, err.Error(), "2020-03")
}

// A long-running transaction holds back the xmin horizon (a report, a
// forgotten psql session): the dead tuples of every batch stay, yet the
// sweeper keeps moving rows in whole batches, through the index, and drains.
func TestSweepingBesideAnOldSnapshotKeepsProgressing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const total = 20_000
	_, err := b.db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at, created_at)
		SELECT 'idem:v1:x' || i, sha256(i::text::bytea), now() - interval '1 hour' - i * interval '1 millisecond', now() - interval '2 days'
		  FROM generate_series(1, $1) AS i`, total)
	require.NoError(t, err)
	old, err := b.db.Pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer func() { _ = old.Rollback(ctx) }()
	var seen int64
	var pid int32
	require.NoError(t, old.QueryRow(ctx, "SELECT count(*), pg_backend_pid() FROM idempotency_keys").Scan(&seen, &pid))
	require.EqualValues(t, total, seen)
	// horizon is the old transaction's xmin as the server reports it, and
	// how many transaction ids were assigned since (its age): each batch
	// deletes in a transaction of its own, newer than that xmin, so while
	// it stays put no vacuum or pruning may remove what the batches
	// deleted.
	horizon := func() (xmin string, age int64) {
		t.Helper()
		require.NoError(t, b.db.Pool.QueryRow(ctx, `SELECT coalesce(backend_xmin::text, ''), coalesce(age(backend_xmin), 0)
			FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&xmin, &age))
		return xmin, age
	}
	held, start := horizon()
	require.NotEmpty(t, held, "the old transaction holds no snapshot")

	var batches []int64
	var last int64
	cfg := sweep.Config{BatchSize: 1000, OnBatch: func(p sweep.Progress) {
		batches = append(batches, p.Moved-last)
		last = p.Moved
		// Every batch ran behind the same held horizon.
		xmin, age := horizon()
		require.Equal(t, held, xmin, "after batch %d the old snapshot's xmin moved", p.Batches)
		require.GreaterOrEqual(t, age-start, int64(p.Batches), "batch %d did not write behind the old snapshot", p.Batches)
	}}
	res, err := newSweeper(t, b.sweeper, cfg, nil, nil).Run(ctx)
	require.NoError(t, err)
	require.True(t, res.Drained)
	require.EqualValues(t, total, res.Moved)
	for i, n := range batches {
		require.LessOrEqual(t, n, int64(1000), "batch %d moved more than its size", i)
	}
	require.Len(t, batches, total/1000+1, "whole batches, then the short one that drains")
	// A vacuum cannot remove what the horizon protects: the old snapshot
	// still sees every row, nothing it can see was lost.
	_, err = b.db.Pool.Exec(ctx, "VACUUM idempotency_keys")
	require.NoError(t, err)
	require.NoError(t, old.QueryRow(ctx, "SELECT count(*) FROM idempotency_keys").Scan(&seen))
	require.EqualValues(t, total, seen)
	xmin, _ := horizon()
	require.Equal(t, held, xmin)
}

// lostRaces wraps a sweeper's partition manager and counts the months it
// was asked for that it found made already (EnsureMonth made nothing): each
// is a race to create a month that this sweeper lost, after which it must
// run its batch again. The first call waits until first is closed, so that
// at least one race is lost whatever the scheduling.
type lostRaces struct {
	m       *partition.Manager
	entered chan struct{} // closed on the first EnsureMonth
	first   chan struct{} // the first EnsureMonth goes on once closed
	once    *sync.Once
	lost    *atomic.Int64
}

func (r lostRaces) EnsureMonth(ctx context.Context, month time.Time) ([]string, error) {
	waited := false
	r.once.Do(func() {
		close(r.entered)
		<-r.first
		waited = true
	})
	stmts, err := r.m.EnsureMonth(ctx, month)
	if err == nil && len(stmts) == 0 {
		r.lost.Add(1)
	} else if waited && err == nil {
		return nil, fmt.Errorf("the partition runs did not make %s first", month.Format("2006-01"))
	}
	return stmts, err
}

// Sweepers and partition runs race: rows expired in months that have no
// partition yet, three sweepers that create them, and partition runs beside
// them. Whoever creates a month, the others retry their batch; every row
// ends in the archive exactly once. The first sweeper to find a month
// missing waits until the partition runs have made every month, so at least
// one race is lost for certain; the others race as they come.
func TestSweepersAndPartitionRunsRaceForMissingMonths(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0) // the previous month through three ahead
	ctx := context.Background()
	start := partition.MonthStart(time.Now())
	const perMonth = 3000
	for back := 3; back <= 6; back++ {
		month := start.AddDate(0, -back, 0)
		_, err := db.Pool.Exec(ctx, `
			INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, expires_at, created_at)
			SELECT 'idem:v1:m' || $2 || '-' || i, sha256(($2 || '-' || i)::bytea), 'completed', 201, jsonb_build_object('id', 'ch_' || i),
			       $1::timestamptz + i * interval '1 second', $1::timestamptz - interval '1 day'
			  FROM generate_series(1, $3) AS i`, month, fmt.Sprint(back), perMonth)
		require.NoError(t, err)
	}
	race := lostRaces{entered: make(chan struct{}), first: make(chan struct{}), once: new(sync.Once), lost: new(atomic.Int64)}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	var created sync.Map // partition -> the sweeper that created it
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := partition.NewManager(db.Pool, partition.Config{}, nil)
			if err != nil {
				errs <- err
				return
			}
			r := race
			r.m = m
			s, err := sweep.New(db.Pool, sweep.Config{BatchSize: 700 + 100*i}, r, nil)
			if err != nil {
				errs <- err
				return
			}
			res, err := s.Run(ctx)
			if err != nil {
				errs <- fmt.Errorf("sweeper %d: %w", i, err)
			}
			for _, p := range res.PartitionsCreated {
				if other, dup := created.LoadOrStore(p, i); dup {
					errs <- fmt.Errorf("sweepers %d and %d both report creating %s", other, i, p)
				}
			}
		}()
	}
	// The partition runs start once a sweeper has found a month missing,
	// and let it go on when they are done.
	var runs sync.WaitGroup
	for range 2 {
		wg.Add(1)
		runs.Add(1)
		go func() {
			defer wg.Done()
			defer runs.Done()
			<-race.entered
			m, err := partition.NewManager(db.Pool, partition.Config{}, nil)
			if err == nil {
				_, err = m.Run(ctx, false)
			}
			if err != nil {
				errs <- fmt.Errorf("partition run: %w", err)
			}
		}()
	}
	go func() { runs.Wait(); close(race.first) }()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("races lost by sweepers: %d", race.lost.Load())
	require.Positive(t, race.lost.Load(), "no sweeper lost a race: the test proved nothing")
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 4*perMonth, dbtest.Count(t, db.Pool, "SELECT count(DISTINCT scoped_key) FROM idempotency_key_archive"))
	require.EqualValues(t, 4*perMonth, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

// A batch skips rows other sweepers or in-flight completions hold: the
// months it needs are not those of the oldest rows. The sweeper creates the
// month its rows need, or names it, whatever rows it skipped.
func TestMissingPartitionBehindLockedRows(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fail=%v", fail), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			start := partition.MonthStart(time.Now())
			_, err := b.parts.EnsureMonth(ctx, start.AddDate(0, -6, 0))
			require.NoError(t, err)
			covered := start.AddDate(0, -6, 0).Add(36 * time.Hour)
			uncovered := start.AddDate(0, -4, 0).Add(36 * time.Hour)
			dbtest.InsertLive(t, b.db.Pool,
				dbtest.LiveRow{Key: "idem:v1:a1", Status: 201, ExpiresAt: covered},
				dbtest.LiveRow{Key: "idem:v1:a2", Status: 201, ExpiresAt: covered.Add(time.Second)},
				dbtest.LiveRow{Key: "idem:v1:b", Status: 201, ExpiresAt: uncovered},
			)
			tx, err := b.db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, "SELECT 1 FROM idempotency_keys WHERE scoped_key IN ('idem:v1:a1', 'idem:v1:a2') FOR UPDATE")
			require.NoError(t, err)

			res, err := newSweeper(t, b.db.Pool, sweep.Config{BatchSize: 2, FailOnMissingPartition: fail}, b.parts, nil).Run(ctx)
			if fail {
				var missing *sweep.MissingPartitionError
				require.ErrorAs(t, err, &missing)
				require.ErrorContains(t, err, "archive has no partition for "+uncovered.Format("2006-01"))
				require.EqualValues(t, 3, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"), "no row may be lost")
				return
			}
			require.NoError(t, err)
			require.EqualValues(t, 1, res.Moved)
			require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:b'"))
		})
	}
}

// Rows that expire before year 1 ('-infinity', a BC date, written by hand or
// another writer) can have no archive partition. As the oldest rows every
// batch would claim them first and fail: they are never claimed, every other
// expired row is archived behind them, and the run reports them.
func TestRowsNoPartitionCanHoldDoNotStallTheSweep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	for _, tc := range []struct{ key, created, expires string }{
		{"idem:v1:bc", "0100-01-01 00:00:00+00 BC", "0100-01-02 00:00:00+00 BC"},
		{"idem:v1:minus-infinity", "-infinity", "4713-01-01 00:00:00+00 BC"},
	} {
		_, err := b.db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, created_at, expires_at, skew_ms)
			VALUES ($1, $2, 'in_flight', $3::timestamptz, $4::timestamptz, 0)`, tc.key, dbtest.Fingerprint(tc.key), tc.created, tc.expires)
		require.NoError(t, err)
	}
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:year-one", Status: 201, ExpiresAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
		dbtest.LiveRow{Key: "idem:v1:recent", Status: 201, ExpiresAt: time.Now().Add(-time.Hour)},
	)
	for _, fail := range []bool{true, false} {
		res, err := newSweeper(t, b.db.Pool, sweep.Config{FailOnMissingPartition: fail}, b.parts, nil).Run(ctx)
		if fail {
			var missing *sweep.MissingPartitionError
			require.ErrorAs(t, err, &missing, "year 1 has no partition yet")
			require.ErrorContains(t, err, "0001-01")
			continue
		}
		require.NoError(t, err)
		require.EqualValues(t, 2, res.Moved, "year 1 and the recent row")
		require.EqualValues(t, 2, res.Backlog)
		require.EqualValues(t, 2, res.Unarchivable)
	}
	require.EqualValues(t, 2, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.EqualValues(t, 2, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key IN ('idem:v1:bc', 'idem:v1:minus-infinity')"), "never lost")
}

// A key over 2,000 bytes (only another writer can store one) may fit the live
// table's primary key and not the archive's, which holds expired_at beside
// it: it is never claimed, so it cannot fail every batch as the oldest row;
// every other row moves behind it, and a run that drained reports it.
func TestKeysTooLongForTheArchiveDoNotStallTheSweep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(1, 2))
	incompressible := func(n int) string {
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.~"
		k := []byte("idem:v1:")
		for len(k) < n {
			k = append(k, alphabet[r.IntN(len(alphabet))])
		}
		return string(k)
	}
	// The longest incompressible key the live table takes, one at the
	// limit and ordinary ones, all expired, the long ones oldest
	var longest string
	for n := 2600; n < 2800; n++ {
		k := incompressible(n)
		tx, err := b.db.Pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, created_at, expires_at, skew_ms)
			VALUES ($1, $2, now() - interval '27 hours', now() - interval '3 hours', 0)`, k, dbtest.Fingerprint(k))
		_ = tx.Rollback(ctx)
		if err != nil {
			break
		}
		longest = k
	}
	require.Greater(t, len(longest), 2000)
	// At the bound lookups accept: every key a lookup accepts is archived.
	atLimit := incompressible(archive.MaxScopedKeyBytes)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: longest, Status: 201, ExpiresAt: time.Now().Add(-3 * time.Hour)},
		dbtest.LiveRow{Key: atLimit, Status: 201, ExpiresAt: time.Now().Add(-3 * time.Hour)},
	)
	for i := range 5 {
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("idem:v1:ok-%d", i), Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	}

	res, err := newSweeper(t, b.db.Pool, sweep.Config{BatchSize: 1}, b.parts, nil).Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 6, res.Moved, "the key at the limit and the ordinary ones")
	require.True(t, res.Drained)
	require.EqualValues(t, 1, res.Backlog)
	require.EqualValues(t, 1, res.Unarchivable)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = $1", longest), "never lost")
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", atLimit))
}

// A month holding only keys no batch claims (over 2,000 bytes) gets no
// partition: the sweeper creates the months of what it can move, and a
// month it could not create (a hand-made partition overlaps it) does not
// hold back the rows of the others.
func TestAMonthOfUnclaimableKeysOnlyGetsNoPartition(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	now := time.Now().UTC()
	old, recent := partition.MonthStart(now).AddDate(-2, 0, 0), partition.MonthStart(now).AddDate(-1, 0, 0)
	long := "idem:v1:" + strings.Repeat("x", 2100)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: long, Status: 201, ExpiresAt: old.Add(6 * 24 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:ordinary", Status: 201, ExpiresAt: recent.Add(6 * 24 * time.Hour)},
	)
	_, err := b.db.Pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE hand_made PARTITION OF idempotency_key_archive FOR VALUES FROM ('%s') TO ('%s')`,
		old.Add(15*24*time.Hour).Format(time.RFC3339), old.AddDate(0, 1, 15).Format(time.RFC3339)))
	require.NoError(t, err)

	res, err := newSweeper(t, b.db.Pool, sweep.Config{}, b.parts, nil).Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Moved, "the ordinary row")
	require.Equal(t, []string{partition.Name(recent)}, res.PartitionsCreated)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = $1", long), "never lost")
}

// A key still in flight is archived InFlightGrace after its expiry, not at
// it: a request that outlives its TTL by less completes its row, and the
// archive keeps its outcome instead of "expired in flight". Zero grace
// archives it at expiry.
func TestAKeyInFlightIsArchivedAQuarterHourAfterItsExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:completed-just-now", Status: 201, ExpiresAt: time.Now().Add(-time.Minute)},
		dbtest.LiveRow{Key: "idem:v1:still-running", ExpiresAt: time.Now().Add(-time.Minute)},
		dbtest.LiveRow{Key: "idem:v1:abandoned", ExpiresAt: time.Now().Add(-16 * time.Minute)},
	)
	grace := sweep.Config{InFlightGrace: 15 * time.Minute}
	res, err := newSweeper(t, b.db.Pool, grace, b.parts, nil).Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Moved)
	require.EqualValues(t, 0, res.Backlog, "the request still running is no backlog")
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys WHERE scoped_key = 'idem:v1:still-running'"))
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:abandoned' AND status_code = 0"))

	// WHEN the running request completes late, and its grace then ends
	_, err = b.db.Pool.Exec(ctx, `UPDATE idempotency_keys SET state = 'completed', status_code = 201, resource_id = 'ch_late' WHERE scoped_key = 'idem:v1:still-running'`)
	require.NoError(t, err)
	res, err = newSweeper(t, b.db.Pool, grace, b.parts, nil).Run(ctx)
	require.NoError(t, err)

	// THEN the archive keeps what it did
	require.EqualValues(t, 1, res.Moved)
	require.EqualValues(t, 1, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:still-running' AND status_code = 201 AND resource_id = 'ch_late'"))

	// AND without a grace a key in flight is archived at its expiry
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:no-grace", ExpiresAt: time.Now().Add(-time.Second)})
	res, err = newSweeper(t, b.db.Pool, sweep.Config{}, b.parts, nil).Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Moved)
	require.NoError(t, grace.WithDefaults().Validate())
	for _, bad := range []time.Duration{-time.Millisecond, 1500 * time.Microsecond, 25 * time.Hour} {
		err := sweep.Config{InFlightGrace: bad}.WithDefaults().Validate()
		var ce *sweep.ConfigError
		require.ErrorAs(t, err, &ce, bad)
		require.Equal(t, "InFlightGrace", ce.Field)
	}
}

// Creating a missing month waits for the partition manager's advisory lock,
// which a partition run can hold for minutes: the wait ends DeadlineMargin
// before the invocation's deadline, where batches stop starting, so that the
// run reports the month and why rather than ride into a Lambda's timeout.
func TestCreatingAMissingMonthStopsAtTheDeadlineMargin(t *testing.T) {
	t.Parallel()
	// GIVEN an expired row of a month without a partition, and a partition
	// run holding the advisory lock
	db := dbtest.New(t)
	ctx := context.Background()
	parts := db.Partition(t, 0)
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:ancient", Status: 201, ExpiresAt: time.Date(2020, 3, 15, 12, 0, 0, 0, time.UTC)})
	holder, err := db.Pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('idempotency_key_archive partitions ' || current_schema(), 0))`)
	require.NoError(t, err)
	defer func() { _, _ = holder.Exec(ctx, `SELECT pg_advisory_unlock_all()`) }()

	// WHEN a sweep with 4 s left and a 2 s margin runs
	const left, margin = 4 * time.Second, 2 * time.Second
	s, err := sweep.New(db.Pool, sweep.Config{StatementTimeout: time.Second, DeadlineMargin: margin}, parts, nil)
	require.NoError(t, err)
	rctx, cancel := context.WithTimeout(ctx, left)
	defer cancel()
	start := time.Now()
	_, err = s.Run(rctx)

	// THEN it stops at the margin, naming the month and the lock
	require.Less(t, time.Since(start), left-margin/2, "the wait rode past the deadline margin")
	var missing *sweep.MissingPartitionError
	require.ErrorAs(t, err, &missing)
	require.ErrorContains(t, err, "2020-03")
	require.ErrorContains(t, err, "advisory lock")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"), "the row stays live")
}

// With SWEEP_MISSING_PARTITION=fail (as the CDK stack deploys it), an
// expired live row older than the months a partition run keeps ready (a
// live table restored from a backup, a sweeper stopped for months) stops
// the sweep on its month, and the remedy the error names works: the
// partition run creates every month the expired backlog needs, however
// old, even outside the retention, which it then keeps until the rows are
// swept and retires after.
func TestTheRemedyOfAFailingMissingPartitionHeals(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	manager := func(retention int) *partition.Manager {
		m, err := partition.NewManager(db.Pool, partition.Config{RetentionMonths: retention}, nil)
		require.NoError(t, err)
		return m
	}
	_, err := manager(0).Run(ctx, false)
	require.NoError(t, err)
	threeBack := partition.MonthStart(time.Now()).AddDate(0, -3, 10)
	yearsBack := partition.MonthStart(time.Now()).AddDate(-3, 0, 10)
	dbtest.InsertLive(t, db.Pool,
		dbtest.LiveRow{Key: "idem:v1:restored-from-backup", Status: 201, ExpiresAt: threeBack},
		dbtest.LiveRow{Key: "idem:v1:years-old", Status: 201, ExpiresAt: yearsBack},
		dbtest.LiveRow{Key: "idem:v1:recent", Status: 201, ExpiresAt: time.Now().Add(-time.Minute)},
	)
	s, err := sweep.New(db.Pool, sweep.Config{FailOnMissingPartition: true, Pause: 0}, nil, nil)
	require.NoError(t, err)
	_, err = s.Run(ctx)
	require.ErrorContains(t, err, "run `archivectl partitions` as the archive owner")
	require.ErrorContains(t, err, yearsBack.Format("2006-01"))

	// WHEN the operator does what the error says (a retention of 12 months)
	res, err := manager(12).Run(ctx, false)
	require.NoError(t, err)
	require.Contains(t, res.Created, partition.Name(threeBack))
	require.Contains(t, res.Created, partition.Name(yearsBack))
	res, err = manager(12).Run(ctx, false)
	require.NoError(t, err)
	require.Empty(t, res.Retired, "its rows still wait in the live table")

	// THEN the sweep moves every row
	swept, err := s.Run(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, swept.Moved)

	// AND the month outside the retention is retired by the next run, not
	// before its rows were swept
	res, err = manager(12).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{partition.Name(yearsBack)}, res.Retired)
}

// liveTraffic registers keysPerWriter keys of prefix<writer>-<n> from each of
// writers goroutines, with TTLs of 1 to maxTTL ms, and completes about two
// thirds of them, storing the status of each completion that found its row
// in completed. The WaitGroup is done when all have.
func liveTraffic(ctx context.Context, t *testing.T, pool *pgxpool.Pool, writers, keysPerWriter, maxTTL int, seed uint64, prefix string, completed *sync.Map) *sync.WaitGroup {
	t.Helper()
	var traffic sync.WaitGroup
	for w := range writers {
		traffic.Add(1)
		go func() {
			defer traffic.Done()
			rng := rand.New(rand.NewPCG(uint64(w), seed))
			for i := range keysPerWriter {
				key := fmt.Sprintf("%s%d-%04d", prefix, w, i)
				if _, err := pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, expires_at) VALUES ($1, $2, now() + $3 * interval '1 millisecond')`,
					key, dbtest.Fingerprint(key), 1+rng.IntN(maxTTL)); err != nil {
					t.Errorf("register %s: %v", key, err)
					return
				}
				if rng.IntN(3) > 0 {
					status := 200 + rng.IntN(5)
					tag, err := pool.Exec(ctx, `UPDATE idempotency_keys SET state = 'completed', status_code = $2, response = jsonb_build_object('id', $1::text) WHERE scoped_key = $1`, key, status)
					if err != nil {
						t.Errorf("complete %s: %v", key, err)
						return
					}
					if tag.RowsAffected() == 1 {
						completed.Store(key, status)
					}
				}
			}
		}()
	}
	return &traffic
}

// The backlog count that ends a run never waits past the invocation's
// deadline: Lambda stops the function there, and the run's metrics and its
// error line would go with it. Here the live table is locked, so the count
// waits for as long as it is let.
func TestTheBacklogCountEndsBeforeTheDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "waiting", Status: 200, ExpiresAt: time.Now().Add(-time.Hour)})
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_keys IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	// A deadline closer than the margin: no batch starts, and the count
	// waits on the lock.
	runCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	res, err := newSweeper(t, b.sweeper, sweep.Config{DeadlineMargin: 35 * time.Second}, nil, nil).Run(runCtx)
	require.NoError(t, runCtx.Err(), "the run returned after its deadline: its count waited past it")
	var noBatch *sweep.DeadlineError
	require.ErrorAs(t, err, &noBatch, "a backlog that could not be counted may still wait")
	require.EqualValues(t, -1, res.Backlog, "not counted")
}
