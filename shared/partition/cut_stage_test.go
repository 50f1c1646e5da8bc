package partition_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// cancelAt cancels the run's context when the run starts a statement that
// at matches.
type cancelAt struct {
	at     func(sql string) bool
	cancel context.CancelFunc
}

func (c *cancelAt) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if c.at(d.SQL) {
		c.cancel()
	}
	return ctx
}

func (*cancelAt) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

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
				cfg.ConnConfig.Tracer = &cancelAt{at: func(s string) bool { return s == sql }, cancel: cancel}
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
