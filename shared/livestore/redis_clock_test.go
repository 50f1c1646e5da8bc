package livestore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// The hash's expiries are relative to now on the Redis server: a process
// clock 20 minutes behind it (or ahead) neither drops an in-flight hash the
// moment it is written, which would let a second identical request run,
// nor a completed one before its window ends.
func TestRedisExpiriesDoNotDependOnTheServersClock(t *testing.T) {
	t.Parallel()
	db := dbtest.New(t)
	db.Partition(t, 0)
	client, prefix := testenv.Redis(t)
	ctx := context.Background()
	for _, skew := range []time.Duration{-20 * time.Minute, 20 * time.Minute} {
		s := NewRedis(client, db.Pool, prefix)
		s.now = func() time.Time { return time.Now().Add(skew) }
		key := "idem:v1:clock-" + skew.String()
		req := idempotency.Registering{Key: key, Fingerprint: dbtest.Fingerprint("a"), TTL: time.Minute}
		first, err := s.Register(ctx, req)
		require.NoError(t, err)
		require.True(t, first.Fresh)
		ttl, err := client.PTTL(ctx, prefix+key).Result()
		require.NoError(t, err)
		require.InDelta(t, (time.Minute + inFlightGrace).Seconds(), ttl.Seconds(), 5, "skew %s", skew)
		second, err := s.Register(ctx, req)
		require.NoError(t, err)
		require.False(t, second.Fresh, "skew %s: the first request is still in flight", skew)

		require.NoError(t, s.Complete(ctx, key, idempotency.Completion{Fingerprint: req.Fingerprint, Status: 201, Body: []byte(`{}`)}))
		ttl, err = client.PTTL(ctx, prefix+key).Result()
		require.NoError(t, err)
		require.InDelta(t, time.Minute.Seconds(), ttl.Seconds(), 5, "skew %s: the completed hash lives to the end of its window", skew)
	}
}
