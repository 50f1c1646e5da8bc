package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
	"github.com/idemarchive/idemarchive/shared/livestore"
	"github.com/idemarchive/idemarchive/shared/testenv"
)

// flakyArchive wraps a Reader and fails every lookup while down is set, as an
// archive that is briefly unreachable does.
type flakyArchive struct {
	next idempotency.Archive
	down atomic.Bool
}

func (a *flakyArchive) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	if a.down.Load() {
		return archive.Record{}, errors.New("archive lookup: dial tcp 10.0.0.5:5432: connect: connection refused")
	}
	return a.next.Lookup(ctx, key, fp)
}

// A Redis key whose request completed and archived its outcome, but whose
// hash could not be marked completed, is answered after its window from the
// archive's completed row. When that lookup fails, the answer is 503
// archive_unavailable with Retry-After (whatever OnArchiveError says), never
// 409 expired with original_status 0 ("never completed"), which a client
// could take for "never ran" and charge again under a new key.
func TestExpiredInFlightIsNotAnsweredNeverCompletedWhenTheArchiveIsDown(t *testing.T) {
	t.Parallel()
	b := setup(t, rds)
	client, prefix := testenv.Redis(t)
	client.AddHook(failCompletion{})
	arch := &flakyArchive{next: b.reader}
	mw, err := idempotency.New(idempotency.Config{Store: livestore.NewRedis(client, b.db.Pool, prefix), SingleTenant: true, Archive: arch,
		LiveTTL: time.Second, ArchiveTimeout: 30 * time.Second})
	require.NoError(t, err)
	h := &charges{}
	srv := mw.Wrap(h)
	require.Equal(t, 201, post(srv, "half-done", `{}`).Code, "the charge ran and its outcome was archived")
	time.Sleep(1200 * time.Millisecond)

	// The archive blips for this one retry.
	arch.down.Store(true)
	w := post(srv, "half-done", `{}`)
	arch.down.Store(false)
	p := problemOf(t, w)
	t.Logf("archive down: %d %s", w.Code, w.Body.String())

	// With the archive back, the same retry is told what happened.
	w2 := post(srv, "half-done", `{}`)
	t.Logf("archive up:   %d %s", w2.Code, w2.Body.String())
	require.EqualValues(t, 201, problemOf(t, w2)["original_status"])

	require.Equal(t, 503, w.Code, "while the archive could not be read, the retry of a completed charge was told %d", w.Code)
	require.Equal(t, "archive_unavailable", p["code"])
	require.NotEmpty(t, w.Header().Get("Retry-After"))
	require.EqualValues(t, 1, h.calls.Load())
}

func insertArchived(t *testing.T, b bundle, key string) {
	t.Helper()
	_, err := b.db.Pool.Exec(context.Background(), `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ($1, $2, 201, 'ch_old', now() - interval '50 hours', now() - interval '26 hours')`, key, emptyBodyFP)
	require.NoError(t, err)
}

// A Postgres store and a Redis store may share an archive. A key the Redis
// service completed (archived at completion, its window still open) and
// retried through the Postgres service is 409
// idempotency_key_response_unavailable, not expired with an expired_at in
// the future. A row a sweeper archived a moment ago, seen from a clock that
// trails the database's, is still expired.
func TestAnUnexpiredArchiveRowIsNotCalledExpired(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	client, prefix := testenv.Redis(t)
	redisMW, err := idempotency.New(idempotency.Config{Store: livestore.NewRedis(client, b.db.Pool, prefix), SingleTenant: true, Archive: b.reader,
		ArchiveTimeout: 30 * time.Second, ClockSkew: 5 * time.Minute})
	require.NoError(t, err)
	h := &charges{}
	require.Equal(t, 201, post(redisMW.Wrap(h), "shared-key", `{}`).Code)

	pgSrv := b.middleware(t, idempotency.Config{ClockSkew: 5 * time.Minute}).Wrap(h)
	w := post(pgSrv, "shared-key", `{}`)
	t.Logf("answer: %d %s", w.Code, w.Body.String())
	require.EqualValues(t, 1, h.calls.Load())
	p := problemOf(t, w)
	require.Equal(t, "idempotency_key_response_unavailable", p["code"], "a key whose window ends in ~24h was called expired")

	// Swept by the database's clock, 30 s ahead of this one.
	_, err = b.db.Pool.Exec(context.Background(), `
		INSERT INTO idempotency_key_archive (scoped_key, fingerprint, status_code, resource_id, created_at, expired_at)
		VALUES ('idem:v1:just-swept', $1, 201, 'ch_swept', now() - interval '24 hours', now() + interval '30 seconds')`, emptyBodyFP)
	require.NoError(t, err)
	w = post(pgSrv, "just-swept", `{}`)
	require.Equal(t, "idempotency_key_expired", problemOf(t, w)["code"], w.Body.String())
	require.EqualValues(t, 1, h.calls.Load())
}
