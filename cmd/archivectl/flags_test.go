package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/sweep"
)

// Whole-number flags are read in base 10, as the variables are
// (PARTITION_RETENTION_MONTHS=012 is 12): the flag package's own reads base
// 0, where --retention-months 012 is octal 10 and retires two months more
// than asked, for good. Pinned on the dry run's DROP statements, on a
// sweep's batch size and on a query's page size.
func TestWholeNumberFlagsAreBase10LikeTheVariables(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 14)
	drops := func(env map[string]string, args ...string) int {
		t.Helper()
		r := cli(t, db, env, append([]string{"partitions", "--dry-run"}, args...)...)
		require.Equal(t, exitOK, r.code, "%v: %s", args, r.stderr)
		return strings.Count(r.stdout, "DROP TABLE")
	}
	want := drops(nil, "--retention-months", "12")
	require.Positive(t, want, "14 months back, 12 kept: some are retired")
	require.Less(t, want, drops(nil, "--retention-months", "10"), "the test tells 12 from 10")
	require.Equal(t, want, drops(nil, "--retention-months", "012"), "012 is 12, not octal 10")
	require.Equal(t, want, drops(nil, "--retention-months", "+12"), "a sign, as the variables take")
	require.Equal(t, want, drops(map[string]string{"PARTITION_RETENTION_MONTHS": "012"}), "the variable reads 012 as 12 too")

	// --batch 010 is 10 rows, not 8: nine expired rows move in one batch.
	for i := range 9 {
		dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: fmt.Sprintf("idem:v1:b%d", i), Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	}
	r := cli(t, db, nil, "sweep", "--batch", "010", "--pause", "0", "--pause-ratio", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	var sw sweep.Result
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &sw))
	require.EqualValues(t, 9, sw.Moved)
	require.Equal(t, 1, sw.Batches, "a batch of 10 moves the 9 rows at once")

	// --limit 010 is a page of 10: the nine archived rows, no next page.
	from, to := time.Now().Add(-48*time.Hour).UTC().Format(time.RFC3339), time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	r = cli(t, db, nil, "query", "--scope-prefix", "idem:v1:b", "--created-from", from, "--created-to", to, "--limit", "010")
	require.Equal(t, exitOK, r.code, r.stderr)
	var page struct {
		Records    []json.RawMessage
		NextCursor string `json:"next_cursor"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &page))
	require.Len(t, page.Records, 9)
	require.Empty(t, page.NextCursor)
}

// What the variables refuse, the whole-number flags refuse, each in one
// line naming the flag, before any configuration or database is touched
// (no DATABASE_URL here): hex, octal and binary prefixes and underscores,
// which the flag package's base-0 reading took. The range checks after
// parsing keep their messages.
func TestWholeNumberFlagsRefuseWhatTheVariablesRefuse(t *testing.T) {
	t.Parallel()
	noDB := map[string]string{"DATABASE_URL": ""}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"partitions", "--retention-months", "0xA"}, `invalid value "0xA" for flag -retention-months: not a whole number`},
		{[]string{"partitions", "--retention-months", "1_0"}, `invalid value "1_0" for flag -retention-months: not a whole number`},
		{[]string{"partitions", "--lead-months", "0b11"}, `invalid value "0b11" for flag -lead-months: not a whole number`},
		{[]string{"partitions", "--compact-per-run", "0o1"}, `invalid value "0o1" for flag -compact-per-run: not a whole number`},
		{[]string{"sweep", "--batch", "1e3"}, `invalid value "1e3" for flag -batch: not a whole number`},
		{[]string{"sweep", "--batch", "99999999999999999999"}, `invalid value "99999999999999999999" for flag -batch: out of range`},
		{[]string{"query", "--limit", "0x0"}, `invalid value "0x0" for flag -limit: not a whole number`},
		{[]string{"query", "--limit", ""}, `invalid value "" for flag -limit: not a whole number`},
	} {
		r := cli(t, nil, noDB, tc.args...)
		requireOneLineError(t, r, tc.want)
	}
	// Parsed, a value is range-checked as before.
	db := dbtest.New(t)
	requireOneLineError(t, cli(t, db, nil, "sweep", "--batch", "000"), "--batch must be at least 1, got 0")
	requireOneLineError(t, cli(t, db, nil, "partitions", "--lead-months", "+1"), "--lead-months must be at least 2, got 1")
}

// A flag given twice is refused (exit 2, one line, before any
// configuration or database is touched), as the Lambda functions refuse an
// option named twice: the flag package kept the last value silently, so
// "--dry-run --dry-run=false" ran for real and "--retention-months 36
// --retention-months 2" retired 34 months more than the first value said.
// The same value twice, and --emit-metrics (read before the command's
// flags), are refused alike. After "--" a flag's name is data.
func TestAFlagGivenTwiceIsRefused(t *testing.T) {
	t.Parallel()
	noDB := map[string]string{"DATABASE_URL": ""}
	fp := hex.EncodeToString(dbtest.Fingerprint("k"))
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"partitions", "--dry-run", "--retention-months", "36", "--retention-months", "2"}, "retention-months"},
		{[]string{"partitions", "--dry-run", "--dry-run=false"}, "dry-run"},
		{[]string{"partitions", "-dry-run", "--dry-run"}, "dry-run"},
		{[]string{"sweep", "--batch", "5", "-batch=5"}, "batch"},
		{[]string{"sweep", "--pause", "1s", "--pause", "0"}, "pause"},
		{[]string{"lookup", "k", "--fingerprint", fp, "--fingerprint", ""}, "fingerprint"},
		{[]string{"lookup", "--fingerprint", fp, "k", "--fingerprint", fp}, "fingerprint"},
		{[]string{"query", "--scope-prefix", "a", "--scope-prefix", "b"}, "scope-prefix"},
		{[]string{"verify", "--recent", "1h", "--recent", "24h"}, "recent"},
		{[]string{"redis-reconcile", "--prefix", "a:", "--prefix", "b:"}, "prefix"},
		{[]string{"lookup", "--emit-metrics", "k", "--emit-metrics=false"}, "emit-metrics"},
	} {
		r := cli(t, nil, noDB, tc.args...)
		requireOneLineError(t, r, "--"+tc.flag+" is given more than once: give each flag once")
		require.Empty(t, r.stdout, tc.args)
	}
	// After "--", a flag's name is a key: no repeat, the run goes on (to
	// the missing DATABASE_URL here).
	r := cli(t, nil, noDB, "lookup", "--fingerprint", fp, "--", "--fingerprint")
	requireOneLineError(t, r, "DATABASE_URL")
	r = cli(t, nil, noDB, "lookup", "--emit-metrics", "--", "--emit-metrics")
	requireOneLineError(t, r, "DATABASE_URL")
	// Help still names each flag's type.
	r = cli(t, nil, noDB, "lookup", "-h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "-fingerprint string")
	r = cli(t, nil, noDB, "partitions", "-h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stderr, "-retention-months months")
	require.NotContains(t, r.stderr, "panic")
}

// A value that looks like --emit-metrics, given as the refusal of one given
// apart advises (--name=value), is the value the line's writer meant; given
// apart, it is still refused.
func TestAnEmitMetricsLikeValueGivenInlineIsTaken(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	from, to := time.Now().Add(-48*time.Hour).UTC().Format(time.RFC3339), time.Now().UTC().Format(time.RFC3339)
	r := cli(t, db, nil, "query", "--scope-prefix=-emit-metrics", "--created-from", from, "--created-to", to)
	t.Logf("exit %d: %s", r.code, r.stderr)
	require.Equal(t, exitOK, r.code, "a flag given as --name=value took nothing for its value: %s", r.stderr)

	r = cli(t, db, nil, "query", "--scope-prefix", "-emit-metrics", "--created-from", from, "--created-to", to)
	require.Equal(t, exitError, r.code, r.stderr)
	require.Contains(t, r.stderr, `--scope-prefix took "-emit-metrics" for its value`)
	r = cli(t, db, nil, "query", "--created-from", from, "--created-to", to, "--", "--scope-prefix=-emit-metrics")
	require.NotEqual(t, exitOK, r.code, "after --, a flag-like word is an argument, not an inline flag: %s", r.stderr)
}
