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

// newRedisStore returns a Redis store over a schema of its own (partitioned
// for this month) and a Redis prefix of its own.
func newRedisStore(t *testing.T) (*Redis, *dbtest.DB) {
	t.Helper()
	db := dbtest.New(t)
	db.Partition(t, 0)
	client, prefix := testenv.Redis(t)
	return NewRedis(client, db.Pool, prefix), db
}

// usedUntil reads the lease the Redis store records (TTL 0) for skew.
func usedUntil(t *testing.T, db *dbtest.DB, skew time.Duration) time.Time {
	t.Helper()
	var until time.Time
	require.NoError(t, db.Pool.QueryRow(context.Background(),
		"SELECT used_until FROM idempotency_writers WHERE ttl_ms = 0 AND skew_ms = $1 AND bounded", skew.Milliseconds()).Scan(&until))
	return until
}

// The Redis store refuses keys ahead of its own clock, not the database's,
// so its lease reaches as far as its own clock says: a process clock an hour
// ahead of the database's registers keys minted up to an hour later than the
// database's clock, and a lease by the database's clock alone would end
// before them (a Postgres store sharing the archive would then prove such a
// key never archived, and skip the lookup of its late retry).
func TestRedisLeaseCoversItsOwnClock(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	s.now = func() time.Time { return time.Now().Add(time.Hour) }
	req := idempotency.Registering{Key: "idem:v1:fast-clock", Fingerprint: dbtest.Fingerprint("a"), TTL: time.Minute, ClockSkew: time.Minute}
	_, err := s.Register(ctx, req)
	require.NoError(t, err)
	require.WithinDuration(t, s.now().Add(leaseFor), usedUntil(t, db, time.Minute), time.Minute)
}

// A frozen process (a Lambda execution environment between invocations)
// may not see the pause on its monotonic clock: the wall clock renews its
// lease too, and a wall clock that stepped back renews it as well.
func TestRedisLeaseRenewsByTheWallClock(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	req := idempotency.Registering{Key: "idem:v1:frozen-1", Fingerprint: dbtest.Fingerprint("a"), TTL: time.Minute, ClockSkew: time.Minute}
	_, err := s.Register(ctx, req)
	require.NoError(t, err)
	first := usedUntil(t, db, time.Minute)

	// Within renewAfter by both clocks: no renewal.
	req.Key = "idem:v1:frozen-2"
	_, err = s.Register(ctx, req)
	require.NoError(t, err)
	require.Equal(t, first, usedUntil(t, db, time.Minute))

	// The wall clock moved 5 minutes (the monotonic one barely): renewed,
	// reaching leaseFor past the wall clock.
	s.now = func() time.Time { return time.Now().Add(5 * time.Minute) }
	req.Key = "idem:v1:frozen-3"
	_, err = s.Register(ctx, req)
	require.NoError(t, err)
	renewed := usedUntil(t, db, time.Minute)
	require.WithinDuration(t, s.now().Add(leaseFor), renewed, time.Minute)

	// The wall clock stepped back: renewed again (used_until never moves
	// earlier, so the record still covers the later clock).
	l := lease{ttlMS: 0, skewMS: time.Minute.Milliseconds()}
	s.leases.mu.Lock()
	before := s.leases.renewed[l]
	s.leases.mu.Unlock()
	s.now = func() time.Time { return time.Now().Add(-time.Hour) }
	req.Key = "idem:v1:frozen-4"
	_, err = s.Register(ctx, req)
	require.NoError(t, err)
	s.leases.mu.Lock()
	after := s.leases.renewed[l]
	s.leases.mu.Unlock()
	require.True(t, after.local.After(before.local), "a wall clock that stepped back renews the lease")
	require.Equal(t, renewed, usedUntil(t, db, time.Minute))
}

// Whether a hash's window has ended is the Redis server's verdict (its
// PTTL), not the reading host's clock: a host whose clock runs hours ahead
// sees a request still running on another host in flight, and one whose
// clock runs behind sees a window the server has ended as ended. Both
// register paths say so: the script's, and the read of a key minted ahead
// of the reading host's clock.
func TestTheRedisServerDecidesWhetherAWindowEnded(t *testing.T) {
	t.Parallel()
	s, _ := newRedisStore(t)
	ctx := context.Background()
	key := "idem:v1:" + dbtest.ULID(time.Now().Add(30*time.Minute), "")
	req := idempotency.Registering{Key: key, Fingerprint: dbtest.Fingerprint("a"), Token: []byte("0123456789abcdef"), TTL: time.Hour, ClockSkew: time.Hour}
	first, err := s.Register(ctx, req)
	require.NoError(t, err)
	require.True(t, first.Fresh)

	ahead := NewRedis(s.client, s.archive, s.prefix)
	ahead.now = func() time.Time { return time.Now().Add(3 * time.Hour) }
	behind := NewRedis(s.client, s.archive, s.prefix)
	behind.now = func() time.Time { return time.Now().Add(-3 * time.Hour) }
	verdict := func(st *Redis, skew time.Duration) *bool {
		r := req
		r.ClockSkew = skew                   // a minute: the key is ahead of the slow host's clock
		r.Token = []byte("another request.") // each request draws its own
		reg, err := st.Register(ctx, r)
		require.NoError(t, err)
		require.False(t, reg.Fresh)
		require.Equal(t, idempotency.InFlight, reg.Entry.State)
		return reg.Entry.WindowEnded
	}
	// WHEN the window has an hour left on the server
	// THEN neither host's clock ends it
	for name, got := range map[string]*bool{"ahead": verdict(ahead, time.Hour), "behind (key ahead of it)": verdict(behind, time.Minute)} {
		require.NotNil(t, got, name)
		require.False(t, *got, name)
	}

	// WHEN the server has ended it (no more than the in-flight grace left)
	require.NoError(t, s.client.PExpire(ctx, s.prefix+key, inFlightGrace-time.Minute).Err())
	// THEN both hosts see it ended
	for name, got := range map[string]*bool{"ahead": verdict(ahead, time.Hour), "behind (key ahead of it)": verdict(behind, time.Minute)} {
		require.NotNil(t, got, name)
		require.True(t, *got, name)
	}

	// AND a hash kept without expiry, a completed one, or one read without
	// its PTTL gives no verdict: the host's clock decides (not tried on the
	// shared Redis above: a hash without expiry is what redis-reconcile
	// tests look for)
	for name, h := range map[string]map[string]string{
		"kept without expiry": {"state": "in_flight", "pttl": "-1"},
		"completed":           {"state": "completed", "pttl": "1000"},
		"read without PTTL":   {"state": "in_flight"},
	} {
		require.Nil(t, windowEnded(h), name)
	}
	require.True(t, *windowEnded(map[string]string{"state": "in_flight", "pttl": "-2"}), "gone since it was read")
}
