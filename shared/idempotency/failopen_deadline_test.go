package idempotency_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemarchive/idemarchive/shared/archive"
	"github.com/idemarchive/idemarchive/shared/idempotency"
)

type loggingArchive struct {
	t    *testing.T
	next idempotency.Archive
}

func (a loggingArchive) Lookup(ctx context.Context, key string, fp []byte) (archive.Record, error) {
	start := time.Now()
	rec, err := a.next.Lookup(ctx, key, fp)
	dl, _ := ctx.Deadline()
	a.t.Logf("lookup %q after %s (deadline in %s): %v", key, time.Since(start), time.Until(dl), err)
	return rec, err
}

// With the archive's pool in exec mode (the RDS Proxy mode the README
// recommends) a lookup that waits on a lock is ended by the server's
// statement_timeout, which the Reader set to end 100 ms before the
// request's deadline: archive.ErrTimeout while the request's context is
// still live. The request's deadline, not the archive, cut the lookup
// short, so even FailOpen answers 503 and never runs the archived key.
func TestFailOpenNeverRunsAKeyWhoseLookupTheRequestDeadlineCut(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	insertArchived(t, b, "idem:v1:deadline-key2")
	reader := execReader(t, b, archive.Config{})
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen, Archive: loggingArchive{t, reader}}).Wrap(h)
	require.Equal(t, http.StatusCreated, post(srv, "warm-up", `{}`).Code)
	require.Equal(t, 409, post(srv, "deadline-key2", `{}`).Code, "the archived key is answered from the archive")
	require.EqualValues(t, 1, h.calls.Load())

	// The archive waits on a lock (partition DDL, an operator's LOCK).
	lockArchive(t, b)

	// A retry that has 800 ms left (a client or server timeout), far more
	// than the Reader keeps free before it.
	w := postWithin(srv, "deadline-key2", 800*time.Millisecond)
	require.EqualValues(t, 1, h.calls.Load(), "an archived key ran again under FailOpen after the request's deadline cut its lookup short")
	require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	require.Equal(t, "archive_unavailable", problemOf(t, w)["code"])
	require.NotEmpty(t, w.Header().Get("Retry-After"))

	// The same lock under a deadline longer than ArchiveTimeout: the
	// archive's own timeout ended the lookup, and FailOpen runs the key as
	// configured (the store still holds it in flight for this attempt).
	srv = b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen, Archive: loggingArchive{t, reader}, ArchiveTimeout: 300 * time.Millisecond}).Wrap(h)
	w = postWithin(srv, "deadline-key2", 5*time.Second)
	require.EqualValues(t, 2, h.calls.Load(), "FailOpen fails open on the archive's own timeout: %d %s", w.Code, w.Body.String())
}

// The Reader's own StatementTimeout (200 ms, an operator's lookup budget)
// ends a lookup that waits on a lock, 1.3 s before the request's deadline
// (1.5 s, under the default ArchiveTimeout of 2 s): the archive ran out of
// its time, not the request, and FailOpen fails open as configured.
func TestFailOpenOpensWhenTheReadersOwnTimeoutEndedTheLookup(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	reader := execReader(t, b, archive.Config{StatementTimeout: 200 * time.Millisecond})
	h := &charges{}
	srv := b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen, Archive: loggingArchive{t, reader}}).Wrap(h)
	require.Equal(t, http.StatusCreated, post(srv, "warm-up", `{}`).Code)
	require.EqualValues(t, 1, h.calls.Load())

	lockArchive(t, b)
	w := postWithin(srv, "fresh-key-archive-slow", 1500*time.Millisecond)
	require.EqualValues(t, 2, h.calls.Load(), "FailOpen did not fail open on the archive's own statement timeout (answered %d %s)", w.Code, w.Body.String())
}

// The Reader on a pool in pgx's default mode (cache_statement) prepares its
// statement on a connection's first use, before any statement timeout is
// set: a lookup that waits there on a lock is ended by the Reader's
// backstop, an error matching context.DeadlineExceeded, well before the
// request's own deadline (none here). The archive was slow, not the
// request: FailOpen runs the fresh key, and FailClosed answers 503.
func TestAPrepareThatWaitsOutArchiveTimeoutIsASlowArchive(t *testing.T) {
	t.Parallel()
	b := setup(t, pg)
	h := &charges{}
	open := b.middleware(t, idempotency.Config{OnArchiveError: idempotency.FailOpen, ArchiveTimeout: 300 * time.Millisecond, Archive: loggingArchive{t, b.reader}}).Wrap(h)
	closed := b.middleware(t, idempotency.Config{ArchiveTimeout: 300 * time.Millisecond, Archive: loggingArchive{t, b.reader}}).Wrap(h)
	lockArchive(t, b)
	w := post(closed, "fresh-key-prepare-waits", `{}`)
	require.Equal(t, http.StatusServiceUnavailable, w.Code, w.Body.String())
	require.Equal(t, "archive_unavailable", problemOf(t, w)["code"])
	require.EqualValues(t, 0, h.calls.Load())
	w = post(open, "fresh-key-prepare-waits", `{}`)
	require.Equal(t, http.StatusCreated, w.Code, "FailOpen did not fail open on a slow archive: %s", w.Body)
	require.EqualValues(t, 1, h.calls.Load())
}

// execReader is a Reader on a pool of its own in exec mode (the RDS Proxy
// mode the stack sets: no statement is prepared in a round trip of its own).
func execReader(t *testing.T, b bundle, cfg archive.Config) *archive.Reader {
	t.Helper()
	pool := b.db.NewPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		c.MaxConns = 2
	})
	reader, err := archive.NewReader(pool, cfg, nil)
	require.NoError(t, err)
	return reader
}

// lockArchive holds a lock every lookup waits on until the test ends.
func lockArchive(t *testing.T, b bundle) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.db.Pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "LOCK TABLE idempotency_archive_plain_keys IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
}

// postWithin posts key with a request that ends after d.
func postWithin(srv http.Handler, key string, d time.Duration) *httptest.ResponseRecorder {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	r := httptest.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`)).WithContext(ctx)
	r.Header.Set(idempotency.HeaderKey, key)
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, r)
	return w
}
