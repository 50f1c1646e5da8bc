package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// recordRedisLease records a Redis store's lease in the test's archive, as
// a Redis store's first registration does: redis-reconcile refuses an
// archive without one.
func recordRedisLease(t *testing.T, db *dbtest.DB) {
	t.Helper()
	_, err := db.Pool.Exec(context.Background(), "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, true, now(), now() + interval '1 day')")
	require.NoError(t, err)
}

// keepHash writes the completed hash of key without expiry, with every
// field a completion writes, as a completion whose archive row could not
// be written leaves it; extra fields override.
func keepHash(t *testing.T, c *redis.Client, prefix, key string, extra ...any) {
	t.Helper()
	ctx := context.Background()
	now := time.Now()
	fields := []any{"fp", string(dbtest.Fingerprint(key)), "state", "completed", "status", "201", "body", `{"id":"ch_1"}`,
		"ct", "application/json", "rid", "ch_1", "has_rid", "1",
		"created", strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10), "expires", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10),
		"reg", "0123456789abcdef", "key", key}
	require.NoError(t, c.HSet(ctx, prefix+key, append(fields, extra...)...).Err())
	require.NoError(t, c.Persist(ctx, prefix+key).Err())
	t.Cleanup(func() { c.Del(context.Background(), prefix+key) })
}

func reconcileSummary(t *testing.T, r result) livestore.ReconcileResult {
	t.Helper()
	var res livestore.ReconcileResult
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), "stdout: %q stderr: %q", r.stdout, r.stderr)
	return res
}

// Every key without expiry under the prefix that the run leaves is counted
// as failed and named on stderr with why, and the run exits 1 (README: "exits
// 1 while a hash without expiry is left, naming each and why"): a hash that
// lost its state field and a key that is not a hash were passed over in
// silence, with exit 0, as if nothing were left.
func TestRedisReconcileNamesEveryKeyWithoutExpiryItLeaves(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	recordRedisLease(t, db)
	client, prefix := testenv.Redis(t)
	ctx := context.Background()
	keepHash(t, client, prefix, "idem:v1:fine")
	keepHash(t, client, prefix, "idem:v1:nostate")
	require.NoError(t, client.HDel(ctx, prefix+"idem:v1:nostate", "state").Err())
	str := prefix + "idem:v1:string"
	require.NoError(t, client.Set(ctx, str, "x", 0).Err())
	t.Cleanup(func() { client.Del(context.Background(), str) })
	env := map[string]string{"REDIS_URL": os.Getenv("REDIS_URL")}

	for _, dryRun := range []bool{true, false} {
		args := []string{"redis-reconcile", "--prefix", prefix}
		if dryRun {
			args = append(args, "--dry-run")
		}
		r := cli(t, db, env, args...)
		require.Equal(t, exitNo, r.code, "dry run %v: %s", dryRun, r.stderr)
		require.Equal(t, livestore.ReconcileResult{Scanned: 3, Kept: 1, Archived: 1, Failed: 2}, reconcileSummary(t, r), "dry run %v", dryRun)
		require.Contains(t, r.stderr, "archivectl redis-reconcile: "+strconv.Quote(prefix+"idem:v1:nostate")+": a hash without expiry and without a state: left alone")
		require.Contains(t, r.stderr, "archivectl redis-reconcile: "+strconv.Quote(str)+": a key without expiry that is not a hash: left alone")
		require.Equal(t, 2, strings.Count(r.stderr, "\n"), "one line each: %q", r.stderr)
	}
	require.Equal(t, time.Duration(-1), client.PTTL(ctx, prefix+"idem:v1:nostate").Val(), "left as it was")
	require.Equal(t, time.Duration(-1), client.PTTL(ctx, str).Val(), "left as it was")
	require.Positive(t, client.PTTL(ctx, prefix+"idem:v1:fine").Val())
}

