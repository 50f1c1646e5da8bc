package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/partition"
)

// fullDisk is a stdout that takes nothing: `> plan.sql` on a full disk.
type fullDisk struct{}

func (fullDisk) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// A command whose output cannot be written fails: exit 2 and one line, never
// exit 0 with an empty plan or table a script would take for the answer.
func TestAnOutputThatCannotBeWrittenFailsTheCommand(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "idem:v1:x", Status: 201, ExpiredAt: time.Now().Add(-time.Hour)})
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	for _, args := range [][]string{
		{"partitions", "--dry-run"},
		{"verify"},
		{"lookup", "idem:v1:x"},
		{"sweep"},
	} {
		var errb strings.Builder
		code := run(context.Background(), args, fullDisk{}, &errb, getenv)
		require.Equal(t, exitError, code, "%v: %s", args, errb.String())
		require.Contains(t, errb.String(), "no space left on device", "%v", args)
		require.Equal(t, 1, strings.Count(strings.TrimSpace(errb.String()), "\n")+1, "%v: one line: %q", args, errb.String())
	}
}

// Every range error of a partitions flag names the flag.
func TestAPartitionsFlagOutOfRangeIsNamed(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	requireOneLineError(t, cli(t, db, nil, "partitions", "--dry-run", "--lead-months", "121"), "--lead-months: partition lead of 121 months is more than 120")
}

// A partitions run interrupted while a retirement waits for its lock (an
// operator's Ctrl-C) says which step it cut short and what that step left,
// beside what it had done.
func TestAnInterruptedPartitionsRunSaysWhichStepItCut(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 6)
	ctx := context.Background()
	old := partition.Name(partition.MonthStart(time.Now()).AddDate(0, -7, 0))
	tx, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, fmt.Sprintf("LOCK TABLE %s IN ACCESS SHARE MODE", old))
	require.NoError(t, err)

	runCtx, cancel := context.WithCancel(ctx)
	app := "interrupted-" + db.Schema
	getenv := func(k string) string {
		switch k {
		case "DATABASE_URL":
			return db.URL + "&application_name=" + app
		case "PARTITION_LOCK_TIMEOUT":
			return "1m"
		}
		return ""
	}
	go func() {
		defer cancel()
		for t0 := time.Now(); time.Since(t0) < time.Minute; time.Sleep(20 * time.Millisecond) {
			var n int
			_ = db.Pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", app).Scan(&n)
			if n > 0 {
				return
			}
		}
	}()
	var out, errb bytes.Buffer
	code := run(runCtx, []string{"partitions", "--lead-months", "8", "--retention-months", "3"}, &out, &errb, getenv)
	require.Equal(t, exitError, code, errb.String())
	require.Contains(t, errb.String(), "retire partition "+old)
	require.Contains(t, errb.String(), "interrupted: the month may be left detach-pending or detached, which the next partitions run finishes")
	require.Contains(t, out.String(), `"created": [`)
	require.Contains(t, out.String(), `"failed": [`)
	require.Contains(t, out.String(), `"action": "retire"`)
	require.Contains(t, out.String(), `"partition": "`+old+`"`)
	require.NoError(t, tx.Rollback(ctx))

	// The next run finishes what the interrupted one left, and retires the
	// month.
	r := cli(t, db, nil, "partitions", "--lead-months", "8", "--retention-months", "3")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, old)
	var exists bool
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", old).Scan(&exists))
	require.False(t, exists)
}

// A name made by hand that holds a newline (a partition's) cannot write a
// line of verify's table of its own: the figure is quoted.
func TestVerifyQuotesAFigureThatWouldBreakItsLine(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE "odd
PASS  all_good" PARTITION OF idempotency_key_archive FOR VALUES FROM ('2001-01-10') TO ('2001-02-10')`)
	require.NoError(t, err)
	r := cli(t, db, nil, "verify")
	require.Equal(t, exitNo, r.code, r.stderr)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		require.Regexp(t, `^(PASS|FAIL)  \S`, line)
	}
	require.Contains(t, r.stdout, `odd\nPASS  all_good`)
	require.NotContains(t, r.stdout, "\nPASS  all_good")
}

