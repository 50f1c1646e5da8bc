package livestore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A completion whose archive row could not be written keeps its hash
// without expiry; Reconcile archives it and gives the expiry back, and
// leaves every other hash, and what it cannot read, as it was.
func TestReconcileArchivesTheHashesKeptWithoutExpiry(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	fp := dbtest.Fingerprint("charge")
	register := func(key string) {
		t.Helper()
		reg, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
		require.NoError(t, err)
		require.True(t, reg.Fresh)
	}
	complete := func(ctx context.Context, key string) error {
		return s.Complete(ctx, key, idempotency.Completion{Fingerprint: fp, Token: []byte("0123456789abcdef"), Status: 201, Body: []byte(`{"id":"ch_1"}`), ResourceID: ptr("ch_1")})
	}

	// The archive stalls through the completion: the hash is kept.
	register("idem:v1:kept")
	stall, err := db.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = stall.Rollback(ctx) }()
	_, err = stall.Exec(ctx, "LOCK TABLE idempotency_key_archive IN SHARE ROW EXCLUSIVE MODE")
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, time.Second)
	require.ErrorContains(t, complete(short, "idem:v1:kept"), "kept in Redis without expiry")
	cancel()
	require.NoError(t, stall.Rollback(ctx))
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.prefix+"idem:v1:kept").Val())

	// Beside it: a completed hash archived as usual, one in flight, a
	// completed one without its times, and a key of another prefix that
	// an unescaped pattern would match.
	register("idem:v1:fine")
	require.NoError(t, complete(ctx, "idem:v1:fine"))
	register("idem:v1:running")
	require.NoError(t, s.client.HSet(ctx, s.prefix+"idem:v1:broken", "state", "completed", "status", "201", "fp", "x").Err())
	require.NoError(t, s.client.HSet(ctx, s.prefix+"idem:v1:stuck", "state", "in_flight", "fp", "x").Err())
	t.Cleanup(func() {
		s.client.Del(context.Background(), s.prefix+"idem:v1:broken", s.prefix+"idem:v1:stuck", s.prefix+"idem:v1:kept")
	})
	archived := func() int64 {
		return dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:kept'")
	}
	require.Zero(t, archived())

	reported := map[string]string{}
	report := func(key string, err error) { reported[key] = err.Error() }
	res, err := s.Reconcile(ctx, true, report)
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 5, Kept: 2, Archived: 1, Failed: 2}, res)
	require.Zero(t, archived(), "a dry run writes nothing")
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.prefix+"idem:v1:kept").Val())

	clear(reported)
	res, err = s.Reconcile(ctx, false, report)
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 5, Kept: 2, Archived: 1, Failed: 2}, res)
	require.EqualValues(t, 1, archived())
	var status int
	var rid string
	require.NoError(t, db.Pool.QueryRow(ctx, "SELECT status_code, resource_id FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:kept'").Scan(&status, &rid))
	require.Equal(t, 201, status)
	require.Equal(t, "ch_1", rid)
	ttl := s.client.PTTL(ctx, s.prefix+"idem:v1:kept").Val()
	require.InDelta(t, time.Hour.Seconds(), ttl.Seconds(), 60, "to the end of its window")
	require.Contains(t, reported[s.prefix+"idem:v1:broken"], "without its registration's times")
	require.Contains(t, reported[s.prefix+"idem:v1:stuck"], "not completed")
	require.Len(t, reported, 2)

	// Run again: nothing left to do.
	res, err = s.Reconcile(ctx, false, report)
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 5, Kept: 1, Failed: 2}, res, "the broken hash alone is still kept")
}

func ptr(s string) *string { return &s }

