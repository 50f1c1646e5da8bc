package partition_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// A run at the last millisecond of November and at the first of December
// (UTC), from a pool whose session TimeZone is far from UTC, with a 1-month
// retention, compaction on, and a live row of the last half hour of October
// (UTC) that still waits to be swept: October must be kept (its row waits),
// November and later never touched, September retired, bounds UTC months.
func TestMonthBoundaryInAFarTimeZoneKeepsTheBacklogsMonth(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{"Pacific/Kiritimati", "America/St_Johns", "Pacific/Pago_Pago"} {
		t.Run(zone, func(t *testing.T) {
			t.Parallel()
			db := dbtest.New(t)
			ctx := context.Background()
			pool := db.NewPool(t, dbtest.WithParam("TimeZone", zone))
			_, err := newManager(t, pool, partition.Config{Now: at("2026-07-15T00:00:00Z")}).Run(ctx, false)
			require.NoError(t, err)
			for mo := month(2026, time.August); mo.Before(month(2026, time.December)); mo = mo.AddDate(0, 1, 0) {
				_, err := newManager(t, pool, partition.Config{Now: at(decNow)}).EnsureMonth(ctx, mo)
				require.NoError(t, err)
				dbtest.InsertArchive(t, pool, dbtest.ArchiveRow{Key: "row " + partition.Name(mo), Status: 201, ExpiredAt: mo.Add(time.Hour)})
			}
			dbtest.InsertLive(t, pool, dbtest.LiveRow{Key: "idem:v1:late-october", Status: 201,
				ExpiresAt: time.Date(2026, time.October, 31, 23, 30, 0, 0, time.UTC)})

			for _, now := range []string{"2026-11-30T23:59:59.999Z", "2026-12-01T00:00:00Z"} {
				nowT, err := time.Parse(time.RFC3339Nano, now)
				require.NoError(t, err)
				res, err := newManager(t, pool, partition.Config{Now: func() time.Time { return nowT }, RetentionMonths: 1, CompactPerRun: 2}).Run(ctx, false)
				require.NoError(t, err, now)
				t.Logf("%s: created=%v retired=%v compacted=%v", now, res.Created, res.Retired, res.Compacted)
				require.NotContains(t, res.Retired, partition.Name(month(2026, time.October)), "%s: October's live row still waits", now)
				require.NotContains(t, res.Retired, partition.Name(month(2026, time.November)), now)
				for _, c := range res.Compacted {
					require.NotEqual(t, partition.Name(month(2026, time.November)), c, now)
				}
			}
			parts, err := partition.List(ctx, pool)
			require.NoError(t, err)
			for _, p := range parts {
				require.Empty(t, p.Foreign(), "%s: %s", p.Name, p.Bound)
			}
			require.NotContains(t, names(parts), partition.Name(month(2026, time.September)), "September is outside the retention")
			require.Contains(t, names(parts), partition.Name(month(2026, time.October)))
			// October keeps its row.
			require.EqualValues(t, 1, dbtest.Count(t, pool, "SELECT count(*) FROM idempotency_key_archive_2026_10"))
		})
	}
}
