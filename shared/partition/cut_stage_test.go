package partition_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// cancelAt cancels the run's context when the run starts a statement that
// at matches, or when one that after matches has ended; a statement that
// fail matches fails on its own (its context past its deadline), the run's
// going on.
type cancelAt struct {
	at, after, fail func(sql string) bool
	cancel          context.CancelFunc
}

type sqlKey struct{}

func matches(f func(string) bool, sql string) bool { return f != nil && f(sql) }

func (c *cancelAt) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if matches(c.at, d.SQL) {
		c.cancel()
	}
	if matches(c.fail, d.SQL) {
		// Past its own deadline: an error that is not the run's
		// context's (canceled).
		done, cancel := context.WithDeadline(ctx, time.Unix(0, 0))
		defer cancel()
		ctx = done
	}
	return context.WithValue(ctx, sqlKey{}, d.SQL)
}

func (c *cancelAt) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if sql, _ := ctx.Value(sqlKey{}).(string); matches(c.after, sql) {
		c.cancel()
	}
}

func is(sql string) func(string) bool { return func(s string) bool { return s == sql } }

// A run whose context ends after its steps (while it keeps the plain keys
// index, drops leftover indexes, compacts, or measures the archive) names
// the stage in Failed: the summary of a run cut short never reads as a run
// whose every step was done.
func TestARunCutShortAfterItsStepsNamesWhereInFailed(t *testing.T) {
	t.Parallel()
	for stage, sql := range partition.StageSQL {
		t.Run(stage, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			db.Partition(t, 0)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pool := db.NewPool(t, func(cfg *pgxpool.Config) {
				cfg.ConnConfig.Tracer = &cancelAt{at: is(sql), cancel: cancel}
			})
			m := newManager(t, pool, partition.Config{CompactPerRun: 1})

			res, err := m.Run(ctx, false)

			require.ErrorIs(t, err, context.Canceled)
			require.NotEmpty(t, res.Failed, "a run cut short in %s reported no failed stage", stage)
			want := stage
			if stage == "compaction" {
				want = "compact"
			}
			last := res.Failed[len(res.Failed)-1]
			require.Equal(t, want, last.Action)
			require.Contains(t, last.Error, "interrupted")
		})
	}
}

// A run whose context ends inside a month's rebuild names the month.
func TestARunCutShortInARebuildNamesTheMonth(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	bloated(t, db, 200, sep)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := db.NewPool(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = &cancelAt{at: func(s string) bool { return strings.HasPrefix(s, "REINDEX INDEX CONCURRENTLY") }, cancel: cancel}
	})
	m := newManager(t, pool, partition.Config{Now: at(decNow), CompactPerRun: 1})

	res, err := m.Run(ctx, false)

	require.ErrorIs(t, err, context.Canceled)
	require.NotEmpty(t, res.Failed)
	last := res.Failed[len(res.Failed)-1]
	require.Equal(t, partition.Failure{Action: "compact", Partition: partition.Name(sep)}, partition.Failure{Action: last.Action, Partition: last.Partition})
	require.Contains(t, last.Error, "interrupted")
	require.Empty(t, res.Compacted)
}

// A stage that completed before the context ended is not named: with
// compaction off, a context that ends once the leftover indexes are listed
// (the compact stage's work) names measure, the stage that did not run.
func TestARunCutBetweenStagesNamesTheOneThatDidNotRun(t *testing.T) {
	t.Parallel()
	for _, dryRun := range []bool{false, true} {
		db := dbtest.New(t)
		db.Partition(t, 0)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		pool := db.NewPool(t, func(cfg *pgxpool.Config) {
			cfg.ConnConfig.Tracer = &cancelAt{after: is(partition.StageSQL["compact"]), cancel: cancel}
		})
		res, err := newManager(t, pool, partition.Config{CompactPerRun: 0}).Run(ctx, dryRun)

		require.ErrorIs(t, err, context.Canceled)
		require.NotEmpty(t, res.Failed)
		require.Equal(t, "measure", res.Failed[len(res.Failed)-1].Action, "dry run %v", dryRun)
	}
}

// A run whose context ends after its last stage returns its own errors, and
// names no stage as interrupted.
func TestARunWhoseContextEndsAfterItsLastStageNamesNoCut(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := db.NewPool(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = &cancelAt{after: is(partition.StageSQL["measure"]), fail: is(partition.StageSQL["plain keys"]), cancel: cancel}
	})
	res, err := newManager(t, pool, partition.Config{}).Run(ctx, false)

	require.ErrorIs(t, err, partition.ErrIncomplete, "the plain keys stage failed")
	require.NotErrorIs(t, err, context.Canceled)
	require.NotZero(t, res.ArchiveBytes, "measured")
	require.Len(t, res.Failed, 1, "%+v", res.Failed)
	require.Equal(t, "plain keys", res.Failed[0].Action)
}

// A statement of the plain keys stage cut short by the context's end can
// fail with pgx's own error ("conn closed") rather than the context's: the
// run still returns the context's error, and names the stage.
func TestARunCutInsideAStageWhoseErrorIsNotTheContextsNamesIt(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	bloated(t, db, 200, sep)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pool := db.NewPool(t, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Tracer = &cancelAt{after: func(s string) bool {
			return strings.HasPrefix(strings.Join(strings.Fields(s), " "), "SELECT late, expired_from")
		}, cancel: cancel}
	})
	res, err := newManager(t, pool, partition.Config{Now: at(decNow), CompactPerRun: 1}).Run(ctx, false)

	require.ErrorIs(t, err, context.Canceled)
	require.NotEmpty(t, res.Failed)
	require.Equal(t, "plain keys", res.Failed[len(res.Failed)-1].Action)
}
