package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/metrics"
	"github.com/idemarchive/idemarchive/shared/partition"
	"github.com/idemarchive/idemarchive/shared/schema"
	"github.com/idemarchive/idemarchive/shared/sweep"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

type result struct {
	code           int
	stdout, stderr string
}

// cli runs archivectl in-process with DATABASE_URL pointing at the test's
// schema and extra environment variables.
func cli(t *testing.T, db *dbtest.DB, env map[string]string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	getenv := func(k string) string {
		if v, ok := env[k]; ok {
			return v
		}
		if k == "DATABASE_URL" && db != nil {
			return db.URL
		}
		return ""
	}
	code := run(context.Background(), args, &out, &errb, getenv)
	return result{code, out.String(), errb.String()}
}

func requireOneLineError(t *testing.T, r result, want string) {
	t.Helper()
	require.Equal(t, exitError, r.code, "stdout: %s", r.stdout)
	require.Contains(t, r.stderr, want)
	require.Equal(t, 1, strings.Count(strings.TrimSpace(r.stderr), "\n")+1, "one line: %q", r.stderr)
	require.NotContains(t, r.stderr, "goroutine")
}

func TestRunbookEndToEnd(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)

	// migrate is idempotent
	r := cli(t, db, nil, "migrate")
	require.Equal(t, exitOK, r.code, r.stderr)
	var mig struct {
		From          int32    `json:"from_version"`
		To            int32    `json:"to_version"`
		RolesCreated  []string `json:"roles_created"`
		GrantsApplied bool     `json:"grants_applied"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &mig))
	require.EqualValues(t, schema.LatestVersion(), mig.To)
	require.Equal(t, mig.From, mig.To, "dbtest already migrated")
	require.Empty(t, mig.RolesCreated, "the roles existed: none was created")
	require.True(t, mig.GrantsApplied)

	// partitions: dry run prints DDL, the real run a JSON summary
	r = cli(t, db, nil, "partitions", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "ATTACH PARTITION")
	require.Equal(t, 5, strings.Count(r.stdout, "CREATE TABLE"))
	r = cli(t, db, nil, "partitions", "--lead-months", "3")
	require.Equal(t, exitOK, r.code, r.stderr)
	var parts struct{ Created []string }
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &parts))
	require.Len(t, parts.Created, 5)

	// verify fails before anything was archived
	r = cli(t, db, nil, "verify")
	require.Equal(t, exitNo, r.code, r.stderr)
	require.Contains(t, r.stdout, "FAIL  recent archive rows exist")

	// a completed key expires and an in-flight one too
	now := time.Now().UTC()
	dbtest.InsertLive(t, db.Pool,
		dbtest.LiveRow{Key: "idem:v1:probe", Status: 201, Response: map[string]any{"id": "ch_probe"}, CreatedAt: now.Add(-30 * time.Hour), ExpiresAt: now.Add(-6 * time.Hour)},
		dbtest.LiveRow{Key: "idem:v1:lost", ExpiresAt: now.Add(-time.Hour)},
	)
	r = cli(t, db, nil, "verify")
	require.Equal(t, exitNo, r.code)
	require.Contains(t, r.stdout, "FAIL  expired backlog is zero              2 expired live rows")

	r = cli(t, db, nil, "sweep", "--batch", "1", "--pause", "1ms", "--emit-metrics")
	require.Equal(t, exitOK, r.code, r.stderr)
	var sw struct {
		Moved   int64
		Drained bool
		Backlog int64
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &sw))
	require.Equal(t, int64(2), sw.Moved)
	require.True(t, sw.Drained)
	require.Contains(t, r.stderr, `"idempotency_archived_total":2`, "--emit-metrics writes EMF to stderr")

	r = cli(t, db, nil, "verify")
	require.Equal(t, exitOK, r.code, r.stdout)
	require.Equal(t, 6, strings.Count(r.stdout, "PASS"))

	// lookup: found (exit 0) with fingerprint match, not found (exit 1)
	fp := hex.EncodeToString(dbtest.Fingerprint("idem:v1:probe"))
	r = cli(t, db, nil, "lookup", "idem:v1:probe", "--fingerprint", fp)
	require.Equal(t, exitOK, r.code, r.stderr)
	var rec map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rec))
	require.EqualValues(t, 201, rec["original_status"])
	require.Equal(t, "ch_probe", rec["resource_id"])
	require.Equal(t, true, rec["fingerprint_match"])
	r = cli(t, db, nil, "lookup", "--fingerprint", hex.EncodeToString(dbtest.Fingerprint("other")), "idem:v1:probe")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"fingerprint_match": false`)
	r = cli(t, db, nil, "lookup", "idem:v1:lost")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stdout, `"original_status": 0`)
	r = cli(t, db, nil, "lookup", "idem:v1:nope")
	require.Equal(t, exitNo, r.code)
	require.Empty(t, r.stdout)

	// query pages with a cursor
	from := now.Add(-48 * time.Hour).Format(time.RFC3339)
	to := now.Format(time.RFC3339)
	r = cli(t, db, nil, "query", "--scope-prefix", "idem:v1:", "--created-from", from, "--created-to", to, "--limit", "1")
	require.Equal(t, exitOK, r.code, r.stderr)
	var page struct {
		Records    []map[string]any
		NextCursor string `json:"next_cursor"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.Len(t, page.Records, 1)
	require.Equal(t, "idem:v1:lost", page.Records[0]["scoped_key"])
	r = cli(t, db, nil, "query", "--scope-prefix", "idem:v1:", "--created-from", from, "--created-to", to, "--limit", "1", "--cursor", page.NextCursor)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "idem:v1:probe")
	require.NotContains(t, r.stdout, "next_cursor")
}

func TestBadInputIsOneClearLine(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown command", nil, []string{"bogus"}, `unknown command "bogus"`},
		{"unknown flag", nil, []string{"sweep", "--bogus"}, "flag provided but not defined: -bogus"},
		{"zero batch", nil, []string{"sweep", "--batch", "0"}, "--batch must be at least 1"},
		{"huge batch", nil, []string{"sweep", "--batch", "50001"}, "between 1 and 50000"},
		{"short lead", nil, []string{"partitions", "--lead-months", "1"}, "at least 2"},
		{"negative retention", nil, []string{"partitions", "--retention-months", "-1"}, "must not be negative"},
		{"lookup without key", nil, []string{"lookup"}, "want 1 argument(s), got 0"},
		{"lookup bad fingerprint", nil, []string{"lookup", "k", "--fingerprint", "zz"}, "--fingerprint is not hex"},
		{"lookup empty key", nil, []string{"lookup", ""}, "invalid key: empty"},
		{"lookup NUL key", nil, []string{"lookup", "idem:v1:a\x00b"}, "invalid key"},
		{"query NUL scope prefix", nil, []string{"query", "--scope-prefix", "idem:\x00", "--created-from", "2026-01-01T00:00:00Z", "--created-to", "2026-02-01T00:00:00Z"}, "invalid query"},
		{"query bad time", nil, []string{"query", "--scope-prefix", "idem:", "--created-from", "yesterday", "--created-to", "2026-01-01T00:00:00Z"}, "--created-from is not an RFC 3339 time"},
		{"query reversed window", nil, []string{"query", "--scope-prefix", "idem:", "--created-from", "2026-02-01T00:00:00Z", "--created-to", "2026-01-01T00:00:00Z"}, "created_from must be before created_to"},
		{"query zero limit", nil, []string{"query", "--limit", "0", "--scope-prefix", "idem:", "--created-from", "2026-01-01T00:00:00Z", "--created-to", "2026-02-01T00:00:00Z"}, "--limit must be at least 1, got 0"},
		{"verify zero window", nil, []string{"verify", "--recent", "0"}, "--recent must be a positive duration, got 0s"},
		{"verify negative window", nil, []string{"verify", "--recent", "-1h"}, "--recent must be a positive duration, got -1h0m0s"},
		{"emit-metrics not a boolean", nil, []string{"lookup", "--emit-metrics=maybe", "k"}, "invalid boolean value"},
		{"query bad cursor", nil, []string{"query", "--scope-prefix", "idem:", "--created-from", "2026-01-01T00:00:00Z", "--created-to", "2026-02-01T00:00:00Z", "--cursor", "%%%"}, "invalid cursor"},
		{"bad env duration", map[string]string{"SWEEP_PAUSE": "soon"}, []string{"sweep"}, `SWEEP_PAUSE: not a duration`},
		{"bad env pause ratio", map[string]string{"SWEEP_PAUSE_RATIO": "NaN"}, []string{"sweep"}, `SWEEP_PAUSE_RATIO: not a decimal number: "NaN"`},
		{"pause ratio out of range", nil, []string{"sweep", "--pause-ratio", "100"}, "--pause-ratio: sweep pause ratio must be between 0 (none) and 99, got 100"},
		{"pause ratio NaN", nil, []string{"sweep", "--pause-ratio", "NaN"}, `invalid value "NaN" for flag -pause-ratio: not a decimal number`},
		{"negative pause ratio", nil, []string{"sweep", "--pause-ratio", "-2"}, "--pause-ratio: sweep pause ratio must be between 0 (none) and 99, got -2"},
		{"pause ratio not a number", nil, []string{"sweep", "--pause-ratio", "lots"}, `invalid value "lots" for flag -pause-ratio: not a decimal number`},
		{"pause ratio in hex", nil, []string{"sweep", "--pause-ratio", "0x1p2"}, `invalid value "0x1p2" for flag -pause-ratio: not a decimal number`},
		{"pause ratio too small to hold", nil, []string{"sweep", "--pause-ratio", "1e-400"}, `invalid value "1e-400" for flag -pause-ratio: is not 0 but too small to hold`},
		{"bad env mode", map[string]string{"SWEEP_MISSING_PARTITION": "maybe"}, []string{"sweep"}, `SWEEP_MISSING_PARTITION: want create or fail`},
		{"no database", map[string]string{"DATABASE_URL": ""}, []string{"verify"}, "set DATABASE_URL"},
		{"database URL with password is not echoed", map[string]string{"DATABASE_URL": "postgres://u:s3cret@[::1"}, []string{"verify"}, "not a valid PostgreSQL connection string"},
		// An unescaped '@' in the password puts its tail ("s3cret") where pgx
		// reads the host: refused before any error could print that host or
		// any lookup could send it to DNS.
		{"a password with an unescaped @ in DATABASE_URL is not echoed", map[string]string{"DATABASE_URL": "postgres://app:Xy@s3cret@10.0.0.5:5432/app"}, []string{"verify"}, "percent-encode @ / : ? #"},
		{"a verify-full URL with an unescaped @ is not echoed", map[string]string{"DATABASE_URL": "postgres://app:Xy@s3cret@db.invalid:5432/app?sslmode=verify-full&connect_timeout=2"}, []string{"verify"}, "DATABASE_URL: database URL is ambiguous"},
		{"reconcile without redis", nil, []string{"redis-reconcile"}, "--redis-url or REDIS_URL is required"},
		{"reconcile redis URL with password is not echoed", nil, []string{"redis-reconcile", "--redis-url", "http://u:s3cret@host"}, "--redis-url is not a redis:// or rediss:// URL"},
		{"reconcile URL in the wrong place is not echoed", nil, []string{"redis-reconcile", "redis://:s3cret@host:6379"}, `want 0 argument(s), got 1: ["redis://REDACTED@host:6379"]`},
		{"reconcile URL as a flag's value is not echoed", nil, []string{"redis-reconcile", "--dry-run=redis://u:s3cret@host"}, `invalid boolean value "redis://REDACTED@host"`},
		{"a password with @ and / is not echoed", nil, []string{"redis-reconcile", "redis://u:s3/cr@et@host"}, `["redis://REDACTED@host"]`},
		{"a key=value password is not echoed", nil, []string{"redis-reconcile", "host=db password=s3cret"}, `password=REDACTED`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := cli(t, db, tc.env, tc.args...)
			requireOneLineError(t, r, tc.want)
			require.NotContains(t, r.stderr, "s3cret")
		})
	}
}

// --emit-metrics takes the spellings of any boolean flag.
func TestEmitMetricsSpellings(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	for flag, on := range map[string]bool{"--emit-metrics": true, "--emit-metrics=true": true, "-emit-metrics=1": true, "--emit-metrics=false": false, "-emit-metrics=0": false} {
		r := cli(t, db, nil, "lookup", flag, "idem:v1:none")
		require.Equal(t, exitNo, r.code, "%s: %s", flag, r.stderr)
		require.Equal(t, on, strings.Contains(r.stderr, "idempotency_archive_lookup_duration_ms"), "%s", flag)
	}
}

// A migration into an empty schema logs JSON lines, like everything else.
func TestMigrateLogsJSON(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	empty := db.Schema + "_empty"
	_, err := db.Pool.Exec(context.Background(), "CREATE SCHEMA "+empty)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP SCHEMA "+empty+" CASCADE") })
	r := cli(t, nil, map[string]string{"DATABASE_URL": dbtest.WithSearchPath(t, db.URL, empty)}, "migrate")
	require.Equal(t, exitOK, r.code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	require.NotEmpty(t, lines)
	for _, line := range lines {
		require.True(t, json.Valid([]byte(line)), "not a JSON log line: %q", line)
	}
	require.Contains(t, r.stderr, `"msg":"applying migration"`)
}

func TestUnreachableDatabaseIsOneLine(t *testing.T) {
	t.Parallel()
	r := cli(t, nil, map[string]string{"DATABASE_URL": "postgres://nobody:pw@127.0.0.1:1/x?connect_timeout=2"}, "verify")
	requireOneLineError(t, r, "connect")
	require.NotContains(t, r.stderr, "pw@")
	require.Equal(t, 1, strings.Count(r.stderr, "connection refused"), "each distinct failure once: %s", r.stderr)
}

// A key or value that looks like a flag is data: no panic, no help text, a
// real answer from the database.
func TestFlagLookingKeysAreData(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "-h", Status: 201, ExpiredAt: time.Now().Add(-time.Hour)})

	r := cli(t, db, nil, "lookup", "--", "-h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"original_status": 201`)

	r = cli(t, db, nil, "lookup", "--", "--help")
	require.Equal(t, exitNo, r.code, r.stderr)
	require.Contains(t, r.stderr, `not in the archive: "--help"`)

	from, to := time.Now().Add(-48*time.Hour).UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339)
	r = cli(t, db, nil, "query", "--scope-prefix", "-h", "--created-from", from, "--created-to", to)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"scoped_key": "-h"`)

	// -h as a flag is still help, needing no database.
	r = cli(t, nil, map[string]string{"DATABASE_URL": ""}, "lookup", "-h")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stderr, "usage of archivectl lookup")
	// Every spelling of help is help, --emit-metrics beside it included.
	for _, args := range [][]string{{"sweep", "--h"}, {"sweep", "--help=true"}, {"sweep", "--emit-metrics", "-h"}, {"lookup", "--emit-metrics", "-h"}} {
		r = cli(t, nil, map[string]string{"DATABASE_URL": "", "SWEEP_PAUSE": "bad"}, args...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		require.Contains(t, r.stderr, "usage of archivectl", args)
	}
	// --emit-metrics before "--" is the flag; after it, data.
	r = cli(t, db, nil, "lookup", "--emit-metrics", "--", "-h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "idempotency_archive_lookup_duration_ms")
	r = cli(t, db, nil, "lookup", "--", "--emit-metrics")
	require.Equal(t, exitNo, r.code, r.stderr)
	require.Contains(t, r.stderr, `not in the archive: "--emit-metrics"`)
	// A bad flag next to a data "-h" is one clear line.
	r = cli(t, nil, map[string]string{"DATABASE_URL": ""}, "lookup", "--bogus", "--", "-h")
	requireOneLineError(t, r, "flag provided but not defined: -bogus")
}

func TestHelp(t *testing.T) {
	t.Parallel()
	r := cli(t, nil, nil, "--help")
	require.Equal(t, exitOK, r.code)
	require.Contains(t, r.stderr, "usage: archivectl")
	r = cli(t, nil, nil)
	require.Equal(t, exitError, r.code)
}

func TestProgressLineOverwritesItself(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	p := &progress{w: &buf, backlog: func() (int64, error) { return 1234, nil }}
	p.report(sweep.Progress{Batches: 3, Moved: 30000, Elapsed: 2 * time.Second})
	// An EMF line written while the progress line is open starts a line of
	// its own: a log shipper reading the terminal gets JSON lines.
	em := metrics.New(p.lineWriter(), "Test")
	em.Emit(metrics.Count(metrics.ArchivedTotal, 30000))
	// The final line carries the backlog counted after the run, not the
	// last sample.
	p.done(sweep.Result{Batches: 4, Moved: 40000, DurationMS: 4000, Backlog: 0})
	lines := strings.Split(buf.String(), "\n")
	require.Len(t, lines, 4, buf.String())
	require.Equal(t, "\rsweep: 30000 rows moved in 3 batches, 15000 rows/s, backlog left 1234   ", lines[0])
	require.True(t, json.Valid([]byte(lines[1])), "the EMF line is JSON on its own: %q", lines[1])
	require.Equal(t, "\rsweep: 40000 rows moved in 4 batches, 10000 rows/s, backlog left 0   ", lines[2])
	require.Empty(t, lines[3])
}

// An interrupted sweep fails the same way whether the signal lands during a
// batch or during the pause between batches.
func TestAnInterruptedSweepIsAnErrorWhereverItLands(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	for i := range 50 {
		dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("k%02d", i), Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb bytes.Buffer
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return db.URL
		}
		return ""
	}
	// A long pause: the cancel lands while the sweep sleeps after batch 1,
	// once that batch has committed (however slow a loaded machine makes it).
	go func() {
		defer cancel()
		// At most a minute: a sweep that never commits fails the test below
		// rather than hanging it.
		for n, t0 := 0, time.Now(); ctx.Err() == nil && n == 0 && time.Since(t0) < time.Minute; time.Sleep(20 * time.Millisecond) {
			_ = db.Pool.QueryRow(ctx, "SELECT count(*) FROM idempotency_key_archive").Scan(&n)
		}
		time.Sleep(100 * time.Millisecond)
	}()
	code := run(ctx, []string{"sweep", "--batch", "1", "--pause", "10m"}, &out, &errb, getenv)
	require.Equal(t, exitError, code, errb.String())
	require.Contains(t, errb.String(), "sweep canceled after 1 batches")
	require.Contains(t, out.String(), `"stopped": "canceled"`)
}

func TestHostileRetentionLosesNoRow(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 3)
	cur := partition.MonthStart(time.Now())
	for i := -4; i <= 3; i++ {
		dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: fmt.Sprint("k", i), Status: 201, ExpiredAt: cur.AddDate(0, i, 0).Add(time.Hour)})
	}
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{nil, []string{"partitions", "--retention-months", "1000000000000000"}, "--retention-months: partition retention of 1000000000000000 months is more than 1200 (100 years); to keep the archive forever, set 0"},
		{nil, []string{"partitions", "--retention-months", fmt.Sprint(math.MaxInt)}, "to keep the archive forever, set 0"},
		{nil, []string{"partitions", "--dry-run", "--retention-months", "1201"}, "more than 1200"},
		{nil, []string{"partitions", "--retention-months", "-3"}, "must not be negative"},
		{nil, []string{"partitions", "--compact-per-run", "25"}, "--compact-per-run: partitions compacted per run must be 0 (none) to 24, got 25"},
		{nil, []string{"partitions", "--compact-per-run", "-1"}, "--compact-per-run: partitions compacted per run must be 0 (none) to 24, got -1"},
		{map[string]string{"PARTITION_RETENTION_MONTHS": "1000000000000000"}, []string{"partitions"}, "PARTITION_RETENTION_MONTHS: partition retention of 1000000000000000 months"},
		{map[string]string{"PARTITION_RETENTION_MONTHS": fmt.Sprint(math.MaxInt)}, []string{"verify"}, "PARTITION_RETENTION_MONTHS"},
	} {
		r := cli(t, db, tc.env, tc.args...)
		requireOneLineError(t, r, tc.want)
		require.EqualValues(t, 8, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"), tc.args)
	}
}

func TestADefaultPartitionIsReportedAndFailsVerify(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	_, err := db.Pool.Exec(context.Background(), "CREATE TABLE archive_catchall PARTITION OF idempotency_key_archive DEFAULT")
	require.NoError(t, err)

	// partitions keeps managing and names the DEFAULT partition
	r := cli(t, db, nil, "partitions", "--lead-months", "4")
	require.Equal(t, exitOK, r.code, r.stderr)
	var res partition.Result
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	require.Len(t, res.Created, 1)
	require.Len(t, res.Foreign, 1)
	require.Equal(t, "archive_catchall", res.Foreign[0].Name)
	require.Equal(t, "DEFAULT", res.Foreign[0].Bound)
	r = cli(t, db, nil, "partitions", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "-- not managed: archive_catchall DEFAULT: a DEFAULT partition")

	// verify fails that check, saying what to do
	r = cli(t, db, nil, "verify")
	require.Equal(t, exitNo, r.code, r.stderr)
	require.Contains(t, r.stdout, "FAIL  partitions exist two months ahead")
	require.Contains(t, r.stdout, "DEFAULT partition archive_catchall: move its rows into monthly partitions and detach it")

	// a month whose rows sit in DEFAULT fails with its name, after the summary
	next := partition.MonthStart(time.Now()).AddDate(0, 5, 0)
	dbtest.InsertArchive(t, db.Pool, dbtest.ArchiveRow{Key: "in default", Status: 201, ExpiredAt: next.Add(time.Hour)})
	r = cli(t, db, nil, "partitions", "--lead-months", "5")
	requireOneLineError(t, r, "the DEFAULT partition archive_catchall holds rows of this month")
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res))
	require.Equal(t, partition.Name(next), res.Failed[0].Partition)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

// A sweep process killed with SIGKILL mid-batch (an OOM kill, a lost host)
// loses nothing: the batch it was in rolls back, and the next run finishes
// the job with every key in exactly one place. The process is killed again
// and again, each time only while pg_stat_activity shows its backend inside
// a transaction that has written (a batch, not a pause between batches), so
// the kills land where a half-moved batch could be left.
func TestASweepKilledWithSIGKILLLosesNothing(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	ctx := context.Background()
	const total = 30_000
	_, err := db.Pool.Exec(ctx, `
		INSERT INTO idempotency_keys (scoped_key, fingerprint, state, status_code, response, expires_at, created_at)
		SELECT 'idem:v1:k' || i, sha256(i::text::bytea), 'completed', 201, jsonb_build_object('id', 'ch_' || i),
		       now() - interval '1 hour' - i * interval '1 millisecond', now() - interval '2 days'
		  FROM generate_series(1, $1) AS i`, total)
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "archivectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	// inBatch waits until the sweep's backend is inside a writing
	// transaction, or the process has had its chance.
	inBatch := func(app string, until time.Time) bool {
		for time.Now().Before(until) {
			var n int64
			_ = db.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
				AND backend_xid IS NOT NULL AND state IN ('active', 'idle in transaction')`, app).Scan(&n)
			if n > 0 {
				return true
			}
			time.Sleep(time.Millisecond)
		}
		return false
	}
	const kills = 12
	landed, left := 0, int64(total)
	for attempt := 0; landed < kills && attempt < 3*kills; attempt++ {
		app := fmt.Sprintf("sigkill-%d", attempt)
		cmd := exec.Command(bin, "sweep", "--batch", "200", "--pause", "2ms")
		cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "PGAPPNAME="+app)
		require.NoError(t, cmd.Start())
		deadline := time.Now().Add(10 * time.Second)
		hit := inBatch(app, deadline)
		if hit {
			// Spread the kills over the run: a random moment after its
			// first batch, then inside a batch again.
			time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
			hit = inBatch(app, deadline)
		}
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		// The backend outlives its client: a COMMIT the process sent just
		// before it died still commits. Count once the backend is gone,
		// or a batch committed between the two counts is in both.
		require.Eventually(t, func() bool {
			return dbtest.Count(t, db.Pool, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app) == 0
		}, 30*time.Second, 5*time.Millisecond, "the killed sweep's backend never ended")
		now := dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys")
		require.LessOrEqual(t, now, left, "a killed sweep put rows back")
		left = now
		if hit {
			landed++
		}
		require.Positive(t, left, "the sweep drained before it was killed %d times inside a batch: make the table bigger", kills)
	}
	t.Logf("kills inside a writing transaction: %d, rows left for the last run: %d", landed, left)
	require.Equal(t, kills, landed, "the kills did not land inside batches")
	// None of the killed batches left anything half-moved.
	require.EqualValues(t, total, left+dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))

	r := cli(t, db, nil, "sweep", "--pause", "0s", "--pause-ratio", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"))
	require.EqualValues(t, total, dbtest.Count(t, db.Pool, "SELECT count(DISTINCT scoped_key) FROM idempotency_key_archive"), "none lost")
	require.EqualValues(t, total, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"), "none twice")
}

// redis-reconcile archives the Redis store's keys kept without expiry and
// exits 1 while one is left (and says which).
func TestRedisReconcile(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	client, prefix := testenv.Redis(t)
	ctx := context.Background()
	fp := dbtest.Fingerprint("a")
	reg, err := livestore.NewRedis(client, db.Pool, prefix).Register(ctx, idempotency.Registering{Key: "idem:v1:kept", Fingerprint: fp, TTL: time.Hour})
	require.NoError(t, err)
	// Completed without expiry, as a completion whose archive write failed
	// leaves it.
	kept := prefix + "idem:v1:kept"
	require.NoError(t, client.HSet(ctx, kept, "state", "completed", "status", "201").Err())
	require.NoError(t, client.Persist(ctx, kept).Err())
	stuck := prefix + "idem:v1:stuck"
	require.NoError(t, client.HSet(ctx, stuck, "state", "in_flight").Err())
	t.Cleanup(func() { client.Del(context.Background(), kept, stuck) })
	redisURL := map[string]string{"REDIS_URL": os.Getenv("REDIS_URL")}

	r := cli(t, db, redisURL, "redis-reconcile", "--prefix", prefix, "--dry-run")
	require.Equal(t, exitNo, r.code, r.stderr)
	require.JSONEq(t, `{"scanned":2,"kept":1,"archived":1,"failed":1,"already":0}`, r.stdout)
	require.Contains(t, r.stderr, strconv.Quote(stuck)+": a hash without expiry that is not completed")
	require.Equal(t, time.Duration(-1), client.PTTL(ctx, kept).Val(), "a dry run changes nothing")

	require.NoError(t, client.Del(ctx, stuck).Err())
	r = cli(t, db, redisURL, "redis-reconcile", "--prefix", prefix, "--dry-run")
	require.Equal(t, exitNo, r.code, "a dry run leaves what it found: %s", r.stderr)
	r = cli(t, db, nil, "redis-reconcile", "--redis-url", redisURL["REDIS_URL"], "--prefix", prefix)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.JSONEq(t, `{"scanned":1,"kept":1,"archived":1,"failed":0,"already":0}`, r.stdout)
	require.InDelta(t, time.Until(reg.Entry.ExpiresAt).Seconds(), client.PTTL(ctx, kept).Val().Seconds(), 60)
	require.Positive(t, client.PTTL(ctx, kept).Val())
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:kept' AND status_code = 201"))
}
