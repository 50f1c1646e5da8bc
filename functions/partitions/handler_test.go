package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/fnenv"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

func setup(t *testing.T) (*dbtest.DB, lambda.Handler, *testenv.SyncBuffer) {
	t.Helper()
	db := dbtest.New(t)
	env, stdout, _ := testenv.FunctionEnv(t, db, nil)
	return db, lambda.NewHandler(newHandler(env)), stdout
}

func TestScheduledRunCreatesPartitions(t *testing.T) {
	t.Parallel()
	db, h, stdout := setup(t)
	out, err := h.Invoke(testenv.Invocation("req-1"), testenv.Event(t, "partitions-schedule.json"))
	require.NoError(t, err)
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.Len(t, res.Created, 5)
	require.NotEmpty(t, res.Statements)
	require.Greater(t, res.NewestPartitionDays, 60.0)
	require.EqualValues(t, 5, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass"))
	require.Len(t, testenv.Lines(stdout.String(), `"idempotency_archive_newest_partition_days"`), 1)

	// A second run has nothing to do.
	out, err = h.Invoke(testenv.Invocation("req-2"), testenv.Event(t, "partitions-schedule.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(out, &res))
	require.Empty(t, res.Created)
}

func TestDryRunEventRunsNothing(t *testing.T) {
	t.Parallel()
	db, h, _ := setup(t)
	out, err := h.Invoke(testenv.Invocation("req-3"), testenv.Event(t, "partitions-dry-run.json"))
	require.NoError(t, err)
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.True(t, res.DryRun)
	require.Len(t, res.Created, 6, "lead_months 4 plans six months, from the previous one")
	// The newest bound is the one the run would leave, not year 1.
	want := partition.MonthStart(time.Now()).AddDate(0, 5, 0)
	require.Equal(t, want, res.NewestUpperBound)
	require.Greater(t, res.NewestPartitionDays, 120.0)
	require.Contains(t, string(out), `"newest_upper_bound":"`+want.Format(time.RFC3339)+`"`)
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass"))
}

func TestBadOptionsAreClearErrors(t *testing.T) {
	t.Parallel()
	_, h, _ := setup(t)
	for payload, want := range map[string]string{
		`{"lead_months": 1}`:       "lead_months must be at least 2, got 1",
		`{"lead_months": 0}`:       "lead_months must be at least 2, got 0",
		`{"lead_months": 121}`:     "invalid options: lead_months: partition lead of 121 months is more than 120",
		`{"retention_months": -1}`: "must not be negative",
		`{"dry-run": true}`:        `unknown field "dry-run"`,
		`{"compact_per_run": -1}`:  "compact_per_run: partitions compacted per run must be 0 (none) to 24, got -1",
		`{"compact_per_run": 25}`:  "compact_per_run",
	} {
		_, err := h.Invoke(testenv.Invocation("req-bad"), []byte(payload))
		require.ErrorContains(t, err, want, payload)
	}
}

// archived gives db partitions from six months back through three ahead, with
// a row in each, and returns the number of rows.
func archived(t *testing.T, db *dbtest.DB) int64 {
	t.Helper()
	db.Partition(t, 5)
	cur := partition.MonthStart(time.Now())
	var n int64
	for i := -6; i <= 3; i++ {
		mo := cur.AddDate(0, i, 0)
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "k " + partition.Name(mo), Status: 201, ExpiredAt: mo.Add(time.Hour)})
		n++
	}
	return n
}

func TestHostileRetentionPayloadsLoseNoRow(t *testing.T) {
	t.Parallel()
	db, h, _ := setup(t)
	rows := archived(t, db)
	const attached = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'idempotency_key_archive'::regclass AND NOT inhdetachpending"
	parts := dbtest.Count(t, db.Pool, attached)
	for payload, want := range map[string]string{
		`{"retention_months": 1000000000000000}`:                  "retention_months: partition retention of 1000000000000000 months is more than 1200 (100 years); to keep the archive forever, set 0",
		fmt.Sprintf(`{"retention_months": %d}`, math.MaxInt):      "to keep the archive forever, set 0",
		`{"retention_months": 1201}`:                              "more than 1200",
		`{"retention_months": -5}`:                                "must not be negative, got -5 (0 keeps the archive forever)",
		fmt.Sprintf(`{"retention_months": %d}`, math.MinInt):      "must not be negative",
		`{"retention_months": 99999999999999999999}`:              "retention_months",
		`{"retention_months": 1e15}`:                              "retention_months",
		`{"dry_run": true, "retention_months": 1000000000000000}`: "set 0",
		// Two values: aws-lambda-go's typed handler read the first alone,
		// a run that retired five months.
		`{"retention_months": 1} {"dry_run": true}`:    "payload is not JSON",
		`{"retention_months": 1}` + "\n" + `"dry_run"`: "payload is not JSON",
	} {
		_, err := h.Invoke(testenv.Invocation("req-hostile"), []byte(payload))
		require.ErrorContains(t, err, want, payload)
		require.Equal(t, rows, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"), payload)
		require.Equal(t, parts, dbtest.Count(t, db.Pool, attached), payload)
	}

	// The largest retention allowed runs and keeps every month.
	out, err := h.Invoke(testenv.Invocation("req-max"), []byte(`{"retention_months": 1200}`))
	require.NoError(t, err)
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.Empty(t, res.Retired)
	require.Equal(t, rows, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

func TestHostileRetentionInTheEnvironmentStopsTheInit(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	rows := archived(t, db)
	for _, v := range []string{"1000000000000000", fmt.Sprint(math.MaxInt), "-1", "1201"} {
		getenv := func(k string) string {
			return map[string]string{"DATABASE_URL": db.URL, "PARTITION_RETENTION_MONTHS": v}[k]
		}
		_, err := fnenv.Load(context.Background(), getenv, &testenv.SyncBuffer{}, &testenv.SyncBuffer{})
		require.ErrorContains(t, err, "PARTITION_RETENTION_MONTHS", v)
	}
	require.Equal(t, rows, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

func TestAScheduledRunAttachesTheCurrentMonthAgain(t *testing.T) {
	t.Parallel()
	db, h, _ := setup(t)
	ctx := context.Background()
	rows := archived(t, db)
	name := partition.Name(partition.MonthStart(time.Now()))
	// GIVEN the current month detached by hand, its rows out of the archive
	_, err := db.Pool.Exec(ctx, "ALTER TABLE idempotency_key_archive DETACH PARTITION "+name)
	require.NoError(t, err)
	require.Equal(t, rows-1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))

	// WHEN the scheduled run comes, keeping everything
	out, err := h.Invoke(testenv.Invocation("req-reattach"), testenv.Event(t, "partitions-schedule.json"))
	require.NoError(t, err)

	// THEN the month is back with its rows
	var res partition.Result
	require.NoError(t, json.Unmarshal(out, &res))
	require.Equal(t, []string{name}, res.Reattached)
	require.Empty(t, res.Retired)
	require.Equal(t, rows, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.True(t, strings.Contains(strings.Join(res.Statements, "\n"), "ATTACH PARTITION"))
}

func TestTheScheduledRunCompactsAClosedMonthAndZeroTurnsItOff(t *testing.T) {
	t.Parallel()
	cur := partition.MonthStart(time.Now())
	closed := partition.Name(cur.AddDate(0, -2, 0))
	compacted := func(t *testing.T, db *dbtest.DB) int64 {
		return dbtest.Count(t, db.Pool, `SELECT count(*) FROM pg_class WHERE relname LIKE 'idempotency_key_archive_%_pkey'
			AND relnamespace = current_schema()::regnamespace AND obj_description(oid, 'pg_class') LIKE '%compacted%'`)
	}
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		// GIVEN months with rows, from six months back
		db, h, stdout := setup(t)
		archived(t, db)
		// WHEN the scheduled run comes with the defaults
		out, err := h.Invoke(testenv.Invocation("req-compact"), testenv.Event(t, "partitions-schedule.json"))
		require.NoError(t, err)
		// THEN it compacts one closed month, the newest, and says what is left
		var res partition.Result
		require.NoError(t, json.Unmarshal(out, &res))
		require.Equal(t, []string{closed}, res.Compacted)
		require.Len(t, res.CompactPending, 4, "months -3 to -6")
		require.EqualValues(t, 1, compacted(t, db))
		lines := testenv.Lines(stdout.String(), `"`+metrics.ArchiveUncompactedPartitions+`":4`)
		require.Len(t, lines, 1, stdout.String())
	})
	t.Run("PARTITION_COMPACT_PER_RUN=0", func(t *testing.T) {
		t.Parallel()
		db := dbtest.New(t)
		env, _, _ := testenv.FunctionEnv(t, db, map[string]string{"PARTITION_COMPACT_PER_RUN": "0"})
		h := lambda.NewHandler(newHandler(env))
		archived(t, db)
		out, err := h.Invoke(testenv.Invocation("req-off"), testenv.Event(t, "partitions-schedule.json"))
		require.NoError(t, err)
		var res partition.Result
		require.NoError(t, json.Unmarshal(out, &res))
		require.Empty(t, res.Compacted)
		require.NotContains(t, strings.Join(res.Statements, "\n"), "REINDEX")
		require.EqualValues(t, 0, compacted(t, db))
	})
}
