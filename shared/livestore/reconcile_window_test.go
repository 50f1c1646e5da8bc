package livestore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// A completed hash whose window no registration gives is left alone,
// however long that window is: one of centuries must not slip past the
// check by overflowing it (milliseconds times time.Millisecond), nor one
// that starts before 1970.
func TestReconcileRefusesWindowsThatOverflow(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	fp := dbtest.Fingerprint("charge")
	reg, err := s.Register(ctx, idempotency.Registering{Key: "idem:v1:old", Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
	require.NoError(t, err)
	hash := s.prefix + "idem:v1:old"
	t.Cleanup(func() { s.client.Del(context.Background(), hash) })
	expires := reg.Entry.ExpiresAt.UnixMilli()
	for _, created := range []int64{
		expires - 300*365*24*3600*1000, // 300 years: overflows a time.Duration in nanoseconds
		-9_000_000_000_000_000,         // overflows expires - created itself
		-1000,                          // before 1970
	} {
		require.NoError(t, s.client.HSet(ctx, hash, "state", "completed", "status", "201", "created", strconv.FormatInt(created, 10)).Err())
		require.NoError(t, s.client.Persist(ctx, hash).Err())
		var why string
		res, err := s.Reconcile(ctx, false, func(_ string, err error) { why = err.Error() })
		require.NoError(t, err)
		require.Equal(t, ReconcileResult{Scanned: 1, Kept: 1, Failed: 1}, res, "created %d", created)
		require.Contains(t, why, "no registration gives")
		require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, hash).Val(), "left without expiry")
	}
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive"))
}
