package livestore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/dbtest"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

// The tests in this file hold the promise that an archived outcome kept in
// Redis without expiry gets its expiry back, wherever it sits (under the
// key's own name or aside) and whatever registration renames it between
// two steps: a completed hash without expiry otherwise stays for good,
// after the last attempt (or redis-reconcile) reported success.

// afterCommand runs fn once, right after the first command match accepts
// was answered: another client's step, interleaved there.
type afterCommand struct {
	match func(redis.Cmder) bool
	fn    func()
	once  sync.Once
}

func (*afterCommand) DialHook(next redis.DialHook) redis.DialHook { return next }
func (*afterCommand) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *afterCommand) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if h.match(cmd) {
			h.once.Do(h.fn)
		}
		return err
	}
}

func hgetallOf(name string) func(redis.Cmder) bool {
	return func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return cmd.Name() == "hgetall" && len(a) == 2 && a[1] == name
	}
}

// hookedStore is a second store on the same Redis, prefix and archive,
// whose client runs hook.
func hookedStore(t *testing.T, s *Redis, db *dbtest.DB, hook redis.Hook) *Redis {
	t.Helper()
	opts, err := redis.ParseURL(os.Getenv("REDIS_URL"))
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(hook)
	return NewRedis(c, db.Pool, s.prefix)
}

// keptAside puts request A's outcome aside (A's hash lost, the key
// registered again by B, the archive down at A's completion), then B's
// lookup fails in the same outage and B releases the key. The archive is
// still down: up ends the outage.
func keptAside(t *testing.T, s *Redis, db *dbtest.DB, key string) (fp []byte, c idempotency.Completion, up func()) {
	t.Helper()
	ctx := context.Background()
	fp = dbtest.Fingerprint("charge")
	tokenA, tokenB := []byte("aaaaaaaaaaaaaaaa"), []byte("bbbbbbbbbbbbbbbb")
	t.Cleanup(func() { s.client.Del(context.Background(), s.both(key)...) })
	regA, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenA, TTL: time.Hour})
	require.NoError(t, err)
	require.NoError(t, s.client.Del(ctx, s.prefix+key).Err(), "A's hash is lost")
	regB, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: tokenB, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, regB.Fresh)
	c = idempotency.Completion{Fingerprint: fp, Token: tokenA, Status: 201, Body: []byte(`{"id":"ch_a"}`), ResourceID: ptr("ch_a"),
		ContentType: "application/json", CreatedAt: regA.Entry.CreatedAt, ExpiresAt: regA.Entry.ExpiresAt}
	up = archiveDown(t, db)
	require.ErrorContains(t, s.Complete(ctx, key, c), "kept aside")
	require.NoError(t, s.Release(ctx, key, fp, tokenB), "B's lookup failed in the outage: it releases")
	return fp, c, up
}

// takenUpAfterReading returns a store on s's Redis whose client, right
// after it reads the hash named name, has another request register key
// (taking up the outcome kept aside), and a check that it did.
func takenUpAfterReading(t *testing.T, s *Redis, db *dbtest.DB, key string, fp []byte, name string) (*Redis, func()) {
	t.Helper()
	var taken idempotency.Registration
	var regErr error
	r := hookedStore(t, s, db, &afterCommand{match: hgetallOf(name), fn: func() {
		taken, regErr = s.Register(context.Background(), idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("cccccccccccccccc"), TTL: time.Hour})
	}})
	return r, func() {
		t.Helper()
		require.NoError(t, regErr)
		require.False(t, taken.Fresh, "the registration took up A's outcome")
	}
}

// noHashWithoutExpiry fails when a hash of key, its own or aside, has no
// expiry.
func noHashWithoutExpiry(t *testing.T, s *Redis, key string) {
	t.Helper()
	for _, name := range s.both(key) {
		require.NotEqual(t, time.Duration(-1), s.client.PTTL(context.Background(), name).Val(), "%q has no expiry", name)
	}
}