// A flag given no value takes the next argument for it, --emit-metrics
// included: "--prefix --emit-metrics --dry-run" would reconcile under the
// prefix "--emit-metrics" (or, --emit-metrics taken out first, "--dry-run",
// for real), "--prefix -- --emit-metrics" under "--". Such a line is
// refused, in every spelling (but a value given inline, --name=value, is
// the value its writer meant); --emit-metrics is every command's flag
// wherever it stands among the flags, and its help names it.
func TestEmitMetricsTakenForAnotherFlagsValueIsRefused(t *testing.T) {
	t.Parallel()
	noDB := map[string]string{"DATABASE_URL": ""}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"redis-reconcile", "--prefix", "--emit-metrics", "--dry-run"}, `--prefix took "--emit-metrics" for its value`},
		{[]string{"redis-reconcile", "--prefix", "--emit-metrics=false", "--dry-run"}, `--prefix took "--emit-metrics=false" for its value`},
		{[]string{"lookup", "--fingerprint", "-emit-metrics", "k"}, `--fingerprint took "-emit-metrics" for its value`},
		{[]string{"query", "--scope-prefix", "--emit-metrics"}, `--scope-prefix took "--emit-metrics" for its value`},
		{[]string{"redis-reconcile", "--prefix", "--", "--emit-metrics"}, `a flag took "--" or --emit-metrics for its value`},
	} {
		r := cli(t, nil, noDB, tc.args...)
		requireOneLineError(t, r, tc.want+": give each flag its value (--name=value)")
		require.Empty(t, r.stdout, tc.args)
	}
	for _, args := range [][]string{
		{"lookup", "k", "--emit-metrics"},
		{"partitions", "--emit-metrics=true", "--dry-run"},
		{"verify", "--recent", "1h", "-emit-metrics"},
		{"redis-reconcile", "--prefix=app:", "--emit-metrics", "--dry-run"},
		{"lookup", "--emit-metrics", "--", "--emit-metrics"},
		{"lookup", "--fingerprint=--emit-metrics", "k"},
	} {
		// The run goes on, to the missing DATABASE_URL.
		requireOneLineError(t, cli(t, nil, noDB, args...), "DATABASE_URL")
	}
	r := cli(t, nil, noDB, "verify", "-h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "-emit-metrics")
}

// A dry run's plan is SQL an operator may run with psql -f: a name made by
// hand that holds a newline (a partition's) stays inside its comment line.
func TestADryRunPlanKeepsAHandMadeNameInItsComment(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, err := db.Pool.Exec(context.Background(), `CREATE TABLE "odd
DROP TABLE idempotency_keys; --" PARTITION OF idempotency_key_archive FOR VALUES FROM ('2001-01-10') TO ('2001-02-10')`)
	require.NoError(t, err)
	r := cli(t, db, nil, "partitions", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `-- not managed: "odd\nDROP TABLE idempotency_keys; --"`)
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		require.False(t, strings.HasPrefix(line, "DROP TABLE idempotency_keys"), "a line of its own: %q", line)
	}
}

// A partitions run with a failed step, whose summary cannot be written
// (stdout a full disk or a closed pipe), reports both: the one line an
// operator or a cron mail gets says why the run failed, not only that its
// output did.
func TestAFailedPartitionsRunWhoseSummaryCannotBeWrittenStillSaysWhy(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, "CREATE TABLE archive_catchall PARTITION OF idempotency_key_archive DEFAULT")
	require.NoError(t, err)
	next := partition.MonthStart(time.Now()).AddDate(0, 5, 0)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "in default", Status: 201, ExpiredAt: next.Add(time.Hour)})
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	// With a writable stdout the error line names the failure.
	r := cli(t, db, nil, "partitions", "--lead-months", "5")
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "the DEFAULT partition archive_catchall holds rows of this month")

	var errb strings.Builder
	code := run(ctx, []string{"partitions", "--lead-months", "5"}, fullDisk{}, &errb, getenv)
	t.Logf("exit %d: %s", code, errb.String())
	require.Equal(t, exitError, code)
	require.Contains(t, errb.String(), "no space left on device")
	require.Contains(t, errb.String(), "the DEFAULT partition archive_catchall holds rows of this month", "the run's failure is not reported")
}