// Reconcile reads only its own prefix, whatever characters it holds.
func TestReconcileEscapesItsPrefix(t *testing.T) {
	t.Parallel()
	s, _ := newRedisStore(t)
	ctx := context.Background()
	_, err := s.Register(ctx, idempotency.Registering{Key: "idem:v1:lease", Fingerprint: dbtest.Fingerprint("a"), TTL: time.Hour})
	require.NoError(t, err)
	other := *s
	s.prefix += "t[1]*?:"
	other.prefix += "t1x:"
	require.NoError(t, s.client.HSet(ctx, other.prefix+"idem:v1:a", "state", "in_flight").Err())
	t.Cleanup(func() { s.client.Del(context.Background(), other.prefix+"idem:v1:a") })
	res, err := s.Reconcile(ctx, true, func(string, error) { t.Error("reported a key of another prefix") })
	require.NoError(t, err)
	require.Zero(t, res.Scanned)
	require.Equal(t, `a\[1\]\*\?:\\`, escapeGlob(`a[1]*?:\`))
}

// A prefix that is not the store's own (the start of another store's, one
// character short, none at all) would archive rows under keys no lookup
// asks for, and then let the hashes expire: such hashes are left alone.
// So are hashes whose fields no completion writes, and an archive that no
// Redis store has written to is refused.
func TestReconcileLeavesWhatIsNotItsOwn(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	// A Redis database of its own: the empty prefix below scans every key,
	// and other tests (of other packages too, run at the same time) keep
	// hashes without expiry in the shared one, as completions whose archive
	// row failed leave them. No other test uses database 15.
	opts := *s.client.Options()
	opts.DB = 15
	s.client = redis.NewClient(&opts)
	t.Cleanup(func() { _ = s.client.Close() })
	require.NoError(t, s.client.FlushDB(ctx).Err())
	base := s.prefix
	s.prefix = base + "idem:"
	_, err := NewRedis(s.client, db.NewPool(t), base).Reconcile(ctx, true, func(string, error) {})
	require.ErrorIs(t, err, ErrNoRedisStoreOnRecord)
	// The unbounded row an upgraded archive of any service holds (migration
	// 004) is no Redis store's lease.
	_, err = db.Pool.Exec(ctx, "INSERT INTO idempotency_writers (ttl_ms, skew_ms, bounded, first_used, used_until) VALUES (0, 0, false, '-infinity', 'infinity')")
	require.NoError(t, err)
	_, err = NewRedis(s.client, db.NewPool(t), base).Reconcile(ctx, true, func(string, error) {})
	require.ErrorIs(t, err, ErrNoRedisStoreOnRecord)

	fp := dbtest.Fingerprint("charge")
	reg, err := s.Register(ctx, idempotency.Registering{Key: "idem:v1:mine", Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
	require.NoError(t, err)
	// Kept without expiry, as a completion whose archive write failed
	// leaves it.
	hash := s.prefix + "idem:v1:mine"
	require.NoError(t, s.client.HSet(ctx, hash, "state", "completed", "status", "201").Err())
	require.NoError(t, s.client.Persist(ctx, hash).Err())
	t.Cleanup(func() { s.client.Del(context.Background(), hash) })
	created, expires := strconv.FormatInt(reg.Entry.CreatedAt.UnixMilli(), 10), strconv.FormatInt(reg.Entry.ExpiresAt.UnixMilli(), 10)
	// An older writer's hash (no key field) under a prefix of its own.
	legacy := base + "idem:eu:idem:v1:legacy"
	require.NoError(t, s.client.HSet(ctx, legacy, "fp", string(fp), "state", "completed", "status", "201", "created", created, "expires", expires).Err())
	t.Cleanup(func() { s.client.Del(context.Background(), legacy) })

	for _, prefix := range []string{"", base, base + "idem", base + "idem:eu"} {
		reported := 0
		res, err := NewRedis(s.client, db.Pool, prefix).Reconcile(ctx, false, func(string, error) { reported++ })
		require.NoError(t, err, "prefix %q", prefix)
		require.Zero(t, res.Archived, "prefix %q", prefix)
		require.Equal(t, res.Kept, reported, "prefix %q", prefix)
	}
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, hash).Val())
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, legacy).Val())
	// Under the store's own prefix, the legacy hash (another store's) is
	// still refused: its name less the prefix is no scoped key.
	res, err := s.Reconcile(ctx, true, func(string, error) {})
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 2, Kept: 2, Archived: 1, Failed: 1}, res)
	require.NoError(t, s.client.Del(ctx, legacy).Err())

	for field, value := range map[string]string{"status": "0", "fp": "short", "expires": created, "has_rid": "1"} {
		require.NoError(t, s.client.HSet(ctx, hash, field, value).Err())
		var why string
		res, err := s.Reconcile(ctx, false, func(_ string, err error) { why = err.Error() })
		require.NoError(t, err)
		require.Equal(t, ReconcileResult{Scanned: 1, Kept: 1, Failed: 1}, res, "%s %q", field, value)
		require.Contains(t, why, "left alone")
		require.NoError(t, s.client.HSet(ctx, hash, "status", "201", "fp", string(fp), "expires", expires).Err())
		require.NoError(t, s.client.HDel(ctx, hash, "has_rid").Err())
	}
	res, err = s.Reconcile(ctx, false, func(_ string, err error) { t.Error(err) })
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 1, Kept: 1, Archived: 1}, res)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:mine'"))
}
