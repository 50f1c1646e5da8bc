package sweep_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// handMadePartition attaches a partition an operator made by hand, from
// 10 days into month to 10 days into the next: its month cannot be created
// (it would overlap), but its rows insert.
func handMadePartition(t *testing.T, b bundle, month time.Time) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE hand_made PARTITION OF idempotency_key_archive FOR VALUES FROM ('%s') TO ('%s')`,
		month.Add(10*24*time.Hour).Format(time.RFC3339), month.AddDate(0, 1, 10).Format(time.RFC3339)))
	require.NoError(t, err)
}

func tableExists(t *testing.T, b bundle, name string) bool {
	t.Helper()
	var ok bool
	require.NoError(t, b.db.Pool.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", name).Scan(&ok))
	return ok
}

// A month the sweeper cannot create (a hand-made partition covers part of
// it) holds back no other month, whichever comes first: the sweeper creates
// every month it can, reports each, and the batch's rows all move when the
// month it could not create is not one they need.
func TestAMonthThatCannotBeCreatedHoldsBackNoOther(t *testing.T) {
	t.Parallel()
	start := partition.MonthStart(time.Now())
	older, newer := start.AddDate(0, -8, 0), start.AddDate(0, -5, 0)
	for _, tc := range []struct {
		name             string
		handMade, needed time.Time
	}{
		{"the partly covered month first", older, newer},
		{"the partly covered month last", newer, older},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			handMadePartition(t, b, tc.handMade)
			dbtest.InsertLive(t, b.db.Pool,
				dbtest.LiveRow{Key: "idem:v1:in-hand-made", Status: 201, ExpiresAt: tc.handMade.Add(12 * 24 * time.Hour)},
				dbtest.LiveRow{Key: "idem:v1:in-missing-month", Status: 201, ExpiresAt: tc.needed.Add(3 * 24 * time.Hour)},
			)
			res, err := newSweeper(t, b.db.Pool, sweep.Config{}, b.parts, nil).Run(context.Background())
			require.NoError(t, err)
			require.Equal(t, []string{partition.Name(tc.needed)}, res.PartitionsCreated)
			require.EqualValues(t, 2, res.Moved)
			require.Equal(t, sweep.StoppedDrained, res.Stopped)
			require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
			require.EqualValues(t, 2, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
		})
	}
}

// When a row does need the month that cannot be created, the run fails
// naming that month alone, with why, and still reports the month it created
// on the way. The batch moves all its rows or none: both stay live.
func TestAFailedMonthIsReportedAloneWithTheMonthsCreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := partition.MonthStart(time.Now())
	older, newer := start.AddDate(0, -8, 0), start.AddDate(0, -5, 0)
	handMadePartition(t, b, newer)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:in-missing-month", Status: 201, ExpiresAt: older.Add(3 * 24 * time.Hour)},
		// Before the hand-made partition's start: only newer's own month
		// would hold it, and it cannot be created.
		dbtest.LiveRow{Key: "idem:v1:before-hand-made", Status: 201, ExpiresAt: newer.Add(2 * 24 * time.Hour)},
	)
	res, err := newSweeper(t, b.db.Pool, sweep.Config{}, b.parts, nil).Run(context.Background())
	var missing *sweep.MissingPartitionError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, []time.Time{newer}, missing.Months)
	require.ErrorContains(t, err, "archive has no partition for "+newer.Format("2006-01")+";")
	require.ErrorContains(t, err, "creating it failed: "+newer.Format("2006-01")+": ")
	require.ErrorContains(t, err, "overlaps")
	require.NotContains(t, err.Error(), older.Format("2006-01"))
	require.NotContains(t, err.Error(), "\n", "one error line")
	require.Equal(t, []string{partition.Name(older)}, res.PartitionsCreated)
	require.True(t, tableExists(t, b, partition.Name(older)))
	require.Equal(t, sweep.StoppedError, res.Stopped)
	require.EqualValues(t, 2, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, 0, dbtest.Count(t, b.db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

// Unarchivable is a part of the backlog: a key over 2,000 bytes still in
// flight within its grace is neither, as no batch would claim it yet.
func TestAnOverlongKeyInFlightWithinItsGraceIsNotUnarchivable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:" + strings.Repeat("a", 2100), Status: 201, ExpiresAt: time.Now().Add(-time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:" + strings.Repeat("b", 2100), ExpiresAt: time.Now().Add(-time.Minute)},
		dbtest.LiveRow{Key: "idem:v1:" + strings.Repeat("c", 2100), ExpiresAt: time.Now().Add(-2 * time.Minute)},
		dbtest.LiveRow{Key: "idem:v1:" + strings.Repeat("d", 2100), ExpiresAt: time.Now().Add(-time.Hour)},
	)
	res, err := newSweeper(t, b.db.Pool, sweep.Config{InFlightGrace: 15 * time.Minute}, b.parts, nil).Run(context.Background())
	require.NoError(t, err)
	require.True(t, res.Drained)
	require.EqualValues(t, 2, res.Backlog, "the completed key and the one in flight past its grace")
	require.EqualValues(t, 2, res.Unarchivable)
}

// A run that fails says so in Stopped, which is never empty.
func TestAFailedRunSaysItStoppedOnAnError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:old", Status: 201, ExpiresAt: time.Now().AddDate(-3, 0, 0)})
	res, err := newSweeper(t, b.sweeper, sweep.Config{}, nil, nil).Run(context.Background())
	var missing *sweep.MissingPartitionError
	require.ErrorAs(t, err, &missing)
	require.Equal(t, sweep.StoppedError, res.Stopped)
}

// holdPartitionLock holds the partition manager's advisory lock on the
// test's schema (a partition run that takes its time) until the test ends.
func holdPartitionLock(t *testing.T, b bundle) {
	t.Helper()
	ctx := context.Background()
	holder, err := b.db.Pool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = holder.Exec(context.Background(), "SELECT pg_advisory_unlock_all()")
		holder.Release()
	})
	_, err = holder.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('idempotency_key_archive partitions ' || $1::text, 0))", b.db.Schema)
	require.NoError(t, err)
}

// A sweep interrupted (SIGTERM, Ctrl-C) while it waits to create a month
// its batch needs says canceled, as one interrupted during a batch or a
// pause does; one whose wait ends at the deadline margin says deadline, and
// names the month still missing.
func TestAWaitToCreateAMonthEndsAsTheRunDoes(t *testing.T) {
	t.Parallel()
	old := partition.MonthStart(time.Now()).AddDate(0, -9, 0)
	t.Run("canceled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:old", Status: 201, ExpiresAt: old.Add(3 * 24 * time.Hour)})
		holdPartitionLock(t, b)
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(700*time.Millisecond, cancel)
		res, err := newSweeper(t, b.db.Pool, sweep.Config{}, b.parts, nil).Run(ctx)
		require.ErrorIs(t, err, sweep.ErrCanceled)
		require.Equal(t, sweep.StoppedCanceled, res.Stopped)
		require.EqualValues(t, 1, res.Backlog)
	})
	t.Run("deadline", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dbtest.InsertLive(t, b.db.Pool, dbtest.LiveRow{Key: "idem:v1:old", Status: 201, ExpiresAt: old.Add(3 * 24 * time.Hour)})
		holdPartitionLock(t, b)
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		res, err := newSweeper(t, b.db.Pool, sweep.Config{DeadlineMargin: time.Second}, b.parts, nil).Run(ctx)
		var missing *sweep.MissingPartitionError
		require.ErrorAs(t, err, &missing)
		require.Equal(t, []time.Time{old}, missing.Months)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	})
}

// lockAfterFirst is the real partition manager, with a partition run that
// takes the manager's advisory lock (a DETACH CONCURRENTLY waiting for old
// snapshots, say) right after the sweeper created its first month.
type lockAfterFirst struct {
	t     *testing.T
	b     bundle
	calls int
}

func (l *lockAfterFirst) EnsureMonth(ctx context.Context, m time.Time) ([]string, error) {
	l.calls++
	if l.calls == 2 {
		holdPartitionLock(l.t, l.b)
	}
	return l.b.parts.EnsureMonth(ctx, m)
}

// Two months missing; the first is created, the wait for the second ends at
// the deadline margin. The run says the second month is missing, keeps the
// first in its result, and stopped at its deadline while it waited (as a
// single month's wait does), not that the invocation was too short to start
// a batch.
func TestAMonthStillMissingAtTheDeadlineIsNamedAfterAnotherWasCreated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := partition.MonthStart(time.Now())
	older, newer := start.AddDate(0, -9, 0), start.AddDate(0, -7, 0)
	dbtest.InsertLive(t, b.db.Pool,
		dbtest.LiveRow{Key: "idem:v1:older", Status: 201, ExpiresAt: older.Add(3 * 24 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:newer", Status: 201, ExpiresAt: newer.Add(3 * 24 * time.Hour)},
	)
	ens := &lockAfterFirst{t: t, b: b}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	res, err := newSweeper(t, b.db.Pool, sweep.Config{DeadlineMargin: time.Second}, ens, nil).Run(ctx)
	require.Equal(t, []string{partition.Name(older)}, res.PartitionsCreated)
	var missing *sweep.MissingPartitionError
	require.ErrorAs(t, err, &missing, "the month still missing is named")
	require.Equal(t, []time.Time{newer}, missing.Months)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Equal(t, sweep.StoppedDeadline, res.Stopped)
	require.EqualValues(t, 2, res.Backlog)
	var noBatch *sweep.DeadlineError
	require.False(t, errors.As(err, &noBatch), "%v", err)
}
