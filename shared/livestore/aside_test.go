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

// archiveDown makes every archive insert fail until the returned function
// runs (an outage of the archive the completion writes to).
func archiveDown(t *testing.T, db *dbtest.DB) (up func()) {
	t.Helper()
	ctx := context.Background()
	_, err := db.Pool.Exec(ctx, `
CREATE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'archive unavailable (test)'; END $$;
CREATE TRIGGER test_outage BEFORE INSERT ON idempotency_key_archive FOR EACH ROW EXECUTE FUNCTION test_refuse();`)
	require.NoError(t, err)
	return func() {
		_, err := db.Pool.Exec(ctx, "DROP TRIGGER test_outage ON idempotency_key_archive")
		require.NoError(t, err)
	}
}

// Request A's hash is lost while it runs, and the archive is down when it
// completes, while the client's retry B holds the key: B's own archive
// lookup fails in the same outage, so B releases the key without running
// (FailClosed). A's outcome was dropped ("that registration runs the
// operation"), and after the outage the next retry found neither a hash nor
// an archive row, and charged again. It is now kept aside, taken up by the
// next registration as the key's own, and archived by reconcile.
func TestAnOutcomeLostBesideAnotherRegistrationIsKeptAside(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	fp := dbtest.Fingerprint("charge")
	const key = "idem:v1:aside"
	tokenA, tokenB, tokenC := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbb"), []byte("cccccccccccccccc")
	t.Cleanup(func() { s.client.Del(context.Background(), s.prefix+key, s.aside(key)) })

	regA, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenA, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, regA.Fresh)
	require.NoError(t, s.client.Del(ctx, s.prefix+key).Err(), "A's hash is lost (a failover)")
	regB, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenB, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, regB.Fresh, "the retry registers the key again")

	up := archiveDown(t, db)
	err = s.Complete(ctx, key, idempotency.Completion{Fingerprint: fp, Token: tokenA, Status: 201, Body: []byte(`{"id":"ch_a"}`),
		ResourceID: ptr("ch_a"), ContentType: "application/json", CreatedAt: regA.Entry.CreatedAt, ExpiresAt: regA.Entry.ExpiresAt})
	require.ErrorContains(t, err, "kept aside")
	require.Equal(t, "in_flight", s.client.HGet(ctx, s.prefix+key, "state").Val(), "B's registration is left as it is")
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.aside(key)).Val(), "kept aside without expiry")

	// B's lookup failed in the same outage: it releases the key.
	require.NoError(t, s.Release(ctx, key, fp, tokenB))
	up()

	// The next retry is answered A's outcome, never run again.
	regC, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenC, TTL: time.Hour})
	require.NoError(t, err)
	require.False(t, regC.Fresh, "the next registration takes up the outcome kept aside")
	require.Equal(t, idempotency.Completed, regC.Entry.State)
	require.Equal(t, 201, regC.Entry.Status)
	require.JSONEq(t, `{"id":"ch_a"}`, string(regC.Entry.Body))
	require.Zero(t, s.client.Exists(ctx, s.aside(key)).Val())

	// Reconcile archives it (from the key's own hash now) and gives it its
	// expiry back.
	res, err := s.Reconcile(ctx, false, func(k string, err error) { t.Errorf("%q: %v", k, err) })
	require.NoError(t, err)
	require.Equal(t, 1, res.Archived)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1 AND resource_id = 'ch_a'", key))
	require.Positive(t, s.client.PTTL(ctx, s.prefix+key).Val())
}

