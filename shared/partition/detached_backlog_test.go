package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A month outside the retention whose DETACH ... CONCURRENTLY was
// interrupted, or that is detached entirely, is not retired while expired
// live rows of that month wait to be swept: like an attached month, it is
// attached again, so that the run leaves every month of the backlog with a
// partition (a sweeper with SWEEP_MISSING_PARTITION=fail waits for this run
// to make it).
func TestADetachedMonthTheBacklogNeedsIsAttachedAgainNotDropped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		detach func(t *testing.T, db *dbtest.DB, name string)
	}{
		{"interrupted", interruptDetach},
		{"detached", func(t *testing.T, db *dbtest.DB, name string) {
			_, err := db.Pool.Exec(context.Background(), "ALTER TABLE idempotency_key_archive DETACH PARTITION "+name)
			require.NoError(t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			ctx := context.Background()
			m := newManager(t, db.Pool, partition.Config{RetentionMonths: 3, Now: at(decNow)})
			march := month(2026, time.March)
			_, err := m.EnsureMonth(ctx, march)
			require.NoError(t, err)
			dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:archived-in-march", Status: 201, ExpiredAt: march.Add(time.Hour)})

			// GIVEN March, outside the retention, detached (or half detached)
			tc.detach(t, db, "idempotency_key_archive_2026_03")
			// AND an expired live row of March that no sweep has moved yet
			_, err = db.Pool.Exec(ctx, `INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, created_at, expires_at)
				VALUES ('idem:v1:live-in-march', decode(repeat('00', 32), 'hex'), 'completed', 201, '2026-03-09 10:00:00+00', '2026-03-10 10:00:00+00')`)
			require.NoError(t, err)

			// WHEN the manager runs
			res, err := m.Run(ctx, false)
			require.NoError(t, err)

			// THEN March is attached (its rows with it), not dropped
			require.NotContains(t, res.Retired, "idempotency_key_archive_2026_03")
			parts, err := partition.List(ctx, db.Pool)
			require.NoError(t, err)
			require.True(t, partition.Covers(parts, march), "the backlog's month must have its partition after the run: %v", names(parts))
			require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:archived-in-march'"))
		})
	}
}
