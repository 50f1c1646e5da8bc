package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// failingRedis fails every command while down is set: an outage, or a
// failover in progress.
type failingRedis struct{ down *atomic.Bool }

func (f failingRedis) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f failingRedis) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f failingRedis) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f.down.Load() {
			err := errors.New("connect: connection refused")
			cmd.SetErr(err)
			return err
		}
		return next(ctx, cmd)
	}
}

// A Redis that fails through every completion attempt, after the handler
// ran, still leaves the outcome archived: the archive row is written before
// Redis is read. Once the hash is gone (the failover's replica never had it,
// or it expired), the retry is answered from the archive, not run again.
func TestARedisOutageAtCompletionStillArchivesTheOutcome(t *testing.T) {
	t.Parallel()
	// GIVEN a Redis store that goes down while the handler runs
	b := setup(t, pg)
	client, prefix := testenv.Redis(t)
	var down atomic.Bool
	client.AddHook(failingRedis{&down})
	b.store = livestore.NewRedis(client, b.db.Pool, prefix)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{}).Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		down.Store(true)
		h.ServeHTTP(w, r)
	}))

	// WHEN the request completes, Redis comes back without its hash, and
	// the client retries
	require.Equal(t, http.StatusCreated, post(srv, "outage", `{}`).Code)
	down.Store(false)
	rec, err := b.reader.Lookup(context.Background(), "idem:v1:outage", nil)
	require.NoError(t, err, "the outcome is archived")
	require.Equal(t, http.StatusCreated, rec.Status)
	require.NoError(t, client.Del(context.Background(), prefix+"idem:v1:outage").Err())
	retry := post(srv, "outage", `{}`)

	// THEN the retry is answered from the archive, and the charge ran once
	require.Equal(t, http.StatusConflict, retry.Code)
	requireResponseLost(t, retry)
	require.EqualValues(t, 1, h.calls.Load())
}

// An archive insert that fails once at completion is written by the
// middleware's next attempt, which gives the hash (kept without expiry
// meanwhile, the only record of the outcome) its expiry back.
func TestAnArchiveBlipAtARedisCompletionIsWrittenByTheNextAttempt(t *testing.T) {
	t.Parallel()
	// GIVEN an archive whose first insert fails
	b := setup(t, pg)
	ctx := context.Background()
	_, err := b.db.Pool.Exec(ctx, `
CREATE SEQUENCE blip;
CREATE FUNCTION blip_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF nextval('blip') = 1 THEN
    RAISE EXCEPTION 'terminating connection due to administrator command' USING ERRCODE = '57P01';
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER blip_once BEFORE INSERT ON idempotency_key_archive FOR EACH ROW EXECUTE FUNCTION blip_once();`)
	require.NoError(t, err)
	client, prefix := testenv.Redis(t)
	b.store = livestore.NewRedis(client, b.db.Pool, prefix)
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{}).Wrap(h)

	// WHEN a request completes
	require.Equal(t, http.StatusCreated, post(srv, "blip", `{}`).Code)

	// THEN its outcome is archived, and its hash expires with its window
	_, err = b.reader.Lookup(ctx, "idem:v1:blip", nil)
	require.NoError(t, err)
	pttl, err := client.PTTL(ctx, prefix+"idem:v1:blip").Result()
	require.NoError(t, err)
	require.Positive(t, pttl, "the hash got its expiry back")

	// AND a retry after the hash is gone is answered from the archive
	require.NoError(t, client.Del(ctx, prefix+"idem:v1:blip").Err())
	require.Equal(t, http.StatusConflict, post(srv, "blip", `{}`).Code)
	require.EqualValues(t, 1, h.calls.Load())
}

// A Redis hash lost while its request runs (a failover to a replica that
// never got it), and an archive that refuses the row through every
// completion attempt: the outcome is written back into Redis, completed
// and without expiry, so that a retry replays it instead of running the
// charge again; the next completion that can archive it gives it back its
// expiry.
func TestALostRedisHashWhoseArchiveRowFailsIsKeptCompleted(t *testing.T) {
	t.Parallel()
	// GIVEN a request running on the Redis store
	b := setup(t, rds)
	ctx := context.Background()

	// WHEN its hash is lost and the archive refuses inserts until it has answered
	srv, h, key, first := runLosingItsHash(t, b, func() {
		_, err := b.db.Pool.Exec(ctx, `
CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'archive unavailable (simulated)'; END $$;
CREATE TRIGGER outage BEFORE INSERT ON idempotency_key_archive FOR EACH ROW EXECUTE FUNCTION refuse();`)
		require.NoError(t, err)
	})
	require.Equal(t, http.StatusCreated, first.Code, "the charge ran and is answered")
	_, err := b.db.Pool.Exec(ctx, "DROP TRIGGER outage ON idempotency_key_archive")
	require.NoError(t, err)

	// THEN its hash is back, completed, without expiry
	keys, err := b.redis.Keys(ctx, "*"+key).Result()
	require.NoError(t, err)
	require.Len(t, keys, 1, "the outcome is kept in Redis")
	t.Cleanup(func() { b.redis.Del(context.Background(), keys[0]) }) // kept without expiry otherwise
	pttl, err := b.redis.PTTL(ctx, keys[0]).Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), pttl, "kept without expiry until archived")

	// AND a retry replays the charge rather than running it again
	retry := post(srv, key, `{}`)
	require.Equal(t, http.StatusCreated, retry.Code, retry.Body.String())
	require.JSONEq(t, first.Body.String(), retry.Body.String())
	require.EqualValues(t, 1, h.calls.Load())
}
