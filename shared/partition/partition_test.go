package partition_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
)

func at(s string) func() time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return func() time.Time { return t }
}

func month(y int, m time.Month) time.Time { return time.Date(y, m, 1, 0, 0, 0, 0, time.UTC) }

func names(parts []partition.Partition) []string {
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = p.Name
	}
	return out
}

func newManager(t *testing.T, pool *pgxpool.Pool, cfg partition.Config) *partition.Manager {
	t.Helper()
	m, err := partition.NewManager(pool, cfg, nil)
	require.NoError(t, err)
	return m
}

// partitionOf returns the partition a row with expired_at = ts lands in.
func partitionOf(t *testing.T, pool *pgxpool.Pool, key string, ts time.Time) string {
	t.Helper()
	dbtest.InsertArchive(t, pool, dbtest.ArchiveRow{Key: key, Status: 201, ExpiredAt: ts})
	var name string
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT tableoid::regclass::text FROM idempotency_key_archive WHERE scoped_key = $1", key).Scan(&name))
	return name
}

func TestBoundsAreUTCMonthsInAnyTimeZoneAcrossAYearBoundary(t *testing.T) {
	t.Parallel()
	cases := []struct {
		zone string
		now  string
	}{
		// 14 hours ahead of UTC: locally it is already January 2027.
		{"Pacific/Kiritimati", "2026-12-31T23:30:00Z"},
		// 11 hours behind UTC: locally it is still December 2026.
		{"Pacific/Pago_Pago", "2027-01-01T00:30:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.zone, func(t *testing.T) {
			t.Parallel()
			// GIVEN a session whose TimeZone is far from UTC
			db := dbtest.New(t)
			pool := db.NewPool(t, dbtest.WithParam("TimeZone", tc.zone))
			now := at(tc.now)

			// WHEN partitions are ensured
			res, err := newManager(t, pool, partition.Config{Now: now}).Run(context.Background(), false)
			require.NoError(t, err)

			// THEN the months are the UTC months around now (the previous
			// one through three ahead), with UTC bounds
			cur := partition.MonthStart(now())
			var want []string
			for i := -1; i <= 3; i++ {
				want = append(want, partition.Name(cur.AddDate(0, i, 0)))
			}
			require.Equal(t, want, res.Created)
			parts, err := partition.List(context.Background(), pool)
			require.NoError(t, err)
			require.Equal(t, want, names(parts))
			for i, p := range parts {
				require.True(t, p.From.Equal(cur.AddDate(0, i-1, 0)), "%s starts at %s", p.Name, p.From)
				require.True(t, p.To.Equal(cur.AddDate(0, i, 0)), "%s ends at %s", p.Name, p.To)
			}
			// AND rows on either side of midnight UTC at the year's end land in
			// the partitions of their UTC month
			if cur.Month() == time.December {
				require.Equal(t, "idempotency_key_archive_2026_12", partitionOf(t, pool, "a", time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC)))
			}
			require.Equal(t, "idempotency_key_archive_2027_01", partitionOf(t, pool, "b", time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)))
			require.Equal(t, "idempotency_key_archive_2027_03", partitionOf(t, pool, "c", time.Date(2027, 3, 31, 23, 59, 59, 0, time.UTC)))
			require.InDelta(t, cur.AddDate(0, 4, 0).Sub(now()).Hours()/24, res.NewestPartitionDays, 0.001)
		})
	}
}

// The manager reads the database's clock. In the exec and simple_protocol
// modes (RDS Proxy's) results come back as text, which pgx reads only in
// DateStyle ISO: the clock is read as a number, so that a role, database or
// parameter group with another DateStyle does not stop every run.
func TestTheDatabaseClockReadsUnderAnyDateStyle(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		pool := db.NewPool(t, dbtest.WithParam("DateStyle", "German"), dbtest.WithParam("TimeZone", "Asia/Kathmandu"),
			func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
		res, err := newManager(t, pool, partition.Config{}).Run(context.Background(), false)
		require.NoError(t, err, mode.String())
		require.Equal(t, partition.MonthStart(time.Now()).AddDate(0, 4, 0), res.NewestUpperBound, mode.String())
	}
}