// A's second attempt (the archive still down) keeps the outcome under the
// key's own name too; the third (the archive back) archives it and gave
// only that copy its expiry: the copy aside stayed without one, and after
// the window the next registration renamed it back, still without one.
func TestAnArchivedOutcomeGetsItsExpiryAsideToo(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:aside-both-copies"
	fp, c, up := keptAside(t, s, db, key)
	require.ErrorContains(t, s.Complete(ctx, key, c), "kept in Redis", "attempt 2: the archive is still down")
	up()
	require.ErrorIs(t, s.Complete(ctx, key, c), idempotency.ErrNotInFlight, "attempt 3 archives it")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	noHashWithoutExpiry(t, s, key)

	// The window ends; the late retry replays A's outcome from a hash
	// that still ends.
	require.NoError(t, s.client.Del(ctx, s.prefix+key).Err())
	late, err := s.Register(ctx, idempotency.Registering{Key: key, Fingerprint: fp, Token: []byte("dddddddddddddddd"), TTL: time.Hour})
	require.NoError(t, err)
	require.False(t, late.Fresh)
	require.Equal(t, 201, late.Entry.Status)
	noHashWithoutExpiry(t, s, key)
}

// A's later attempt (the archive back) finds no hash, and a registration
// takes up the outcome kept aside (renaming it) between that read and the
// step that gives it its expiry: that step, naming the aside key alone,
// found nothing, and the key's hash stayed without expiry with no attempt
// left.
func TestAnOutcomeTakenUpWhileItsAttemptArchivesItGetsItsExpiry(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:aside-complete-race"
	fp, c, up := keptAside(t, s, db, key)
	up()
	r, tookUp := takenUpAfterReading(t, s, db, key, fp, s.prefix+key)
	require.ErrorIs(t, r.Complete(ctx, key, c), idempotency.ErrNotInFlight)
	tookUp()
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	noHashWithoutExpiry(t, s, key)
}

// redis-reconcile reads the outcome kept aside, and a registration takes
// it up before the run gives it its expiry: the run counted it "already"
// and exited 0 with a key without expiry left under the prefix.
func TestReconcileGivesAnOutcomeTakenUpMeanwhileItsExpiry(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:aside-reconcile-race"
	fp, _, up := keptAside(t, s, db, key)
	up()
	r, tookUp := takenUpAfterReading(t, s, db, key, fp, s.aside(key))
	var reported []string
	res, err := r.Reconcile(ctx, false, func(k string, err error) { reported = append(reported, k+": "+err.Error()) })
	tookUp()
	require.NoError(t, err)
	require.Empty(t, reported)
	require.Equal(t, 1, res.Archived, "%+v", res)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	noHashWithoutExpiry(t, s, key)
}

// A's second attempt (the archive still down) finds no hash of its own,
// and a registration takes up the copy aside before the attempt keeps the
// outcome: the attempt wrote a second copy aside, and a reconcile dry run
// then counted two outcomes to archive where the run archived one. The
// outcome is kept once, under the key's own name.
func TestAnOutcomeTakenUpBeforeItsAttemptKeepsItIsKeptOnce(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:aside-kept-once"
	fp, c, up := keptAside(t, s, db, key)
	r, tookUp := takenUpAfterReading(t, s, db, key, fp, s.prefix+key)
	require.ErrorContains(t, r.Complete(ctx, key, c), "kept in Redis")
	tookUp()
	require.Zero(t, s.client.Exists(ctx, s.aside(key)).Val(), "no second copy aside")

	up()
	dry, err := s.Reconcile(ctx, true, func(k string, err error) { t.Errorf("%s: %v", k, err) })
	require.NoError(t, err)
	res, err := s.Reconcile(ctx, false, func(k string, err error) { t.Errorf("%s: %v", k, err) })
	require.NoError(t, err)
	require.Equal(t, 1, res.Archived, "%+v", res)
	require.Equal(t, dry.Archived, res.Archived, "the dry run foretells the run")
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	noHashWithoutExpiry(t, s, key)
}

// An older writer's completed hash (no token, no key) kept without expiry,
// and so not known to be archived, is never given an expiry by another
// request's completion, nor by one without a token.
func TestAnOlderWritersHashKeepsNoExpiryForAnotherRequest(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:aside-older-writer"
	_, c, up := keptAside(t, s, db, key)
	up()
	require.NoError(t, s.client.HSet(ctx, s.prefix+key, "fp", string(dbtest.Fingerprint("older")), "state", "completed", "status", "200",
		"created", time.Now().Add(-time.Minute).UnixMilli(), "expires", time.Now().Add(time.Hour).UnixMilli()).Err())
	require.Error(t, s.Complete(ctx, key, c))
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.prefix+key).Val(), "the older writer's hash")
	require.Positive(t, s.client.PTTL(ctx, s.aside(key)).Val(), "A's archived outcome aside")
	untokened := c
	untokened.Token = nil
	_ = s.Complete(ctx, key, untokened)
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.prefix+key).Val())
}

