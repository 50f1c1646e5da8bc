package livestore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
)

// A kept hash counts as archived only for the run whose script gave it its
// expiry back. Another run beside it (or the request's own later attempt)
// that gave it back first, between this run's read of the hash and its
// script, leaves this run's row written (ON CONFLICT DO NOTHING) and the
// hash "already" reconciled: counted as archived by both, concurrent runs
// summed to more hashes than there were.
func TestReconcileCountsAsArchivedOnlyTheExpiryItGaveBack(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	now := time.Now()
	keep := func(key string) (string, map[string]string) {
		t.Helper()
		hash := s.prefix + key
		require.NoError(t, s.client.HSet(ctx, hash, "fp", string(dbtest.Fingerprint(key)), "state", "completed", "status", "201",
			"created", strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10), "expires", strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10),
			"reg", "0123456789abcdef", "key", key).Err())
		t.Cleanup(func() { s.client.Del(context.Background(), hash) })
		h, err := s.client.HGetAll(ctx, hash).Result()
		require.NoError(t, err)
		return hash, h
	}

	hash, h := keep("idem:v1:mine")
	set, err := s.reconcileOne(ctx, hash, h, false)
	require.NoError(t, err)
	require.True(t, set, "this run gave the expiry back")
	require.Positive(t, s.client.PTTL(ctx, hash).Val())

	// Read without expiry, then given its expiry by someone else.
	hash, h = keep("idem:v1:theirs")
	require.NoError(t, s.client.PExpire(ctx, hash, time.Hour).Err())
	set, err = s.reconcileOne(ctx, hash, h, false)
	require.NoError(t, err)
	require.False(t, set, "another gave the expiry back first")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = 'idem:v1:theirs'"), "its row is written all the same")

	// Read, then changed (another registration's token) and still
	// without expiry: a key left as it was, reported, never "already".
	hash, h = keep("idem:v1:changed")
	require.NoError(t, s.client.HSet(ctx, hash, "reg", "fedcba9876543210").Err())
	_, err = s.reconcileOne(ctx, hash, h, false)
	require.ErrorContains(t, err, "changed since it was read and still has no expiry")
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, hash).Val())

	// Read, then gone.
	hash, h = keep("idem:v1:gone")
	require.NoError(t, s.client.Del(ctx, hash).Err())
	set, err = s.reconcileOne(ctx, hash, h, false)
	require.NoError(t, err)
	require.False(t, set)
}