// Nothing at all under the prefix is what a mistyped --prefix, or a Redis
// URL naming another database index, finds: the run says so on stderr,
// naming both. An empty store is legitimate (a fresh one, or an idle one
// whose keys all expired), so it is a warning and the exit status stays 0.
func TestRedisReconcileWarnsWhenNoKeyIsUnderThePrefix(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	recordRedisLease(t, db)
	client, prefix := testenv.Redis(t)
	keepHash(t, client, prefix, "idem:v1:kept")
	redisURL := os.Getenv("REDIS_URL")
	env := map[string]string{"REDIS_URL": redisURL}
	opts, err := redis.ParseURL(redisURL)
	require.NoError(t, err)

	typo := strings.TrimSuffix(prefix, ":") + ";"
	r := cli(t, db, env, "redis-reconcile", "--prefix", typo)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.JSONEq(t, `{"scanned":0,"kept":0,"archived":0,"failed":0,"already":0}`, r.stdout)
	require.Equal(t, fmt.Sprintf("archivectl redis-reconcile: warning: no key under prefix %q in Redis database %d: is this the store's prefix and database?\n", typo, opts.DB), r.stderr)

	// The right prefix in another database index.
	u, err := url.Parse(redisURL)
	require.NoError(t, err)
	other := (opts.DB + 7) % 16
	u.Path = "/" + strconv.Itoa(other)
	r = cli(t, db, nil, "redis-reconcile", "--redis-url", u.String(), "--prefix", prefix)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Equal(t, fmt.Sprintf("archivectl redis-reconcile: warning: no key under prefix %q in Redis database %d: is this the store's prefix and database?\n", prefix, other), r.stderr)
	require.Equal(t, time.Duration(-1), client.PTTL(context.Background(), prefix+"idem:v1:kept").Val(), "the store's kept hash is still left")

	// With a key under the prefix, no warning.
	r = cli(t, db, env, "redis-reconcile", "--prefix", prefix)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Empty(t, r.stderr)
}