// Kept aside while the other registration still runs, the outcome is
// archived by the request's own later attempt, or by reconcile, and then
// expires with its window; the other registration is never touched.
func TestAnOutcomeKeptAsideIsArchivedBesideTheOtherRegistration(t *testing.T) {
	t.Parallel()
	for _, by := range []string{"a later attempt", "reconcile"} {
		t.Run(by, func(t *testing.T) {
			t.Parallel()
			s, db := newRedisStore(t)
			ctx := context.Background()
			fp := dbtest.Fingerprint("charge")
			const key = "idem:v1:aside-archived"
			tokenA, tokenB := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbb")
			t.Cleanup(func() { s.client.Del(context.Background(), s.prefix+key, s.aside(key)) })
			regA, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenA, TTL: time.Hour})
			require.NoError(t, err)
			require.NoError(t, s.client.Del(ctx, s.prefix+key).Err())
			_, err = s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenB, TTL: time.Hour})
			require.NoError(t, err)
			completion := idempotency.Completion{Fingerprint: fp, Token: tokenA, Status: 201, Body: []byte(`{}`), ResourceID: ptr("ch_a"),
				CreatedAt: regA.Entry.CreatedAt, ExpiresAt: regA.Entry.ExpiresAt}
			up := archiveDown(t, db)
			require.ErrorContains(t, s.Complete(ctx, key, completion), "kept aside")
			up()

			switch by {
			case "a later attempt":
				require.ErrorIs(t, s.Complete(ctx, key, completion), idempotency.ErrNotInFlight)
			default:
				res, err := s.Reconcile(ctx, false, func(k string, err error) { t.Errorf("%q: %v", k, err) })
				require.NoError(t, err)
				require.Equal(t, 1, res.Archived)
			}
			require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1 AND resource_id = 'ch_a'", key))
			ttl := s.client.PTTL(ctx, s.aside(key)).Val()
			require.Positive(t, ttl, "archived, the outcome kept aside expires with its window")
			require.LessOrEqual(t, ttl, time.Hour)
			h := s.client.HGetAll(ctx, s.prefix+key).Val()
			require.Equal(t, "in_flight", h["state"])
			require.Equal(t, string(tokenB), h["reg"], "the other registration is untouched")
		})
	}
}

// A dry run of reconcile says what the run does: a row the run cannot
// write (its month's partition gone) fails the dry run too.
func TestReconcileDryRunFailsWhatTheRunFails(t *testing.T) {
	t.Parallel()
	s, _ := newRedisStore(t)
	ctx := context.Background()
	fp := dbtest.Fingerprint("charge")
	// A registration records the store's lease.
	_, err := s.Register(ctx, idempotency.Registering{Key: "idem:v1:lease", Fingerprint: fp, Token: []byte("0123456789abcdef"), TTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.client.Del(ctx, s.prefix+"idem:v1:lease").Err())

	created := time.Now().AddDate(-2, 0, 0) // no partition holds it
	hash := s.prefix + "idem:v1:old"
	require.NoError(t, s.client.HSet(ctx, hash, "fp", string(fp), "state", "completed", "status", "201", "body", "{}", "ct", "application/json",
		"rid", "", "has_rid", "0", "created", strconv.FormatInt(created.UnixMilli(), 10), "expires", strconv.FormatInt(created.Add(time.Hour).UnixMilli(), 10),
		"reg", "0123456789abcdef", "key", "idem:v1:old").Err())
	t.Cleanup(func() { s.client.Del(context.Background(), hash) })

	var dryErr, runErr string
	dry, err := s.Reconcile(ctx, true, func(_ string, err error) { dryErr = err.Error() })
	require.NoError(t, err)
	run, err := s.Reconcile(ctx, false, func(_ string, err error) { runErr = err.Error() })
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 1, Kept: 1, Failed: 1}, run)
	require.Equal(t, run, dry, "the dry run says what the run does")
	require.Equal(t, runErr, dryErr)
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, hash).Val(), "left as it is")
}

// A key with a NUL byte is refused: the archive cannot hold it, and its
// hash could be named like another key's outcome kept aside.
func TestRedisRefusesAKeyWithANulByte(t *testing.T) {
	t.Parallel()
	s, _ := newRedisStore(t)
	_, err := s.Register(context.Background(), idempotency.Registering{Key: "idem:v1:k" + asideSuffix, Fingerprint: dbtest.Fingerprint("x"), Token: []byte("0123456789abcdef"), TTL: time.Hour})
	require.ErrorContains(t, err, "NUL")
	require.Zero(t, s.client.Exists(context.Background(), s.aside("idem:v1:k")).Val())
}
