package livestore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// failCompleteScript fails the completion script (evalsha sha 1 key + 9
// ARGV = 13 args, or EVAL of its body), as a Redis that resets the
// connection at that step would.
type failCompleteScript struct{}

func (failCompleteScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (failCompleteScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (failCompleteScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if (name == "evalsha" || name == "eval") && len(cmd.Args()) == 13 {
			err := errors.New("read tcp: connection reset by peer")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// The archive is down AND the Redis step that would keep the hash without
// expiry fails: nothing keeps the outcome (the hash stays in flight with its
// expiry). The error Complete returns, the only word the operator gets
// (logged as "idempotency: live store complete failed" on every attempt),
// does not claim the key is kept without expiry, which redis-reconcile would
// then find, and names the Redis failure.
func TestACompletionWhoseKeepStepFailedDoesNotSayKept(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:keep-failed"
	fp := dbtest.Fingerprint("charge")
	token := []byte("keepfailkeepfail")
	hooked := hookedStore(t, s, db, failCompleteScript{})
	t.Cleanup(func() { s.client.Del(context.Background(), s.both(key)...) })

	reg, err := hooked.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: token, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, reg.Fresh)
	up := archiveDown(t, db)
	defer up()

	c := idempotency.Completion{Fingerprint: fp, Token: token, Status: 201, Body: []byte(`{"id":"ch_1"}`), ResourceID: ptr("ch_1"),
		ContentType: "application/json", CreatedAt: reg.Entry.CreatedAt, ExpiresAt: reg.Entry.ExpiresAt}
	// The middleware's four attempts.
	var errs []string
	for range 4 {
		err := hooked.Complete(ctx, key, c)
		require.Error(t, err)
		errs = append(errs, err.Error())
	}

	// What really happened: neither archived nor kept.
	require.Zero(t, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	h := s.client.HGetAll(ctx, s.prefix+key).Val()
	pttl := s.client.PTTL(ctx, s.prefix+key).Val()
	require.Equal(t, "in_flight", h["state"])
	require.Greater(t, pttl, time.Duration(0), "the hash still expires")
	res, err := s.Reconcile(ctx, true, func(string, error) {})
	require.NoError(t, err)
	require.Zero(t, res.Kept, "redis-reconcile cannot see it")

	for i, msg := range errs {
		require.NotContains(t, msg, "kept in Redis without expiry", "attempt %d claims the key is kept, but it expires and will run again", i+1)
		require.Contains(t, msg, "neither archived nor kept", i+1)
		require.Contains(t, msg, "connection reset", "attempt %d hides the Redis failure", i+1)
	}
}

// The archive is down, and the hash is lost (an eviction, a failover)
// between the completion's read and its keep step: the script finds nothing
// in flight, and the outcome is kept as for a hash lost before the read
// (completed, without expiry), never said to be kept while nothing is.
func TestACompletionWhoseHashWentBeforeTheKeepStepKeepsIt(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:vanished"
	fp := dbtest.Fingerprint("charge")
	token := []byte("vanishedvanished")
	t.Cleanup(func() { s.client.Del(context.Background(), s.both(key)...) })
	hooked := hookedStore(t, s, db, &afterCommand{match: hgetallOf(s.prefix + key), fn: func() {
		s.client.Del(context.Background(), s.prefix+key)
	}})
	reg, err := hooked.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: token, TTL: time.Hour})
	require.NoError(t, err)
	up := archiveDown(t, db)
	defer up()
	c := idempotency.Completion{Fingerprint: fp, Token: token, Status: 201, Body: []byte(`{"id":"ch_1"}`), ResourceID: ptr("ch_1"),
		ContentType: "application/json", CreatedAt: reg.Entry.CreatedAt, ExpiresAt: reg.Entry.ExpiresAt}
	err = hooked.Complete(ctx, key, c)
	require.ErrorContains(t, err, "kept in Redis")
	h := s.client.HGetAll(ctx, s.prefix+key).Val()
	require.Equal(t, "completed", h["state"], "the outcome is kept")
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.prefix+key).Val(), "without expiry")
	res, err := s.Reconcile(ctx, true, func(string, error) {})
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Kept, "redis-reconcile finds it")
}
