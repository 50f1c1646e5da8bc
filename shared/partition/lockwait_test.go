package partition_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A partition run, or a sweeper's EnsureMonth, that starts while another
// run compacts a month waits for it and then does its work. Waiting inside
// pg_advisory_lock would hold a snapshot that the rebuild's REINDEX ...
// CONCURRENTLY waits for, while the waiter waits for the rebuild's run to
// let go of the lock: a deadlock PostgreSQL breaks by failing one of them.
func TestARunStartedDuringACompactionWaitsForIt(t *testing.T) {
	t.Parallel()
	for name, second := range map[string]func(ctx context.Context, db *dbtest.DB) error{
		"partition run": func(ctx context.Context, db *dbtest.DB) error {
			_, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).Run(ctx, false)
			return err
		},
		"EnsureMonth": func(ctx context.Context, db *dbtest.DB) error {
			_, err := newManager(t, db.Pool, partition.Config{Now: at(decNow)}).EnsureMonth(ctx, month(2020, time.March))
			return err
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// GIVEN a run compacting September, its rebuild held up by a
			// writer of the month
			db := dbtest.New(t)
			ctx := context.Background()
			bloated(t, db, 2000, sep)
			writer, err := db.Pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = writer.Rollback(ctx) }()
			_, err = writer.Exec(ctx, "LOCK TABLE idempotency_key_archive_2026_09 IN ROW EXCLUSIVE MODE")
			require.NoError(t, err)
			var writerPID int32
			require.NoError(t, writer.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&writerPID))
			var wg sync.WaitGroup
			var first partition.Result
			var errFirst, errSecond error
			wg.Add(2)
			go func() {
				defer wg.Done()
				first, errFirst = compacting(t, db, partition.Config{}).Run(ctx, false)
			}()
			require.Eventually(t, func() bool {
				return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_stat_activity
					WHERE $1 = ANY (pg_blocking_pids(pid)) AND query LIKE 'REINDEX%'`, writerPID) > 0
			}, 30*time.Second, 10*time.Millisecond, "the rebuild waits for the writer")

			// WHEN a second one starts, and the writer then ends
			go func() {
				defer wg.Done()
				errSecond = second(ctx, db)
			}()
			time.Sleep(500 * time.Millisecond) // the second one is waiting for the lock
			require.NoError(t, writer.Rollback(ctx))
			wg.Wait()

			// THEN both succeed: the compaction and, after it, the second
			require.NoError(t, errFirst)
			require.Equal(t, []string{"idempotency_key_archive_2026_09"}, first.Compacted)
			require.NoError(t, errSecond, "the second waited for the first, not failed")
		})
	}
}