// A dry run makes the checks the run makes before it writes: a hash whose
// key PostgreSQL's text cannot hold (not UTF-8, or with a NUL byte) counts
// as failed in both, not as archived in the dry run and failed in the run.
func TestRedisReconcileDryRunCountsAsFailedWhatTheRunCannotWrite(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	recordRedisLease(t, db)
	client, prefix := testenv.Redis(t)
	keepHash(t, client, prefix, "idem:v1:fine")
	keepHash(t, client, prefix, "idem:v1:bad\xff")
	keepHash(t, client, prefix, "idem:v1:a\x00b")
	keepHash(t, client, prefix, "idem:v1:badrid", "rid", "ch_\x00")
	env := map[string]string{"REDIS_URL": os.Getenv("REDIS_URL")}

	want := livestore.ReconcileResult{Scanned: 4, Kept: 4, Archived: 1, Failed: 3}
	dry := cli(t, db, env, "redis-reconcile", "--prefix", prefix, "--dry-run")
	require.Equal(t, exitNo, dry.code, dry.stderr)
	require.Equal(t, want, reconcileSummary(t, dry))
	wet := cli(t, db, env, "redis-reconcile", "--prefix", prefix)
	require.Equal(t, exitNo, wet.code, wet.stderr)
	require.Equal(t, want, reconcileSummary(t, wet))
	for _, r := range []result{dry, wet} {
		require.Contains(t, r.stderr, strconv.Quote(prefix+"idem:v1:bad\xff")+`: a completed hash whose key "idem:v1:bad\xff" is not UTF-8 or holds a NUL byte, which the archive cannot store: left alone`)
		require.Contains(t, r.stderr, strconv.Quote(prefix+"idem:v1:a\x00b")+`: a completed hash whose key "idem:v1:a\x00b" is not UTF-8`)
		require.Contains(t, r.stderr, strconv.Quote(prefix+"idem:v1:badrid")+`: a completed hash whose resource id "ch_\x00" is not UTF-8`)
	}
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

// Runs at once over the same kept hashes each write every row (ON
// CONFLICT DO NOTHING), but only the run whose script gave a hash its
// expiry back counts it as archived; the others count it as "already".
// Summed over the runs, archived is the number of hashes, not up to three
// times it.
func TestConcurrentRedisReconcilesCountEachHashArchivedOnce(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	recordRedisLease(t, db)
	client, prefix := testenv.Redis(t)
	const n = 1500
	for i := range n {
		keepHash(t, client, prefix, fmt.Sprintf("idem:v1:c%d", i))
	}
	env := map[string]string{"REDIS_URL": os.Getenv("REDIS_URL")}
	var wg sync.WaitGroup
	results := make([]result, 3)
	for i := range results {
		wg.Go(func() { results[i] = cli(t, db, env, "redis-reconcile", "--prefix", prefix) })
	}
	wg.Wait()
	archived, already := 0, 0
	for _, r := range results {
		require.Equal(t, exitOK, r.code, r.stderr)
		res := reconcileSummary(t, r)
		require.Zero(t, res.Failed)
		require.Equal(t, res.Kept, res.Archived+res.Already, "every kept hash is archived by this run or already: %+v", res)
		archived += res.Archived
		already += res.Already
	}
	t.Logf("archived %d, already %d, over the runs", archived, already)
	require.Equal(t, n, archived, "each hash counted archived by one run")
	require.EqualValues(t, n, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}

// A Redis URL whose database number is negative (/-1, ?db=-5) is accepted
// by redis.ParseURL, and go-redis then selects no database: the run would
// reconcile database 0's hashes, archiving and expiring them, while naming
// database -1. It is refused, as a URL that does not parse is.
func TestRedisReconcileRefusesANegativeDatabase(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	recordRedisLease(t, db)
	client, prefix := testenv.Redis(t)
	keepHash(t, client, prefix, "idem:v1:db0")
	for _, mangle := range []func(*url.URL){
		func(u *url.URL) { u.Path = "/-1" },
		func(u *url.URL) { u.Path = ""; u.RawQuery = "db=-5" },
	} {
		u, err := url.Parse(os.Getenv("REDIS_URL"))
		require.NoError(t, err)
		mangle(u)
		r := cli(t, db, nil, "redis-reconcile", "--redis-url", u.String(), "--prefix", prefix, "--dry-run")
		t.Logf("%s: exit %d stdout %q stderr %q", u, r.code, r.stdout, r.stderr)
		require.Equal(t, exitError, r.code, "a negative Redis database number must be refused, not read as database 0: %s", u)
		require.Contains(t, r.stderr, "--redis-url names Redis database -")
		require.NotContains(t, r.stderr, u.Host, "the URL is not echoed")
	}
	require.Equal(t, time.Duration(-1), client.PTTL(context.Background(), prefix+"idem:v1:db0").Val())
}

// A '#' in a Redis URL is a password's, not percent-encoded: parsed, it
// would start a fragment, and the password's start be read as the port and
// named in the dial error. The URL is refused without being echoed.
func TestRedisReconcileRefusesAURLWithAHash(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	r := cli(t, db, map[string]string{"REDIS_URL": "redis://:1234#secret@127.0.0.1:6379/0"}, "redis-reconcile", "--prefix", "p:")
	require.Equal(t, exitError, r.code)
	require.Contains(t, r.stderr, "REDIS_URL holds a '#'")
	require.NotContains(t, r.stderr, "1234")
	require.NotContains(t, r.stderr, "secret")
}

// --redis-url given with an empty value (an unset shell variable:
// --redis-url="$STAGING_REDIS") is refused, not replaced by REDIS_URL: the
// run would write archive rows and give back expiries on a server the
// operator did not name.
func TestAnEmptyRedisURLFlagIsRefused(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	recordRedisLease(t, db)
	client, prefix := testenv.Redis(t)
	keepHash(t, client, prefix, "idem:v1:elsewhere")
	env := map[string]string{"REDIS_URL": os.Getenv("REDIS_URL")}

	for _, args := range [][]string{
		{"redis-reconcile", "--redis-url=", "--prefix", prefix},
		{"redis-reconcile", "--redis-url", "", "--prefix", prefix},
	} {
		r := cli(t, db, env, args...)
		t.Logf("%q -> exit %d\nstdout: %s\nstderr: %s", args, r.code, r.stdout, r.stderr)
		require.Equal(t, exitError, r.code, "%q ran against REDIS_URL", args)
		require.Empty(t, r.stdout, "%q: nothing should have run", args)
		require.Contains(t, r.stderr, "--redis-url is empty")
	}
	// What the run did on the server REDIS_URL names.
	require.EqualValues(t, 0, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:elsewhere'"), "archived from REDIS_URL's server")
	require.Equal(t, int64(-1), int64(client.PTTL(context.Background(), prefix+"idem:v1:elsewhere").Val()), "the hash on REDIS_URL's server was given an expiry")
}
