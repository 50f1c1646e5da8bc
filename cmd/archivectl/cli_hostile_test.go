package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// A flag's value echoed back in an error line is redacted like an argument
// is: an operator who pastes a connection string into the wrong flag must
// not find its password in a terminal's scrollback or a CI log.
func TestFlagValuesInErrorsAreRedacted(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	for _, args := range [][]string{
		{"lookup", "k", "--fingerprint", "postgres://u:s3cret@db.example:5432/app"},
		{"lookup", "k", "--fingerprint", "host=db password=s3cret"},
		{"query", "--scope-prefix", "idem:", "--created-from", "redis://:s3cret@cache:6379", "--created-to", "2026-01-01T00:00:00Z"},
		{"query", "--scope-prefix", "idem:", "--created-from", "2026-01-01T00:00:00Z", "--created-to", "postgres://u:s3cret@db"},
	} {
		r := cli(t, db, nil, args...)
		requireOneLineError(t, r, "REDACTED")
		require.NotContains(t, r.stderr, "s3cret", args)
	}
}

// A duration flag is read as the configuration variables are: a nonzero
// value too short to be one is refused, never read as 0 (--max-duration 0
// is "until drained", --pause 0 "no fixed pause"), and one too long to hold is
// "out of range", not the flag package's bare "parse error".
func TestDurationFlagsAreNeverSilentlyZero(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	dbtest.InsertLive(t, db.Pool, dbtest.LiveRow{Key: "idem:v1:left", Status: 201, ExpiresAt: time.Now().Add(-time.Hour)})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sweep", "--max-duration", "0.0000001ms"}, `invalid value "0.0000001ms" for flag -max-duration: is not 0 but shorter than a nanosecond`},
		{[]string{"sweep", "--pause", "0.0000001ms"}, `invalid value "0.0000001ms" for flag -pause: is not 0 but shorter than a nanosecond`},
		{[]string{"verify", "--recent", "100000000h"}, `invalid value "100000000h" for flag -recent: out of range`},
		{[]string{"sweep", "--pause", "NaN"}, `invalid value "NaN" for flag -pause: not a duration such as 200ms, 30s or 24h`},
	} {
		r := cli(t, db, nil, tc.args...)
		requireOneLineError(t, r, tc.want)
		require.Empty(t, r.stdout, "nothing ran: %v", tc.args)
	}
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"), "no sweep ran")
	// Zero and ordinary values still work.
	r := cli(t, db, nil, "sweep", "--pause", "0", "--max-duration", "1m")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_keys"))
}

// A Redis URL taken from REDIS_URL is named as such when it is refused.
func TestABadRedisURLFromTheEnvironmentNamesIt(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	r := cli(t, db, map[string]string{"REDIS_URL": "http://u:s3cret@cache"}, "redis-reconcile", "--prefix", "p")
	requireOneLineError(t, r, "REDIS_URL is not a redis:// or rediss:// URL")
	require.NotContains(t, r.stderr, "s3cret")
}

// An unreachable Redis is one error line on stderr, as every error is: not
// the client library's own log lines (one per dial attempt) before it.
func TestUnreachableRedisIsOneLine(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	// A Redis store on record, so the run gets as far as Redis.
	_, err := db.Pool.Exec(context.Background(), "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, true, now(), now() + interval '1 day')")
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "archivectl")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	cmd := exec.Command(bin, "redis-reconcile", "--prefix", "p")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+db.URL, "REDIS_URL=redis://:s3cret@127.0.0.1:1/0")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	require.ErrorAs(t, err, &exit)
	requireOneLineError(t, result{exit.ExitCode(), stdout.String(), stderr.String()}, "connection refused")
	require.NotContains(t, stderr.String(), "s3cret")
}