func TestRunIsIdempotentAndEmitsMetrics(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var buf bytes.Buffer
	m, err := partition.NewManager(db.Pool, partition.Config{LeadMonths: 2, Now: at("2026-12-02T10:00:00Z")}, metrics.New(&buf, "Test"))
	require.NoError(t, err)

	first, err := m.Run(context.Background(), false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2026_11", "idempotency_key_archive_2026_12", "idempotency_key_archive_2027_01", "idempotency_key_archive_2027_02"}, first.Created)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "k", Status: 201, ExpiredAt: time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)})

	buf.Reset()
	second, err := m.Run(context.Background(), false)
	require.NoError(t, err)
	require.Empty(t, second.Created)
	require.Empty(t, second.Statements)
	require.Equal(t, time.Date(2027, 3, 1, 0, 0, 0, 0, time.UTC), second.NewestUpperBound)
	require.Positive(t, second.ArchiveBytes)

	var line map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &line), buf.String())
	require.InDelta(t, 88.583, line[metrics.ArchiveNewestPartitionDays], 0.01)
	require.EqualValues(t, second.ArchiveBytes, line[metrics.ArchiveBytes])
	require.Contains(t, line, metrics.ArchiveRows)
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   partition.Config
		field string
		want  string
	}{
		{partition.Config{LeadMonths: 1}, "LeadMonths", "at least 2"},
		{partition.Config{LeadMonths: -1}, "LeadMonths", "at least 2"},
		{partition.Config{LeadMonths: 121}, "LeadMonths", "more than 120"},
		{partition.Config{RetentionMonths: -1}, "RetentionMonths", "must not be negative"},
		{partition.Config{RetentionMonths: math.MinInt}, "RetentionMonths", "0 keeps the archive forever"},
		{partition.Config{RetentionMonths: 1201}, "RetentionMonths", "more than 1200 (100 years); to keep the archive forever, set 0"},
		{partition.Config{RetentionMonths: 1000000000000000}, "RetentionMonths", "set 0"},
		{partition.Config{RetentionMonths: math.MaxInt}, "RetentionMonths", "set 0"},
		// Under a millisecond renders as 0ms, which PostgreSQL reads as no timeout.
		{partition.Config{LockTimeout: 900 * time.Microsecond}, "LockTimeout", "at least 1ms"},
		{partition.Config{StatementTimeout: -time.Second}, "StatementTimeout", "at least 1ms"},
	} {
		_, err := partition.NewManager(nil, tc.cfg, nil)
		require.ErrorContains(t, err, tc.want, "%+v", tc.cfg)
		var ce *partition.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, tc.field, ce.Field)
	}
	for _, retention := range []int{0, 1, partition.MaxRetentionMonths} {
		_, err := partition.NewManager(nil, partition.Config{LeadMonths: 2, RetentionMonths: retention}, nil)
		require.NoError(t, err, retention)
	}
}

func TestDryRunPrintsDDLAndChangesNothing(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	res, err := newManager(t, db.Pool, partition.Config{Now: at("2026-12-02T10:00:00Z")}).Run(context.Background(), true)
	require.NoError(t, err)
	require.True(t, res.DryRun)
	require.Len(t, res.Created, 5)
	ddl := strings.Join(res.Statements, ";\n")
	require.Contains(t, ddl, `ATTACH PARTITION "`+db.Schema+`"."idempotency_key_archive_2026_12" FOR VALUES FROM ('2026-12-01 00:00:00+00') TO ('2027-01-01 00:00:00+00')`)
	parts, err := partition.List(context.Background(), db.Pool)
	require.NoError(t, err)
	require.Empty(t, parts)
}

func TestRetentionDetachesAndDropsOldMonthsOnly(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// GIVEN partitions from January 2026 on, with a row in each
	m := newManager(t, db.Pool, partition.Config{Now: at("2026-12-02T10:00:00Z")})
	for mo := time.January; mo <= time.November; mo++ {
		_, err := m.EnsureMonth(ctx, month(2026, mo))
		require.NoError(t, err)
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "k" + mo.String(), Status: 200, ExpiredAt: month(2026, mo).Add(time.Hour)})
	}

	// WHEN a run keeps three whole months before the current one
	keep3 := newManager(t, db.Pool, partition.Config{RetentionMonths: 3, Now: at("2026-12-02T10:00:00Z")})
	res, err := keep3.Run(ctx, false)
	require.NoError(t, err)

	// THEN January to August are gone, September on remain with their rows
	require.Len(t, res.Retired, 8)
	require.Equal(t, "idempotency_key_archive_2026_01", res.Retired[0])
	require.Contains(t, strings.Join(res.Statements, "\n"), "DETACH PARTITION \""+db.Schema+"\".\"idempotency_key_archive_2026_08\" CONCURRENTLY")
	parts, err := partition.List(ctx, db.Pool)
	require.NoError(t, err)
	require.Equal(t, []string{
		"idempotency_key_archive_2026_09", "idempotency_key_archive_2026_10", "idempotency_key_archive_2026_11",
		"idempotency_key_archive_2026_12", "idempotency_key_archive_2027_01", "idempotency_key_archive_2027_02", "idempotency_key_archive_2027_03",
	}, names(parts))
	require.EqualValues(t, 3, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'idempotency_key_archive_2026_08' AND relnamespace = current_schema()::regnamespace"))

	// AND the shortest retention never touches the current month
	res, err = newManager(t, db.Pool, partition.Config{RetentionMonths: 1, Now: at("2026-12-31T23:59:59Z")}).Run(ctx, false)
	require.NoError(t, err)
	require.Equal(t, []string{"idempotency_key_archive_2026_09", "idempotency_key_archive_2026_10"}, res.Retired)
}