// An outcome kept twice (aside, then under its key's own name by a later
// attempt while the archive was still down) is one outcome, kept and
// archived once, in a dry run as in the run (which gives both copies their
// expiry in one step, so that whether its scan still finds the second
// without expiry depends on where SCAN puts the two), and the run writes
// one archive row and leaves neither copy without expiry.
func TestADryRunCountsAnOutcomeKeptTwiceAsTheRunDoes(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:kept-twice"
	_, c, up := keptAside(t, s, db, key)
	require.ErrorContains(t, s.Complete(ctx, key, c), "kept in Redis")
	up()
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.prefix+key).Val(), "the outcome under its key's own name, without expiry")
	require.Equal(t, time.Duration(-1), s.client.PTTL(ctx, s.aside(key)).Val(), "and aside, without expiry")
	fail := func(k string, err error) { t.Errorf("%q: %v", k, err) }
	dry, err := s.Reconcile(ctx, true, fail)
	require.NoError(t, err)
	run, err := s.Reconcile(ctx, false, fail)
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 2, Kept: 1, Archived: 1}, dry)
	require.Equal(t, dry, run)
	require.EqualValues(t, 1, dbtest.Count(t, db.Pool, "SELECT count(*) FROM idempotency_key_archive WHERE scoped_key = $1", key))
	require.Positive(t, s.client.PTTL(ctx, s.prefix+key).Val(), "the copy under its key's name has its expiry")
	require.Positive(t, s.client.PTTL(ctx, s.aside(key)).Val(), "and the one aside")
}

// An outcome kept twice whose expiry the request's own later attempt gives
// back between the scan and the run's processing: one outcome, counted
// once (as the dry run before it counted it).
func TestAnOutcomeKeptTwiceGivenBackMeanwhileCountsOnce(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:twin-meanwhile"
	_, c, up := keptAside(t, s, db, key)
	require.ErrorContains(t, s.Complete(ctx, key, c), "kept in Redis")
	up()
	fail := func(k string, err error) { t.Errorf("%q: %v", k, err) }
	dry, err := s.Reconcile(ctx, true, fail)
	require.NoError(t, err)
	require.Equal(t, ReconcileResult{Scanned: 2, Kept: 1, Archived: 1}, dry)
	either := func(cmd redis.Cmder) bool {
		a := cmd.Args()
		return cmd.Name() == "hgetall" && len(a) == 2 && (a[1] == s.prefix+key || a[1] == s.aside(key))
	}
	r := hookedStore(t, s, db, &afterCommand{match: either, fn: func() {
		// The request's later attempt, the archive back: it archives the
		// outcome and gives both copies their expiry (its own entry is no
		// longer in flight, which it says).
		_ = s.Complete(context.Background(), key, c)
	}})
	run, err := r.Reconcile(ctx, false, fail)
	require.NoError(t, err)
	noHashWithoutExpiry(t, s, key)
	require.Equal(t, ReconcileResult{Scanned: 2, Kept: 1, Already: 1}, run, "one outcome kept twice")
}

// An outcome kept twice that the run cannot archive (the archive still
// down): counted once, kept and failed, in a dry run as in the run, and
// both copies are named.
func TestAnOutcomeKeptTwiceThatCannotBeArchivedCountsOnce(t *testing.T) {
	t.Parallel()
	s, db := newRedisStore(t)
	ctx := context.Background()
	const key = "idem:v1:twin-failing"
	_, c, _ := keptAside(t, s, db, key)
	require.ErrorContains(t, s.Complete(ctx, key, c), "kept in Redis")
	var reports []string
	rep := func(k string, err error) { reports = append(reports, fmt.Sprintf("%q: %v", k, err)) }
	dry, err := s.Reconcile(ctx, true, rep)
	require.NoError(t, err)
	run, err := s.Reconcile(ctx, false, rep)
	require.NoError(t, err)
	require.Equal(t, dry, run)
	require.Equal(t, ReconcileResult{Scanned: 2, Kept: 1, Failed: 1}, run, "one outcome kept twice")
	require.Len(t, reports, 3, "the dry run names the first copy, the run both: %v", reports)
}