func TestInterruptedDetachOutsideTheRetentionIsFinalizedAndDropped(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{RetentionMonths: 3, Now: at("2026-12-02T10:00:00Z")})
	_, err := m.EnsureMonth(ctx, month(2026, time.March))
	require.NoError(t, err)

	// GIVEN a DETACH ... CONCURRENTLY of March cancelled while it waited for a reader
	interruptDetach(t, db, "idempotency_key_archive_2026_03")

	// WHEN the manager runs with a retention that March is outside of
	res, err := m.Run(ctx, false)
	require.NoError(t, err)

	// THEN it finalizes the detach and drops the table
	require.Equal(t, []string{"idempotency_key_archive_2026_03"}, res.Finalized)
	require.Equal(t, []string{"idempotency_key_archive_2026_03"}, res.Retired)
	require.Empty(t, res.Reattached)
	parts, err := partition.List(ctx, db.Pool)
	require.NoError(t, err)
	require.NotContains(t, names(parts), "idempotency_key_archive_2026_03")
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname = 'idempotency_key_archive_2026_03' AND relnamespace = current_schema()::regnamespace"))
}

func TestConcurrentRunsAgree(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	var wg sync.WaitGroup
	created := make([][]string, 6)
	errs := make([]error, 6)
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := partition.NewManager(db.Pool, partition.Config{Now: at("2026-12-02T10:00:00Z"), RetentionMonths: 2}, nil)
			if err == nil {
				var res partition.Result
				res, err = m.Run(context.Background(), false)
				created[i] = res.Created
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	total := 0
	for i := range errs {
		require.NoError(t, errs[i])
		total += len(created[i])
	}
	require.Equal(t, 5, total, "each month is created by exactly one run")
	parts, err := partition.List(context.Background(), db.Pool)
	require.NoError(t, err)
	require.Len(t, parts, 5)
}

func TestHandMadePartitionInALocalTimeZoneIsReportedNotOverlapped(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	// GIVEN the runbook's hand-made partition, created in a New York session
	pool := db.NewPool(t, dbtest.WithParam("TimeZone", "America/New_York"))
	_, err := pool.Exec(ctx, `CREATE TABLE idempotency_key_archive_2026_12 PARTITION OF idempotency_key_archive
		FOR VALUES FROM ('2026-12-01') TO ('2027-01-01')`)
	require.NoError(t, err)

	// WHEN the manager runs THEN it names the partition and its real bounds
	_, err = newManager(t, db.Pool, partition.Config{Now: at("2026-12-02T10:00:00Z")}).Run(ctx, false)
	require.ErrorContains(t, err, "partition idempotency_key_archive_2026_12 covers [2026-12-01T05:00:00Z, 2027-01-01T05:00:00Z)")
}

func TestPartitionsStayWithTheArchiveOwner(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	_, err := newManager(t, db.Pool, partition.Config{Now: at("2026-12-02T10:00:00Z")}).Run(context.Background(), false)
	require.NoError(t, err)
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, `
		SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		 WHERE i.inhparent = 'idempotency_key_archive'::regclass
		   AND pg_get_userbyid(c.relowner) <> 'idempotency_owner'`))
}

func TestAPartitionDetachedButNotDroppedIsDroppedLater(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	ctx := context.Background()
	m := newManager(t, db.Pool, partition.Config{Now: at("2026-12-02T10:00:00Z")})
	for _, mo := range []time.Month{time.March, time.April} {
		_, err := m.EnsureMonth(ctx, month(2026, mo))
		require.NoError(t, err)
	}
	// GIVEN March detached (as a run whose DROP timed out leaves it)
	_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2026_03")
	require.NoError(t, err)
	// WHEN a run with retention covering March and April runs
	res, err := newManager(t, db.Pool, partition.Config{RetentionMonths: 3, Now: at("2026-12-02T10:00:00Z")}).Run(ctx, false)
	require.NoError(t, err)
	// THEN both are gone
	require.ElementsMatch(t, []string{"idempotency_key_archive_2026_03", "idempotency_key_archive_2026_04"}, res.Retired)
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_class WHERE relname IN ('idempotency_key_archive_2026_03', 'idempotency_key_archive_2026_04') AND relnamespace = current_schema()::regnamespace"))

	// AND a month detached but still wanted is attached again, rows and all
	_, err = db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION idempotency_key_archive_2027_01")
	require.NoError(t, err)
	_, err = db.Pool.Exec(ctx, "INSERT INTO idempotency_key_archive_2027_01 VALUES ('k', '\\x00', 201, NULL, '2027-01-01', '2027-01-02')")
	require.NoError(t, err)
	_, err = m.Run(ctx, false)
	require.NoError(t, err)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'k'"))
}

func TestCompactPerRunIsBounded(t *testing.T) {
	t.Parallel()
	for _, n := range []int{-1, partition.MaxCompactPerRun + 1} {
		_, err := partition.NewManager(nil, partition.Config{CompactPerRun: n}, nil)
		var ce *partition.ConfigError
		require.ErrorAs(t, err, &ce, n)
		require.Equal(t, "CompactPerRun", ce.Field)
	}
	for _, n := range []int{0, 1, partition.MaxCompactPerRun} {
		_, err := partition.NewManager(nil, partition.Config{CompactPerRun: n}, nil)
		require.NoError(t, err, n)
	}
}
